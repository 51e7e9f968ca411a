"""The functional hot path: a train state pytree, its shardings, and jitted train / eval steps.

The model is split once into a static graph and a pure dict of parameters; the state is
{'params', 'opt_state', 'step', 'rng'}, created directly with its shardings (never whole on
one device) and donated to every step. ('rng' is unused by the steps but kept: every saved
checkpoint holds it, and restoring reads the same tree.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lm.config import hides_a_pair
from lm.data.recall import BLANK, LABEL_FLAG, TARGET_FLAG
from lm.model.config import ModelConfig
from lm.model.transformer import Transformer
from lm.sharding import (
    activation_constraint,
    batch_sharding,
    global_batch,
    param_shardings,
    stacked_sharding,
)
from lm.train.loss import cross_entropy

State = dict


@dataclasses.dataclass(frozen=True)
class StepContext:
    """The static half of training, which the jitted steps close over: the model graph, the
    optimizer and its schedule, the mesh and every sharding."""

    graphdef: nnx.GraphDef
    tx: optax.GradientTransformation
    abstract_state: State  # ShapeDtypeStructs carrying the shardings below
    state_sharding: State
    batch_sharding: NamedSharding
    mesh: Mesh
    constrain: Callable  # activation sharding constraint passed to the model
    lr_schedule: optax.Schedule | None = None  # the optimizer's, for the logged 'lr'
    document_eos: int | None = None  # EOS id: attend within documents only; None = causal
    masked_targets: bool = False  # rows flag their scored targets (TARGET_FLAG): recall tasks
    xla_options: tuple[tuple[str, str | bool], ...] = ()  # the train step's compile options
    # An ensemble (`lm.train.ensemble`): K > 0 members, each a single run of its own seed; the
    # state, its shardings and the train batches then lead with a member axis [K, ...] sharded
    # over `member_axes` (the eval batch and `batch_sharding` stay one member's).
    members: int = 0
    member_axes: tuple[str, ...] = ()
    member_loop: bool = False  # members looped in the program (lax.map) instead of vmapped
    # Members with learning rates of their own: each member's (peak, min_lr), and a member's
    # (optimizer, schedule) from them, which replace `tx` and `lr_schedule` inside the step.
    member_lrs: tuple[tuple[float, float], ...] = ()
    member_optimizer: Callable[[jax.Array], tuple] | None = None


def parse_xla_options(spec: str, given: str = '') -> dict[str, str | bool]:
    """'key=value key=value' (space-separated; a value may hold commas) -> {key: value}
    ('' -> {}); 'true' / 'false' become bools. Errors start with `given`, default
    "config.train.xla_options='...'"."""
    options: dict[str, str | bool] = {}
    for pair in spec.split():
        key, eq, value = pair.partition('=')
        given = given or f'config.train.xla_options={spec!r}'
        if not eq or not key:
            raise ValueError(f'{given}: {pair!r} is not key=value')
        if hides_a_pair(value):
            raise ValueError(f'{given}: {pair!r} holds a second option; separate options by spaces')
        options[key] = {'true': True, 'false': False}.get(value.lower(), value)
    return options


def check_xla_options(
    options: dict[str, str | bool], setting: str = 'config.train.xla_options'
) -> None:
    """Raises ValueError naming `setting` if XLA refuses an option's name or value (a trivial
    program is compiled with them). XLA's options are one set for every backend: xla_gpu_* ones
    compile, and do nothing, on a CPU."""
    if not options:
        return
    try:
        jax.jit(lambda: jnp.zeros(()), compiler_options=options).lower().compile()
    except Exception as e:  # XLA's error type differs between backends and versions
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f'{setting}: {reason}') from None


def _abstract_params(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)


def _init(cfg: ModelConfig, tx: optax.GradientTransformation, seed: int | jax.Array) -> State:
    """A fresh state from `seed` (an int, or a traced uint32 when members are vmapped: the
    same arrays either way)."""
    key = jax.random.key(seed)
    params = nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(params=key)), nnx.Param))
    return {
        'params': params,
        'opt_state': tx.init(params),
        'step': jnp.zeros((), jnp.int32),
        'rng': jax.random.key_data(key),
    }


def _init_fn(cfg: ModelConfig, tx: optax.GradientTransformation, seed: int) -> Callable:
    return lambda: _init(cfg, tx, seed)


def make_step_context(
    cfg: ModelConfig,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rules: dict,
    seed: int,
    lr_schedule: optax.Schedule | None = None,
    document_eos: int | None = None,
    masked_targets: bool = False,
    xla_options: dict[str, str | bool] | None = None,
) -> StepContext:
    """Abstract state and shardings for model `cfg` trained by `tx` on `mesh` (nothing is
    allocated); `lr_schedule` is `tx`'s, so steps can report the rate they used; with
    `document_eos`, losses attend within documents (`token_losses`); with `masked_targets`,
    only the flagged targets count (`batch_loss`); `xla_options` are the train step's compile
    options (`check_xla_options`)."""
    graphdef, abstract = _abstract_params(cfg)
    p_shard = param_shardings(abstract, mesh, rules)
    shapes = jax.eval_shape(_init_fn(cfg, tx, seed))
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shard = optax.tree_utils.tree_map_params(
        tx,
        lambda _, s: s,
        shapes['opt_state'],
        p_shard,
        transform_non_params=lambda _: replicated,
    )
    sharding = {'params': p_shard, 'opt_state': opt_shard, 'step': replicated, 'rng': replicated}
    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, sharding
    )
    return StepContext(
        graphdef,
        tx,
        abstract_state,
        sharding,
        batch_sharding(mesh, rules),
        mesh,
        activation_constraint(mesh, rules),
        lr_schedule,
        document_eos,
        masked_targets,
        tuple(sorted((xla_options or {}).items())),
    )


def init_state(ctx: StepContext, cfg: ModelConfig, seed: int) -> State:
    """A fresh state, each array created directly in its sharding; for an ensemble the
    members' states from seeds `seed`, `seed + 1`, ... stacked."""
    init = lambda s: _init(cfg, ctx.tx, s)  # noqa: E731
    if not ctx.members:  # the seed an argument: one program for every seed (a cache hit)
        return jax.jit(init, out_shardings=ctx.state_sharding)(np.uint32(seed))
    seeds_K = np.arange(seed, seed + ctx.members, dtype=np.uint32)
    return jax.jit(jax.vmap(init), out_shardings=ctx.state_sharding)(seeds_K)


