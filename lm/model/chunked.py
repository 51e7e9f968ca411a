"""Decoding attention that reads only the filled part of the cache, in chunks (flash-decoding's
split of the keys, run as a loop on one device): a few new queries attend a cache of S slots of
which only the first `filled` hold tokens. Each chunk of C slots is read once, for its scores and
its values while it is still in the processor's cache, and the softmax is combined across chunks
online (running max and sum), so a latent that serves as both keys and values (absorbed MLA) is
read from memory once instead of twice, and a long cache that is mostly empty costs nothing.
Shape letters: see the legend in lm/model/transformer.py; C is the chunk length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lm.model.kv_cache import drop_unit_axes

NEG = jnp.finfo(jnp.float32).min


def read_chunk(
    k_xSD: jax.Array,
    v_xSU: jax.Array,
    mask_BTS: jax.Array,
    i: jax.Array,
    chunk: int,
    lead: tuple[int, int],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Chunk i of the cache: keys [B, G, C, D], values [B, G, C, U] and its mask [B, 1, 1, T, C]
    (the last chunk is read from S - C; its slots that chunk i - 1 covered are masked out).
    k_xSD / v_xSU: the cache as stored, without size-1 axes (`drop_unit_axes`): slicing the
    bitcast that strips one, XLA copied the whole cache per step. lead: (B, G)."""
    S = k_xSD.shape[-2]
    start = jnp.minimum(i * chunk, S - chunk)
    axis = k_xSD.ndim - 2
    k_xCD = jax.lax.dynamic_slice_in_dim(k_xSD, start, chunk, axis=axis)
    v_xCU = jax.lax.dynamic_slice_in_dim(v_xSU, start, chunk, axis=axis)
    k_BGCD = k_xCD.reshape(lead + k_xCD.shape[-2:])
    v_BGCU = v_xCU.reshape(lead + v_xCU.shape[-2:])
    m_BTC = jax.lax.dynamic_slice_in_dim(mask_BTS, start, chunk, axis=2)
    m_BTC = m_BTC & (start + jnp.arange(chunk) >= i * chunk)[None, None]
    return k_BGCD, v_BGCU, m_BTC[:, None, None]


def online_softmax_step(
    carry: tuple[jax.Array, jax.Array, jax.Array],
    q_BGRTD: jax.Array,
    k_BGCD: jax.Array,
    v_BGCU: jax.Array,
    m_B11TC: jax.Array,
    scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Folds one chunk into (running max [B, G, R, T, 1], sum of exp [B, G, R, T, 1], weighted
    value sum [B, G, R, T, U]), all float32."""
    max_BGRT1, sum_BGRT1, acc_BGRTU = carry
    # scores[b, g, r, t, c] = <q[b, t, g, r], k[b, g, c]> · scale
    s_BGRTC = jnp.einsum('BGRTD,BGCD->BGRTC', q_BGRTD, k_BGCD, preferred_element_type=jnp.float32)
    s_BGRTC = jnp.where(m_B11TC, s_BGRTC * scale, NEG)
    new_max = jnp.maximum(max_BGRT1, s_BGRTC.max(axis=-1, keepdims=True))
    e_BGRTC = jnp.where(m_B11TC, jnp.exp(s_BGRTC - new_max), 0.0)
    rescale = jnp.exp(max_BGRT1 - new_max)
    # pv[b, g, r, t] = sum_c e[b, g, r, t, c] · v[b, g, c]
    pv_BGRTU = jnp.einsum(
        'BGRTC,BGCU->BGRTU',
        e_BGRTC.astype(v_BGCU.dtype),
        v_BGCU,
        preferred_element_type=jnp.float32,
    )
    new_sum = sum_BGRT1 * rescale + e_BGRTC.sum(-1, keepdims=True)
    return new_max, new_sum, acc_BGRTU * rescale + pv_BGRTU


def chunked_attention(
    q_BTHD: jax.Array,
    k_BGSD: jax.Array,
    v_BGSU: jax.Array,
    mask_BTS: jax.Array,
    *,
    scale: float,
    filled: jax.Array,
    chunk: int,
) -> jax.Array:
    """Softmax attention of T queries over the first `filled` of S cached slots, chunk by chunk:
    [B, T, H, U], equal to `grouped_attention` with the same mask (up to float rounding).

    k_BGSD / v_BGSU: head-major caches, or [B, S, D] / [B, S, U] for one shared KV head (absorbed
    MLA's latent); v may be k itself. mask_BTS: True = attend (slots at or past `filled` never are).
    filled: int32 scalar, the slots written so far. chunk: C < S (the caller attends in one
    piece otherwise); S need not be a multiple of C.
    """
    B, T, H, D = q_BTHD.shape
    G = 1 if k_BGSD.ndim == 3 else k_BGSD.shape[1]
    S, U = k_BGSD.shape[-2], v_BGSU.shape[-1]
    q_BGRTD = q_BTHD.reshape(B, T, G, H // G, D).transpose(0, 2, 3, 1, 4)

    k_xSD, v_xSU = drop_unit_axes(k_BGSD), drop_unit_axes(v_BGSU)

    def body(i, carry):
        k_BGCD, v_BGCU, m_B11TC = read_chunk(k_xSD, v_xSU, mask_BTS, i, chunk, (B, G))
        return online_softmax_step(carry, q_BGRTD, k_BGCD, v_BGCU, m_B11TC, scale)

    stats_BGRT1 = jnp.zeros((B, G, H // G, T, 1), jnp.float32)
    init = (stats_BGRT1 + NEG, stats_BGRT1, jnp.zeros((B, G, H // G, T, U), jnp.float32))
    n_chunks = jnp.minimum((filled + chunk - 1) // chunk, -(-S // chunk))
    _, sum_BGRT1, acc_BGRTU = jax.lax.fori_loop(0, n_chunks, body, init)
    out_BGRTU = acc_BGRTU / jnp.maximum(sum_BGRT1, jnp.finfo(jnp.float32).tiny)
    return out_BGRTU.astype(v_BGSU.dtype).transpose(0, 3, 1, 2, 4).reshape(B, T, H, U)
