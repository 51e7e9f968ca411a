"""Seed ensembles (`config.train.ensemble` = K > 0): K members trained as one compiled program.

Member i is exactly the single run of `member_config(config, i)` (seed `config.seed + i`): its
initialisation, its batches and so its losses. The state is the single run's tree with every
array stacked on a leading member axis [K, ...]; the train step is the single run's mapped over
that axis (`lm.train.step.over_members`). The member axis lies on the mesh axes of
`config.mesh.rules.member` (default 'data'); inside a member, every other rule keeps its mesh
axes less those, so a member's batch rows are not split over the devices that hold other members.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import AbstractMesh, Mesh

from lm.model.transformer import check_model_config
from lm.sharding import MESH_AXES, mesh_shape, rules_table, stacked_sharding
from lm.train.optimizer import lr_schedule, make_optimizer
from lm.train.step import StepContext

MEMBER = 'member'  # the logical axis of ensemble members in config.mesh.rules


def members(config: ml_collections.ConfigDict) -> int:
    """Members of `config`'s run: 0 for a single run."""
    return config.train.ensemble


def ensemble_loop_default(backend: str | None = None) -> bool:
    """The faster of an ensemble's programs on `backend` (default: this process's), as measured
    (docs/performance.md): members looped inside the program on a CPU (vmapping gains nothing
    there), vmapped on an accelerator."""
    return (backend or jax.default_backend()) == 'cpu'


def member_seeds(config: ml_collections.ConfigDict) -> list[int]:
    """The members' seeds, `config.seed + i` for member i."""
    return [config.seed + i for i in range(members(config))]


def _rates(spec: str) -> tuple[float, ...]:
    return tuple(float(v) for v in spec.split(',')) if spec else ()


def member_lrs(config: ml_collections.ConfigDict) -> tuple[tuple[float, float], ...]:
    """Each member's (peak, min_lr) (`config.train.ensemble_lr`, `ensemble_min_lr`; the one
    not given is `train.lr` / `train.min_lr` for all); () when neither is given."""
    train, k = config.train, config.train.ensemble
    peaks, floors = _rates(train.ensemble_lr), _rates(train.ensemble_min_lr)
    if not (peaks or floors):
        return ()
    return tuple(zip(peaks or (train.lr,) * k, floors or (train.min_lr,) * k, strict=True))


def member_config(config: ml_collections.ConfigDict, i: int) -> ml_collections.ConfigDict:
    """The single run that member `i` of `config`'s ensemble is: ensemble off, seed + i, and
    its own peak rate and min_lr when the members have theirs (`member_lrs`)."""
    if not 0 <= i < members(config):
        raise ValueError(f'member {i} is not in config.train.ensemble={members(config)}')
    single = ml_collections.ConfigDict(config.to_dict())
    if lrs := member_lrs(config):
        single.train.lr, single.train.min_lr = lrs[i]
    single.train.ensemble = 0
    single.train.ensemble_loop = False
    single.train.ensemble_lr = single.train.ensemble_min_lr = ''
    single.seed = config.seed + i
    return single


def member_tree(tree, i: int):
    """Member `i`'s part of an ensemble's stacked tree (state, params or metrics)."""
    return jax.tree.map(lambda x: x[i], tree)


def check_ensemble_config(config: ml_collections.ConfigDict) -> None:
    """One-line errors for `config.train.ensemble` that need neither data nor devices."""
    k = config.train.ensemble
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(
            f'config.train.ensemble must be 0 (off) or a member count K >= 1, got {k!r}'
        )
    if not k:
        for key in ('ensemble_lr', 'ensemble_min_lr'):
            if config.train[key]:
                raise ValueError(
                    f'config.train.{key}={config.train[key]!r} needs an ensemble: '
                    'set config.train.ensemble to its number of rates'
                )
        if config.train.ensemble_loop:
            raise ValueError(
                'config.train.ensemble_loop=True needs an ensemble (it loops over its members): '
                'set config.train.ensemble to the member count K, or leave ensemble_loop False'
            )
        return
    check_member_lrs(config)
    if config.seed + k > 2**32:
        raise ValueError(
            f'config.train.ensemble={k}: member seeds config.seed={config.seed} ... '
            f'{config.seed + k - 1} must stay below 2**32'
        )
    if jax.process_count() > 1:
        raise ValueError(f'config.train.ensemble={k}: ensembles train in one process only')