def documents(tokens_BT: jax.Array, eos_id: int) -> tuple[jax.Array, jax.Array]:
    """(segment ids, positions) [B, T] of packed rows: an EOS ends its document, the token after
    it starts the next one at position 0."""
    B, T = tokens_BT.shape
    ends_BT = (tokens_BT == eos_id).astype(jnp.int32)
    segments_BT = jnp.cumsum(ends_BT, axis=1) - ends_BT  # an EOS belongs to the document it ends
    t_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    starts_BT = jnp.concatenate([jnp.ones((B, 1), jnp.int32), ends_BT[:, :-1]], axis=1)
    first_BT = jax.lax.cummax(jnp.where(starts_BT == 1, t_BT, 0), axis=1)
    return segments_BT, t_BT - first_BT


def _logits(ctx: StepContext, params: dict, batch_BT1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits [B, T, V] in `logits_dtype`: `cross_entropy` upcasts them, targets [B, T]) of a
    batch of T + 1 tokens per row (flags cleared)."""
    model = nnx.merge(ctx.graphdef, params)
    tokens_BT = batch_BT1[:, :-1]
    if ctx.masked_targets:  # flags cleared; a label-only target's input position reads BLANK
        batch_BT1 = batch_BT1 & (LABEL_FLAG - 1)
        tokens_BT = jnp.where((tokens_BT & LABEL_FLAG) != 0, BLANK, batch_BT1[:, :-1])
    if ctx.document_eos is None:
        logits = model(tokens_BT, constrain=ctx.constrain, upcast=False)
    else:
        segments_BT, positions_BT = documents(tokens_BT, ctx.document_eos)
        logits = model(
            tokens_BT,
            positions_BT,
            constrain=ctx.constrain,
            segment_ids_BT=segments_BT,
            upcast=False,
        )
    return logits, batch_BT1[:, 1:]


def token_losses(ctx: StepContext, params: dict, batch_BT1: jax.Array) -> jax.Array:
    """Next-token losses [B, T] of the model `params` on a batch of T + 1 tokens per row; with
    `ctx.document_eos`, each token sees only its own document, from position 0."""
    return cross_entropy(*_logits(ctx, params, batch_BT1))


def scored(batch_BT1: jax.Array) -> jax.Array:
    """Float32 [B, T]: 1 where a row's target carries TARGET_FLAG (a recall answer)."""
    return (batch_BT1[:, 1:] >= TARGET_FLAG).astype(jnp.float32)


