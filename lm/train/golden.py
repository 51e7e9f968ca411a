"""Golden runs: a few steps of a config trained from its initialisation, kept bit for bit (each
step's loss and gradient norm, a digest of the parameters reached, and their validation loss).
Two checkouts, machines or toolchains that give a config different golden runs train or score it
differently; a change to the bits of the forward, backward, optimizer, data or evaluation path
on the steps it covers changes it (the schedule's later steps it does not cover).
`scripts/golden_run.py` compares this checkout with the recorded runs
(`tests/fixtures/golden_runs.json`); docs/train.md keeps the log of their changes, so a study's
reruns can be told apart from its runs.
"""

from __future__ import annotations

import hashlib

import jax
import ml_collections
import numpy as np

from lm.train.evaluation import eval_batch_size, evaluate, evaluate_members
from lm.train.loop import call_batch, call_sizes
from lm.train.run import Run, assemble
from lm.train.step import device_call_batch, make_eval_step, make_train_step

# Two golden runs taken under different toolchains (`lm.train.provenance.toolchain`) may differ in
# their last bits. They agree to this relative tolerance in every loss, gradient norm and
# validation loss unless the computation changed: about 300 times the differences between the
# test suite's -O0 compiles and optimised ones (up to 3.1e-7 over the 8 steps, 1.3e-8 in the
# validation losses, 2026-12-01, a 2-core Intel Xeon); not yet measured across CPU kinds.
TOOLCHAIN_RTOL = 1e-4


def params_digest(params: dict) -> str:
    """sha256 over every parameter's path, dtype, shape and bytes, in path order."""
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        value = np.ascontiguousarray(jax.device_get(leaf))
        h.update(f'{jax.tree_util.keystr(path)} {value.dtype} {value.shape};'.encode())
        h.update(value.tobytes())
    return h.hexdigest()


def golden_run(config: ml_collections.ConfigDict, steps: int) -> dict:
    """Trains `config` from its initialisation for `steps` steps in this process, with its data
    and train step (no logging or checkpoints; calls of up to `train.steps_per_call` steps
    ending at `steps`, which may group the steps otherwise than a logged run's calls), then
    scores the parameters reached as a run's evaluation does, and returns {'loss', 'grad_norm':
    one row per step of each member's value as `float.hex` (one value for a single run, K for
    an ensemble), 'params_sha256': `params_digest` of the parameters reached, 'eval_loss': each
    member's validation loss}. The gradient norm sees a changed backward pass even where the
    learning rate is still too small for the loss to show it."""
    if steps < 1:
        raise ValueError(f'a golden run needs steps >= 1, got {steps}')
    run = assemble(config, state='init', data=True)
    c, series, step = run.config, {'loss': [], 'grad_norm': []}, 0
    with run, jax.set_mesh(run.mesh):
        state, fns = run.state, {}
        for n in call_sizes(0, steps, c.train.steps_per_call, (steps,)):
            if n not in fns:
                fns[n] = make_train_step(run.ctx, c.train.grad_accum_steps, n)
            batch = device_call_batch(run.ctx, call_batch(run, step, n))
            state, metrics = fns[n](state, batch)
            for key, rows in series.items():
                value = np.asarray(jax.device_get(metrics[key]), np.float32)
                # a call's values: [N] (a scalar for N = 1), or [K, N] ([K]) for an ensemble
                value = value.reshape(-1, n).T if run.ctx.members else value.reshape(n, 1)
                rows += [[float(v).hex() for v in row] for row in value]
            step += n
        digest = params_digest(state['params'])
        scored = _validation_losses(run, state['params'])
    return {**series, 'params_sha256': digest, 'eval_loss': [float(v).hex() for v in scored]}


def _validation_losses(run: Run, params: dict) -> list[float]:
    """Each member's validation loss of `params` (one for a single run), as the run's
    evaluation scores it (`lm.train.evaluation`: its windows, or a recall task's answers)."""
    c = run.config
    score = evaluate_members if run.ctx.members else evaluate
    metrics = score(
        make_eval_step(run.ctx),
        params,
        run.corpus,
        'validation',
        batch_size=eval_batch_size(c),
        seq_len=c.data.seq_len,
        eval_tokens=c.eval_tokens,
        batch_sharding=run.ctx.batch_sharding,
    )
    return [m['loss'] for m in (metrics if run.ctx.members else [metrics])]


def _steps(run: dict) -> list[list[str]]:
    """A golden run's loss and gradient norm side by side, one row per step."""
    return [a + b for a, b in zip(run['loss'], run['grad_norm'], strict=True)]


def first_difference(got: list[list[str]], want: list[list[str]]) -> int | None:
    """The first step (1-based) at which two golden runs' rows differ; None if none does."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i + 1
    return None if len(got) == len(want) else min(len(got), len(want)) + 1


def relative_difference(got: list[list[str]], want: list[list[str]]) -> float:
    """The largest relative difference between two golden runs' rows (of equal shape)."""
    a = np.array([[float.fromhex(v) for v in row] for row in got], np.float64)
    b = np.array([[float.fromhex(v) for v in row] for row in want], np.float64)
    if a.shape != b.shape:
        raise ValueError(f'golden runs of different shapes: {a.shape} vs {b.shape}')
    return float(np.max(np.abs(a - b) / np.abs(b)))


def compare(name: str, got: dict, want: dict, exact: bool) -> tuple[bool, str]:
    """(matches, one line) for golden run `name` against its record `want`: bitwise when `exact`
    (the record's toolchain), else its losses, gradient norms and validation losses within
    TOOLCHAIN_RTOL (the parameters' digest then aside)."""
    a, b = _steps(got), _steps(want)
    if len(a) != len(b):
        return False, f'{name}: {len(a)} steps, the record has {len(b)}'
    if len(got['eval_loss']) != len(want['eval_loss']):
        n, m = len(got['eval_loss']), len(want['eval_loss'])
        return False, f'{name}: {n} validation losses, the record has {m}'
    step, scores = first_difference(a, b), ([got['eval_loss']], [want['eval_loss']])
    if step is None and scores[0] == scores[1]:
        if got['params_sha256'] == want['params_sha256']:
            return True, f'{name}: bitwise equal ({len(a)} steps, the parameters, the evaluation)'
        accepted = ' (accepted under another toolchain)' if not exact else ''
        return (
            not exact,
            f'{name}: every loss, gradient norm and the evaluation equal, the parameters '
            f'differ{accepted}',
        )
    where = 'in the validation loss' if step is None else f'from step {step}'
    rel = max(relative_difference(a, b), relative_difference(*scores))
    ok = not exact and rel <= TOOLCHAIN_RTOL
    return ok, (
        f'{name}: differs {where}; largest relative difference {rel:.2e} '
        f'({"within" if ok else "beyond"} {TOOLCHAIN_RTOL:g})'
    )
