"""Attention variants against the float64 reference in tests/reference.py, and the exact
equivalences between MHA, GQA and MQA."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from conftest import tiny_config
from flax import nnx

from lm.model.attention import make_attention
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
}
# float32 module vs float64 reference on O(1) activations.
ATOL, RTOL = 2e-5, 1e-4


def randomize_biases(module, seed=0):
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    for _, leaf in nnx.iter_graph(module):
        axes = leaf.get_metadata().get('axes', ()) if isinstance(leaf, nnx.Param) else ()
        if (axes[-1:] == ('head_dim',) and len(axes) == 2) or axes == ('embed',):  # biases
            leaf[...] = jax.random.normal(next(keys), leaf[...].shape)


def inputs(cfg, B=2, T=16, seed=0):
    kx, kp = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (B, T, cfg.d_model), jnp.float32)
    start = jax.random.randint(kp, (B, 1), 0, 100)  # RoPE must use the given positions
    return x, start + jnp.arange(T)[None]


@pytest.mark.parametrize('case', CASES)
def test_attention_matches_reference(case):
    cfg = model_config(tiny_config(**CASES[case]).model)
    attn = make_attention(cfg, rngs=nnx.Rngs(0))
    randomize_biases(attn)
    x, pos = inputs(cfg)
    want = reference.attention(attn, cfg, np.asarray(x, np.float64), np.asarray(pos, np.float64))
    np.testing.assert_allclose(attn(x, pos), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('case', CASES)
def test_model_matches_reference(case):
    cfg = model_config(tiny_config(**CASES[case], tie_embeddings=case != 'mha').model)
    model = build_model(cfg, seed=1)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, cfg.vocab_size)
    want = reference.forward(model, cfg, np.asarray(tokens))
    np.testing.assert_allclose(model(tokens), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('case', CASES)
def test_backends_agree(case):
    cfg = model_config(tiny_config(**CASES[case]).model)
    x, pos = inputs(cfg)
    outs = [
        make_attention(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))(x, pos)
        for impl in ('einsum', 'dot_product')
    ]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def outputs(seed=0, **model):
    cfg = model_config(tiny_config(**model).model)
    x, pos = inputs(cfg)
    return cfg, make_attention(cfg, rngs=nnx.Rngs(seed)), x, pos


def test_gqa_with_g_equal_heads_is_exactly_mha():
    _, mha, x, pos = outputs(attention='mha')
    _, gqa, _, _ = outputs(attention='gqa', num_kv_heads=4)
    for a, b in zip(jax.tree.leaves(nnx.state(mha)), jax.tree.leaves(nnx.state(gqa)), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(mha(x, pos), gqa(x, pos))


@pytest.mark.parametrize(
    'model', [dict(attention='gqa', num_kv_heads=2), dict(attention='mqa')], ids=['gqa2', 'mqa']
)
def test_grouped_equals_mha_with_contiguously_repeated_kv_heads(model):
    """Query head i reads KV head i // (H/g): an MHA whose K/V heads repeat the GQA (or MQA)
    heads contiguously computes the same function (up to float32 rounding of another einsum)."""
    cfg, grouped, x, pos = outputs(**model)
    _, mha, _, _ = outputs(attention='mha')
    for name in ('q_proj', 'o_proj'):
        getattr(mha, name).kernel[...] = getattr(grouped, name).kernel[...]
    R = cfg.num_heads // cfg.num_kv_heads
    for name in ('k_proj', 'v_proj'):
        getattr(mha, name).kernel[...] = jnp.repeat(getattr(grouped, name).kernel[...], R, axis=1)
    np.testing.assert_allclose(mha(x, pos), grouped(x, pos), atol=1e-6, rtol=1e-6)


def test_kv_projections_hold_only_kv_heads():
    cfg, gqa, _, _ = outputs(attention='gqa', num_kv_heads=2)
    assert gqa.k_proj.kernel.shape == (cfg.d_model, 2, cfg.head_dim)
    assert gqa.q_proj.kernel.shape == (cfg.d_model, 4, cfg.head_dim)


def test_head_dim_independent_of_d_model():
    cfg, attn, x, pos = outputs(attention='gqa', num_kv_heads=2, head_dim=20)
    assert attn.q_proj.kernel.shape == (32, 4, 20)
    assert attn(x, pos).shape == x.shape
