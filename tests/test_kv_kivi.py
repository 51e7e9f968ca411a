"""KIVI 4-bit KV cache ('kivi4'): packing, quantization against a float64 NumPy reference, the
grouped storage with its float residual written in pieces against a NumPy reference, decoding
against the float cache (within a stated tolerance; exact while every token is in the
residual), bytes = the formula, and the one-line refusals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from test_kv_quant import teacher_forced

from lm.infer.decode import Decoder, init_caches
from lm.model import accounting, kv_kivi
from lm.model.kv_cache import KVCache
from lm.model.transformer import build_model, model_config

VARIANTS = {
    'gqa2': dict(attention='gqa', num_kv_heads=2),
    'mqa': dict(attention='mqa'),
    'mla': dict(attention='mla'),
}


def test_pack_unpack_round_trip():
    """Two codes a byte (channel 2i low nibble, 2i + 1 high), as a NumPy reference packs them;
    unpacking gives the codes back."""
    codes = np.asarray(jax.random.randint(jax.random.key(0), (3, 2, 5, 8), 0, 16), np.uint8)
    packed = np.asarray(kv_kivi.pack(jnp.asarray(codes)))
    assert packed.dtype == np.uint8 and packed.shape == (3, 2, 5, 4)
    np.testing.assert_array_equal(packed, codes[..., 0::2] + 16 * codes[..., 1::2])
    np.testing.assert_array_equal(np.asarray(kv_kivi.unpack(jnp.asarray(packed))), codes)


def reference_codes(x, mn, scale):
    """float64 codes from the stored min and scale, and where they sit within 1e-4 of a rounding
    tie (float32 arithmetic may round those the other way)."""
    q = (x.astype(np.float64) - mn) / np.where(scale > 0, scale, 1)
    return np.clip(np.round(q), 0, 15), np.abs(q - np.floor(q) - 0.5) < 1e-4


def check_quantized(x, codes, mn, scale, lo, hi):
    """mn and scale equal the float64 min and (max - min) / 15 (stored in float32: within an
    ulp); the codes equal the float64 reference's (±1 only at a near-tie); the round trip is
    within half a step."""
    np.testing.assert_array_equal(mn, lo.astype(np.float32))
    np.testing.assert_allclose(scale, (hi - lo) / 15, rtol=1e-6)
    want, tie = reference_codes(x, mn.astype(np.float64), scale.astype(np.float64))
    diff = np.abs(codes.astype(np.int64) - want)
    assert np.all(diff[~tie] == 0) and np.all(diff <= 1)
    back = codes * scale.astype(np.float64) + mn
    assert np.all(np.abs(back - x) <= scale / 2 * (1 + 1e-5) + 1e-7)


def test_codes_and_scales_equal_numpy():
    """Keys per channel over each group of G = 4 tokens; values per token; a constant group or
    vector has scale 0 and comes back exactly."""
    x = np.asarray(jax.random.normal(jax.random.key(1), (2, 3, 12, 8)), np.float32) * 3
    x[0, 1, 4:8, 2] = 1.5  # one constant key channel of group 1
    x[1, 2, 5] = -0.25  # one constant value vector
    codes, mn, scale = (np.asarray(a) for a in kv_kivi.quantize_per_channel(jnp.asarray(x), 4))
    assert codes.shape == x.shape and mn.shape == scale.shape == (2, 3, 3, 8)
    g = x.astype(np.float64).reshape(2, 3, 3, 4, 8)
    per_group = codes.reshape(g.shape), mn[..., None, :], scale[..., None, :]
    check_quantized(g, *per_group, g.min(-2, keepdims=True), g.max(-2, keepdims=True))
    assert scale[0, 1, 1, 2] == 0 and np.all(codes[0, 1, 4:8, 2] == 0)
    codes, mn, scale = (np.asarray(a) for a in kv_kivi.quantize_per_token(jnp.asarray(x)))
    assert mn.shape == scale.shape == (2, 3, 12, 1)
    x64 = x.astype(np.float64)
    check_quantized(x64, codes, mn, scale, x64.min(-1, keepdims=True), x64.max(-1, keepdims=True))
    assert scale[1, 2, 5, 0] == 0
    back = kv_kivi.dequantize(jnp.asarray(codes), jnp.asarray(mn), jnp.asarray(scale), jnp.float32)
    assert np.all(np.asarray(back)[1, 2, 5] == -0.25)


@pytest.mark.slow
def test_storage_written_in_pieces_equals_numpy():
    """Entries written 5, 1, 1, 4, 3 at a time into a cache of 15 slots (G = 4), row 1 with 2
    slots of left padding holding keys of 100: after each write, the new queries see the new
    entries exact and the others as read back (to rounding); a complete group reads back as its
    own per-channel (keys, the padding left out of the statistics) or per-token (values)
    quantization by a NumPy reference (within half a step, statistics from exactly its
    entries), and the tokens of the incomplete group (the residual) read back exactly."""
    G, S, D = 4, 15, 6
    x = np.array(jax.random.normal(jax.random.key(2), (2, 3, S, D)), np.float32)
    y = np.asarray(jax.random.normal(jax.random.key(3), (2, 3, S, D)), np.float32)
    pad = np.array([0, 2], np.int32)
    x[1, :, :2] = 100.0  # never attended: must not widen group 0's range
    valid = (np.arange(S) >= pad[:, None])[:, None, :, None]  # [B, 1, S, 1]
    zeros = jnp.zeros((2, 3, S, D), jnp.float32)
    cache = KVCache.empty(per_channel=('k',), k=zeros, v=zeros).configured(0, S, 'kivi4', G)
    cache = dataclasses.replace(cache, pad_B=jnp.asarray(pad))
    assert cache.arrays['k'].shape == (2, 3, (4 + 1) * G, D // 2)
    write = jax.jit(lambda c, k, v: c.write(k=k, v=v))
    done = 0
    for T in (5, 1, 1, 4, 3):
        cache, seen, _ = write(
            cache, jnp.asarray(x[..., done : done + T, :]), y[..., done : done + T, :]
        )
        done += T
        seen_k = np.asarray(seen['k'])  # the new entries unrounded, the others as stored
        np.testing.assert_array_equal(seen_k[..., done - T : done, :], x[..., done - T : done, :])
        got_k = np.asarray(cache.read('k', jnp.float32))
        old_k = seen_k[..., : done - T, :]  # jitted there, eager here: within an ulp or two
        np.testing.assert_allclose(old_k, got_k[..., : done - T, :], rtol=1e-6, atol=1e-6)
        full = done // G * G  # tokens in complete groups
        for name, ref, axis in (('k', x, -2), ('v', y, -1)):
            got = np.asarray(cache.read(name, jnp.float32))
            np.testing.assert_array_equal(got[..., full:done, :], ref[..., full:done, :])
            counted = valid[..., :full, :] if name == 'k' else np.ones((1, 1, full, 1), bool)
            g = np.where(counted, ref[..., :full, :], np.nan).astype(np.float64)
            g = g.reshape(2, 3, -1, G, D)
            lo, hi = np.nanmin(g, axis, keepdims=True), np.nanmax(g, axis, keepdims=True)
            step = (hi - lo) / 15
            err = np.abs(got[..., :full, :].reshape(g.shape) - g)
            assert np.all(np.isnan(err) | (err <= step / 2 * (1 + 1e-5) + 1e-6)), name
            # the stored statistics: of exactly each complete group's entries
            for stat, want in (('min', lo), ('scale', step)):
                stored = np.asarray(cache.arrays[f'{name}_{stat}'])
                stored = stored[..., : full // G, :] if name == 'k' else stored[..., :full, 0]
                want = want[..., 0, :] if name == 'k' else want[..., 0].reshape(2, 3, full)
                np.testing.assert_allclose(stored, want, rtol=1e-6, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize('variant', VARIANTS)
def test_kivi4_decodes_within_tolerance_of_float(variant):
    """Teacher-forced logits (a 7-token prefill + 8 steps, 15 tokens) with G = 4 (prefill and
    steps cross three group boundaries) within 25% of the largest |logit| of the float cache's
    (measured: 15.0% GQA, 15.1% MQA, 16.0% MLA; int8: 0.9% to 2.0%; this random tiny model's
    logits are within +-0.43), the same greedy token at >= 80% of the 27 positions (measured:
    89% to 93%); with G = 16 every token stays in the float residual and the logits equal the
    float cache's exactly."""
    cfg = model_config(tiny_config(**VARIANTS[variant], num_layers=2, kv_quant_group=4).model)
    decoder = Decoder(build_model(cfg, seed=3), kv_cache_dtype='kivi4')
    cont = np.asarray(jax.random.randint(jax.random.key(4), (3, 8), 0, cfg.vocab_size), np.int32)
    want = teacher_forced(decoder, cfg, cont, 'float')
    got = teacher_forced(decoder, cfg, cont, 'kivi4')
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 0.25, err
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8
    whole = model_config(tiny_config(**VARIANTS[variant], num_layers=2, kv_quant_group=16).model)
    np.testing.assert_array_equal(teacher_forced(decoder, whole, cont, 'kivi4'), want)


