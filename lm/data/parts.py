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
"""

from __future__ import annotations

import dataclasses
import hashlib

import ml_collections

PARTS = ('pretrain', 'uptrain', 'pretrain+uptrain')
HELDOUT = 'heldout'


def check_split_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for bad part settings."""
    if data.split and data.split not in PARTS:
        raise ValueError(f"config.data.split must be '' or one of {PARTS}, got {data.split!r}")
    for key in ('uptrain_fraction', 'heldout_fraction'):
        if not 0 < data[key] < 1:
            raise ValueError(f'config.data.{key} must be in (0, 1), got {data[key]}')


def cuts(num_train: int, num_validation: int, data: ml_collections.ConfigDict) -> tuple[int, int]:
    """(first uptrain token of the training split, first held-out token of validation)."""
    up = round(num_train * (1 - data.uptrain_fraction))
    return up, round(num_validation * (1 - data.heldout_fraction))


def split_corpus(corpus, data: ml_collections.ConfigDict):
    """`corpus` (lm.data.corpus.Corpus) with its train split cut to the part `data.split` names
    and its validation split cut into 'validation' and 'heldout'; unchanged if no part is set.
    Its fingerprint covers the part and the fractions."""
    if not data.split:
        return corpus
    train, val = corpus.tokens['train'], corpus.tokens['validation']
    up, held = cuts(len(train), len(val), data)
    part = {'pretrain': train[:up], 'uptrain': train[up:], 'pretrain+uptrain': train}[data.split]
    tokens = {'train': part, 'validation': val[:held], HELDOUT: val[held:]}
    bytes_per_token = {
        'train': corpus.bytes_per_token('train'),
        'validation': corpus.bytes_per_token('validation'),
        HELDOUT: corpus.bytes_per_token('validation'),
    }
    num_bytes = {k: round(len(v) * bytes_per_token[k]) for k, v in tokens.items()}
    key = f'{corpus.fingerprint}-{data.split}-{data.uptrain_fraction}-{data.heldout_fraction}'
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    return dataclasses.replace(corpus, tokens=tokens, num_bytes=num_bytes, fingerprint=fingerprint)
