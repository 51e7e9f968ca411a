"""config.data.document_mask: attention stays inside each EOS-separated document of a packed
window, for every attention variant, and equals running each document on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jitted, tiny_config
from flax import nnx

from lm.model.attention import parse_variant
from lm.model.transformer import build_model, model_config, no_constraint
from lm.train.step import StepContext, cross_entropy, documents, token_losses

EOS = 60  # the last id of tiny_config's vocabulary of 61


def test_documents_marks_segments_and_restarts_positions():
    tokens = jnp.asarray([[5, 6, EOS, 7, EOS, 8, 9], [EOS, 1, 2, 3, 4, EOS, EOS]])
    segments, positions = documents(tokens, EOS)
    np.testing.assert_array_equal(segments, [[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 2]])
    np.testing.assert_array_equal(positions, [[0, 1, 2, 0, 1, 0, 1], [0, 0, 1, 2, 3, 4, 0]])


def packed_rows(lengths_per_row, seed=0):
    """Rows of documents (each ending in EOS, but a row's last, which the window cuts)."""
    rng = np.random.default_rng(seed)
    rows = []
    for lengths in lengths_per_row:
        docs = [np.append(rng.integers(0, EOS, n - 1), EOS) for n in lengths]
        docs[-1] = rng.integers(0, EOS, lengths[-1])
        rows.append(docs)
    return rows, jnp.asarray(np.stack([np.concatenate(docs) for docs in rows]))


def alone(model, docs, T):
    """Each document run on its own, from position 0, as the first tokens of a causal row
    (what follows a token cannot change its output): [documents, T, V]."""
    padded = np.stack([np.pad(doc, (0, T - len(doc))) for doc in docs])
    return np.asarray(jitted(model)(jnp.asarray(padded)))


@pytest.mark.parametrize(
    'spec,impl',
    [('mha', 'einsum'), ('gqa2', 'einsum'), ('mqa', 'einsum'), ('mla', 'einsum')]
    + [('gqa2', 'dot_product')],
)
def test_document_mask_equals_each_document_alone(spec, impl):
    cfg = model_config(tiny_config(**parse_variant(spec), attention_impl=impl).model)
    model = build_model(cfg, seed=0)
    rows, tokens_BT = packed_rows([(5, 8, 3, 6), (10, 12)])
    T = tokens_BT.shape[1]
    segments_BT, positions_BT = documents(tokens_BT, EOS)
    run = jitted(model)
    packed = np.asarray(run(tokens_BT, positions_BT, segments_BT))
    docs = [doc for row in rows for doc in row]
    want = alone(model, docs + [np.asarray(tokens_BT[0])], T)  # + a row without the mask
    i = 0
    for r, row in enumerate(rows):
        start = 0
        for doc in row:
            got = packed[r, start : start + len(doc)]
            np.testing.assert_allclose(got, want[i, : len(doc)], atol=2e-5)  # float32
            start, i = start + len(doc), i + 1
    plain = want[-1]  # without the mask, later documents see earlier ones
    assert np.abs(plain[5:13] - want[1, :8]).max() > 1e-3


@pytest.mark.slow
def test_training_loss_with_document_mask_is_each_documents_own_loss():
    """The production path: `token_losses` with the run's EOS (set by `assemble` when
    config.data.document_mask). A document's last token (EOS) predicts the next document's
    first from its own document alone."""
    model = build_model(model_config(tiny_config(**parse_variant('gqa2')).model), seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    # what `token_losses` reads of the step context: the graph, the activation constraint and
    # the document EOS (the rest concerns optimizer and shardings)
    ctx = StepContext(graphdef, *[None] * 5, no_constraint, document_eos=EOS)
    rows, batch_BT1 = packed_rows([(4, 9, 4), (7, 10)], seed=1)  # T + 1 = 17 tokens a row
    losses = np.asarray(jax.jit(lambda p, b: token_losses(ctx, p, b))(params, batch_BT1))
    T = batch_BT1.shape[1] - 1
    docs = [doc for row in rows for doc in row]
    logits = alone(model, docs, T + 1)
    i = 0
    for r, row in enumerate(rows):
        start = 0
        for doc in row:
            n = min(len(doc), T - start)  # targets of this document's tokens in the window
            targets = np.asarray(batch_BT1[r, start + 1 : start + n + 1])
            want = cross_entropy(jnp.asarray(logits[i, :n]), jnp.asarray(targets))
            np.testing.assert_allclose(losses[r, start : start + n], want, atol=2e-5)
            start, i = start + len(doc), i + 1
