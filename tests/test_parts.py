"""Disjoint corpus parts (lm/data/parts.py): pretrain / uptrain / validation / held-out."""

import numpy as np
import pytest
from conftest import tiny_config, tiny_train_config

from lm.data.corpus import load_corpus
from lm.data.parts import FOUR, PARTS, block_parts, part_shares
from lm.train.loop import train


def data_config(tmp_path, text, **overrides):
    path = tmp_path / 'text.txt'
    path.write_text(text)
    data = tiny_config().data
    data.update(source='text', path=str(path), cache_dir=str(tmp_path / 'cache'), seq_len=16)
    data.update(overrides)
    return data


@pytest.fixture
def text():
    letters = np.array(list('abcdefghijklmnopqrstuvwxyz .,'))
    return ''.join(np.random.default_rng(0).choice(letters, 5_000))


def test_parts_are_disjoint_and_cover_the_corpus(tmp_path, text):
    whole = load_corpus(data_config(tmp_path, text))
    parts = {
        split: load_corpus(data_config(tmp_path, text, split=split, uptrain_fraction=0.2))
        for split in ('pretrain', 'uptrain', 'pretrain+uptrain')
    }
    pre, up = parts['pretrain'].tokens['train'], parts['uptrain'].tokens['train']
    train, val = np.asarray(whole.tokens['train']), np.asarray(whole.tokens['validation'])
    # the two training parts are consecutive, non-overlapping slices covering the training text
    np.testing.assert_array_equal(np.concatenate([pre, up]), train)
    np.testing.assert_array_equal(parts['pretrain+uptrain'].tokens['train'], train)
    assert abs(len(up) / len(train) - 0.2) < 1e-3
    for corpus in parts.values():  # validation and held-out: consecutive halves of validation
        held, sel = corpus.tokens['heldout'], corpus.tokens['validation']
        np.testing.assert_array_equal(np.concatenate([sel, held]), val)
        assert abs(len(held) - len(val) / 2) <= 1
    # deterministic: loading again gives the same cut
    again = load_corpus(data_config(tmp_path, text, split='uptrain', uptrain_fraction=0.2))
    np.testing.assert_array_equal(again.tokens['train'], up)
    fingerprints = {c.fingerprint for c in [whole, *parts.values()]}
    assert len(fingerprints) == 4  # every part is other data to a resumed run
    assert 'heldout' not in whole.tokens  # no part set: the two splits as before


def test_interleaved_parts_are_disjoint_cover_the_corpus_and_spread_across_it(tmp_path, text):
    """Blocks of 16 tokens dealt to the four parts: each token in exactly one part, each part
    its stated share (to within two blocks), and blocks of every part in every decile."""
    layout = {'split_layout': 'interleaved', 'split_block': 16, 'uptrain_fraction': 0.2}
    whole = load_corpus(data_config(tmp_path, text))
    corpus = {s: load_corpus(data_config(tmp_path, text, split=s, **layout)) for s in PARTS}
    parts = {
        'pretrain': corpus['pretrain'].tokens['train'],
        'uptrain': corpus['uptrain'].tokens['train'],
        'validation': corpus['pretrain'].tokens['validation'],
        'heldout': corpus['pretrain'].tokens['heldout'],
    }
    n = len(whole.tokens['train']) + len(whole.tokens['validation'])
    labels = block_parts(-(-n // 16), part_shares(data_config(tmp_path, text, **layout)))
    # Rebuild each part from the labels and compare: the parts are the blocks, dealt once each.
    stream = np.concatenate([whole.tokens['train'], whole.tokens['validation']])
    blocks = np.split(stream, np.arange(16, n, 16))
    for i, name in enumerate(FOUR):
        np.testing.assert_array_equal(
            np.concatenate([b for b, k in zip(blocks, labels, strict=True) if k == i]), parts[name]
        )
    assert sum(len(p) for p in parts.values()) == n  # disjoint and covering
    shares = {'pretrain': 0.9 * 0.8, 'uptrain': 0.9 * 0.2, 'validation': 0.05, 'heldout': 0.05}
    for name, share in shares.items():
        assert abs(len(parts[name]) - share * n) <= 2 * 16, name
    for i, name in enumerate(FOUR):  # every part has blocks in every tenth of the corpus
        deciles = {k * 10 // len(labels) for k in np.flatnonzero(labels == i)}
        assert deciles == set(range(10)), name
    both = corpus['pretrain+uptrain'].tokens['train']
    assert len(both) == len(parts['pretrain']) + len(parts['uptrain'])
    assert len({c.fingerprint for c in corpus.values()}) == 3
    contiguous = load_corpus(data_config(tmp_path, text, split='uptrain', uptrain_fraction=0.2))
    assert corpus['uptrain'].fingerprint != contiguous.fingerprint


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'split': 'heldout'}, "config.data.split must be '' or one of"),
        ({'split': 'uptrain', 'uptrain_fraction': 1.0}, 'config.data.uptrain_fraction must be'),
        ({'heldout_fraction': 0.0}, 'config.data.heldout_fraction must be in'),
        ({'split_layout': 'blocks'}, 'config.data.split_layout must be one of'),
        ({'split_block': 0}, 'config.data.split_block must be a whole number > 0'),
    ],
)
def test_bad_part_settings_are_refused(tmp_path, text, overrides, message):
    with pytest.raises(ValueError, match=message):
        load_corpus(data_config(tmp_path, text, **overrides))


@pytest.mark.slow
def test_a_run_on_a_part_is_scored_on_the_held_out_part_at_its_last_step(tmp_path, small_text):
    """Training on 'uptrain' evaluates on the validation part along the way and, at the last
    step only, on every target of the held-out part."""
    config = tiny_train_config(tmp_path, small_text, **{'data.split': 'uptrain', 'train.steps': 2})
    out = train(config, str(tmp_path / 'run'))
    corpus = load_corpus(config.data)
    assert out['heldout']['tokens'] == len(corpus.tokens['heldout']) - 1
    assert out['eval']['tokens'] == len(corpus.tokens['validation']) - 1
    assert out['heldout']['loss'] != out['eval']['loss']
    plain = tiny_train_config(tmp_path, small_text, **{'train.steps': 0})
    assert train(plain, str(tmp_path / 'plain'))['heldout'] == {}  # no parts: no held-out score
