"""Runs as data: `assemble` builds what a run needs once (checked config, mesh, sharding rules,
model, step context, data, state) as a frozen `Run`, which training, evaluation, generation,
export, analysis and uptraining all start from; a run's checkpoints as stored are
lm/train/stored.py."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from lm.config import check_value_types, default_values
from lm.config_migration import upgrade_config
from lm.data.checks import check_data_config, check_idle_data
from lm.data.corpus import Corpus, check_corpus_size, check_vocab_fits, load_corpus
from lm.data.recall import TASKS
from lm.model.config import ModelConfig, check_idle_rope_knobs, warn_idle_window
from lm.model.transformer import check_model_config, model_config
from lm.sharding import (
    check_cpu_devices,
    data_parallel_size,
    fit_mesh,
    make_mesh,
    rules_table,
)
from lm.train.checkpoint import (
    Checkpointer,
    read_latest_meta,
)
from lm.train.ensemble import (
    as_ensemble,
    check_ensemble_config,
    check_members_divide,
    check_scores_fit,
    check_size_estimate,
    step_rules,
)
from lm.train.evaluation import check_eval_config, eval_batch_size
from lm.train.identity import check_config_change
from lm.train.optimizer import (
    check_eps_in,
    check_train_config,
    lr_schedule,
    make_optimizer,
    schedule_moved,
    warn_schedule,
)
from lm.train.step import (
    StepContext,
    check_xla_options,
    init_state,
    make_step_context,
    parse_xla_options,
)
from lm.train.stored import check_step, inherited_data, restore, stored_config
from lm.train.workdir import RunError, WorkdirLock, check_run_files, run_resolved

# What `assemble` gives a run as its state: nothing, a fresh one from config.seed, a workdir's
# checkpoint, only its parameters (inference: no optimizer state is read), or (training) the
# workdir's latest checkpoint when it has one, else a fresh one.
STATES = ('none', 'init', 'restore', 'params', 'resume')


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run needs, built once by `assemble` (nothing compiled). `config.model.vocab_size`
    holds the resolved size (what checkpoints save)."""

    config: ml_collections.ConfigDict
    model_cfg: ModelConfig
    rules: dict[str, tuple[str, ...]]  # config.mesh.rules as {logical axis: mesh axes}
    ctx: StepContext  # on the run's mesh, with these rules
    corpus: Corpus | None = None  # the tokenised data (assemble(data=True))
    step: int | None = None  # the step of `state`
    state: dict | None = None  # {'params', 'opt_state', 'step', 'rng'} in ctx's shardings;
    # state='params': {'params'} only
    meta: dict | None = None  # the restored checkpoint's side-car
    checkpointer: Checkpointer | None = None  # state='resume': the run's own, open for saving
    lock: WorkdirLock | None = None  # state='resume': the workdir, owned until `close`

    @property
    def mesh(self) -> Mesh:
        return self.ctx.mesh

    def close(self) -> None:
        """Closes the checkpointer and releases the workdir (both only with state='resume')."""
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
        finally:
            if self.lock is not None:
                self.lock.release()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_seed(seed: int, name: str) -> None:
    """A seed of jax.random.key must be an integer in [0, 2**32): without x64 it reads larger
    and negative seeds as others (2**32 as 0); `name` (a key or flag) names it in the error."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f'{name} must be an integer in [0, 2**32), got {seed!r}')


def check_loop_config(config: ml_collections.ConfigDict) -> None:
    """One-line errors for the loop's intervals, the seed and the loss-spike guard (no JAX:
    train.py checks them before it finds a run already finished)."""
    for name in ('eval_every', 'log_every', 'checkpoint_every', 'keep_checkpoints'):
        if config[name] <= 0:
            raise ValueError(f'config.{name} must be > 0, got {config[name]}')
    check_seed(config.seed, 'config.seed')
    ratio = config.train.max_loss_ratio  # <= 1 stops at the first loss above the median
    if not (ratio == 0 or ratio > 1):  # NaN too
        raise ValueError(f'config.train.max_loss_ratio must be 0 (off) or > 1, got {ratio}')


def step_context(
    config: ml_collections.ConfigDict,
    cfg: ModelConfig,
    mesh: Mesh,
    rules: dict[str, tuple[str, ...]],
    document_eos: int | None = None,
) -> StepContext:
    """The step context of `config`'s training for the model `cfg` on `mesh` under `rules`.
    The learning-rate schedule is built here once; the optimizer and the logged 'lr' share it.
    A recall source's losses count its answers only. An ensemble's (`lm.train.ensemble`) is a
    member's context under the member rules, stacked (refused if it cannot fit)."""
    schedule = lr_schedule(config.train)
    tx = make_optimizer(config.train, schedule)
    masked = config.data.source in TASKS
    xla_options = parse_xla_options(config.train.xla_options)
    inner = step_rules(config, mesh, rules)
    ctx = make_step_context(
        cfg, tx, mesh, inner, config.seed, schedule, document_eos, masked, xla_options
    )
    return as_ensemble(config, ctx, mesh, rules)


