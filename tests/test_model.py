"""Whole-model behaviour: causality, dtypes, parameter names."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiered, tiny_config
from flax import nnx

from lm.model.transformer import build_model, model_config

VARIANTS = {
    'mha': dict(attention='mha'),
    'gqa2': dict(attention='gqa', num_kv_heads=2),
    'mqa': dict(attention='mqa'),
    'mla': dict(attention='mla', q_lora_rank=8),
}


@pytest.mark.parametrize(
    'variant, impl',  # the full suite crosses every variant with both implementations
    tiered(
        [(v, i) for v in VARIANTS for i in ('einsum', 'dot_product')],
        # one grouped case (MHA is GQA at g = H) and MLA; in tests/test_attention.py the
        # fast reference tests hold the default implementation to a causal float64 reference
        # and test_backends_agree the other one to it
        fast=[('gqa2', 'dot_product'), ('mla', 'einsum')],
    ),
)
def test_causality(variant, impl):
    """Changing tokens after position t changes no logit at or before t (atol 1e-6)."""
    cfg = model_config(tiny_config(**VARIANTS[variant], attention_impl=impl).model)
    model = build_model(cfg)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, cfg.vocab_size)
    t = 6
    changed = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 7) % cfg.vocab_size)
    a, b = model(tokens), model(changed)
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3


@pytest.mark.parametrize('variant', tiered(VARIANTS, fast=('mha', 'gqa2', 'mla')))
def test_bfloat16_compute_keeps_float32_params(variant):
    cfg32 = model_config(tiny_config(**VARIANTS[variant]).model)
    cfg16 = model_config(tiny_config(**VARIANTS[variant], dtype='bfloat16').model)
    m32, m16 = build_model(cfg32), build_model(cfg16)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(m16, nnx.Param))} == {jnp.dtype('float32')}
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, cfg32.vocab_size)
    logits16 = m16(tokens)
    assert logits16.dtype == jnp.float32
    # bfloat16 has an 8-bit mantissa: same function to within a few percent of the logit scale.
    np.testing.assert_allclose(logits16, m32(tokens), atol=0.05 * float(jnp.abs(m32(tokens)).max()))


def test_forward_shapes_and_names():
    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2, tie_embeddings=False).model)
    model = build_model(cfg)
    assert model(jnp.zeros((2, 16), jnp.int32)).shape == (2, 16, cfg.vocab_size)
    names = {'/'.join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    for n in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
        assert f'blocks/0/attn/{n}/kernel' in names
    assert 'lm_head/kernel' in names and 'embed' in names
    mla = build_model(model_config(tiny_config(attention='mla', q_lora_rank=8).model))
    names = {'/'.join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(mla, nnx.Param))}
    for n in (
        'q_a_proj',
        'q_a_layernorm',
        'q_b_proj',
        'kv_a_proj_with_mqa',
        'kv_a_layernorm',
        'kv_b_proj',
        'o_proj',
    ):
        assert any(name.startswith(f'blocks/1/attn/{n}/') for name in names), n


def test_every_param_has_logical_axes():
    model = build_model(model_config(tiny_config(attention='mla', q_lora_rank=8).model))
    for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        assert len(leaf.get_metadata()['axes']) == leaf[...].ndim, path


def test_same_seed_same_params_different_seed_different():
    cfg = model_config(tiny_config(num_kv_heads=2).model)
    a, b, c = build_model(cfg, 0), build_model(cfg, 0), build_model(cfg, 1)
    leaves = [jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (a, b, c)]
    assert all(np.array_equal(x, y) for x, y in zip(leaves[0], leaves[1], strict=True))
    assert not np.array_equal(leaves[0][0], leaves[2][0])


def test_fused_dense_equals_separate_projections():
    """fused_dense gives each layer's own output (float32, 1e-6), and the same bits whether it
    concatenates the kernels per call or reads them as `fuse_kernels` stored them."""
    from lm.model.layers import Dense, FusedKernel, fuse_kernels, fused_dense

    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2).model)
    rngs = nnx.Rngs(3)

    class Owner(nnx.Module):
        fused_groups = (('q', 'k', 'v'),)

        def __init__(self):
            self.q = Dense(
                (32,), (4, 8), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs, use_bias=True
            )
            self.k = Dense((32,), (2, 8), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs)
            self.v = Dense(
                (32,), (2, 8), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs, use_bias=True
            )

    owner = Owner()
    layers = [owner.q, owner.k, owner.v]
    for layer in (owner.q, owner.v):
        layer.bias[...] = jax.random.normal(jax.random.key(5), layer.bias[...].shape)
    x = jax.random.normal(jax.random.key(4), (2, 5, 32))
    per_call = fused_dense(x, owner, ('q', 'k', 'v'))
    for fused, layer in zip(per_call, layers, strict=True):
        np.testing.assert_allclose(fused, layer(x), atol=1e-6, rtol=1e-6)
    fuse_kernels(owner)
    assert isinstance(owner.q_k_v_fused, FusedKernel)
    assert owner.q_k_v_fused[...].shape == (32, 8, 8)
    for stored, fused in zip(fused_dense(x, owner, ('q', 'k', 'v')), per_call, strict=True):
        np.testing.assert_array_equal(stored, fused)


@pytest.mark.parametrize(
    'dtype,out_dtype', [('float32', 'float32'), ('bfloat16', 'float32'), ('bfloat16', 'bfloat16')]
)
def test_head_logits_and_their_gradients_match_a_float64_reference(dtype, out_dtype):
    """head_logits: logits x · tableᵀ in `out_dtype`; its hand-written backward gives autodiff's
    gradients (float64 numpy reference of the same bf16-rounded inputs; tolerance 1e-5
    relative in float32, 2e-2 in bfloat16, whose backward rounds the cotangent to bf16, and
    bfloat16 logits within their own rounding, 2^-8 relative)."""
    from lm.model.layers import head_logits

    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (2, 5, 16)).astype(dtype)
    w = jax.random.normal(kw, (40, 16)).astype(dtype)
    g = jax.random.normal(kg, (2, 5, 40)).astype(out_dtype)
    logits, vjp = jax.vjp(lambda x, w: head_logits(x, w, jnp.dtype(out_dtype)), x, w)
    gx, gw = vjp(g)
    assert logits.dtype == out_dtype and gx.dtype == x.dtype and gw.dtype == w.dtype
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    tol = 1e-5 if dtype == 'float32' else 2e-2
    want = x64 @ w64.T
    rel = 1e-5 if out_dtype == 'float32' else 2**-8
    np.testing.assert_allclose(np.asarray(logits, np.float64), want, rtol=rel, atol=1e-5)
    for got, want in ((gx, g64 @ w64), (gw, np.einsum('btv,bte->ve', g64, x64))):
        scale = np.abs(want).max()
        np.testing.assert_allclose(np.asarray(got, np.float64) / scale, want / scale, atol=tol)


@pytest.mark.parametrize('tie', [True, False])
def test_logits_dtype_sets_the_heads_output_for_tied_and_untied_heads(tie):
    """config.model.logits_dtype: 'float32' keeps the head's product in float32 (tied or not);
    'compute' rounds it to the bfloat16 compute dtype, within 2^-8 relative of the float32 one;
    the model returns float32 either way, or with upcast=False the head's output as written
    (what the training loss reads). A bad value is refused naming the key."""
    outs = {}
    for logits_dtype in ('float32', 'compute'):
        cfg = model_config(
            tiny_config(
                attention='mha', dtype='bfloat16', tie_embeddings=tie, logits_dtype=logits_dtype
            ).model
        )
        model = build_model(cfg, seed=0)
        tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, cfg.vocab_size)
        jaxpr = jax.make_jaxpr(model.__call__)(tokens)
        heads = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'custom_vjp_call']
        assert heads[-1].outvars[0].aval.dtype == (
            jnp.float32 if logits_dtype == 'float32' else jnp.bfloat16
        )
        logits = jax.jit(model.__call__)(tokens)
        assert logits.dtype == jnp.float32
        as_written = jax.jit(functools.partial(model.__call__, upcast=False))(tokens)
        assert as_written.dtype == heads[-1].outvars[0].aval.dtype  # the loss upcasts them
        np.testing.assert_array_equal(as_written.astype(jnp.float32), logits)
        outs[logits_dtype] = np.asarray(logits, np.float64)
    np.testing.assert_allclose(outs['compute'], outs['float32'], rtol=2**-8, atol=1e-6)
    assert not np.array_equal(outs['compute'], outs['float32'])
    with pytest.raises(ValueError, match=r'^config.model.logits_dtype must be one of'):
        model_config(tiny_config(attention='mha', logits_dtype='bfloat16').model)


def test_tied_head_backward_multiplies_in_the_compute_dtype():
    """In a bfloat16 model the tied head's backward matmuls take bfloat16 operands (float32
    ones run as TF32 on a GPU at half the rate); its forward keeps float32 logits."""
    from lm.model.layers import head_logits

    x = jnp.ones((2, 3, 8), jnp.bfloat16)
    w = jnp.ones((12, 8), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: head_logits(x, w).sum(), argnums=(0, 1)))(x, w)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'dot_general']
    assert len(dots) >= 2
    for e in dots:
        assert [v.aval.dtype for v in e.invars] == [jnp.bfloat16, jnp.bfloat16], e
