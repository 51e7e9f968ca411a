"""A run's checkpoints as stored: the JSON side-car each carries (`checkpoint_meta`), the one
way a state is read back (`restore`), the config saved with a run (`stored_config`) and whether a
workdir already finished a run (`finished_step`); the last two read no array and start no JAX
backend."""

from __future__ import annotations

import json
import os

import jax
import ml_collections

from lm.config_migration import upgrade_config
from lm.data.corpus import check_tokenizer_file, tokenizer_file_digest
from lm.train.checkpoint import (
    Checkpointer,
    check_same_shapes,
    param_shapes,
    read_sound_meta,
    read_step_meta,
    saved_steps,
)
from lm.train.identity import as_used, config_changes, config_fingerprint
from lm.train.step import StepContext
from lm.train.workdir import (
    A_RUN,
    A_SWEEP,
    directory_kind,
    held_directories,
    run_relative,
    run_resolved,
)


def check_step(steps: list[int], step: int | None, directory: str, flag: str) -> None:
    """One-line errors for a workdir without checkpoints (naming the run when the workdir is
    its checkpoints directory or a step in it), or without checkpoint `step`."""
    if not steps:
        raise FileNotFoundError(_no_checkpoint(directory, flag))
    if step is not None and step not in steps:
        raise FileNotFoundError(
            f'{flag}: no checkpoint for step {step} in {directory}; available: {steps}'
        )


def _no_checkpoint(directory: str, flag: str) -> str:
    """Why <workdir>/checkpoints (`directory`) holds nothing: no such workdir, a file, a sweep
    directory or a folder of runs given for a run, a path inside a run (its checkpoints, or a
    step of them) given for the run, or an empty run."""
    workdir = os.path.dirname(directory)
    if not os.path.exists(workdir):
        return f'{flag}: {workdir} does not exist'
    if not os.path.isdir(workdir):
        return f'{flag}: {workdir} is a file, not a run directory'
    runs = [name for name, kind in held_directories(workdir) if kind == A_RUN]
    if runs or directory_kind(workdir) == A_SWEEP:
        what = A_SWEEP if directory_kind(workdir) == A_SWEEP else 'a folder of runs'
        example = f' (e.g. {os.path.join(workdir, runs[0])})' if runs else ''
        return f'{flag}: {workdir} is {what}, not a run; name one of its runs{example}'
    for run in (os.path.dirname(workdir), os.path.dirname(os.path.dirname(workdir))):
        if saved_steps(run):
            return (
                f'{flag}: {workdir} holds no checkpoint: it is inside the run {run}; give the '
                'run directory (the one holding checkpoints/)'
            )
    return f'{flag}: {directory} holds no checkpoint'


def checkpoint_meta(
    config: ml_collections.ConfigDict,
    data_fingerprint: str,
    step: int,
    abstract_params: dict,
    workdir: str | None = None,
) -> dict:
    """The JSON side-car of a checkpoint: resolved config (and its `config_fingerprint`), data
    position, parameter shapes, a tokenizer.json's sha256 (`stored_config` refuses the file
    once edited). With `workdir` (where the run is, or will be once moved in), a
    tokenizer inside the run is saved relative to it (`run_relative`)."""
    saved = json.loads(config.to_json())
    if workdir is not None:
        saved = run_relative(saved, workdir)
    digest = tokenizer_file_digest(config.data)  # a tokenizer.json edited later is refused
    return {
        **({'tokenizer_sha256': digest} if digest else {}),
        'config': saved,
        'config_fingerprint': config_fingerprint(ml_collections.ConfigDict(saved)),
        'data_fingerprint': data_fingerprint,
        'data_step': step,
        'param_shapes': param_shapes(abstract_params),
    }


def restore(
    ckpt: Checkpointer, ctx: StepContext, step: int | None = None, params_only: bool = False
) -> tuple[int, dict, dict]:
    """(step, state, meta): checkpoint `step` (default: the newest readable one) read into
    `ctx`'s shardings, after checking its parameter shapes are `ctx`'s (one-line error naming
    the first that differs, before any array is read). `params_only`: the state is {'params'},
    nothing else is read. A checkpoint saved without optimizer state (an import's) gets a fresh
    one, made in its shardings."""
    current = param_shapes(ctx.abstract_state['params'])
    target = {'params': ctx.abstract_state['params']} if params_only else ctx.abstract_state
    step, state, meta = ckpt.restore(
        target,
        step,
        check_meta=lambda m: check_same_shapes(
            m['param_shapes'], current, f'the checkpoint in {ckpt.directory}'
        ),
        partial=params_only,
    )
    if not params_only and 'opt_state' not in state:
        init = jax.jit(ctx.tx.init, out_shardings=ctx.state_sharding['opt_state'])
        state = {**state, 'opt_state': init(state['params'])}
    return step, state, meta


def finished_step(config: ml_collections.ConfigDict, workdir: str) -> int | None:
    """`config.train.steps` when `workdir` already finished that run under `config` (its latest
    checkpoint is at that step, its results.json is written for it, no setting but the
    resumable ones differs), else None; read without starting a JAX backend."""
    steps = saved_steps(workdir)
    if not steps or steps[-1] != config.train.steps:
        return None
    if results_step(workdir) != steps[-1]:  # none, or a shorter run's: its evaluation is owed
        return None
    try:
        saved = run_resolved(read_step_meta(workdir, steps[-1])['config'], workdir)
    except Exception:  # noqa: BLE001 - a damaged side-car: training's restore moves it aside
        return None
    return None if config_changes(saved, config) else steps[-1]


def stored_config(
    workdir: str, flag: str = '--workdir', step: int | None = None
) -> ml_collections.ConfigDict:
    """The config saved with `workdir`'s checkpoint `step` (default: the latest), e.g. to resume
    without --config, read without starting a JAX backend; as the run used it (`as_used`)."""
    directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    steps = saved_steps(workdir)
    check_step(steps, step, directory, flag)
    step = steps[-1] if step is None else step
    meta = read_sound_meta(workdir, step, flag)
    config = as_used(upgrade_config(run_resolved(meta['config'], workdir)))
    check_tokenizer_file(config.data, meta.get('tokenizer_sha256', ''), f'{flag}={workdir}')
    return config


def results_step(workdir: str) -> int | None:
    """The step of `<workdir>/results.json` (None: none written, or unreadable)."""
    try:
        with open(os.path.join(workdir, 'results.json')) as f:
            return json.load(f).get('step')
    except (OSError, ValueError, AttributeError):
        return None


def result_step(workdir: str) -> int | None:
    """The step of `workdir`'s results.json (None without one), which an analysis of the
    finished run restores: a run resumed past its result trains on, so its newest checkpoint is
    not the result's. A one-line error when that step's checkpoint is no longer kept."""
    step = results_step(workdir)
    if step is not None and step not in (steps := saved_steps(workdir)):
        raise FileNotFoundError(
            f'{workdir}: its results.json is for step {step}, but its checkpoints are {steps} '
            '(resumed past its result, which is no longer kept): finish or remove that run'
        )
    return step


def inherited_data(config: ml_collections.ConfigDict, step: int, recorded: str) -> bool:
    """Whether a checkpoint's recorded data fingerprint is inherited, not its own corpus's: an
    imported model's ('hf:<dir>'), or a converted run's first checkpoint (its source's)."""
    converted = bool(config.uptrain.source_workdir) and step == config.uptrain.source_step
    return recorded.startswith('hf:') or converted
