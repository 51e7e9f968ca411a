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
(lm/convert/mla.py).
Both options and their checks: lm/convert/methods.py.

The converted run continues the source's global step: its first checkpoint is the source's step,
and it trains on the source recipe's batches for the steps after it (new data, never a replay).
`uptrain.schedule`: 'continue' carries the source's learning-rate schedule on (optionally ramped
up over uptrain.warmup_steps), 'rewarm' warms up to the peak anew and decays over the uptraining
steps. `uptrain.optimizer_state`: 'convert' keeps the source's AdamW state with the K/V moments
converted like the weights (zeroed for 'random'), 'fresh' starts the moments anew.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import shutil
import tempfile
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from flax import nnx

from lm.convert import head_merging
from lm.convert import methods as conversion
from lm.convert.methods import (
    SCHEDULES,
    Plan,
    check_conversion,
    check_flags,
    check_steps,
    resolve_method,
)
from lm.data.corpus import load_corpus
from lm.model import attention
from lm.model.config import DTYPES, ModelConfig
from lm.model.transformer import model_config
from lm.train.checkpoint import Checkpointer, read_latest_meta
from lm.train.optimizer import check_train_config
from lm.train.run import check_loop_config, checkpoint_meta, restore_run, step_context
from lm.train.workdir import WorkdirLock

METHODS = conversion.POOL_METHODS  # for K/V pooling: 'mean', 'first', 'random', 'aligned'
PARTIAL = '.uptrain-partial-'  # a conversion is written here, inside --dst, then moved in


def merge_kv_heads(x: jax.Array, head_axis: int, num_kv_heads: int, method: str) -> jax.Array:
    """Merges runs of consecutive heads along `head_axis` down to `num_kv_heads` heads."""
    G = x.shape[head_axis]
    r = G // num_kv_heads
    grouped = x.reshape(x.shape[:head_axis] + (num_kv_heads, r) + x.shape[head_axis + 1 :])
    if method in ('mean', 'aligned'):
        return grouped.mean(axis=head_axis + 1, dtype=jnp.float32).astype(x.dtype)
    return jnp.take(grouped, 0, axis=head_axis + 1)


def _map_kv(params: dict, fn: Callable[[dict], dict]) -> dict:
    """`params` with fn applied to every layer's k_proj and v_proj dicts; the rest shared."""
    out = dict(params)
    out['blocks'] = {}
    for layer, block in params['blocks'].items():
        attn = dict(block['attn'])
        for name in ('k_proj', 'v_proj'):
            attn[name] = fn(dict(attn[name]))
        out['blocks'][layer] = {**block, 'attn': attn}
    return out


def _merge_proj(proj: dict, num_kv_heads: int, method: str) -> dict:
    proj['kernel'] = merge_kv_heads(proj['kernel'], 1, num_kv_heads, method)  # [E, G, D]
    if 'bias' in proj:
        proj['bias'] = merge_kv_heads(proj['bias'], 0, num_kv_heads, method)  # [G, D]
    return proj


def convert_params(
    params: dict,
    src: ModelConfig,
    num_kv_heads: int,
    method: str,
    seed: int = 0,
    groups: list | None = None,
    inputs: list | None = None,
    rotations: list | None = None,
) -> dict:
    """The parameter tree (pure dict, as checkpointed) with every layer's k_proj / v_proj
    converted to `num_kv_heads` heads, merging `groups[layer]` (default: consecutive runs; the
    heads are permuted first, `head_merging.permute_heads`). 'aligned' rotates heads first by
    `rotations` (default: `alignments` fitted on the layers' attention inputs `inputs`, [M, E]
    each), then mean-pools. Unchanged parameters are shared, not copied."""
    check_conversion(src, num_kv_heads, method)
    if method == 'aligned' and rotations is None:
        if inputs is None:
            raise ValueError("method='aligned' needs the layers' calibration inputs")
        rotations = head_merging.alignments(params, num_kv_heads, groups, inputs)
    params = head_merging.permute_and_rotate(
        params, groups, rotations if method == 'aligned' else None
    )
    if method != 'random':
        return _map_kv(params, lambda proj: _merge_proj(proj, num_kv_heads, method))
    key = jax.random.key(seed)

    def fresh(proj: dict) -> dict:
        nonlocal key
        key, sub = jax.random.split(key)
        E, _, D = proj['kernel'].shape
        std = 1 / math.sqrt(E)  # the model's own init (lm/model/layers.py)
        proj['kernel'] = std * jax.random.normal(sub, (E, num_kv_heads, D), DTYPES[src.param_dtype])
        if 'bias' in proj:
            proj['bias'] = jnp.zeros((num_kv_heads, D), proj['bias'].dtype)
        return proj

    return _map_kv(params, fresh)


