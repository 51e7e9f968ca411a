"""MHA → GQA / MQA checkpoint conversion (Ainslie et al. 2023, §2.1), as pure functions.

Query head i of H reads KV head i // (H / g) (contiguous groups). Converting g_src KV heads to
g_dst (g_src divisible by g_dst) merges each run of r = g_src / g_dst consecutive source heads:
- 'mean': their K and V projections (and biases) are averaged — the paper's method;
- 'first': the first head of each run is kept;
- 'random': K and V are re-initialised (the ablation's lower bound);
- 'aligned': each head's K / V basis rotated onto its group's first head, then 'mean'
  (lm/convert/head_merging.py).
`grouping='similarity'` merges the most similar heads instead of consecutive ones (permuting
heads first, lm/convert/head_merging.py); a latent target converts to MLA instead
(lm/convert/mla.py). What a conversion does is one `ConversionOptions` (lm/convert/options.py,
with its checks); `convert_checkpoint` applies it to a run's checkpoint.

The converted run continues the source's global step: its first checkpoint is the source's step,
and it trains on the source recipe's batches for the steps after it (new data, never a replay).
`uptrain.schedule`: 'continue' carries the source's learning-rate schedule on (optionally ramped
up over uptrain.warmup_steps), 'rewarm' warms up to the peak anew and decays over the uptraining
steps. `uptrain.optimizer_state`: 'convert' keeps the source's AdamW state with the K/V moments
converted like the weights (zeroed for 'random'; for an MLA target, kept where the parameter is
kept and zero for the new latent factors), 'fresh' starts the moments anew.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from lm.config import default_values
from lm.convert import cla, head_merging, mla, per_layer, pooling
from lm.convert import methods as conversion
from lm.convert.hf_files import copy_run_files, lent_tokenizer
from lm.convert.options import (
    POOL_METHODS,
    SCHEDULES,
    ConversionOptions,
    check_conversion,
    check_some_steps,
    check_steps,
    uptrain_steps,
)
from lm.convert.pool_checkpoint import (
    convert_opt_state,
    convert_params,
    with_schedule_count,
)
from lm.data.checks import eval_text_settings, reset_idle_data
from lm.data.corpus import load_corpus
from lm.model import attention
from lm.model.config import ModelConfig
from lm.model.transformer import model_config
from lm.train.checkpoint import (
    NO_OPT_STATE,
    Checkpointer,
    check_finite,
    checkpoint_entries,
    read_latest_meta,
    read_step_meta,
)
from lm.train.ensemble_run import member_run
from lm.train.identity import flat_config
from lm.train.interrupt import StopRequest
from lm.train.optimizer import check_train_config
from lm.train.provenance import SESSIONS
from lm.train.run import assemble, check_loop_config, step_context
from lm.train.stored import checkpoint_meta, stored_config
from lm.train.workdir import WorkdirLock, check_apart, check_run_dir

METHODS = POOL_METHODS  # for K/V pooling: 'mean', 'first', 'random', 'aligned'
PARTIAL = '.uptrain-partial-'  # a conversion is written here, inside its workdir, then moved in
SOURCE = 'config.uptrain.source_workdir'  # what errors call the source workdir (as recorded)
WORKDIR = 'workdir'  # and the converted run's (convert_checkpoint's argument)


def uptrain_config(
    source: ml_collections.ConfigDict,
    num_kv_heads: int,
    source_step: int,
    steps: int | None = None,
    model_settings: dict | None = None,
    **provenance,
) -> ml_collections.ConfigDict:
    """The converted run's config: attention and KV heads updated (or `model_settings`, e.g. a
    latent conversion's, applied); it continues from step
    `source_step` for `steps` more (default: `uptrain.fraction` × source_step) under
    `uptrain.schedule`; provenance recorded.

    'continue': the source's schedule at the continuing steps (its decay horizon kept, so a
    source whose cosine ended stays at min_lr), ramped up from 0 over uptrain.warmup_steps when
    that is > 0 (-1 or 0: no ramp); for a step-0 source (an import), the config's schedule over
    this run's steps. 'rewarm': warmup to train.lr over uptrain.warmup_steps (-1: 10% of the
    uptraining steps) from source_step, cosine to min_lr at the last step."""
    config = ml_collections.ConfigDict(copy.deepcopy(source.to_dict()))
    pooled = model_settings or attention.VARIANTS[source.model.attention].pooled(num_kv_heads)
    config.model.update(pooled)
    up, train = config.uptrain, config.train
    if up.schedule not in SCHEDULES:
        raise ValueError(f'config.uptrain.schedule must be one of {SCHEDULES}, got {up.schedule!r}')
    check_steps(source_step, steps)
    steps = uptrain_steps(source_step, steps, up.fraction)
    if up.schedule == 'continue':
        # the source's horizon; a step-0 source (an import) has none: decay over this run
        train.decay_steps = (train.decay_steps or train.steps) if source_step else 0
        train.ramp_start, train.ramp_steps = source_step, max(up.warmup_steps, 0)
    else:
        warmup = up.warmup_steps if up.warmup_steps >= 0 else round(0.1 * steps)
        train.update(schedule_start=source_step, warmup_steps=warmup, decay_steps=0)
        train.update(ramp_start=0, ramp_steps=0)
    train.steps = source_step + steps
    config.eval_every = min(config.eval_every, max(steps, 1))
    config.checkpoint_every = min(config.checkpoint_every, max(steps, 1))
    up.update(source_step=source_step, target=config.model.attention, **provenance)
    return config


def convert_checkpoint(
    source_workdir: str,
    options: ConversionOptions,
    workdir: str,
    stop: StopRequest | None = None,
    member: int | None = None,
    need_steps: bool = False,
) -> ml_collections.ConfigDict:
    """Converts `source_workdir`'s checkpoint as `options` say and writes it as a new run in
    `workdir` whose first checkpoint is at the source's step (config from `uptrain_config`);
    returns that config; an ensemble's `member` as that member split out would be. Everything
    that can be checked is checked before anything is written, and `workdir` is owned meanwhile
    (`WorkdirLock`); the checkpoint is built beside its place and moved in when complete, so a
    failure leaves `workdir` as it was. A signal `stop` sees during the conversion raises
    `Interrupted` at once (nothing is written yet); the writing, brief, is let finish. A
    `workdir` that is the source's, lies inside it or holds it is refused first, as is one that
    cannot be a run's own directory or holds what is not a run's (`check_run_dir`). `need_steps`
    (scripts/uptrain.py, whose run is to be uptrained): no uptraining step is refused too
    (`alpha` 0 of the ablation converts only)."""
    stop = stop or StopRequest()  # never entered: records nothing, stops nothing
    check_apart(workdir, WORKDIR, source_workdir, SOURCE)
    check_run_dir(workdir, WORKDIR)
    _check_steps_first(source_workdir, options, need_steps)
    with WorkdirLock(workdir, WORKDIR):
        dst_ckpts = os.path.join(workdir, 'checkpoints')
        if checkpoint_entries(workdir):
            raise FileExistsError(
                f'{WORKDIR}: {workdir} already holds checkpoints; choose a new directory'
            )
        with stop.at_once():
            config, state, meta = _convert(source_workdir, options, workdir, member)
        stop.check()  # a signal that arrived where nothing raised: still nothing written
        tokenizer = stored_config(source_workdir, SOURCE, options.source_step).data.tokenizer
        for name in os.listdir(workdir):  # left by a conversion that was killed
            if name.startswith(PARTIAL):
                shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
        partial = tempfile.mkdtemp(prefix=PARTIAL, dir=workdir)
        try:
            out = Checkpointer(partial, async_save=False)
            out.save(config.uptrain.source_step, state, meta)
            out.close()
            shutil.rmtree(dst_ckpts, ignore_errors=True)  # empty, or unfinished saves only
            copy_run_files(source_workdir, workdir, tokenizer)  # the run stands on its own
            os.replace(os.path.join(partial, 'checkpoints'), dst_ckpts)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    logging.info(
        'wrote %s; uptraining from step %d to %d',
        workdir,
        config.uptrain.source_step,
        config.train.steps,
    )
    return config


def _check_steps_first(source_workdir: str, options: ConversionOptions, need_steps: bool) -> None:
    """`convert_checkpoint`'s checks of the uptraining steps and schedule, before the conversion's
    work: the step counts, some uptraining step when `need_steps`, and the training settings
    of the run it would write (a rate that is 0 at every step, say)."""
    step = options.source_step
    latest = read_latest_meta(source_workdir, SOURCE) if step is None else None
    source_step = step if step is not None else latest and latest['data_step']
    check_steps(source_step, options.steps)
    if source_step is None:  # no checkpoint: the conversion says so
        return
    stored = stored_config(source_workdir, SOURCE, step)  # read once, for both checks
    if need_steps:
        fraction = stored.uptrain.fraction if options.fraction is None else options.fraction
        check_some_steps(source_step, options.steps, fraction)
    keep = {'attention': stored.model.attention}  # the model is the conversion's to check
    _converted_config(source_workdir, stored, source_step, options, keep, {})


def cache_summary(config: ml_collections.ConfigDict) -> str:
    """What the converted model's cache holds per token and layer, for messages ('1 KV head',
    '2 KV heads (CLA2)', '4,2,2,1 KV heads per layer', 'a latent of 64 + 8 RoPE dims')."""
    cfg = model_config(config.model)
    if attention.variant(cfg).latent_kv:
        section = cfg.section
        keys = f'{section.rope_heads} x ' if section.rope_heads > 1 else ''
        return f'a latent of {section.kv_lora_rank} + {keys}{section.qk_rope_head_dim} RoPE dims'
    if cfg.kv_heads_per_layer:
        heads = f'{",".join(map(str, cfg.kv_heads_per_layer))} KV heads per layer'
    else:
        heads = f'{cfg.num_kv_heads} KV head' + ('s' if cfg.num_kv_heads != 1 else '')
    return heads + (f' (CLA{cfg.kv_share_every})' if cfg.kv_share_every > 1 else '')


def optimizer_state_summary(config: ml_collections.ConfigDict) -> str:
    """How the converted run's optimizer state was made, for messages: its
    `uptrain.optimizer_state`, or that the source checkpoint had none (an import's)."""
    up = config.uptrain
    return _optimizer_state(up.optimizer_state, read_step_meta(up.source_workdir, up.source_step))


def _optimizer_state(choice: str, source_meta: dict) -> str:
    if source_meta.get(NO_OPT_STATE):
        return 'a fresh optimizer state (the source has none)'
    return f'{choice} optimizer state'


# What a conversion did to the weights, one typed value per kind, which the moments follow.
Recipe = pooling.PoolRecipe | mla.LatentRecipe | per_layer.PerLayerRecipe


def _converted_params(source, options: ConversionOptions) -> tuple[dict, Recipe, dict, dict]:
    """(parameters, the recipe they were converted by, model settings or None, provenance)."""
    params, cfg = source.state['params'], source.model_cfg
    inputs, groups, rotations, settings, record = None, None, None, None, {}
    if options.needs_calibration:
        model = nnx.merge(source.ctx.graphdef, params)
        tokens = load_corpus(source.config.data).tokens['train']
        seq_len, num_tokens = source.config.data.seq_len, options.calibration_tokens
        if num_tokens is None:
            num_tokens = source.config.uptrain.calibration_tokens
        inputs = conversion.calibration_inputs(model, tokens, seq_len, num_tokens)
        record['calibration_tokens'] = num_tokens
    if options.latent:
        target = attention.VARIANTS[options.target].read_section(source.config.model)
        eps = target.latent_norm_eps  # the source config's section (0: DeepseekV3's, 1e-6)
        params, settings, pairs = conversion.latent_conversion(params, cfg, options, inputs, eps)
        order = mla.q_order(cfg.head_dim, np.array([int(j) for j in pairs.split(',')]))
        return params, mla.LatentRecipe(order), settings, {**record, 'rope_pairs': pairs}
    if options.kv_budget:
        return _per_layer_params(params, cfg, options, inputs, record)
    g, method, n = options.num_kv_heads or cfg.num_kv_heads, options.method, options.kv_share_every
    if options.grouping == 'similarity':
        groups = conversion.similarity_groups(params, g, method, inputs)
        record['groups'] = conversion.format_groups(groups)
    if method == 'aligned':
        rotations = head_merging.alignments(params, g, groups, inputs)
    params = convert_params(params, cfg, g, method, options.seed, groups, rotations=rotations)
    merge: cla.CLARecipe | None = None
    if n > 1:  # then merge each n layers' K/V (cross-layer attention)
        merge = cla.plan(params, n, method, options.grouping, inputs)
        params = cla.convert(params, merge)
        settings = {**attention.VARIANTS[cfg.attention].pooled(g), 'kv_share_every': n}
    return params, pooling.PoolRecipe(g, method, groups, rotations, merge), settings, record


def _per_layer_params(params: dict, cfg: ModelConfig, options, inputs: list, record: dict):
    """`_converted_params` under a KV budget: each layer's count and groups from its heads'
    similarity (lm/convert/per_layer.py)."""
    sims = per_layer.similarities(params, inputs)
    counts = per_layer.choose_counts(sims, cfg.num_heads, options.kv_budget)
    groups = per_layer.layer_groups(sims, counts)
    params = per_layer.convert_params(params, counts, groups)
    settings = {
        **attention.VARIANTS[cfg.attention].pooled(max(counts)),
        'kv_heads_per_layer': counts,
    }
    record.update(groups=conversion.format_groups(groups), kv_budget=options.kv_budget)
    return params, per_layer.PerLayerRecipe(counts, groups), settings, record


def _check_same_evaluation(src_config: ml_collections.ConfigDict, part: str) -> None:
    """Refuses a corpus part whose run would score other text than the source did (a part
    cuts the held-out text from validation; none scores all of it): the converted run's curve
    continues the source's, so both must evaluate the same text."""
    before = eval_text_settings(flat_config(src_config))
    after = copy.deepcopy(src_config)
    after.data.split = part
    if eval_text_settings(flat_config(after)) != before:
        raise ValueError(
            f'config.data.split={part!r}: the source trained with '
            f'data.split={src_config.data.split!r}, so its evaluation scored other text than a '
            'run on this part would (a part cuts the held-out text from validation); train the '
            "source on a part ('pretrain') to uptrain on another"
        )


def _converted_config(
    src: str,
    src_config: ml_collections.ConfigDict,
    step: int,
    options: ConversionOptions,
    settings: dict | None,
    record: dict,
) -> ml_collections.ConfigDict:
    """The converted run's config: `uptrain_config` of the source's (`src_config` of workdir
    `src` at `step`, updated in place) with the options and the conversion's `settings` and
    provenance `record`, its training settings checked."""
    if options.fraction is not None:
        src_config.uptrain.fraction = options.fraction
    src_config.uptrain.update(schedule=options.schedule, optimizer_state=options.optimizer_state)
    if options.warmup_steps is not None:
        src_config.uptrain.warmup_steps = options.warmup_steps
    if options.data_split is not None:  # the parts' settings are dropped if it reads none
        _check_same_evaluation(src_config, options.data_split)
        src_config.data.split = options.data_split
        reset_idle_data(src_config.data, default_values('data'))
    if options.lr is not None:
        train = src_config.train
        train.update(lr=options.lr, min_lr=train.min_lr * options.lr / train.lr)
    config = uptrain_config(
        src_config,
        options.num_kv_heads,
        step,
        options.steps,
        settings,
        method=options.method,
        grouping=options.grouping,
        source_workdir=os.path.abspath(src),
        **record,
    )
    check_train_config(config.train)
    check_loop_config(config)
    return config


def _converted_state(source, options: ConversionOptions, ctx, params: dict, recipe: Recipe) -> dict:
    """The converted run's first state (the source's step and rng), placed on `ctx`'s shardings:
    the source's optimizer state converted like the weights (by `recipe`), or a fresh one at the
    source's step (`options.optimizer_state`)."""
    state, r = source.state, recipe
    if options.optimizer_state != 'convert':
        opt_state = with_schedule_count(ctx.tx.init(params), source.step)
    elif isinstance(r, mla.LatentRecipe):
        fresh = with_schedule_count(ctx.tx.init(params), source.step)
        opt_state = conversion.latent_opt_state(state['opt_state'], fresh, r.order_D)
    elif isinstance(r, per_layer.PerLayerRecipe):
        opt_state = per_layer.convert_opt_state(
            state['opt_state'], state['params'], r.counts, r.groups
        )
    else:
        then = r.cla and cla.moment_step(r.cla)
        g, method = r.num_kv_heads, r.method
        opt_state = convert_opt_state(
            state['opt_state'], state['params'], g, method, r.groups, r.rotations, then
        )
    new_state = {
        'params': params,
        'opt_state': opt_state,
        'step': jnp.asarray(source.step, jnp.int32),
        'rng': state['rng'],
    }
    return jax.device_put(new_state, ctx.state_sharding)


def _convert(
    src: str, options: ConversionOptions, workdir: str, member: int | None
) -> tuple[ml_collections.ConfigDict, dict, dict]:
    """(config, state, checkpoint side-car) of the converted run's first step (the source's),
    to be written in `workdir`: a tokenizer the source keeps is read from the copy there."""
    source = assemble(
        src,
        state='restore',
        step=options.source_step,
        check=lambda cfg: check_conversion(cfg, options),
        flag=SOURCE,
    )
    if source.ctx.members and member is None:
        raise ValueError(
            f'{SOURCE}={src} is an ensemble (config.train.ensemble={source.ctx.members}): '
            'convert it with convert_ensemble, or one member'
        )
    if source.ctx.members:
        source = member_run(source, member)
    check_finite(source.state['params'], f'{SOURCE}={src}: the checkpoint at step {source.step}')
    params, recipe, settings, record = _converted_params(source, options)
    config = _converted_config(src, source.config, source.step, options, settings, record)
    dst_cfg = model_config(config.model)
    ctx = step_context(config, dst_cfg, source.mesh, source.rules)  # the source's mesh
    new_state = _converted_state(source, options, ctx, params, recipe)
    src_cfg = source.model_cfg
    logging.info(
        'converted %s step %d (%s, %d KV heads) to %s by %s (%s grouping); schedule %s, %s',
        src,
        source.step,
        src_cfg.attention,
        src_cfg.num_kv_heads,
        attention.variant(dst_cfg).kv_heads(dst_cfg),
        options.method,
        options.grouping,
        options.schedule,
        _optimizer_state(options.optimizer_state, source.meta),
    )
    config.data.tokenizer = lent_tokenizer(config.data.tokenizer, src, workdir)
    meta = checkpoint_meta(
        config,
        source.meta['data_fingerprint'],
        source.step,
        ctx.abstract_state['params'],
        workdir,
    )
    if SESSIONS in source.meta:  # the steps up to the conversion: the source run's
        meta[SESSIONS] = source.meta[SESSIONS]
    return config, new_state, meta
