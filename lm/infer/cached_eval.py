"""Evaluation through the decoding cache: each evaluation window is decoded token by token from
an empty cache (teacher-forced: the next input is the window's own next token), so every
prediction attends keys and values as the cache stores them (float, int8, ...), as in
generation. With a float cache this equals the training forward up to float rounding; with a
quantized one the loss change is what quantizing the cache costs in quality.

The step has `lm.train.step.make_eval_step`'s signature, so `lm.train.evaluation.evaluate`
scores the same windows, each once, under the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec

from lm.infer.decode import Decoder, init_caches


def cached_token_losses(
    decoder: Decoder, params, batch_BT1: jax.Array, stopped: Callable[[], bool] | None = None
) -> jax.Array:
    """[B, T] next-token losses (nats) of rows [B, T+1] decoded one token at a time through
    caches of T slots stored as `decoder.kv_cache_dtype`; position t attends tokens 0..t. With
    `stopped` (asked on the host before each token, e.g. `StopRequest.arrived`), the tokens after
    it returns True are skipped (their losses 0): the caller must then discard the result."""
    inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]
    B, T = inputs_BT.shape
    caches = init_caches(decoder.cfg, B, T, decoder.kv_cache_dtype)
    model = decoder.model(params)  # outside the scan: its kernels concatenated once

    def token(caches, t):
        tokens_B1 = jax.lax.dynamic_slice_in_dim(inputs_BT, t, 1, axis=1)
        positions_B1 = jnp.full((B, 1), t, jnp.int32)
        logits_B1V, caches = model(tokens_B1, positions_B1, caches=caches)
        logp_BV = jax.nn.log_softmax(logits_B1V[:, 0].astype(jnp.float32), axis=-1)
        target_B1 = jax.lax.dynamic_slice_in_dim(targets_BT, t, 1, axis=1)
        return caches, -jnp.take_along_axis(logp_BV, target_B1, axis=-1)[:, 0]

    def body(carry, t):
        caches, halted = carry
        halted |= io_callback(lambda: np.bool_(stopped()), jax.ShapeDtypeStruct((), jnp.bool_))
        caches, nats_B = jax.lax.cond(
            halted, lambda c, t: (c, jnp.zeros((B,), jnp.float32)), token, caches, t
        )
        return (caches, halted), nats_B

    if stopped is None:
        _, nats_TB = jax.lax.scan(token, caches, jnp.arange(T))
    else:
        _, nats_TB = jax.lax.scan(body, (caches, jnp.bool_(False)), jnp.arange(T))
    return nats_TB.T


def make_cached_eval_step(
    decoder: Decoder, mesh: jax.sharding.Mesh, stopped: Callable[[], bool] | None = None
) -> Callable:
    """(params, batch [B, T+1] int32, weights [B, T] float32) -> [B] weighted nats per row,
    like `make_eval_step`'s, but decoded through caches stored as `decoder.kv_cache_dtype`
    (MLA by weight absorption unless the decoder was made with absorb=False); `params` are
    `decoder.params`; the result is replicated over `mesh`. `stopped`: as in
    `cached_token_losses` (a batch stops within a token of a stop signal)."""

    def step(params, batch_BT1: jax.Array, weights_BT: jax.Array) -> jax.Array:
        nats_BT = cached_token_losses(decoder, params, batch_BT1, stopped)
        return (nats_BT * weights_BT).sum(axis=-1)

    return jax.jit(step, out_shardings=NamedSharding(mesh, PartitionSpec()))