def check_parallel(config: ml_collections.ConfigDict, mesh: Mesh, rules: dict) -> None:
    """The train and eval batches must divide by the data-parallel size and the processes; an
    ensemble's members by the member axes, and each member's batch by what is left."""
    if config.train.ensemble:
        check_members_divide(config, mesh, rules)
    dp = data_parallel_size(mesh, step_rules(config, mesh, rules))
    per_micro = config.train.batch_size // config.train.grad_accum_steps
    if per_micro % dp or config.train.batch_size % jax.process_count():
        raise ValueError(
            f'config.train.batch_size={config.train.batch_size} (/ grad_accum_steps = {per_micro}'
            f' per micro-batch) must be divisible by the data-parallel size {dp} and by the '
            f'{jax.process_count()} processes'
        )
    check_eval_config(config, dp)
    check_scores_fit(config, per_micro, f'config.train.batch_size={config.train.batch_size}')
    check_scores_fit(config, eval_batch_size(config), 'the evaluation (config.eval_batch_size)')


def check_config(
    config: ml_collections.ConfigDict, saved: bool = False
) -> ml_collections.ConfigDict:
    """An upgraded private copy of `config` after checking every setting that needs neither
    data nor devices (one-line errors); `assemble` checks the batches against the mesh. A
    `saved` config (read back from its checkpoint, checked when that run was made) is checked
    only for what rebuilding its model needs."""
    old_eval_batches = config.get('eval_batches')
    config = upgrade_config(config.to_dict())  # private copy; vocab_size is recorded
    if saved:
        check_model_config(config.model)
        return config
    check_value_types(config, 'config')
    if old_eval_batches is not None:
        logging.warning(
            'config.eval_batches=%d is replaced by config.eval_tokens: evaluating %d tokens '
            '(0 = the whole split)',
            old_eval_batches,
            config.eval_tokens,
        )
    check_loop_config(config)
    check_train_config(config.train)
    check_ensemble_config(config)
    parse_xla_options(config.train.xla_options)  # its form; `assemble` checks the names
    check_data_config(config.data)
    check_idle_data(config.data, default_values('data'))
    check_model_config(config.model)  # model errors before reading any data
    check_eps_in(config.train, config.model.param_dtype)
    check_idle_rope_knobs(config.model, default_values('model'))
    warn_idle_window(config.model, config.data.seq_len)
    check_cpu_devices(config.mesh)
    if config.model.attention_impl == 'cudnn' and jax.default_backend() != 'gpu':
        raise ValueError(
            "config.model.attention_impl='cudnn' needs a GPU (cuDNN fused attention), but this "
            f"run's backend is {jax.default_backend()}: use 'dot_product' or 'einsum'"
        )
    return config


def check_devices(config: ml_collections.ConfigDict, saved: bool = False) -> tuple[dict, Mesh]:
    """(sharding rules, mesh) of a checked config, after the checks that need the devices but
    no data: the batches against the mesh and the train step's XLA options (not for a `saved`
    config, which was checked when its run was made)."""
    rules = rules_table(config.mesh)
    mesh = make_mesh(config.mesh)
    if not saved:
        check_parallel(config, mesh, rules)
        check_xla_options(parse_xla_options(config.train.xla_options))
        check_size_estimate(config)  # before the model is traced
    return rules, mesh