@pytest.mark.parametrize('variant', VARIANTS)
def test_kivi4_cache_bytes_equal_the_formula(variant):
    """The live arrays' bytes equal `kv_cache_bytes(..., 'kivi4')` for lengths that fill their
    last group or not, and a hand count: (ceil(S/G) + 1)·G slots of half a byte per element, a
    min and a scale per key channel per group and per value vector per slot, a float residual
    of G slots; per token as S grows (`kv_cache_bytes_per_layer`) it is half a byte per element
    plus the statistics."""
    for dtype, G, S in (('float32', 4, 8), ('float32', 4, 10), ('bfloat16', 3, 13)):
        cfg = model_config(tiny_config(**VARIANTS[variant], dtype=dtype, kv_quant_group=G).model)
        caches = init_caches(cfg, 3, S, 'kivi4')
        measured = sum(a.nbytes for c in caches for a in c.arrays.values())
        assert measured == 3 * accounting.kv_cache_bytes(cfg, S, dtype, 'kivi4')
        size = 2 if dtype == 'bfloat16' else 4
        slots = (-(-S // G) + 1) * G
        if cfg.attention == 'mla':  # the latent, 16 + 4 wide, per token
            layer = slots * 20 // 2 + 2 * size * slots + G * 20 * size
            asymptote = 20 / 2 + 2 * size
        else:  # K and V of g heads of 8: keys per channel, values per token
            g = cfg.num_kv_heads
            codes, residual = slots * 2 * g * 8 // 2, G * 2 * g * 8 * size
            layer = codes + 2 * size * (slots // G * g * 8 + slots * g) + residual
            asymptote = 2 * g * 8 / 2 + 2 * size * (g * 8 / G + g)
        assert measured == 3 * 2 * layer
        assert accounting.kv_cache_bytes_per_layer(cfg, dtype, 'kivi4') == [asymptote] * 2


def test_refusals_are_one_line():
    """Ring caches (local layers), CLA, an odd cache width and a group of 0 tokens with kivi4."""
    local = tiny_config(attention='gqa', num_kv_heads=2, sliding_window=4, layer_pattern='LG')
    cfg = model_config(local.model)
    with pytest.raises(ValueError, match=r"^config.model.sliding_window=4 with kv_cache_dtype='k"):
        init_caches(cfg, 1, 8, 'kivi4')
    with pytest.raises(ValueError, match=r'^config.model.sliding_window=4 with .*int8 only$'):
        accounting.kv_cache_bytes(cfg, 8, 'float32', 'kivi4')
    cla = model_config(tiny_config(attention='mqa', num_layers=4, kv_share_every=2).model)
    with pytest.raises(ValueError, match=r"^config.model.kv_share_every=2 with kv_cache_dtype='k"):
        Decoder(build_model(cla), kv_cache_dtype='kivi4')
    odd = model_config(tiny_config(attention='mla', kv_lora_rank=15).model)
    with pytest.raises(ValueError, match=r"^kv_cache_dtype='kivi4' packs .* 'latent' has an odd"):
        init_caches(odd, 1, 8, 'kivi4')
    with pytest.raises(ValueError, match=r'^config.model.kv_quant_group must be > 0'):
        model_config(tiny_config(kv_quant_group=0).model)
    with pytest.raises(ValueError, match=r"^kv_cache_dtype must be one of \('float', 'int8', 'k"):
        init_caches(odd, 1, 8, 'int4')
