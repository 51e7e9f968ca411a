"""The fused decode kernel (lm/model/flash_decode.py, config.model.decode_kernel='pallas'):
against a float64 reference written here, and inside the model against the XLA decode path. On
a machine without a GPU (CI) the kernel runs in Pallas's interpreter ('pallas_interpret'); on a
GPU the same tests run it compiled (Triton)."""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiered, tiny_config

from lm.infer.decode import Decoder, init_caches
from lm.model.attention import parse_variant
from lm.model.flash_decode import flash_decode, pieces, slots_per_tile, tile_slots
from lm.model.transformer import build_model, model_config

ON_GPU = jax.default_backend() == 'gpu'
KERNEL = 'pallas' if ON_GPU else 'pallas_interpret'
# float32 in the interpreter; Triton's float32 dots round their inputs to TF32 (10-bit mantissa)
ATOL = 3e-3 if ON_GPU else 2e-6
# power-of-2 head widths: d_h 16; MLA's latent 16 + 16 (keys), 32 (values)
WIDTHS = dict(d_model=64, mlp_dim=128, kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16)
# widths of no power of 2, read in pieces: d_h 24 = 16 + 8; MLA's latent 24 + 6 (keys: 16 + 8,
# then 4 + 2), 24 (values), RoPE keys 6 wide (MLA's heads are 8 + 6)
ODD_WIDTHS = dict(d_model=96, mlp_dim=128, kv_lora_rank=24, qk_rope_head_dim=6, qk_nope_head_dim=8)


