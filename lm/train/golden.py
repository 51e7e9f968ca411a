"""Golden runs: a few steps of a config trained from its initialisation, kept bit for bit (each
step's loss and a digest of the parameters reached). Two checkouts, machines or toolchains that
give a config the same golden run train it the same; a change to any bit of the forward,
backward, optimizer or data path changes it. `scripts/golden_run.py` compares this checkout with
the recorded runs (`tests/fixtures/golden_runs.json`); docs/train.md keeps the log of their
changes, so a study's reruns can be told apart from its runs.
"""

from __future__ import annotations

import hashlib

import jax
import ml_collections
import numpy as np

from lm.train.loop import call_batch, call_sizes
from lm.train.run import assemble
from lm.train.step import device_call_batch, make_train_step

# Two golden runs taken under different toolchains (`lm.train.provenance.toolchain`) may differ in
# their losses' last bits; they agree to this relative tolerance unless the computation changed.
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
    """Trains `config` from its initialisation for `steps` steps in this process, with its data,
    train step and steps per call as `lm.train.train` runs them (no logging, eval or
    checkpoints), and returns {'loss': one row per step of each member's loss as `float.hex`
    (one value for a single run, K for an ensemble), 'params_sha256': `params_digest` of the
    parameters reached}."""
    if steps < 1:
        raise ValueError(f'a golden run needs steps >= 1, got {steps}')
    run = assemble(config, state='init', data=True)
    c, losses, step = run.config, [], 0
    with run, jax.set_mesh(run.mesh):
        state, fns = run.state, {}
        for n in call_sizes(0, steps, c.train.steps_per_call, (steps,)):
            if n not in fns:
                fns[n] = make_train_step(run.ctx, c.train.grad_accum_steps, n)
            batch = device_call_batch(run.ctx, call_batch(run, step, n))
            state, metrics = fns[n](state, batch)
            loss = np.asarray(jax.device_get(metrics['loss']), np.float32)
            # a call's losses: [N] (a scalar for N = 1), or [K, N] ([K]) for an ensemble
            rows = loss.reshape(-1, n).T if run.ctx.members else loss.reshape(n, 1)
            losses += [[float(v).hex() for v in row] for row in rows]
            step += n
        digest = params_digest(state['params'])
    return {'loss': losses, 'params_sha256': digest}


def first_difference(got: list[list[str]], want: list[list[str]]) -> int | None:
    """The first step (1-based) at which two golden runs' losses differ; None if none does."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i + 1
    return None if len(got) == len(want) else min(len(got), len(want)) + 1


def relative_difference(got: list[list[str]], want: list[list[str]]) -> float:
    """The largest relative difference between two golden runs' losses (of equal shape)."""
    a = np.array([[float.fromhex(v) for v in row] for row in got], np.float64)
    b = np.array([[float.fromhex(v) for v in row] for row in want], np.float64)
    if a.shape != b.shape:
        raise ValueError(f'golden runs of different shapes: {a.shape} vs {b.shape}')
    return float(np.max(np.abs(a - b) / np.abs(b)))


def compare(name: str, got: dict, want: dict, exact: bool) -> tuple[bool, str]:
    """(matches, one line) for golden run `name` against its record `want`: bitwise when `exact`
    (the record's toolchain), else its losses within TOOLCHAIN_RTOL."""
    step = first_difference(got['loss'], want['loss'])
    same_params = got['params_sha256'] == want['params_sha256']
    if step is None and same_params:
        return True, f'{name}: bitwise equal ({len(got["loss"])} steps and the parameters)'
    if step is None:
        return not exact, f'{name}: every loss equal, the parameters differ'
    if len(got['loss']) != len(want['loss']):
        return False, f'{name}: {len(got["loss"])} steps, the record has {len(want["loss"])}'
    rel = relative_difference(got['loss'], want['loss'])
    ok = not exact and rel <= TOOLCHAIN_RTOL
    return ok, (
        f'{name}: differs from step {step}; largest relative difference {rel:.2e} '
        f'({"within" if ok else "beyond"} {TOOLCHAIN_RTOL:g})'
    )
