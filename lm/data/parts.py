"""Disjoint parts of one corpus for experiments that train twice on it (uptraining): the
training text cut into a `pretrain` and an `uptrain` part, the validation text into a
validation part (model selection) and a `heldout` part (the reported score).

`config.data.split` picks the part a run trains on: '' keeps the corpus's two splits as they
are (every run before parts existed); 'pretrain' is the first 1 − `uptrain_fraction` of the
training tokens, 'uptrain' the rest, 'pretrain+uptrain' both. With any part, the validation
split becomes its first 1 − `heldout_fraction` of tokens and a third split, 'heldout', the
rest; training never reads it and evaluation reads it only at a run's last step. Cuts are
token offsets, so parts are deterministic, disjoint and together cover the corpus. Bytes per
token (for bits/byte) are taken as the whole split's.

`config.data.split_layout` says where the parts lie. 'contiguous' (above): each part is one span,
so `uptrain` sits just before the evaluation text. 'interleaved': the corpus's two splits, end to
end, are cut into blocks of `split_block` tokens and every block goes to one part, in the same
shares (pretrain (1 − v)(1 − u), uptrain (1 − v)u, validation v(1 − h), held-out vh, with v, u,
h = val_fraction, uptrain_fraction, heldout_fraction): a block's part follows a largest-deficit
rotation (every prefix of the corpus holds each part's share to within a block), shuffled by a
seeded permutation within each run of ⌈1 / smallest share⌉ blocks, so every part is drawn from
across the whole corpus and none lies nearer the evaluation text than another. A part's blocks
are joined in corpus order (a training window may cross from one block into the next).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import ml_collections
import numpy as np

PARTS = ('pretrain', 'uptrain', 'pretrain+uptrain')
HELDOUT = 'heldout'
LAYOUTS = ('contiguous', 'interleaved')
# The four parts in the order `part_shares` and `block_parts` number them.
FOUR = ('pretrain', 'uptrain', 'validation', HELDOUT)
PERMUTATION_SEED = 0  # the interleaved layout's shuffle: fixed, so every run cuts alike


def check_split_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for bad part settings."""
    if data.split and data.split not in PARTS:
        raise ValueError(f"config.data.split must be '' or one of {PARTS}, got {data.split!r}")
    for key in ('uptrain_fraction', 'heldout_fraction'):
        if not 0 < data[key] < 1:
            raise ValueError(f'config.data.{key} must be in (0, 1), got {data[key]}')
    if data.split_layout not in LAYOUTS:
        raise ValueError(
            f'config.data.split_layout must be one of {LAYOUTS}, got {data.split_layout!r}'
        )
    if not (isinstance(data.split_block, int) and data.split_block > 0):
        raise ValueError(
            f'config.data.split_block must be a whole number > 0, got {data.split_block!r}'
        )


def cuts(num_train: int, num_validation: int, data: ml_collections.ConfigDict) -> tuple[int, int]:
    """(first uptrain token of the training split, first held-out token of validation)."""
    up = round(num_train * (1 - data.uptrain_fraction))
    return up, round(num_validation * (1 - data.heldout_fraction))


def part_shares(data: ml_collections.ConfigDict) -> np.ndarray:
    """The shares of the corpus in pretrain, uptrain, validation and held-out (`FOUR`)."""
    v, u, h = data.val_fraction, data.uptrain_fraction, data.heldout_fraction
    return np.array([(1 - v) * (1 - u), (1 - v) * u, v * (1 - h), v * h])


def block_parts(num_blocks: int, shares: np.ndarray, seed: int = PERMUTATION_SEED) -> np.ndarray:
    """Each block's part (an index into `shares`): the part furthest below its share of the
    blocks so far, then the labels of each run of ⌈1 / min(shares)⌉ blocks shuffled."""
    labels, counts = np.empty(num_blocks, np.int64), np.zeros(len(shares))
    for k in range(num_blocks):
        labels[k] = np.argmax(shares * (k + 1) - counts)
        counts[labels[k]] += 1
    run, rng = math.ceil(1 / shares.min()), np.random.default_rng(seed)
    for start in range(0, num_blocks, run):
        labels[start : start + run] = rng.permutation(labels[start : start + run])
    return labels


def _interleaved(train: np.ndarray, val: np.ndarray, data) -> dict[str, np.ndarray]:
    """{part: tokens} of the interleaved layout (`FOUR` and 'pretrain+uptrain')."""
    whole = np.concatenate([train, val])
    starts = np.arange(0, len(whole), data.split_block)
    labels = block_parts(len(starts), part_shares(data))
    blocks = np.split(whole, starts[1:])
    parts = {
        name: [b for b, i in zip(blocks, labels, strict=True) if FOUR[i] == name] for name in FOUR
    }
    out = {name: np.concatenate(b) if b else whole[:0] for name, b in parts.items()}
    joined = [b for b, i in zip(blocks, labels, strict=True) if i < 2]
    return {**out, 'pretrain+uptrain': np.concatenate(joined)}


def _contiguous(train: np.ndarray, val: np.ndarray, data) -> dict[str, np.ndarray]:
    """{part: tokens} of the contiguous layout: spans of the two splits."""
    up, held = cuts(len(train), len(val), data)
    return {
        'pretrain': train[:up],
        'uptrain': train[up:],
        'pretrain+uptrain': train,
        'validation': val[:held],
        HELDOUT: val[held:],
    }


def split_corpus(corpus, data: ml_collections.ConfigDict):
    """`corpus` (lm.data.corpus.Corpus) with its train split cut to the part `data.split` names
    and its validation split cut into 'validation' and 'heldout' (contiguous layout), or all
    four drawn as interleaved blocks of the whole corpus; unchanged if no part is set. Its
    fingerprint covers the part, the fractions and (interleaved) the layout and block size."""
    if not data.split:
        return corpus
    train, val = corpus.tokens['train'], corpus.tokens['validation']
    interleaved = data.split_layout == 'interleaved'
    parts = (_interleaved if interleaved else _contiguous)(train, val, data)
    tokens = {
        'train': parts[data.split],
        'validation': parts['validation'],
        HELDOUT: parts[HELDOUT],
    }
    both = (corpus.num_bytes['train'] + corpus.num_bytes['validation']) / (len(train) + len(val))
    bytes_per_token = {
        'train': both if interleaved else corpus.bytes_per_token('train'),
        'validation': both if interleaved else corpus.bytes_per_token('validation'),
        HELDOUT: both if interleaved else corpus.bytes_per_token('validation'),
    }
    num_bytes = {k: round(len(v) * bytes_per_token[k]) for k, v in tokens.items()}
    key = f'{corpus.fingerprint}-{data.split}-{data.uptrain_fraction}-{data.heldout_fraction}'
    if interleaved:
        key += f'-interleaved{data.split_block}-{data.val_fraction}'
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    return dataclasses.replace(corpus, tokens=tokens, num_bytes=num_bytes, fingerprint=fingerprint)
