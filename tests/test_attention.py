"""Attention variants against the float64 reference in tests/reference.py (outputs, and the
weights they sow for analysis, with and without a KV cache), and the exact equivalence between
GQA / MQA and an MHA that repeats their K/V heads."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from conftest import sown_weights, tiered, tiny_config
from flax import nnx

from lm.model.attention import VARIANTS, make_attention, set_absorb, variant
from lm.model.transformer import build_model, model_config

CASES = {
    'mha': dict(attention='mha'),
    'gqa2': dict(attention='gqa', num_kv_heads=2),
    'mqa': dict(attention='mqa'),
    'gqa2_bias_hd12': dict(attention='gqa', num_kv_heads=2, qkv_bias=True, head_dim=12),
    'mla': dict(attention='mla'),
    'mla_qlora': dict(attention='mla', q_lora_rank=12),
    'gqa2_obias_llama3': dict(
        attention='gqa',
        num_kv_heads=2,
        qkv_bias=True,
        o_bias=True,
        rope_scaling='llama3',
        rope_original_max_len=64,  # head_dim 8: one frequency in each llama3 regime
    ),
    'mla_qlora_latent_eps': dict(attention='mla', q_lora_rank=12, latent_norm_eps=0.5),
    'mla_rope_heads2': dict(attention='mla', rope_heads=2),  # heads 0, 1 read key 0; 2, 3 key 1
}
# float32 module vs float64 reference on O(1) activations.
ATOL, RTOL = 2e-5, 1e-4


def randomize_biases_and_scales(module, seed=0):
    """Biases (0 at init) and norm scales (1 at init) made random: a reference that leaves one
    out, or applies a norm where a unit scale hides the difference (before or after RoPE, which
    keeps the RMS), fails."""
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    for _, leaf in nnx.iter_graph(module):
        axes = leaf.get_metadata().get('axes', ()) if isinstance(leaf, nnx.Param) else ()
        if (axes[-1:] == ('head_dim',) and len(axes) == 2) or axes == ('embed',):  # biases
            leaf[...] = jax.random.normal(next(keys), leaf[...].shape)
        elif axes == ('norm',):
            leaf[...] = 1 + 0.5 * jax.random.normal(next(keys), leaf[...].shape)


def inputs(cfg, B=2, T=16, seed=0):
    kx, kp = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (B, T, cfg.d_model), jnp.float32)
    start = jax.random.randint(kp, (B, 1), 0, 100)  # RoPE must use the given positions
    return x, start + jnp.arange(T)[None]


# MHA is the grouped implementation at g = H: the fast tier's grouped case is GQA-2 (MHA's own
# case runs in the full suite, and in the fast tier as test_model_matches_reference's)
@pytest.mark.parametrize('case', tiered(CASES, fast=('gqa2', 'mla', 'mla_rope_heads2')))
def test_attention_matches_reference(case):
    cfg = model_config(tiny_config(**CASES[case]).model)
    attn = make_attention(cfg, rngs=nnx.Rngs(0))
    randomize_biases_and_scales(attn)
    x, pos = inputs(cfg)
    want = reference.attention(attn, cfg, np.asarray(x, np.float64), np.asarray(pos, np.float64))
    np.testing.assert_allclose(attn(x, pos)[0], want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    'case',
    tiered(CASES, fast=('mha', 'gqa2_obias_llama3', 'mla_qlora_latent_eps', 'mla_rope_heads2')),
)
def test_model_matches_reference(case):
    cfg = model_config(tiny_config(**CASES[case], tie_embeddings=case != 'mha').model)
    model = build_model(cfg, seed=1)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, cfg.vocab_size)
    want = reference.forward(model, cfg, np.asarray(tokens))
    np.testing.assert_allclose(model(tokens), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('case', tiered(CASES, fast=('gqa2_bias_hd12', 'mla')))
def test_backends_agree(case):
    cfg = model_config(tiny_config(**CASES[case]).model)
    x, pos = inputs(cfg)
    outs = [
        make_attention(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))(x, pos)[0]
        for impl in ('einsum', 'dot_product')
    ]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_cases_cover_every_registered_variant():
    assert {CASES[c]['attention'] for c in CASES} == set(VARIANTS)


@pytest.mark.parametrize('case', tiered(CASES, fast=('mha', 'gqa2', 'mla_rope_heads2')))
def test_sown_weights_match_reference(case):
    """The weights a variant sows for analysis, against float64 softmax(q·k) written from the
    module's parameters (atol 1e-5 on weights in [0, 1]): on the training path, and on the
    cached path (T tokens prefilled into a cache of T + 3 slots; MLA absorbed and expanded),
    whose empty slots get weight exactly 0 and whose output is the training path's."""
    cfg = model_config(tiny_config(**CASES[case]).model)
    attn = make_attention(cfg, rngs=nnx.Rngs(0))
    randomize_biases_and_scales(attn)
    x, pos = inputs(cfg)
    B, T = pos.shape
    want = reference.weights(attn, cfg, np.asarray(x, np.float64), np.asarray(pos, np.float64))
    (y, _), got = sown_weights(attn, x, pos)
    assert got.shape == (B, cfg.num_heads, T, T) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    for absorb in (True, False):
        set_absorb(attn, absorb)
        cache = variant(cfg).init_cache(cfg, B, T + 3, jnp.float32)
        (y_cached, cache), got = sown_weights(attn, x, pos, cache=cache)
        np.testing.assert_allclose(got[..., :T], want, atol=1e-5, err_msg=f'absorb={absorb}')
        np.testing.assert_array_equal(got[..., T:], 0)
        np.testing.assert_allclose(y_cached, y, atol=ATOL, rtol=RTOL)
        assert int(cache.slot) == T