def assemble(
    source: ml_collections.ConfigDict | str,
    *,
    state: str = 'none',
    workdir: str | None = None,
    step: int | None = None,
    data: bool = False,
    check: Callable[[ModelConfig], None] | None = None,
    allow_config_change: bool = False,
    flag: str = '--workdir',
    model_overrides: Mapping[str, Any] | None = None,
) -> Run:
    """The one way a run is built: its config checked (`check_config`), sharding rules and mesh
    made, `data` tokenised, the model config resolved, `check(model_config)` run, the step
    context and the `state` (one of STATES) built, each once.

    `source` is a config, or a workdir whose checkpoint `step` (default: the newest) gives both
    the config and, with state='restore' or 'params', the state. A config's 'restore', 'params'
    and 'resume' read `workdir`; 'resume' (training) first takes the workdir (`WorkdirLock`,
    released by `Run.close`) and refuses a config changed since its checkpoint unless
    `allow_config_change`. `flag` names the workdir in errors. `model_overrides`: `config.model`
    keys set on the config before the model is built, for settings that leave the parameters
    as they are (e.g. inference's `decode_kernel`)."""
    saved = isinstance(source, str)
    workdir = source if saved else workdir
    config = check_config(_source_config(source, state, workdir, step, flag), saved)
    if state in ('restore', 'params'):  # reading a run, maybe trained on more devices
        config.mesh = fit_mesh(config.mesh, jax.device_count())
    if model_overrides:
        config.model.update(model_overrides)
        check_model_config(config.model)
    rules, mesh = check_devices(config, saved)
    if state in ('init', 'resume'):  # a run that trains: after every check (errors alone)
        warn_schedule(config.train)
    lock = None
    if state == 'resume':
        lock = WorkdirLock(workdir, owner=jax.process_index() == 0).__enter__()
    try:
        if state == 'resume':  # before the data is read (and a tokenizer trained) for nothing
            _check_resume_config(config, workdir, allow_config_change)
        trains = state in ('init', 'resume')
        corpus, cfg = _data_and_model(config, data, check, not saved, trains)
        eos = corpus.tokenizer.eos_id if corpus and config.data.document_mask else None
        ctx = step_context(config, cfg, mesh, rules, eos)
        with jax.set_mesh(mesh):
            if state == 'resume':
                ckpt, (start, restored, meta) = _resume(
                    config, cfg, ctx, corpus, workdir, allow_config_change
                )
            else:
                ckpt = None
                start, restored, meta = _state(state, cfg, ctx, config.seed, workdir, step, flag)
        return Run(config, cfg, rules, ctx, corpus, start, restored, meta, ckpt, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _source_config(
    source: ml_collections.ConfigDict | str,
    state: str,
    workdir: str | None,
    step: int | None,
    flag: str,
) -> ml_collections.ConfigDict:
    """`assemble`'s config as given or saved in workdir `source`, after the checks that come
    before any other: the state's name, its workdir, and the side files of a run it reads."""
    if state not in STATES:
        raise ValueError(f'state must be one of {STATES}, got {state!r}')
    if state in ('restore', 'params', 'resume') and workdir is None:
        raise ValueError(f'state={state!r} needs a workdir to read the checkpoint from')
    config = stored_config(workdir, flag, step) if isinstance(source, str) else source
    if state in ('restore', 'params'):  # an existing run's side files, before any other check
        check_run_files(config.data.tokenizer, workdir, flag)
    return config


def _data_and_model(
    config: ml_collections.ConfigDict,
    data: bool,
    check: Callable | None,
    check_size: bool,
    trains: bool,
) -> tuple[Corpus | None, ModelConfig]:
    """(the corpus or None, the model config); `config.model.vocab_size` is resolved. With
    `check_size`, the splits must hold what the run reads: a batch to train on if it `trains`,
    two evaluation windows of each split evaluated."""
    corpus = None
    if data:
        check_vocab_fits(config.data, config.model.vocab_size)  # before a BPE is trained
        corpus = load_corpus(config.data)
        if check_size:
            batch = config.train.batch_size if trains else None
            check_corpus_size(corpus, batch, config.data.seq_len)
    cfg = model_config(config.model, corpus.tokenizer.vocab_size if corpus else None)
    config.model.vocab_size = cfg.vocab_size
    if check is not None:
        check(cfg)
    return corpus, cfg


def _state(
    state: str,
    cfg: ModelConfig,
    ctx: StepContext,
    seed: int,
    workdir: str | None,
    step: int | None,
    flag: str,
) -> tuple[int | None, dict | None, dict | None]:
    """(step, state, checkpoint side-car) of the state 'none', 'init' (from `seed`), 'restore'
    (checkpoint `step` of `workdir`, default: the newest readable one) or 'params' (its
    parameters only; refused for an ensemble, whose members are split out first)."""
    if state == 'none':
        return None, None, None
    if state == 'params' and ctx.members:
        raise ValueError(
            f'{flag}: {workdir} is an ensemble of {ctx.members} members (config.train.ensemble);'
            ' split one out first: scripts/split_ensemble.py'
        )
    if state == 'init':
        return 0, init_state(ctx, cfg, seed), None
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        check_step(ckpt.steps(), step, ckpt.directory, flag)
        return restore(ckpt, ctx, step, params_only=state == 'params')
    finally:
        ckpt.close()


def _resume(
    config: ml_collections.ConfigDict,
    cfg: ModelConfig,
    ctx: StepContext,
    corpus: Corpus | None,
    workdir: str,
    allow_other_data: bool = False,
) -> tuple[Checkpointer, tuple[int, dict, dict | None]]:
    """(the run's checkpointer, open; (step, state, side-car)) of training in `workdir`: its
    latest checkpoint restored, else a fresh state (`assemble` has checked its config). Data
    other than the checkpoint recorded (a file changed since, a relative data.path read from
    another directory) is refused unless `allow_other_data` (--allow_config_change)."""
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(workdir, config.keep_checkpoints, config.async_checkpointing)
    try:
        if not ckpt.steps():
            return ckpt, (0, init_state(ctx, cfg, config.seed), None)
        step, state, meta = restore(ckpt, ctx)
    except BaseException:
        ckpt.close()
        raise
    # None where the checkpoint's fingerprint is inherited: an imported or converted run goes
    # on training on its own corpus by design.
    recorded = meta['data_fingerprint']
    if (
        corpus is not None
        and recorded != corpus.fingerprint
        and not inherited_data(config, step, recorded)
    ):
        if not allow_other_data:
            ckpt.close()
            raise RunError(
                f'--workdir: {workdir} trained to step {step} on other data than it reads here '
                f'(fingerprint {recorded[:12]}, here {corpus.fingerprint[:12]}: '
                f'config.data.path={config.data.path!r} from {os.getcwd()}): give the data it '
                'trained on, or --allow_config_change to go on with this data'
            )
        logging.warning(
            'resuming on other data than the checkpoint recorded (fingerprint %s -> %s)',
            meta['data_fingerprint'],
            corpus.fingerprint,
        )
    logging.info('resumed from %s at step %d', ckpt.directory, step)
    return ckpt, (step, state, meta)


def check_not_past(meta: dict | None, config: ml_collections.ConfigDict, workdir: str) -> None:
    """One-line RunError when `workdir`'s newest checkpoint (its side-car `meta`; None: none)
    is past config.train.steps: a resume would train nothing, silently."""
    if meta and meta['data_step'] > config.train.steps:
        raise RunError(
            f'--workdir: {workdir} holds a checkpoint at step {meta["data_step"]}, past '
            f'config.train.steps={config.train.steps}: raise train.steps to go on from it, or '
            'use another workdir'
        )


def _check_resume_config(config: ml_collections.ConfigDict, workdir: str, allow: bool) -> None:
    """Refuses (or, when allowed, logs) a resume under a changed config."""
    try:
        meta = read_latest_meta(workdir)
    except Exception:  # noqa: BLE001 - an unreadable latest checkpoint: restore falls back
        meta = None
    where = f'the checkpoint in {os.path.join(workdir, "checkpoints")}'
    check_not_past(meta, config, workdir)
    saved = meta and run_resolved(meta['config'], workdir)
    if changes := check_config_change(saved, config, where, allow):
        logging.warning('resuming under a changed config: %s', '; '.join(changes))
    if saved and (was := upgrade_config(saved).model.param_dtype) != config.model.param_dtype:
        raise RunError(  # else every checkpoint read as damaged (checksums of the cast arrays)
            f'config.model.param_dtype={config.model.param_dtype!r}: {where} holds {was} '
            f'parameters, and a run resumes in the dtype it saved; resume with '
            f'param_dtype={was!r}, or train a new run'
        )

    if saved and (
        moved := schedule_moved(upgrade_config(saved).train, config.train, meta['data_step'])
    ):
        logging.warning(moved)
