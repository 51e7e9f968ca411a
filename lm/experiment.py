"""Runs as data: a validated config with its data and step setup (`prepare`), checkpoint
side-cars, and restoring a run's checkpoint on the mesh of its saved config (`restore_run`)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

import jax
import ml_collections
from absl import logging

from lm.checkpoint import Checkpointer, param_shapes, read_latest_meta
from lm.config import ModelConfig, upgrade_config
from lm.data import Corpus, check_corpus_size, check_data_config, load_corpus
from lm.evaluation import check_eval_config
from lm.model import model_config
from lm.optimizer import check_train_config, make_optimizer
from lm.sharding import data_parallel_size, make_mesh, rules_table, set_cpu_devices
from lm.train_step import Setup, make_setup


@dataclasses.dataclass
class Experiment:
    """A validated config with its data, model config, mesh and step setup (nothing compiled)."""

    config: ml_collections.ConfigDict
    model: ModelConfig
    corpus: Corpus
    setup: Setup


def check_loop_config(config: ml_collections.ConfigDict) -> None:
    for name in ('eval_every', 'log_every', 'checkpoint_every', 'keep_checkpoints'):
        if config[name] <= 0:
            raise ValueError(f'config.{name} must be > 0, got {config[name]}')


def prepare(config: ml_collections.ConfigDict) -> Experiment:
    """Checks every setting (one-line errors), tokenises the data, builds mesh and shardings."""
    old_eval_batches = config.get('eval_batches')
    config = upgrade_config(config.to_dict())  # private copy; vocab_size is filled in
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
    vocab_given = config.model.vocab_size
    config.model.vocab_size = vocab_given or 1
    model_config(config.model)  # model errors before reading any data
    set_cpu_devices(config.mesh)
    mesh = make_mesh(config.mesh)
    rules = rules_table(config.mesh)
    dp = data_parallel_size(mesh, rules)
    per_micro = config.train.batch_size // config.train.grad_accum_steps
    if per_micro % dp or config.train.batch_size % jax.process_count():
        raise ValueError(
            f'config.train.batch_size={config.train.batch_size} (/ grad_accum_steps = {per_micro}'
            f' per micro-batch) must be divisible by the data-parallel size {dp} and by the '
            f'{jax.process_count()} processes'
        )
    check_eval_config(config, dp)
    corpus = load_corpus(config.data)
    check_corpus_size(corpus, config.train.batch_size, config.data.seq_len)
    if vocab_given and vocab_given < corpus.tokenizer.vocab_size:
        raise ValueError(
            f'config.model.vocab_size={vocab_given} is smaller than the tokenizer '
            f'vocabulary ({corpus.tokenizer.vocab_size})'
        )
    config.model.vocab_size = vocab_given or corpus.tokenizer.vocab_size
    cfg = model_config(config.model)
    setup = make_setup(cfg, make_optimizer(config.train), mesh, rules, config.seed)
    return Experiment(config, cfg, corpus, setup)


def checkpoint_meta(
    config: ml_collections.ConfigDict, data_fingerprint: str, step: int, abstract_params: dict
) -> dict:
    """The JSON side-car of a checkpoint: resolved config, data position, parameter shapes."""
    return {
        'config': json.loads(config.to_json()),
        'data_fingerprint': data_fingerprint,
        'data_step': step,
        'param_shapes': param_shapes(abstract_params),
    }


@dataclasses.dataclass
class Restored:
    """A run's checkpoint with the config, model config and setup it was saved under."""

    config: ml_collections.ConfigDict
    model: ModelConfig
    setup: Setup
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
        meta = ckpt.read_meta(step if step is not None else ckpt.steps()[-1])
        config = upgrade_config(meta['config'])
        cfg = model_config(config.model)
        if check is not None:
            check(cfg)
        mesh, rules = make_mesh(config.mesh), rules_table(config.mesh)
        setup = make_setup(cfg, make_optimizer(config.train), mesh, rules, config.seed)
        restored_step, state, meta = ckpt.restore(setup.abstract_state, step)
        return Restored(config, cfg, setup, restored_step, state, meta)
    finally:
        ckpt.close()


def stored_config(workdir: str) -> ml_collections.ConfigDict:
    """The config saved with the latest checkpoint in `workdir` (to resume without --config)."""
    meta = read_latest_meta(workdir)
    if meta is None:
        raise FileNotFoundError(f'no checkpoint in {os.path.join(workdir, "checkpoints")}')
    return upgrade_config(meta['config'])