def outputs(seed=0, **model):
    cfg = model_config(tiny_config(**model).model)
    x, pos = inputs(cfg)
    return cfg, make_attention(cfg, rngs=nnx.Rngs(seed)), x, pos


@pytest.mark.parametrize(
    'model', [dict(attention='gqa', num_kv_heads=2), dict(attention='mqa')], ids=['gqa2', 'mqa']
)
def test_grouped_equals_mha_with_contiguously_repeated_kv_heads(model):
    """Query head i reads KV head i // (H/g): an MHA (a module of its own, G = H) whose K/V heads
    repeat the GQA (or MQA) heads contiguously computes the same weights and outputs. The
    projections agree bit for bit; the score einsum runs as differently shaped XLA dots
    ([G, R·T] rows against [G] key heads), so a few float32 ulps apart (atol 1e-6)."""
    cfg, grouped, x, pos = outputs(**model)
    _, mha, _, _ = outputs(seed=1, attention='mha')
    for name in ('q_proj', 'o_proj'):
        getattr(mha, name).kernel[...] = getattr(grouped, name).kernel[...]
    R = cfg.num_heads // cfg.num_kv_heads
    for name in ('k_proj', 'v_proj'):
        getattr(mha, name).kernel[...] = jnp.repeat(getattr(grouped, name).kernel[...], R, axis=1)
    (y_mha, _), w_mha = sown_weights(mha, x, pos)
    (y_grouped, _), w_grouped = sown_weights(grouped, x, pos)
    np.testing.assert_allclose(w_mha, w_grouped, atol=1e-6, rtol=0)
    np.testing.assert_allclose(y_mha, y_grouped, atol=1e-6, rtol=0)


def test_kv_projections_hold_only_kv_heads():
    cfg, gqa, x, _ = outputs(attention='gqa', num_kv_heads=2)
    assert gqa.k_proj.kernel.shape == (cfg.d_model, 2, cfg.head_dim)
    assert gqa.q_proj.kernel.shape == (cfg.d_model, 4, cfg.head_dim)
    k_BTGD, v_BTGD = gqa.kv_projections(x)
    want_k = np.einsum('bte,egd->btgd', np.asarray(x, np.float64), reference.p(gqa.k_proj.kernel))
    want_v = np.einsum('bte,egd->btgd', np.asarray(x, np.float64), reference.p(gqa.v_proj.kernel))
    np.testing.assert_allclose(k_BTGD, want_k, atol=1e-5)  # float32, before RoPE
    np.testing.assert_allclose(v_BTGD, want_v, atol=1e-5)


def test_head_dim_independent_of_d_model():
    cfg, attn, x, pos = outputs(attention='gqa', num_kv_heads=2, head_dim=20)
    assert attn.q_proj.kernel.shape == (32, 4, 20)
    assert attn(x, pos)[0].shape == x.shape