def batch_loss(ctx: StepContext, params: dict, batch_BT1: jax.Array) -> jax.Array:
    """The training loss: the mean next-token loss over every target, or with
    `ctx.masked_targets` over the flagged ones only."""
    losses_BT = token_losses(ctx, params, batch_BT1)
    if not ctx.masked_targets:
        return losses_BT.mean()
    w_BT = scored(batch_BT1)
    return (losses_BT * w_BT).sum() / jnp.maximum(w_BT.sum(), 1.0)


def call_sharding(ctx: StepContext, steps_per_call: int) -> NamedSharding:
    """Sharding of one train-step call's batch: [B, T+1], or [N, B, T+1] for N steps per call;
    an ensemble's lead with its member axis, [K, B, T+1] or [K, N, B, T+1]."""
    sharding = ctx.batch_sharding
    if steps_per_call > 1:
        sharding = stacked_sharding(sharding)
    return stacked_sharding(sharding, ctx.member_axes) if ctx.members else sharding


def call_steps(ctx: StepContext, batch: np.ndarray | jax.Array) -> int:
    """Optimizer steps in one call's batch (`call_sharding`'s layouts)."""
    return 1 if batch.ndim == 2 + bool(ctx.members) else batch.shape[bool(ctx.members)]


def device_call_batch(ctx: StepContext, local: np.ndarray) -> jax.Array:
    """A call's global batch on the mesh from this process's rows (`lm.data.corpus.call_batch`)."""
    sharding = call_sharding(ctx, call_steps(ctx, local))
    return global_batch(local, sharding, batch_axis=local.ndim - 2)


def over_members(ctx: StepContext, fn: Callable, in_axes: tuple = (0, 0)) -> Callable:
    """`fn` mapped over the ensemble's member axis (the arguments `in_axes` marks 0): vmapped
    with that axis on `ctx.member_axes`; with `ctx.member_loop`, each device's members one
    after another (the members [K, ...] as [devices, K / devices, ...], vmapped over the
    devices and looped within each)."""
    spmd = ctx.member_axes or None
    if not ctx.member_loop:
        return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=spmd)
    devices = math.prod(ctx.mesh.shape[a] for a in ctx.member_axes)
    if devices == 1:
        return _looped(fn, in_axes)

    def grouped(*args: jax.Array | dict) -> tuple:
        split = lambda x: x.reshape(devices, x.shape[0] // devices, *x.shape[1:])
        pairs = zip(args, in_axes, strict=True)
        args = [jax.tree.map(split, a) if ax == 0 else a for a, ax in pairs]
        out = jax.vmap(_looped(fn, in_axes), in_axes=in_axes, spmd_axis_name=spmd)(*args)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    return grouped


def _looped(fn: Callable, in_axes: tuple) -> Callable:
    """`fn` over the leading axis of the arguments `in_axes` marks 0, one slice after another
    (`lax.map`)."""

    def looped(*args: jax.Array | dict) -> tuple:
        mapped = [a for a, axis in zip(args, in_axes, strict=True) if axis == 0]

        def one(member: tuple) -> tuple:
            it = iter(member)
            return fn(*(next(it) if ax == 0 else a for a, ax in zip(args, in_axes, strict=True)))

        return jax.lax.map(one, mapped)

    return looped


def make_train_step(ctx: StepContext, grad_accum_steps: int, steps_per_call: int = 1) -> Callable:
    """(state, batch [B, T+1] int32) -> (state, metrics); state donated.

    Metrics: 'loss', 'grad_norm' and, when `ctx` carries the optimizer's schedule, the 'lr' this
    step used (computed on the device, so the host does no per-step schedule maths).

    With grad_accum_steps = A, the batch is split into A micro-batches of B/A rows (row r goes
    to micro-batch r mod A, which keeps each device's rows local) and gradients are averaged.
    With steps_per_call = N > 1 the call takes the batches of N consecutive steps, [N, B, T+1]
    (sharded as `call_sharding(ctx, N)`), runs the N optimizer steps in one
    `lax.scan` and returns metrics of shape [N]: the same updates as N calls, one dispatch.
    An ensemble's step is this step over its members (`over_members`): state and batch lead
    with the member axis [K, ...], and so do the metrics.
    """
    grad_fn = jax.value_and_grad(lambda p, b: batch_loss(ctx, p, b))

    def step(state: State, batch_BT1: jax.Array, lr: jax.Array | None = None) -> tuple:
        tx, schedule = (ctx.tx, ctx.lr_schedule) if lr is None else ctx.member_optimizer(lr)
        params = state['params']
        if grad_accum_steps == 1:
            loss, grads = grad_fn(params, batch_BT1)
        else:
            B, T1 = batch_BT1.shape
            # row r goes to micro-batch r mod A: [B, T1] -> [B/A, A, T1] -> [A, B/A, T1]
            micro_ABT1 = batch_BT1.reshape(B // grad_accum_steps, grad_accum_steps, T1)
            micro_ABT1 = micro_ABT1.transpose(1, 0, 2)

            def accumulate(carry, micro):
                loss, grads = grad_fn(params, micro)
                return jax.tree.map(jnp.add, carry, (loss, grads)), None

            zero = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(accumulate, zero, micro_ABT1)
            loss, grads = jax.tree.map(lambda x: x / grad_accum_steps, (loss, grads))
        updates, opt_state = tx.update(grads, state['opt_state'], params)
        new_state = {
            'params': optax.apply_updates(params, updates),
            'opt_state': opt_state,
            'step': state['step'] + 1,
            'rng': state['rng'],
        }
        metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads)}
        if schedule is not None:
            metrics['lr'] = schedule(state['step'])
        return new_state, metrics

    def steps(state: State, batches_NBT1: jax.Array, lr: jax.Array | None = None) -> tuple:
        return jax.lax.scan(lambda s, b: step(s, b, lr), state, batches_NBT1)

    fn = step if steps_per_call == 1 else steps
    return jax.jit(
        _members_step(ctx, fn) if ctx.members else fn,
        in_shardings=(ctx.state_sharding, call_sharding(ctx, steps_per_call)),
        out_shardings=(ctx.state_sharding, None),
        donate_argnums=0,
        compiler_options=dict(ctx.xla_options) or None,
    )


