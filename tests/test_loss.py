"""The next-token loss (lm/train/loss.py): values and gradients against a float64 reference and
against autodiff of the textbook formula, and the backward's shape in the compiled program."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiered, tiny_config
from flax import nnx

from lm.model.transformer import build_model, model_config
from lm.train.loss import cross_entropy


def textbook(logits_BTV, targets_BT):
    """logsumexp(l) - l[target], left to autodiff (the loss before lm/train/loss.py)."""
    logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    return logz_BT - jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]


def inputs(V: int, seed: int, scale: float = 3.0):
    """Random logits [2, 5, V] (some -inf: masked vocabulary), targets and token weights."""
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    logits = scale * jax.random.normal(k1, (2, 5, V))
    logits = jnp.where(jax.random.uniform(k4, logits.shape) < 0.05, -jnp.inf, logits)
    targets = jax.random.randint(k2, (2, 5), 0, V)
    # a target is never a masked entry (its loss would be infinite)
    logits = logits.at[jnp.arange(2)[:, None], jnp.arange(5)[None], targets].set(1.0)
    return logits, targets, jax.random.uniform(k3, (2, 5))


def weighted(ce, targets, w):
    return lambda logits: (ce(logits, targets) * w).sum() / w.sum()


@pytest.mark.parametrize(
    'V,seed,scale', tiered([(7, 0, 3.0), (258, 1, 3.0), (1000, 2, 30.0)], fast=[(258, 1, 3.0)])
)
def test_cross_entropy_and_its_gradient_match_a_float64_reference(V, seed, scale):
    """Per-token loss and d(weighted mean)/d logits in float32 against numpy float64 of the same
    inputs: softmax − one-hot, times the token's weight (tolerance 1e-5 relative, 1e-7 abs)."""
    logits, targets, w = inputs(V, seed, scale)
    l64, t, w64 = np.asarray(logits, np.float64), np.asarray(targets), np.asarray(w, np.float64)
    m = l64.max(-1, keepdims=True)
    logz = np.log(np.exp(l64 - m).sum(-1)) + m[..., 0]
    want = logz - np.take_along_axis(l64, t[..., None], -1)[..., 0]
    p = np.exp(l64 - logz[..., None])
    want_grad = (p - np.eye(V)[t]) * (w64 / w64.sum())[..., None]
    got, grad = jax.jit(
        lambda x: (cross_entropy(x, targets), jax.grad(weighted(cross_entropy, targets, w))(x))
    )(logits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('V', tiered([7, 258, 50304], fast=[7]))
def test_cross_entropy_equals_autodiff_of_the_textbook_formula(V):
    """The same loss bits as logsumexp − take_along_axis, and its gradient to within an ulp of
    autodiff's (the backward repeats autodiff's operations; XLA may round exp differently in
    another fusion: rtol 3e-7)."""
    logits, targets, w = inputs(V, 3)
    ours, theirs = (
        jax.jit(jax.value_and_grad(weighted(ce, targets, w))) for ce in (cross_entropy, textbook)
    )
    (loss, grad), (want, want_grad) = ours(logits), theirs(logits)
    assert loss == want
    np.testing.assert_allclose(grad, want_grad, rtol=3e-7, atol=1e-12)


def test_cross_entropy_backward_scatters_nothing():
    """The gradient's program has no scatter (autodiff's transpose of the target gather scatters
    into a float32 zeros of the logits' size; read before XLA, whose CPU backend may rewrite a
    scatter as a loop). Bfloat16 logits give a float32 loss, equal to
    that of the same values upcast first, and a bfloat16 gradient within its rounding of the
    float32 one (2^-8 relative)."""
    logits, targets, w = inputs(258, 4)
    grad = jax.jit(jax.grad(weighted(cross_entropy, targets, w)))
    assert 'stablehlo.scatter' not in grad.lower(logits).as_text()
    textbook_grad = jax.jit(jax.grad(weighted(textbook, targets, w)))
    assert 'stablehlo.scatter' in textbook_grad.lower(logits).as_text()
    l16 = logits.astype(jnp.bfloat16)
    loss16 = jax.jit(cross_entropy)(l16, targets)
    assert loss16.dtype == jnp.float32
    np.testing.assert_array_equal(loss16, jax.jit(cross_entropy)(l16.astype(jnp.float32), targets))
    g16, g32 = grad(l16), grad(l16.astype(jnp.float32))
    assert g16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(g16, np.float32), g32, rtol=2**-8, atol=1e-6)


@pytest.mark.slow
def test_a_bfloat16_model_trains_on_its_heads_logits_as_before():
    """A bfloat16 model with bfloat16 logits (`logits_dtype='compute'`): the loss on the head's
    logits as written (upcast=False, what the trainer passes) is the same bits as the textbook
    loss on the model's float32 output, and the parameter gradients agree within bfloat16
    rounding (2^-7 relative of each gradient's largest entry)."""
    cfg = model_config(
        tiny_config(attention='gqa', num_kv_heads=2, dtype='bfloat16', logits_dtype='compute').model
    )
    graphdef, params = nnx.split(build_model(cfg, seed=0), nnx.Param)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)

    def loss(params, ce, upcast):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1], upcast=upcast)
        return ce(logits, tokens[:, 1:]).mean()

    ours = jax.jit(jax.value_and_grad(functools.partial(loss, ce=cross_entropy, upcast=False)))
    theirs = jax.jit(jax.value_and_grad(functools.partial(loss, ce=textbook, upcast=True)))
    (got, grads), (want, want_grads) = ours(params), theirs(params)
    assert got == want
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        np.testing.assert_allclose(g, w, atol=2**-7 * np.abs(w).max())