def check_member_lrs(config: ml_collections.ConfigDict) -> None:
    """`config.train.ensemble_lr`: '' or K finite rates > 0; `ensemble_min_lr`: '' or K
    finite rates >= 0; in one line."""
    k = config.train.ensemble
    for key, sign, ok in (
        ('ensemble_lr', '>', lambda lr: lr > 0),
        ('ensemble_min_lr', '>=', lambda lr: lr >= 0),
    ):
        spec = config.train[key]
        try:
            lrs = _rates(spec)
        except ValueError:
            lrs = ()
        if spec and (len(lrs) != k or not all(math.isfinite(lr) and ok(lr) for lr in lrs)):
            raise ValueError(
                f'config.train.{key}={spec!r} must be {k} comma-separated learning rates '
                f'{sign} 0, one per member of config.train.ensemble={k}'
            )
    for i, (peak, floor) in enumerate(member_lrs(config)):
        if floor > peak:
            raise ValueError(
                f'config.train: member {i} of the ensemble would decay from lr {peak} up to '
                f"min_lr {floor}; set ensemble_min_lr (or min_lr) <= each member's lr"
            )


def member_axes(mesh: Mesh, rules: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The mesh axes (of size > 1) that `rules['member']` spreads members over."""
    return tuple(a for a in rules.get(MEMBER, ()) if mesh.shape[a] > 1)


def member_rules(mesh: Mesh, rules: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The rules inside one member: every rule's mesh axes less the member axes."""
    taken = set(member_axes(mesh, rules))
    return {
        name: tuple(a for a in axes if a not in taken)
        for name, axes in rules.items()
        if name != MEMBER
    }


def step_rules(
    config: ml_collections.ConfigDict, mesh: Mesh, rules: dict[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """The rules a member's step context uses: `member_rules` for an ensemble, else `rules`."""
    return member_rules(mesh, rules) if config.train.ensemble else rules


def as_ensemble(
    config: ml_collections.ConfigDict, ctx: StepContext, mesh: Mesh, rules: dict
) -> StepContext:
    """A member's step context `ctx` as `config`'s ensemble's (`ensemble_context`, refused if it
    cannot fit: `check_members_fit`); `ctx` itself for a single run (refused if it cannot fit)."""
    if not config.train.ensemble:
        check_members_fit(ctx)
        return ctx
    axes = member_axes(mesh, rules)
    ctx = ensemble_context(ctx, config.train.ensemble, axes, config.train.ensemble_loop)
    if lrs := member_lrs(config):
        ctx = dataclasses.replace(ctx, member_lrs=lrs, member_optimizer=member_optimizer(config))
    check_members_fit(ctx)
    return ctx


def member_optimizer(config: ml_collections.ConfigDict) -> Callable:
    """(peak, min_lr) as a traced [2] -> (optimizer, schedule) of a member of `config`'s
    ensemble that trains with those rates."""
    train = config.train

    def optimizer(lr: jax.Array) -> tuple[optax.GradientTransformation, optax.Schedule]:
        schedule = lr_schedule(train, lr[0], lr[1])
        return make_optimizer(train, schedule), schedule

    return optimizer


def check_members_divide(
    config: ml_collections.ConfigDict, mesh: Mesh | AbstractMesh, rules: dict
) -> None:
    """The member count must divide over the member axes, in one line naming both settings."""
    axes = member_axes(mesh, rules)
    size = math.prod(mesh.shape[a] for a in axes)
    if config.train.ensemble % size:
        raise ValueError(
            f'config.train.ensemble={config.train.ensemble} members do not divide over the '
            f'mesh axes {axes} of size {size} (config.mesh.rules.member='
            f'{config.mesh.rules.get(MEMBER, "")!r}): use a multiple of {size}, or '
            "config.mesh.rules.member='' (each member over all devices)"
        )


def check_members_divide_over(config: ml_collections.ConfigDict, num_devices: int) -> None:
    """`check_members_divide` before any device exists: on the mesh `config.mesh` makes of
    `num_devices` devices (for a driver that plans runs it does not start)."""
    mesh = AbstractMesh(mesh_shape(config.mesh, num_devices), MESH_AXES)
    check_members_divide(config, mesh, rules_table(config.mesh))


def ensemble_context(ctx: StepContext, k: int, axes: tuple[str, ...], loop: bool) -> StepContext:
    """A member's step context `ctx` as an ensemble's of `k` members: the state's abstract
    arrays and shardings stacked on a leading member axis over the mesh `axes`; `loop`: the
    members run one after another inside the program (lax.map) instead of vmapped."""
    sharding = jax.tree.map(lambda s: stacked_sharding(s, axes), ctx.state_sharding)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct((k, *x.shape), x.dtype, sharding=s),
        ctx.abstract_state,
        sharding,
    )
    return dataclasses.replace(
        ctx,
        abstract_state=abstract,
        state_sharding=sharding,
        members=k,
        member_axes=axes,
        member_loop=loop,
    )


def state_bytes(ctx: StepContext) -> int:
    """Bytes of the (stacked) train state of `ctx`, all devices together."""
    leaves = jax.tree.leaves(ctx.abstract_state)
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves)


def _device_bytes(tree: dict) -> int:
    """Bytes of `tree`'s abstract arrays on one device (the largest shard of each)."""
    leaves = jax.tree.leaves(tree)
    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves
    )


