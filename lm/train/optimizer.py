"""AdamW with linear warmup, cosine decay and global-norm clipping, from `config.train`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging


def lr_schedule(
    train: ml_collections.ConfigDict,
    lr: float | jax.Array | None = None,
    min_lr: float | jax.Array | None = None,
) -> optax.Schedule:
    """The rate at (global) step s: 0 → lr linearly over warmup_steps from `schedule_start`, then
    cosine to min_lr at `decay_steps` (0: `steps`), min_lr after; times a linear ramp 0 → 1 over
    `ramp_steps` from `ramp_start` when ramp_steps > 0 (continued uptraining's short warmup).
    `lr` replaces train.lr as the peak and `min_lr` train.min_lr (traced scalars too: an
    ensemble member's own rates); optax's warmup_cosine_decay_schedule, written out so that its
    peak may be traced."""
    peak = train.lr if lr is None else lr
    floor = train.min_lr if min_lr is None else min_lr
    start = train.schedule_start
    end = train.decay_steps or train.steps
    warmup = train.warmup_steps
    base = optax.join_schedules(
        [
            optax.linear_schedule(0.0, peak, warmup),
            optax.cosine_decay_schedule(
                peak, max(end - start, warmup + 1) - warmup, alpha=floor / peak
            ),
        ],
        [warmup],
    )
    if not (start or train.ramp_steps):
        return base

    def schedule(count):
        lr = base(jnp.maximum(count - start, 0))
        if train.ramp_steps:
            lr *= jnp.clip((count - train.ramp_start) / train.ramp_steps, 0.0, 1.0)
        return lr

    return schedule


def make_optimizer(
    train: ml_collections.ConfigDict, schedule: optax.Schedule | None = None
) -> optax.GradientTransformation:
    """Clip the global gradient norm, then AdamW with `schedule` (default: `lr_schedule(train)`);
    weight decay only on matrices."""
    adamw = optax.adamw(
        lr_schedule(train) if schedule is None else schedule,
        b1=train.b1,
        b2=train.b2,
        eps=train.eps,
        weight_decay=train.weight_decay,
        mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    )
    if train.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(train.grad_clip), adamw)
    return adamw


def schedule_moved(
    saved: ml_collections.ConfigDict, train: ml_collections.ConfigDict, step: int
) -> str | None:
    """A warning when resuming at `step` under `train` changes the learning rate there from what
    the checkpoint's own schedule (`saved`, its config.train) gives: a longer train.steps moves
    the cosine's end when decay_steps is 0, and the rate jumps back up."""
    before, after = float(lr_schedule(saved)(step)), float(lr_schedule(train)(step))
    if math.isclose(before, after, rel_tol=1e-6):
        return None
    why = ''
    if saved.steps != train.steps and not train.decay_steps:
        old_end = saved.decay_steps or saved.steps
        why = (
            f" (config.train.steps {saved.steps} -> {train.steps} moves the cosine's end; "
            f'config.train.decay_steps={old_end} keeps the old decay)'
        )
    moved = f'from {before:.3g} to {after:.3g}'
    return f'resuming at step {step} moves the learning rate there {moved}{why}'


def check_eps_in(train: ml_collections.ConfigDict, param_dtype: str) -> None:
    """One-line error when AdamW's eps is below the smallest normal number of the dtype its
    state is kept in (the parameters'): float16's 6.1e-05 turns eps=1e-8 into 0, and an
    update whose second moment underflows divides by zero (NaN from the first steps)."""
    tiny = float(jnp.finfo(param_dtype).tiny)
    if train.eps < tiny:
        raise ValueError(
            f'config.train.eps={train.eps:g} is below {tiny:.2g}, the smallest normal '
            f"{param_dtype} (config.model.param_dtype, the dtype of AdamW's state): it rounds "
            f'to 0 there and updates turn NaN; use eps >= {tiny:.2g}, e.g. 1e-4'
        )


def check_train_config(train: ml_collections.ConfigDict) -> None:
    """One-line errors for bad optimizer / schedule settings."""
    for name in ('lr', 'min_lr', 'b1', 'b2', 'eps', 'weight_decay', 'grad_clip', 'peak_flops'):
        if not math.isfinite(train[name]):
            raise ValueError(f'config.train.{name} must be a finite number, got {train[name]}')
    for name in ('batch_size', 'grad_accum_steps', 'steps_per_call'):
        if train[name] <= 0:
            raise ValueError(f'config.train.{name} must be > 0, got {train[name]}')
    if train.steps < 0:
        raise ValueError(f'config.train.steps must be >= 0 (0 = evaluate only), got {train.steps}')
    if train.batch_size % train.grad_accum_steps:
        raise ValueError(
            f'config.train.batch_size={train.batch_size} must be divisible by '
            f'grad_accum_steps={train.grad_accum_steps}'
        )
    for name in ('schedule_start', 'decay_steps', 'ramp_start', 'ramp_steps'):
        if train[name] < 0:
            raise ValueError(f'config.train.{name} must be >= 0, got {train[name]}')
    if train.lr <= 0:
        raise ValueError(f'config.train.lr must be > 0, got {train.lr}')
    for name in ('min_lr', 'warmup_steps'):
        if train[name] < 0:
            raise ValueError(f'config.train.{name} must be >= 0, got {train[name]}')
    if not (0 <= train.b1 < 1 and 0 <= train.b2 < 1):
        raise ValueError(f'config.train.b1 and b2 must be in [0, 1), got {train.b1}, {train.b2}')
    _check_schedule(train)


def warn_schedule(train: ml_collections.ConfigDict) -> None:
    """One warning line each for a schedule that is legal but likely not meant: a warmup or a
    ramp that ends after the last step (the last update, at step steps - 1, uses only a share
    of lr), or a decay that ends before the warmup."""
    last = train.steps - 1  # the step whose rate the run's last update uses
    peak_at = train.schedule_start + train.warmup_steps
    if train.warmup_steps and 0 < train.steps < peak_at:
        logging.warning(
            'config.train.warmup_steps=%d (from step %d) ends after the last step %d: the rate '
            'rises only to %.3g of lr=%g, at the last update (step %d)',
            train.warmup_steps,
            train.schedule_start,
            train.steps,
            (last - train.schedule_start) / train.warmup_steps,
            train.lr,
            last,
        )
    if train.ramp_steps and 0 < train.steps < train.ramp_start + train.ramp_steps:
        logging.warning(
            'config.train.ramp_steps=%d (from step %d) ends after the last step %d: the rate '
            'is scaled only by %.3g at the last update (step %d)',
            train.ramp_steps,
            train.ramp_start,
            train.steps,
            (last - train.ramp_start) / train.ramp_steps,
            last,
        )
    if train.decay_steps and train.decay_steps < peak_at:
        logging.warning(
            'config.train.decay_steps=%d comes before the warmup ends (step %d): the cosine is '
            'cut to one step',
            train.decay_steps,
            peak_at,
        )


def _check_rate_not_zero(train: ml_collections.ConfigDict) -> None:
    """One-line errors for a schedule whose rate is 0 at every step the run updates with (0 ..
    steps - 1): a warmup gives 0 up to its start (schedule_start), a ramp up to ramp_start."""
    last = train.steps - 1
    if last < 0:  # evaluate only
        return
    if train.ramp_steps and train.ramp_start >= last:
        raise ValueError(
            f'config.train.ramp_start={train.ramp_start} (ramp_steps={train.ramp_steps}) must be '
            f'< train.steps - 1 = {last}: the ramp scales the rate by 0 up to step ramp_start, '
            f'so the learning rate is 0 at every step of the run (0 .. {last})'
        )
    if train.warmup_steps and train.schedule_start >= last:
        raise ValueError(
            f'config.train.schedule_start={train.schedule_start} (warmup_steps='
            f'{train.warmup_steps}) must be < train.steps - 1 = {last}, or warmup_steps 0: the '
            f'warmup gives rate 0 up to step schedule_start, so the learning rate is 0 at every '
            f'step of the run (0 .. {last})'
        )


def _check_schedule(train: ml_collections.ConfigDict) -> None:
    """One-line errors for settings the schedule and AdamW would take silently but wrongly."""
    own_rates = train.ensemble_lr and train.ensemble_min_lr  # each member's: lr, min_lr unread
    if train.min_lr > train.lr and not own_rates:
        raise ValueError(
            f'config.train.min_lr={train.min_lr} must be <= lr={train.lr} (the cosine decays '
            'from lr to it; min_lr = lr holds the rate constant)'
        )
    if train.weight_decay < 0:
        raise ValueError(f'config.train.weight_decay must be >= 0, got {train.weight_decay}')
    if train.grad_clip < 0:
        raise ValueError(f'config.train.grad_clip must be >= 0 (0 = off), got {train.grad_clip}')
    if train.eps <= 0:
        raise ValueError(f'config.train.eps must be > 0, got {train.eps}')
    if train.peak_flops < 0:
        raise ValueError(
            f'config.train.peak_flops must be >= 0 (FLOP/s per device; 0 = the GPU/TPU table), '
            f'got {train.peak_flops}'
        )
    _check_rate_not_zero(train)