def convert_moments(
    moments: dict,
    num_kv_heads: int,
    method: str,
    groups: list | None = None,
    rotations: list | None = None,
    second: bool = False,
) -> dict:
    """An optimizer moment tree mirroring the parameters (Adam's mu, or nu if `second`)
    converted like `convert_params` converts the weights: heads permuted to `groups`, rotated
    by `rotations` ('aligned': mu exactly, nu by the squared rotations), K/V moments pooled by
    `method`, zero for 'random' (the fresh K/V have no history); other moments shared."""
    if method != 'random':
        moments = head_merging.permute_and_rotate(moments, groups, rotations, second)
        return _map_kv(moments, lambda proj: _merge_proj(proj, num_kv_heads, method))

    def zero(proj: dict) -> dict:
        return {
            k: jnp.zeros_like(merge_kv_heads(v, v.ndim - 2, num_kv_heads, 'first'))
            for k, v in proj.items()
        }

    return _map_kv(moments, zero)


def convert_opt_state(
    opt_state,
    params: dict,
    num_kv_heads: int,
    method: str,
    groups: list | None = None,
    rotations: list | None = None,
):
    """The optax state `opt_state` (namedtuples, tuples and dicts) with every subtree shaped like
    `params` (the moments; Adam's nu as a second moment) converted by `convert_moments`;
    counts and the rest kept."""
    treedef = jax.tree.structure(params)
    convert = functools.partial(
        convert_moments, num_kv_heads=num_kv_heads, method=method, groups=groups
    )
    rotations = rotations if method == 'aligned' else None

    def moments(node):
        if isinstance(node, optax.ScaleByAdamState):
            mu = convert(node.mu, rotations=rotations)
            return node._replace(mu=mu, nu=convert(node.nu, rotations=rotations, second=True))
        if isinstance(node, dict) and jax.tree.structure(node) == treedef:
            return convert(node, rotations=rotations)
        return None

    return _map_opt_state(opt_state, moments)


def with_schedule_count(opt_state, step: int):
    """`opt_state` with the learning-rate schedule's step counts set to `step` (a fresh state of
    a run continuing at `step`: Adam's own count stays 0, the schedule reads the global step)."""

    def schedule_count(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.full_like(node.count, step))
        return None

    return _map_opt_state(opt_state, schedule_count)


def _map_opt_state(opt_state, replace):
    """`opt_state` (optax's namedtuples, tuples, lists and dicts) rebuilt with every node for
    which `replace(node)` is not None replaced by that value."""

    def visit(node):
        if (new := replace(node)) is not None:
            return new
        if isinstance(node, tuple) and hasattr(node, '_fields'):
            return type(node)(*(visit(x) for x in node))
        if isinstance(node, (tuple, list)):
            return type(node)(visit(x) for x in node)
        if isinstance(node, dict):
            return {k: visit(v) for k, v in node.items()}
        return node

    return visit(opt_state)


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
    steps = round(up.fraction * source_step) if steps is None else steps
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
    src: str,
    dst: str,
    num_kv_heads: int,
    method: str,
    step: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
    steps: int | None = None,
    schedule: str = 'continue',
    optimizer_state: str = 'convert',
    grouping: str = 'contiguous',
    target: str = '',
    kv_lora_rank: int = 0,
    qk_rope_head_dim: int = 0,
    calibration_tokens: int | None = None,
) -> ml_collections.ConfigDict:
    """Converts `src`'s checkpoint to `num_kv_heads` KV heads (merged by `method` after
    `grouping`), or to a latent `target` (lm/convert/methods.py), and writes it as a new run in
    `dst` whose first checkpoint is at the source's step (optimizer state per
    `optimizer_state`, config from `uptrain_config` under `schedule`, `steps` uptraining steps
    or uptrain.fraction of the source's); returns that config. Every flag is checked
    before anything is written, and `dst` is owned meanwhile (`WorkdirLock`); the checkpoint is
    built beside its place and moved in when complete, so a failure leaves `dst` as it was."""
    method = resolve_method(target, method)
    plan = Plan(num_kv_heads, method, grouping, target, kv_lora_rank, qk_rope_head_dim)
    check_flags(num_kv_heads, method, step, fraction, seed, schedule, optimizer_state, plan)
    if calibration_tokens is not None and calibration_tokens < 1:
        raise ValueError(f'--calibration_tokens must be >= 1, got {calibration_tokens}')
    latest = read_latest_meta(src)
    check_steps(step if step is not None else latest and latest['data_step'], steps)
    with WorkdirLock(dst, '--dst'):
        dst_ckpts = os.path.join(dst, 'checkpoints')
        if os.path.isdir(dst_ckpts) and os.listdir(dst_ckpts):
            raise FileExistsError(f'--dst: {dst} already holds checkpoints; choose a new workdir')
        options = dict(fraction=fraction, seed=seed, steps=steps, schedule=schedule)
        options.update(optimizer_state=optimizer_state, calibration_tokens=calibration_tokens)
        config, state, meta = _convert(src, step, plan, **options)
        for name in os.listdir(dst):  # left by a conversion that was killed
            if name.startswith(PARTIAL):
                shutil.rmtree(os.path.join(dst, name), ignore_errors=True)
        partial = tempfile.mkdtemp(prefix=PARTIAL, dir=dst)
        try:
            out = Checkpointer(partial, async_save=False)
            out.save(config.uptrain.source_step, state, meta)
            out.close()
            os.replace(os.path.join(partial, 'checkpoints'), dst_ckpts)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    logging.info(
        'wrote %s; uptraining from step %d to %d',
        dst,
        config.uptrain.source_step,
        config.train.steps,
    )
    return config


