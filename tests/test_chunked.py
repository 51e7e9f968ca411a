"""Chunked decoding attention (lm/model/chunked.py) against a float64 softmax reference written
here: random queries and caches, any number of filled slots, a cache length that is not a
multiple of the chunk, G KV heads or one head cached as [B, S, D], values that are the keys
themselves (absorbed MLA). Tolerance: 1e-5 absolute (float32 sums over at most 53 slots)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.model.chunked import chunked_attention
from lm.model.kv_cache import cache_mask


def reference(q, k, v, mask, scale):
    """float64: q [B, T, H, D], k [B, G, S, D], v [B, G, S, U], mask [B, T, S]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, T, H, _ = q.shape
    G = k.shape[1]
    out = np.zeros((B, T, H, v.shape[-1]))
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            s = q[b, :, h] @ k[b, g].T * scale
            s = np.where(mask[b], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[b, :, h] = (p / p.sum(-1, keepdims=True)) @ v[b, g]
    return out


@pytest.mark.parametrize('G, U, one_head', [(2, 6, False), (4, 8, False), (1, 8, True)])
@pytest.mark.parametrize('T, filled', [(1, 1), (1, 9), (1, 40), (1, 53), (3, 17)])
def test_chunked_attention_equals_reference(G, U, one_head, T, filled):
    B, H, S, D, chunk = 2, 4, 53, 8, 8
    rng = np.random.default_rng(filled + 10 * T + G)
    q = rng.normal(size=(B, T, H, D)).astype(np.float32)
    k = rng.normal(size=(B, G, S, D)).astype(np.float32)
    v = rng.normal(size=(B, G, S, U)).astype(np.float32)
    pad = jnp.array([0, min(filled - T, 3)], jnp.int32)  # row 1 left-padded
    mask = np.asarray(cache_mask(jnp.arange(S), pad, jnp.int32(filled - T), T))
    want = reference(q, k, v, mask, 0.3)
    kc, vc = (k[:, 0], v[:, 0]) if one_head else (k, v)
    run = jax.jit(chunked_attention, static_argnames=('scale', 'chunk'))
    got = run(q, kc, vc, mask, scale=0.3, filled=jnp.int32(filled), chunk=chunk)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_values_may_be_the_keys_and_unfilled_slots_are_never_read():
    """Absorbed MLA passes the latent as keys and values; slots at or past `filled` hold NaN
    here, so reading (not just masking) one of them would poison the output."""
    B, T, H, S, D, filled = 2, 1, 4, 40, 8, 13
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, T, H, D)).astype(np.float32)
    kv = rng.normal(size=(B, S, D)).astype(np.float32)
    mask = np.asarray(cache_mask(jnp.arange(S), jnp.zeros(B, jnp.int32), jnp.int32(filled - T), T))
    want = reference(q, kv[:, None], kv[:, None], mask, 0.5)
    kv[:, 16:] = np.nan  # chunks of 8: slots 16.. lie in chunks past the filled ones
    got = chunked_attention(q, kv, kv, mask, scale=0.5, filled=jnp.int32(filled), chunk=8)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
