"""Runs as data: a validated config with its data and step context (`prepare`), checkpoint
side-cars, and the one way a run's state is read back (`restore`; `restore_run` when the run's
own saved config decides the model and mesh)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from lm.config_migration import upgrade_config
from lm.data.corpus import Corpus, check_corpus_size, check_data_config, load_corpus
from lm.model.config import ModelConfig
from lm.model.transformer import check_model_config, model_config
from lm.sharding import data_parallel_size, make_mesh, rules_table, set_cpu_devices
from lm.train.checkpoint import Checkpointer, check_same_shapes, param_shapes, read_latest_meta
from lm.train.evaluation import check_eval_config
from lm.train.optimizer import check_train_config, lr_schedule, make_optimizer
from lm.train.step import StepContext, make_step_context
from lm.train.workdir import config_fingerprint


@dataclasses.dataclass
class Experiment:
    """A validated config with its data, model config, mesh and step context (nothing compiled).
    `config.model.vocab_size` holds the resolved size (what checkpoints save)."""

    config: ml_collections.ConfigDict
    model_cfg: ModelConfig
    corpus: Corpus
    ctx: StepContext


def check_loop_config(config: ml_collections.ConfigDict) -> None:
    for name in ('eval_every', 'log_every', 'checkpoint_every', 'keep_checkpoints'):
        if config[name] <= 0:
            raise ValueError(f'config.{name} must be > 0, got {config[name]}')
    seed = config.seed  # jax.random.key reads 2**32 and above as smaller seeds (no x64)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f'config.seed must be an integer in [0, 2**32), got {seed!r}')
    if not config.train.max_loss_ratio >= 0:  # NaN too
        raise ValueError(
            f'config.train.max_loss_ratio must be >= 0 (0 = off), got {config.train.max_loss_ratio}'
        )


def step_context(
    config: ml_collections.ConfigDict, cfg: ModelConfig, mesh: Mesh | None = None
) -> StepContext:
    """The step context of `config` for the model `cfg`, on `mesh` (default: from config.mesh).
    The learning-rate schedule is built here once; the optimizer and the logged 'lr' share it."""
    mesh = make_mesh(config.mesh) if mesh is None else mesh
    schedule = lr_schedule(config.train)
    tx = make_optimizer(config.train, schedule)
    return make_step_context(cfg, tx, mesh, rules_table(config.mesh), config.seed, schedule)


def _check_batch_divides(config: ml_collections.ConfigDict) -> int:
    """The data-parallel size, after checking the batch divides by it and by the processes."""
    dp = data_parallel_size(make_mesh(config.mesh), rules_table(config.mesh))
    per_micro = config.train.batch_size // config.train.grad_accum_steps
    if per_micro % dp or config.train.batch_size % jax.process_count():
        raise ValueError(
            f'config.train.batch_size={config.train.batch_size} (/ grad_accum_steps = {per_micro}'
            f' per micro-batch) must be divisible by the data-parallel size {dp} and by the '
            f'{jax.process_count()} processes'
        )
    return dp


def check_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """An upgraded private copy of `config` after checking every setting that needs no data
    (one-line errors): cheap, so entry points call it before taking a workdir or compiling."""
    old_eval_batches = config.get('eval_batches')
    config = upgrade_config(config.to_dict())  # private copy; vocab_size is recorded
    if old_eval_batches is not None:
        logging.warning(
            'config.eval_batches=%d is replaced by config.eval_tokens: evaluating %d tokens '
            '(0 = the whole split)',
            old_eval_batches,
            config.eval_tokens,
        )
    check_loop_config(config)
    check_train_config(config.train)
    check_data_config(config.data)
    check_model_config(config.model)  # model errors before reading any data
    set_cpu_devices(config.mesh)
    if config.model.attention_impl == 'cudnn' and jax.default_backend() != 'gpu':
        raise ValueError(
            "config.model.attention_impl='cudnn' needs a GPU (cuDNN fused attention), but this "
            f"run's backend is {jax.default_backend()}: use 'dot_product' or 'einsum'"
        )
    check_eval_config(config, _check_batch_divides(config))
    return config


def prepare(config: ml_collections.ConfigDict) -> Experiment:
    """Checks every setting (`check_config`), tokenises the data, builds mesh and shardings."""
    config = check_config(config)
    corpus = load_corpus(config.data)
    check_corpus_size(corpus, config.train.batch_size, config.data.seq_len)
    cfg = model_config(config.model, corpus.tokenizer.vocab_size)
    config.model.vocab_size = cfg.vocab_size
    ctx = step_context(config, cfg)
    if config.data.document_mask:
        ctx = dataclasses.replace(ctx, document_eos=corpus.tokenizer.eos_id)
    return Experiment(config, cfg, corpus, ctx)


def checkpoint_meta(
    config: ml_collections.ConfigDict, data_fingerprint: str, step: int, abstract_params: dict
) -> dict:
    """The JSON side-car of a checkpoint: resolved config (and its `config_fingerprint`), data
    position, parameter shapes."""
    return {
        'config': json.loads(config.to_json()),
        'config_fingerprint': config_fingerprint(config),
        'data_fingerprint': data_fingerprint,
        'data_step': step,
        'param_shapes': param_shapes(abstract_params),
    }


def restore(
    ckpt: Checkpointer, ctx: StepContext, step: int | None = None
) -> tuple[int, dict, dict]:
    """(step, state, meta): checkpoint `step` (default: the newest readable one) read into
    `ctx`'s shardings, after checking its parameter shapes are `ctx`'s (one-line error naming
    the first that differs, before any array is read)."""
    current = param_shapes(ctx.abstract_state['params'])
    return ckpt.restore(
        ctx.abstract_state,
        step,
        check_meta=lambda m: check_same_shapes(
            m['param_shapes'], current, f'the checkpoint in {ckpt.directory}'
        ),
    )


@dataclasses.dataclass
class Restored:
    """A run's checkpoint with the config, model config and step context it was saved under."""

    config: ml_collections.ConfigDict
    model_cfg: ModelConfig
    ctx: StepContext
    step: int
    state: dict
    meta: dict


def restore_run(
    workdir: str,
    step: int | None = None,
    check: Callable[[ModelConfig], None] | None = None,
    flag: str = '--workdir',
) -> Restored:
    """Restores `workdir`'s latest (or `step`) checkpoint on the mesh of its saved config.
    `check(model_config)` runs before any array is read."""
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        if not ckpt.steps():
            raise FileNotFoundError(f'{flag}: {ckpt.directory} holds no checkpoint')
        if step is not None and step not in ckpt.steps():
            raise FileNotFoundError(
                f'{flag}: no checkpoint for step {step} in {ckpt.directory}; '
                f'available: {ckpt.steps()}'
            )
        meta = ckpt.read_meta(step if step is not None else ckpt.steps()[-1])
        config = upgrade_config(meta['config'])
        cfg = model_config(config.model)
        if check is not None:
            check(cfg)
        ctx = step_context(config, cfg)
        restored_step, state, meta = restore(ckpt, ctx, step)
        return Restored(config, cfg, ctx, restored_step, state, meta)
    finally:
        ckpt.close()


def stored_config(workdir: str, flag: str = '--workdir') -> ml_collections.ConfigDict:
    """The config saved with the latest checkpoint in `workdir` (to resume without --config),
    read without starting a JAX backend."""
    meta = read_latest_meta(workdir)
    if meta is None:
        directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
        raise FileNotFoundError(f'{flag}: {directory} holds no checkpoint')
    return upgrade_config(meta['config'])