def device_memory() -> int | None:
    """Bytes one device may hold: an accelerator's allocator limit, a CPU device's share of the
    host's physical memory; None when unknown."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != 'cpu' else None
    if stats and stats.get('bytes_limit'):
        return int(stats['bytes_limit'])
    try:
        host = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError):
        return None
    return host // jax.local_device_count() if device.platform == 'cpu' else None


def check_size_estimate(config: ml_collections.ConfigDict) -> None:
    """Refuses, before the model is traced (layer by layer: minutes for 100,000 layers), a
    config whose parameters and gradients alone exceed the memory of every device together,
    counting only the weights each variant has (the embedding and the SwiGLU MLPs), a lower
    bound of what `check_members_fit` counts once the model is traced."""
    limit = device_memory()
    if limit is None:
        return
    cfg = check_model_config(config.model)
    weights = cfg.vocab_size * cfg.d_model + cfg.num_layers * 3 * cfg.d_model * cfg.mlp_dim
    members = max(config.train.ensemble, 1)
    need = 2 * weights * np.dtype(cfg.param_dtype).itemsize * members
    n = jax.device_count()
    if need > limit * n:
        raise ValueError(
            f'config.model needs at least {need / 2**30:.2f} GiB for the parameters and '
            f'gradients of its embedding and MLPs alone (vocab_size={cfg.vocab_size}, '
            f'num_layers={cfg.num_layers}, d_model={cfg.d_model}, mlp_dim={cfg.mlp_dim}'
            f'{f", ensemble={members}" if members > 1 else ""}), more than the '
            f'{limit * n / 2**30:.2f} GiB of {"all" if n > 1 else "the"} {n} '
            f'device{"s" if n > 1 else ""}: a smaller model or more devices'
        )


def check_scores_fit(config: ml_collections.ConfigDict, batch: int, what: str) -> None:
    """Refuses, before compiling, calls of `batch` windows whose attention scores alone exceed a
    device's memory: one layer's float32 [batch, heads, T, T], each device its share of `batch`
    over every device (a lower bound); cuDNN's fused attention makes none."""
    limit = device_memory()
    if limit is None or config.model.attention_impl == 'cudnn':
        return
    T, H = config.data.seq_len, config.model.num_heads
    per_device = -(-batch // jax.device_count())
    need = per_device * H * T * T * 4
    if need > limit:
        raise ValueError(
            f"{what}: one layer's attention scores alone need {need / 2**30:.2f} GiB per device "
            f'({per_device} windows x {H} heads x {T}^2 float32), more than the '
            f'{limit / 2**30:.2f} GiB a device has: fewer windows per call or a shorter '
            'config.data.seq_len'
        )


def check_members_fit(ctx: StepContext) -> None:
    """Refuses, before compiling, a run (an ensemble: its members) whose train state and
    gradients alone exceed a device's memory (activations come on top), naming the bytes (and
    how many members fit); a single run's would fail allocating them, in no line of its own."""
    limit = device_memory()
    if limit is None:
        return
    need = _device_bytes(ctx.abstract_state) + _device_bytes(ctx.abstract_state['params'])
    if need <= limit:
        return
    if not ctx.members:
        raise ValueError(
            f'config.model needs {need / 2**30:.2f} GiB per device for the train state and '
            f'gradients alone, more than the {limit / 2**30:.2f} GiB a device has: a smaller '
            'd_model, num_layers, mlp_dim or vocab_size, or more devices (config.mesh.fsdp)'
        )
    size = math.prod(ctx.mesh.shape[a] for a in ctx.member_axes)
    per_member = need / (ctx.members // size)
    fit = int(limit // per_member) * size
    raise ValueError(
        f'config.train.ensemble={ctx.members} needs {need / 2**30:.2f} GiB per device for the '
        f'train state and gradients alone ({per_member / 2**30:.3f} GiB per member), more '
        f'than the {limit / 2**30:.2f} GiB a device has: at most {fit} members fit'
    )
