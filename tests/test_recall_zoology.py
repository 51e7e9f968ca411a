"""MQAR as Zoology builds it (`source='mqar_zoology'`): every answer re-derived from its row in
plain Python and absent from the input, the no-lookup baseline at 1/pairs (and the same check
catching the leaky 'mqar' generator), determinism by seed, and the step feeding BLANK where an
answer is a label only."""

import re

import jax
import numpy as np
import pytest
from conftest import ROOT, tiny_config

from lm.config import with_values
from lm.data.corpus import load_corpus
from lm.data.recall import BLANK, LABEL_FLAG, TARGET_FLAG, RecallTask, unpack
from lm.data.recall_baseline import no_lookup_baseline, no_lookup_scores


def zoology_config(**overrides):
    config = tiny_config(attention='mha')
    config.model.vocab_size = 0
    config.data.update(
        source='mqar_zoology',
        seq_len=24,
        recall_pairs=4,
        recall_vocab=1024,
        recall_eval_examples=40,
    )
    return with_values(config, overrides)


def check_row(row, pairs, vocab):
    """Each key once as a query, its answer right after it, scored and a label only; the
    model's input holds every value only at its own pair (never after a query)."""
    tokens = [int(t) & (LABEL_FLAG - 1) for t in row]
    kv = {tokens[i]: tokens[i + 1] for i in range(0, 2 * pairs, 2)}
    assert len(kv) == pairs and len(set(kv.values())) == pairs
    assert all(1 <= k < vocab // 2 <= v < vocab - 1 for k, v in kv.items())
    answers = [i for i, t in enumerate(row) if t >= TARGET_FLAG]
    assert all(int(row[i]) & LABEL_FLAG for i in answers)
    assert sorted(tokens[a - 1] for a in answers) == sorted(kv)
    for a in answers:
        assert (a - 1 - 2 * pairs) % 2 == 0 and tokens[a] == kv[tokens[a - 1]]
    inputs, targets = unpack(np.asarray(row))
    for a in answers:
        assert targets[a - 1] == tokens[a] and inputs[a] == BLANK
        assert [i for i, t in enumerate(inputs) if t == tokens[a]] == [
            2 * list(kv).index(tokens[a - 1]) + 1
        ]
    rest = set(range(2 * pairs, len(row))) - set(answers) - {a - 1 for a in answers}
    assert all(tokens[i] == BLANK for i in rest)


def test_rows_rederived_and_no_answer_in_the_input():
    corpus = load_corpus(zoology_config().data)
    rows, _ = corpus.task.split('validation')
    assert rows.shape == (40, 25) and corpus.tokenizer.vocab_size == 1024
    for row in rows:
        check_row(row, 4, 1024)
    for row in corpus.task.call_batch(seed=3, step=7, steps=1, batch_size=8):
        check_row(row, 4, 1024)
    # Queries at random slots in random order: the first query asks every pair equally often.
    rows, _ = corpus.task.rows([0, 9], 4000)
    first = [np.flatnonzero(r >= TARGET_FLAG)[0] - 1 for r in rows]
    pair = [list(r[0:8:2]).index(r[q]) for r, q in zip(rows, first, strict=True)]
    assert np.bincount(pair).min() / 4000 > 0.2


@pytest.mark.parametrize('pairs,seq_len', [(4, 24), (16, 64)])
def test_no_lookup_baseline_is_one_over_pairs(pairs, seq_len):
    task = RecallTask(zoology_config(**{'data.recall_pairs': pairs, 'data.seq_len': seq_len}).data)
    fit, test = task.rows([0, 1], 4000)[0], task.rows([0, 2], 4000)[0]
    scores = no_lookup_scores(fit, test, pairs)
    assert max(scores.values()) == no_lookup_baseline(fit, test, pairs)
    assert no_lookup_baseline(fit, test, pairs) <= 1 / pairs + 0.02, scores


def test_no_lookup_baseline_catches_the_leaky_generator():
    """The old 'mqar' rows ask early pairs first: copying by query rank beats 1/pairs by far."""
    data = zoology_config(**{'data.source': 'mqar', 'data.seq_len': 32}).data
    data.update(recall_pairs=8, recall_vocab=64)
    task = RecallTask(data)
    fit, test = task.rows([0, 1], 2000)[0], task.rows([0, 2], 2000)[0]
    assert no_lookup_scores(fit, test, 8)['copy_by_rank'] > 1 / 8 + 0.05


def test_same_seed_same_rows_heldout_fixed_by_recall_seed():
    task = RecallTask(zoology_config().data)
    again = RecallTask(zoology_config(seed=5).data)  # the run's seed leaves held-out rows alone
    np.testing.assert_array_equal(task.split('validation')[0], again.split('validation')[0])
    other = RecallTask(zoology_config(**{'data.recall_seed': 1}).data)
    assert (task.split('validation')[0] != other.split('validation')[0]).any(axis=1).all()
    one = task.call_batch(seed=0, step=4, steps=1, batch_size=8)
    np.testing.assert_array_equal(one, again.call_batch(seed=0, step=4, steps=1, batch_size=8))
    assert (task.call_batch(seed=1, step=4, steps=1, batch_size=8) != one).any(axis=1).all()


def test_bad_settings_refused_in_one_line():
    for key, value, words in [
        ('data.recall_pairs', 7, 'config.data.recall_pairs=7 must be >= 1 with 4 x pairs'),
        ('data.recall_vocab', 8, 'config.data.recall_vocab=8 must hold recall_pairs=4'),
        ('data.recall_train_pairs', '2,4', "recall_train_pairs='2,4' applies to source='mqar'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            load_corpus(zoology_config(**{key: value}).data)


@pytest.mark.parametrize('variant', ['mha', 'gqa2', 'mqa', 'mla'])
def test_config_builds(variant):
    from lm.config import load_config_file
    from lm.model.transformer import check_model_config
    from lm.train.run import check_config

    path = str(ROOT / 'configs' / 'recall' / 'mqar_zoology.py')
    config = check_config(load_config_file(path, variant))
    assert config.data.source == 'mqar_zoology' and config.data.recall_vocab >= 1024
    check_model_config(config.model)


@pytest.mark.slow
def test_step_feeds_blank_where_the_answer_is_a_label():
    """The training loss equals a float64 reference on `unpack`'s inputs (answers hidden) and
    differs from the loss with the answers left in the input."""
    from flax import nnx

    from lm.train.run import assemble
    from lm.train.step import batch_loss, init_state

    config = zoology_config(**{'train.batch_size': 8})
    run = assemble(config, data=True)
    params = init_state(run.ctx, run.model_cfg, 0)['params']
    rows = run.corpus.task.call_batch(seed=0, step=0, steps=1, batch_size=8)
    model = nnx.merge(run.ctx.graphdef, jax.tree.map(np.asarray, params))

    def reference(inputs, targets):
        logits = np.asarray(model(inputs), np.float64)
        top = logits.max(-1, keepdims=True)
        logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
        nll = logz - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
        return nll[rows[:, 1:] >= TARGET_FLAG].mean()

    inputs, targets = unpack(rows)
    with jax.set_mesh(run.mesh):
        got = float(jax.jit(lambda p, b: batch_loss(run.ctx, p, b))(params, rows))
    np.testing.assert_allclose(got, reference(inputs, targets), rtol=1e-5)
    leaked = (rows & (LABEL_FLAG - 1))[:, :-1]
    assert abs(got - reference(leaked, targets)) > 1e-4


def test_sign_flip_p_counts_sign_patterns():
    from lm.experiments.capacity import sign_flip_p

    assert sign_flip_p([0.1] * 8) == pytest.approx(2 / 256)  # only all-plus and all-minus
    assert sign_flip_p([0.3, -0.1, 0.2]) == pytest.approx(4 / 8)  # |mean| ≥ 0.4/3: 4 of 8
    assert sign_flip_p([1.0, -1.0]) == 1.0


def test_capacity_table_tests_each_question_as_its_own_family():
    from lm.experiments.capacity import capacity_table

    rows = [
        {
            'point': 'x',
            'kv_dims': d,
            'kv_bytes_per_token': 8 * d,
            'pairs': p,
            'seed': s,
            'eval_recall_accuracy': 1.0 - (0.3 if (d, p) == (16, 8) else 0.0) - 0.01 * (s % 3),
        }
        for p in (2, 8)
        for d in (64, 16)
        for s in range(8)
    ]
    text = capacity_table(rows)
    row = next(line for line in text.splitlines() if line.startswith('| 8 |'))
    assert row.startswith('| 8 | 99.1% [') and '8/8 ≥ 90% | 69.1% [' in row and '0/8' in row
    assert 'lowest 98.0%, 8/8' in row and 'lowest 68.0%, 0/8' in row  # the gate's seed
    assert '(2 comparisons, Holm over them)' in text  # KV at 2 and 8 pairs; pairs at each KV
    assert '| KV 16, 8 pairs | KV 64, 8 pairs | -30.0 | [-30.0, -30.0] |' in text
    # one pairs count run: the KV family has one comparison, the pairs family is left out
    text = capacity_table([r for r in rows if r['pairs'] == 2])
    assert '(1 comparison, Holm over them)' in text and 'Question 2' not in text
    # a cell missing at the fewest pairs: the pairs family says so
    text = capacity_table([r for r in rows if (r['pairs'], r['kv_dims']) != (2, 16)])
    assert 'KV 16' in text and '(1 comparison, Holm over them)' in text
    # one cell (a calibration gate run alone): its grid row, no family
    text = capacity_table([r for r in rows if (r['pairs'], r['kv_dims']) == (8, 64)])
    assert text.splitlines()[-1].startswith('| 8 | 99.1% [') and 'Question' not in text


def test_capacity_table_compares_layouts_of_equal_kv_dims_by_head_width():
    """With kv_heads and head_dim columns, arms of equal KV dims are told apart (2×16 against
    1×32), each is tested against the largest arm, and the wider head against the narrower
    forms a family of its own."""
    from lm.experiments.capacity import capacity_table

    layouts = {(4, 16): 0.97, (2, 16): 0.25, (1, 32): 0.96}
    rows = [
        {
            'point': 'x',
            'kv_dims': h * hd,
            'kv_heads': h,
            'head_dim': hd,
            'kv_bytes_per_token': 8 * h * hd,
            'pairs': 8,
            'seed': s,
            'eval_recall_accuracy': acc - 0.01 * (s % 2),
        }
        for (h, hd), acc in layouts.items()
        for s in range(8)
    ]
    text = capacity_table(rows)
    assert text.splitlines()[0] == (
        '| pairs | KV 4×16 = 64 dims (512 B/token) | KV 1×32 = 32 dims (256 B/token) | '
        'KV 2×16 = 32 dims (256 B/token) |'
    )
    assert 'each arm against the largest at equal pairs (2 comparisons' in text
    assert 'the wider KV head against the narrower (1 comparison, Holm over them)' in text
    assert '| KV 1×32 = 32, 8 pairs | KV 2×16 = 32, 8 pairs | +71.0 | [+71.0, +71.0] |' in text
    assert 'times a family of 2 it can pass' in text