def _converted_params(source, plan: conversion.Plan, seed: int, calibration_tokens: int):
    """(parameters, (groups, rotations) or Nones, model settings or None, provenance)."""
    params, cfg = source.state['params'], source.model_cfg
    inputs, groups, rotations, settings, record = None, None, None, None, {}
    if plan.needs_calibration:
        model = nnx.merge(source.ctx.graphdef, params)
        tokens = load_corpus(source.config.data).tokens['train']
        seq_len = source.config.data.seq_len
        inputs = conversion.calibration_inputs(model, tokens, seq_len, calibration_tokens)
        record['calibration_tokens'] = calibration_tokens
    if plan.latent:
        target = attention.VARIANTS[plan.target].read_section(source.config.model)
        eps = target.latent_norm_eps  # the converted run's: the source config's section
        params, settings, pairs = conversion.latent_conversion(params, cfg, plan, inputs, eps)
        return params, (None, None), settings, {**record, 'rope_pairs': pairs}
    if plan.grouping == 'similarity':
        groups = conversion.similarity_groups(params, plan.num_kv_heads, plan.method, inputs)
        record['groups'] = conversion.format_groups(groups)
    if plan.method == 'aligned':
        rotations = head_merging.alignments(params, plan.num_kv_heads, groups, inputs)
    g, method = plan.num_kv_heads, plan.method
    params = convert_params(params, cfg, g, method, seed, groups, rotations=rotations)
    return params, (groups, rotations), settings, record


def _convert(
    src: str,
    step: int | None,
    plan: conversion.Plan,
    fraction: float | None,
    seed: int,
    steps: int | None,
    schedule: str,
    optimizer_state: str,
    calibration_tokens: int | None,
) -> tuple[ml_collections.ConfigDict, dict, dict]:
    """(config, state, checkpoint side-car) of the converted run's first step (the source's)."""
    source = restore_run(
        src, step, lambda cfg: check_conversion(cfg, plan.num_kv_heads, plan.method, plan), '--src'
    )
    src_config, src_cfg, state = source.config, source.model_cfg, source.state
    if fraction is not None:
        src_config.uptrain.fraction = fraction
    if calibration_tokens is None:
        calibration_tokens = src_config.uptrain.calibration_tokens
    src_config.uptrain.update(schedule=schedule, optimizer_state=optimizer_state)
    params, recipe, settings, record = _converted_params(source, plan, seed, calibration_tokens)
    config = uptrain_config(
        src_config,
        plan.num_kv_heads,
        source.step,
        steps,
        settings,
        method=plan.method,
        grouping=plan.grouping,
        source_workdir=os.path.abspath(src),
        **record,
    )
    check_train_config(config.train)
    check_loop_config(config)
    dst_cfg = model_config(config.model)
    ctx = step_context(config, dst_cfg, mesh=source.ctx.mesh)
    if optimizer_state == 'convert':
        opt_state = convert_opt_state(
            state['opt_state'], state['params'], plan.num_kv_heads, plan.method, *recipe
        )
    else:
        opt_state = with_schedule_count(ctx.tx.init(params), source.step)
    new_state = jax.device_put(
        {
            'params': params,
            'opt_state': opt_state,
            'step': jnp.asarray(source.step, jnp.int32),
            'rng': state['rng'],
        },
        ctx.state_sharding,
    )
    logging.info(
        'converted %s step %d (%s, %d KV heads) to %s by %s (%s grouping); schedule %s, %s '
        'optimizer state',
        src,
        source.step,
        src_cfg.attention,
        src_cfg.num_kv_heads,
        attention.variant(dst_cfg).kv_heads(dst_cfg),
        plan.method,
        plan.grouping,
        schedule,
        optimizer_state,
    )
    meta = checkpoint_meta(
        config, source.meta['data_fingerprint'], source.step, ctx.abstract_state['params']
    )
    return config, new_state, meta
