"""attention_impl='cudnn' (cuDNN fused attention through jax.nn.dot_product_attention): refused
off the GPU in one line; on a GPU, the same function as the float32 einsum path to bfloat16
rounding — forward, gradients, document masks and cached decoding. The GPU tests are skipped on
a machine without one (CI); they run with the fast tier on a GPU (scripts/bench_gpu.sh)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted, tiny_config
from flax import nnx

from lm.infer.decode import Decoder, init_caches
from lm.model.attention import parse_variant
from lm.model.transformer import build_model, model_config
from lm.train.run import check_config
from lm.train.step import documents

ON_GPU = jax.default_backend() == 'gpu'
gpu_only = pytest.mark.skipif(not ON_GPU, reason='needs a GPU (cuDNN fused attention)')
VARIANTS = ['mha', 'gqa2', 'mqa', 'mla']
# cuDNN wants head widths that are multiples of 8: d_h 16 (mha/gqa/mqa), 16 + 16 and 16 (mla).
WIDTHS = dict(d_model=64, mlp_dim=128, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)


def config_for(variant: str, impl: str, dtype: str, num_layers: int = 2):
    return tiny_config(
        **parse_variant(variant), **WIDTHS, attention_impl=impl, dtype=dtype, num_layers=num_layers
    )


def models(variant: str, num_layers: int = 2) -> tuple[nnx.Module, nnx.Module]:
    """(cuDNN in bfloat16, einsum in float32) with the same parameters."""
    fast, ref = (
        build_model(model_config(config_for(variant, impl, dtype, num_layers).model), seed=0)
        for impl, dtype in (('cudnn', 'bfloat16'), ('einsum', 'float32'))
    )
    return fast, ref


def close(got, want, what: str) -> None:
    """bfloat16 has an 8-bit mantissa: within 5% of the reference's largest magnitude."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 0.05, f'{what}: max error {err:.3g} of the largest |value|'


@pytest.mark.skipif(ON_GPU, reason='the refusal is for machines without a GPU')
def test_cudnn_is_refused_without_a_gpu():
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' needs a GPU"):
        check_config(config_for('mha', 'cudnn', 'bfloat16'))


def test_cudnn_needs_a_half_precision_dtype():
    with pytest.raises(ValueError, match=r"'cudnn' needs config.model.dtype bfloat16 or float16"):
        model_config(config_for('mha', 'cudnn', 'float32').model)


@gpu_only
@pytest.mark.parametrize('variant', VARIANTS)
def test_cudnn_forward_and_gradients_match_einsum(variant):
    """One layer: with --xla_gpu_deterministic_ops (tests/conftest.py), XLA fails to compile two
    identically shaped cuDNN backward calls (IndexError 'raw_hash_map<>::at', openxla/xla#46500;
    seen on an H100 with JAX 0.11.2). Training, without that flag, compiles any depth."""
    fast, ref = models(variant, num_layers=1)
    tokens = jax.random.randint(jax.random.key(1), (2, 65), 0, 61)  # inputs of 64: cuDNN's tiles

    def loss_and_grads(model):
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p):
            logp_BTV = jax.nn.log_softmax(nnx.merge(graphdef, p)(tokens[:, :-1]))
            return -jnp.take_along_axis(logp_BTV, tokens[:, 1:, None], axis=-1).mean()

        return jax.jit(jax.value_and_grad(loss))(params)

    close(jitted(fast)(tokens), jitted(ref)(tokens), f'{variant} logits')
    compiled = jitted(fast).lower(tokens).compile().as_text()
    assert '__cudnn$fmha' in compiled, 'cuDNN fused attention is not in the compiled program'
    (_, g_fast), (_, g_ref) = loss_and_grads(fast), loss_and_grads(ref)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref), strict=True):
        close(a, b, f'{variant} gradient')


@gpu_only
@pytest.mark.parametrize('variant', ['gqa2', 'mla'])
def test_cudnn_document_mask_matches_einsum(variant):
    fast, ref = models(variant)
    eos = 0
    tokens = jax.random.randint(jax.random.key(2), (2, 64), 1, 61).at[:, [10, 30, 47]].set(eos)
    segments, positions = documents(tokens, eos)

    close(
        jitted(fast)(tokens, positions, segments),
        jitted(ref)(tokens, positions, segments),
        f'{variant} with document mask',
    )


@gpu_only
@pytest.mark.parametrize('variant', VARIANTS)
def test_cudnn_cached_decoding_matches_einsum(variant):
    fast, ref = models(variant)
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, 24), 0, 61), np.int32)
    pad = np.zeros(2, np.int32)
    outs = []
    for model in (fast, ref):
        decoder = Decoder(model)
        caches = init_caches(decoder.cfg, 2, 32)
        logits, caches = decoder.prefill(decoder.params, tokens[:, :16], pad, caches)
        steps = [logits[:, -1]]
        for i in range(16, 24):
            step, caches = decoder.step(decoder.params, tokens[:, i], pad, caches)
            steps.append(step)
        outs.append(np.stack(steps, 1))
    close(outs[0], outs[1], f'{variant} cached decoding')