def reference(q_BHD, k_BGSD, v_BGSU, mask_BS, scale):
    """Softmax attention in float64, each query head i reading KV head i // (H / G)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q_BHD, k_BGSD, v_BGSU))
    R = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, R, axis=1), np.repeat(v, R, axis=1)
    s = np.einsum('bhd,bhsd->bhs', q, k) * scale
    s = np.where(mask_BS[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum('bhs,bhsu->bhu', p / p.sum(-1, keepdims=True), v)


def padded_mask(B: int, S: int, filled: int) -> np.ndarray:
    """[B, S]: the first `filled` slots, rows 0 and 2 left-padded (their first slots masked)."""
    mask = np.zeros((B, S), bool)
    mask[:, :filled] = True
    mask[0, : min(3, filled - 1)] = False
    mask[2, : filled // 2] = False
    return mask


@pytest.mark.parametrize(
    'G, D, U, one_head, filled',
    [
        (2, 16, 16, False, 53),
        (8, 32, 16, False, 64),
        (1, 16, 32, True, 17),
        (1, 32, 32, False, 1),
        (2, 24, 8, False, 40),  # pieces 16 + 8 (keys), 8 (values: elementwise)
        (4, 96, 12, False, 33),  # pieces 64 + 32 (keys), 8 + 4 (values)
        (1, 13, 48, True, 64),  # pieces 8 + 4 + 1 (keys), 32 + 16 (values)
    ],
)
def test_kernel_equals_reference(G, D, U, one_head, filled):
    """B = 3, H = 8, a cache of 64 slots in tiles of 16 (several tiles and splits), slots at or
    past `filled` never attended (NaN keys there), any key and value widths."""
    B, H, S = 3, 8, 64
    rng = np.random.default_rng(filled)
    q = rng.standard_normal((B, 1, H, D)).astype(np.float32)
    shape = (B, S) if one_head else (B, G, S)
    k = rng.standard_normal((*shape, D)).astype(np.float32)
    v = rng.standard_normal((*shape, U)).astype(np.float32)
    mask = padded_mask(B, S, filled)
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


@pytest.mark.parametrize(
    'H, C, X, filled',
    [(16, 512, 32, 200), (8, 24, 6, 61), (4, 40, 16, 96), (2, 16, 16, 1)],
)
def test_latent_kernel_equals_reference(H, C, X, filled):
    """Absorbed MLA: one latent [c_KV; k_R] per slot, C + X wide, read once as keys and (its
    first C columns) as values; the deployment's 512 + 32 and widths of no power of 2; a cache
    of 256 slots in its own tiles."""
    B, S = 3, 256
    rng = np.random.default_rng(C + filled)
    q = rng.standard_normal((B, 1, H, C + X)).astype(np.float32)
    latent = rng.standard_normal((B, S, C + X)).astype(np.float32) / 4
    mask = padded_mask(B, S, filled)
    latent[:, filled:] = np.nan
    scale = (C + X) ** -0.5
    got = flash_decode(
        jnp.asarray(q),
        jnp.asarray(latent),
        None,
        jnp.asarray(mask[:, None]),
        scale=scale,
        filled=jnp.int32(filled),
        value_width=C,
        interpret=not ON_GPU,
    )
    assert got.shape == (B, 1, H, C)
    lat4 = latent[:, None]
    want = reference(q[:, 0], lat4, lat4[..., :C], mask, scale)
    np.testing.assert_allclose(np.asarray(got)[:, 0], want, atol=ATOL, rtol=0)


def test_pieces_cover_a_width_in_powers_of_2():
    assert pieces(0, 544) == ((0, 512), (512, 32))
    assert pieces(512, 30) == ((512, 16), (528, 8), (536, 4), (540, 2))
    assert pieces(0, 0) == ()


def test_the_tile_is_the_largest_power_of_2_dividing_the_cache():
    assert [slots_per_tile(s, 128) for s in (8, 48, 144, 1024, 8192)] == [8, 16, 16, 128, 128]
    # MLA's 544-wide bfloat16 latent: two stages of 32 slots fit the shared-memory budget
    assert tile_slots(8192, 128, 544, 2) == 32
    assert tile_slots(8192, 128, 128, 2) == 128


def step_logits(variant: str, kernel: str, widths: dict = WIDTHS, slots: int = 32) -> np.ndarray:
    """Logits of 4 decode steps after a left-padded prefill, a cache of `slots`, float32."""
    config = tiny_config(**parse_variant(variant), **widths, decode_kernel=kernel)
    decoder = Decoder(build_model(model_config(config.model), seed=3))
    tokens = np.array([[0, 0, 5, 9, 2], [4, 4, 10, 1, 7]], np.int32)
    pad = np.array([2, 0], np.int32)
    caches = init_caches(decoder.cfg, 2, slots)
    _, caches = decoder.prefill(decoder.params, tokens, pad, caches)
    out = []
    for token in (3, 8, 1, 6):
        logits, caches = decoder.step(decoder.params, np.full(2, token, np.int32), pad, caches)
        out.append(np.asarray(logits))
    return np.stack(out)


@pytest.mark.parametrize(
    'variant, widths',  # GQA and MLA at odd widths in the fast tier, the others in the full suite
    tiered(
        tuple((v, w) for w in ('pow2', 'odd') for v in ('mha', 'gqa2', 'mqa', 'mla')),
        fast=(('gqa2', 'pow2'), ('mla', 'odd')),
    ),
)
def test_decoding_with_the_kernel_equals_the_xla_path(variant, widths):
    """Inside the model: MLA absorbed (the latent kernel), the others per KV head."""
    widths = WIDTHS if widths == 'pow2' else ODD_WIDTHS
    got, want = step_logits(variant, KERNEL, widths), step_logits(variant, 'xla', widths)
    np.testing.assert_allclose(got, want, atol=10 * ATOL, rtol=0)


def test_a_cache_the_kernel_cannot_tile_decodes_with_xla_said_once(caplog):
    """A cache of 40 slots (no tile of 16 divides it): the variant falls back to XLA's
    attention with one log line naming it and the reason; the run is not refused."""
    with caplog.at_level(logging.WARNING):
        got = step_logits('mla', KERNEL, slots=40)
    lines = [r.getMessage() for r in caplog.records if 'decodes with XLA' in r.getMessage()]
    assert lines == [
        "MultiHeadLatentAttention: config.model.decode_kernel='pallas' needs a cache of a "
        'multiple of 16 slots, got 40 (lm.infer.decode.cache_capacity sizes caches so); this '
        'variant decodes with XLA'
    ]
    np.testing.assert_allclose(got, step_logits('mla', 'xla', slots=40), atol=1e-6, rtol=0)


def test_shapes_the_kernel_cannot_tile_are_refused_in_one_line():
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


@pytest.mark.skipif(ON_GPU, reason='on a GPU the tests above compile the kernels')
@pytest.mark.parametrize(
    'G, D, U, shared',
    [(1, 544, 512, True), (4, 96, 96, False), (1, 30, 24, True), (2, 24, 12, False)],
)
def test_the_kernels_lower_to_triton_for_a_gpu(monkeypatch, G, D, U, shared):
    """Lowered for CUDA on this CPU (what a GPU compiles, up to Triton's own passes), 16 heads
    and 8k slots in bfloat16: MLA's 512 + 32 latent, 4 KV heads of 96 (64 + 32), and pieces
    narrower than a matrix tile; Pallas's Triton lowering refuses a tile that is not a power
    of 2."""
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    bf16 = jnp.bfloat16
    args = [
        jax.ShapeDtypeStruct((8, 1, 16, D), bf16),
        jax.ShapeDtypeStruct((8, G, 8192, D), bf16),
        None if shared else jax.ShapeDtypeStruct((8, G, 8192, U), bf16),
        jax.ShapeDtypeStruct((8, 1, 8192), jnp.bool_),
    ]
    f = jax.jit(functools.partial(flash_decode, scale=0.1, value_width=U if shared else None))
    traced = f.trace(*args, filled=jax.ShapeDtypeStruct((), jnp.int32))
    text = traced.lower(lowering_platforms=('cuda',)).as_text()
    assert text.count('__gpu$xla.gpu.triton') == 1, text[:2000]