def _members_step(ctx: StepContext, fn: Callable) -> Callable:
    """The step `fn(state, batch[, lr])` over the ensemble's members, each member with its own
    (peak, min_lr) as `lr` [2] when `ctx.member_lrs` gives them."""
    if not ctx.member_lrs:
        return over_members(ctx, fn)
    mapped = over_members(ctx, fn, (0, 0, 0))
    lrs_K2 = np.asarray(ctx.member_lrs, np.float32)
    return lambda state, batch: mapped(state, batch, lrs_K2)


def make_eval_step(ctx: StepContext) -> Callable:
    """(params, batch [B, T+1] int32, weights [B, T] float32) -> [B] weighted nats per row,
    replicated on every device (each process reads all rows); with `ctx.masked_targets` (a
    recall task) `make_recall_eval_step`'s step instead. An ensemble's: every member's params
    on one batch, [K, B]."""
    if ctx.masked_targets:
        return make_recall_eval_step(ctx)

    def step(params: dict, batch_BT1: jax.Array, weights_BT: jax.Array) -> jax.Array:
        return (token_losses(ctx, params, batch_BT1) * weights_BT).sum(axis=-1)

    return jax.jit(
        over_members(ctx, step, (0, None, None)) if ctx.members else step,
        in_shardings=(ctx.state_sharding['params'], ctx.batch_sharding, ctx.batch_sharding),
        out_shardings=NamedSharding(ctx.mesh, PartitionSpec()),
    )


def make_recall_eval_step(ctx: StepContext) -> Callable:
    """(params, packed rows [B, T+1] int32) -> [B, 3] float32 per row: nats summed over its
    flagged targets, how many of them the argmax predicts, how many there are; replicated (an
    ensemble's: [K, B, 3], every member's params on one batch)."""

    def step(params: dict, batch_BT1: jax.Array) -> jax.Array:
        logits_BTV, targets_BT = _logits(ctx, params, batch_BT1)
        w_BT = scored(batch_BT1)
        right_BT = (jnp.argmax(logits_BTV, axis=-1) == targets_BT).astype(jnp.float32)
        nats_B = (cross_entropy(logits_BTV, targets_BT) * w_BT).sum(axis=-1)
        return jnp.stack([nats_B, (right_BT * w_BT).sum(axis=-1), w_BT.sum(axis=-1)], axis=-1)

    return jax.jit(
        over_members(ctx, step, (0, None)) if ctx.members else step,
        in_shardings=(ctx.state_sharding['params'], ctx.batch_sharding),
        out_shardings=NamedSharding(ctx.mesh, PartitionSpec()),
    )
