"""AdamW with linear warmup, cosine decay and global-norm clipping, from `config.train`."""

from __future__ import annotations

import math

import jax
import ml_collections
import optax


def lr_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
    """0 → lr linearly over warmup_steps, then cosine to min_lr at `steps`."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=train.lr,
        warmup_steps=train.warmup_steps,
        decay_steps=max(train.steps, train.warmup_steps + 1),
        end_value=train.min_lr,
    )


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
    if train.lr <= 0 or train.min_lr < 0 or train.warmup_steps < 0:
        raise ValueError('config.train.lr must be > 0, and min_lr and warmup_steps >= 0')
    if not (0 <= train.b1 < 1 and 0 <= train.b2 < 1):
        raise ValueError(f'config.train.b1 and b2 must be in [0, 1), got {train.b1}, {train.b2}')
