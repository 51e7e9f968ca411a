"""The fused decode kernel (lm/model/flash_decode.py, config.model.decode_kernel='pallas'):
against a float64 reference written here, and inside the model against the XLA decode path. On
a machine without a GPU (CI) the kernel runs in Pallas's interpreter ('pallas_interpret'); on a
GPU the same tests run it compiled (Triton)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiered, tiny_config

from lm.infer.decode import Decoder, init_caches
from lm.model.attention import parse_variant
from lm.model.flash_decode import flash_decode, slots_per_tile
from lm.model.transformer import build_model, model_config

ON_GPU = jax.default_backend() == 'gpu'
KERNEL = 'pallas' if ON_GPU else 'pallas_interpret'
# float32 in the interpreter; Triton's float32 dots round their inputs to TF32 (10-bit mantissa)
ATOL = 3e-3 if ON_GPU else 2e-6
# power-of-2 head widths (Triton tiles): d_h 16; MLA's latent 16 + 16 (keys), 32 (values)
WIDTHS = dict(d_model=64, mlp_dim=128, kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16)


def reference(q_BHD, k_BGSD, v_BGSU, mask_BS, scale):
    """Softmax attention in float64, each query head i reading KV head i // (H / G)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q_BHD, k_BGSD, v_BGSU))
    R = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, R, axis=1), np.repeat(v, R, axis=1)
    s = np.einsum('bhd,bhsd->bhs', q, k) * scale
    s = np.where(mask_BS[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum('bhs,bhsu->bhu', p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize(
    'G, D, U, one_head, filled',
    [(2, 16, 16, False, 53), (8, 32, 16, False, 64), (1, 16, 32, True, 17), (1, 32, 32, False, 1)],
)
def test_kernel_equals_reference(G, D, U, one_head, filled):
    """B = 3, H = 8, a cache of 64 slots in tiles of 16 (several tiles and splits); rows 0 and 2
    left-padded (their first slots masked), slots at or past `filled` never attended."""
    B, H, S = 3, 8, 64
    rng = np.random.default_rng(filled)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    shape = (B, S) if one_head else (B, G, S)
    k = rng.standard_normal((*shape, D)).astype(np.float32)
    v = rng.standard_normal((*shape, U)).astype(np.float32)
    mask = np.zeros((B, S), bool)
    mask[:, :filled] = True
    mask[0, : min(3, filled - 1)] = False
    mask[2, : filled // 2] = False
    k[..., filled:, :] = np.nan  # masked: a NaN key there must not reach the output
    got = flash_decode(
        jnp.asarray(q),
        jnp.asarray(k),
        jnp.asarray(v),
        jnp.asarray(mask[:, None]),
        scale=D**-0.5,
        filled=jnp.int32(filled),
        block=16,
        interpret=not ON_GPU,
    )
    k4, v4 = (x[:, None] if one_head else x for x in (k, v))
    want = reference(q[:, 0], k4, v4, mask, D**-0.5)
    np.testing.assert_allclose(np.asarray(got)[:, 0], want, atol=ATOL, rtol=0)


def test_values_may_be_the_keys():
    """Absorbed MLA passes its latent as both keys and values; 48 slots tile by 16 by default."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 4, 32)).astype(np.float32)
    kv = rng.standard_normal((2, 48, 32)).astype(np.float32)
    mask = np.ones((2, 1, 48), bool)
    got = flash_decode(q, kv, kv, mask, scale=0.2, filled=jnp.int32(48), interpret=not ON_GPU)
    want = reference(q[:, 0], kv[:, None], kv[:, None], mask[:, 0], 0.2)
    np.testing.assert_allclose(np.asarray(got)[:, 0], want, atol=ATOL, rtol=0)


def test_the_tile_is_the_largest_power_of_2_dividing_the_cache():
    assert [slots_per_tile(s, 128) for s in (8, 48, 144, 1024, 8192)] == [8, 16, 16, 128, 128]


def step_logits(variant: str, kernel: str) -> np.ndarray:
    """Logits of 4 decode steps after a left-padded prefill, cache of 32 slots, float32."""
    config = tiny_config(**parse_variant(variant), **WIDTHS, decode_kernel=kernel)
    decoder = Decoder(build_model(model_config(config.model), seed=3))
    tokens = np.array([[0, 0, 5, 9, 2], [4, 4, 10, 1, 7]], np.int32)
    pad = np.array([2, 0], np.int32)
    caches = init_caches(decoder.cfg, 2, 32)
    _, caches = decoder.prefill(decoder.params, tokens, pad, caches)
    out = []
    for token in (3, 8, 1, 6):
        logits, caches = decoder.step(decoder.params, np.full(2, token, np.int32), pad, caches)
        out.append(np.asarray(logits))
    return np.stack(out)


@pytest.mark.parametrize(
    'variant',  # GQA in the fast tier, the others in the full suite
    tiered(('mha', 'gqa2', 'mqa', 'mla'), fast=('gqa2',)),
)
def test_decoding_with_the_kernel_equals_the_xla_path(variant):
    got, want = step_logits(variant, KERNEL), step_logits(variant, 'xla')
    np.testing.assert_allclose(got, want, atol=10 * ATOL, rtol=0)


def test_shapes_the_kernel_cannot_tile_are_refused_in_one_line():
    q, kv = jnp.zeros((1, 1, 4, 24)), jnp.zeros((1, 4, 32, 24))
    with pytest.raises(ValueError, match=r"decode_kernel='pallas' needs power-of-2 key widths"):
        flash_decode(q, kv, kv, jnp.ones((1, 1, 32), bool), scale=1.0, filled=1, interpret=True)
    q, kv = jnp.zeros((1, 1, 4, 16)), jnp.zeros((1, 4, 40, 16))
    with pytest.raises(ValueError, match=r'needs a cache of a multiple of 16 slots, got 40'):
        flash_decode(q, kv, kv, jnp.ones((1, 1, 40), bool), scale=1.0, filled=1, interpret=True)
    with pytest.raises(ValueError, match=r'config.model.decode_kernel must be one of'):
        model_config(tiny_config(decode_kernel='triton').model)


@pytest.mark.skipif(ON_GPU, reason='the refusal is for machines without a GPU')
def test_the_compiled_kernel_is_refused_without_a_gpu():
    q, kv = jnp.zeros((1, 1, 4, 16)), jnp.zeros((1, 4, 32, 16))
    with pytest.raises(ValueError, match=r"decode_kernel='pallas' needs a GPU \(Triton kernels\)"):
        flash_decode(q, kv, kv, jnp.ones((1, 1, 32), bool), scale=1.0, filled=1)
