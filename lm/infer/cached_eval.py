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
from jax.sharding import NamedSharding, PartitionSpec

from lm.infer.decode import Decoder, init_caches


def cached_token_losses(decoder: Decoder, params, batch_BT1: jax.Array) -> jax.Array:
    """[B, T] next-token losses (nats) of rows [B, T+1] decoded one token at a time through
    caches of T slots stored as `decoder.kv_cache_dtype`; position t attends tokens 0..t."""
    inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]
    B, T = inputs_BT.shape
    caches = init_caches(decoder.cfg, B, T, decoder.kv_cache_dtype)

    def body(caches, t):
        tokens_B1 = jax.lax.dynamic_slice_in_dim(inputs_BT, t, 1, axis=1)
        positions_B1 = jnp.full((B, 1), t, jnp.int32)
        logits_B1V, caches = decoder.forward(params, tokens_B1, positions_B1, caches)
        logp_BV = jax.nn.log_softmax(logits_B1V[:, 0].astype(jnp.float32), axis=-1)
        target_B1 = jax.lax.dynamic_slice_in_dim(targets_BT, t, 1, axis=1)
        return caches, -jnp.take_along_axis(logp_BV, target_B1, axis=-1)[:, 0]

    _, nats_TB = jax.lax.scan(body, caches, jnp.arange(T))
    return nats_TB.T


def make_cached_eval_step(decoder: Decoder, mesh: jax.sharding.Mesh) -> Callable:
    """(params, batch [B, T+1] int32, weights [B, T] float32) -> [B] weighted nats per row,
    like `make_eval_step`'s, but decoded through caches stored as `decoder.kv_cache_dtype`
    (MLA by weight absorption unless the decoder was made with absorb=False); `params` are
    `decoder.params`; the result is replicated over `mesh`."""

    def step(params, batch_BT1: jax.Array, weights_BT: jax.Array) -> jax.Array:
        return (cached_token_losses(decoder, params, batch_BT1) * weights_BT).sum(axis=-1)

    return jax.jit(step, out_shardings=NamedSharding(mesh, PartitionSpec()))
