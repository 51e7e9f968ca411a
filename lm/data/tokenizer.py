"""Tokenizers: raw bytes, a byte-level BPE trained here with HF `tokenizers`, or a JSON file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from typing import Protocol

import ml_collections
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS = '<|endoftext|>'
PAD = '<|pad|>'


class Tokenizer(Protocol):
    """What the data pipeline and decoding need from a tokenizer."""

    name: str  # identifies the exact vocabulary; part of the data cache fingerprint
    vocab_size: int
    eos_id: int
    parallel: bool  # encoding is CPU-bound enough that worker processes pay (lm.data.cache)
    continuation_mark: str  # shown between a prompt and its continuation ('': text runs on)

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray:
        """`encode(text)` as a 1-D integer array (what the token cache writes)."""
        ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """The same vocabulary as a `tokenizers.Tokenizer` (what a tokenizer.json holds)."""
        ...


def _byte_chars() -> list[str]:
    """[256] GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: b for b in printable} | {b: 256 + i for i, b in enumerate(others)}
    return [chr(chars[b]) for b in range(256)]


class ByteTokenizer:
    """Token = UTF-8 byte (0..255), then EOS = 256 and PAD = 257. Needs no training."""

    name = 'byte'
    vocab_size = 258
    eos_id = 256
    pad_id = 257
    parallel = False  # a UTF-8 encode: cheaper here than handing the text to a worker
    continuation_mark = ''

    def encode(self, text: str) -> list[int]:
        return list(text.encode('utf-8'))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode('utf-8'), np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode('utf-8', errors='replace')

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        """A byte-level BPE without merges: byte b is token b (GPT-2's character for it), then
        EOS and PAD as special tokens. Its ids are this tokenizer's on any text that does not
        spell a special token (the `tokenizers` library matches those in text; lm never does);
        its decode, skipping special tokens, is `decode` (invalid UTF-8 becomes U+FFFD)."""
        vocab = {c: b for b, c in enumerate(_byte_chars())}
        tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in (EOS, PAD)])
        return tok


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` (from a tokenizer.json, or trained by `train_bpe`)."""

    parallel = True
    continuation_mark = ''

    def __init__(self, tok: tokenizers.Tokenizer, name: str, eos_token: str = ''):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        eos = tok.token_to_id(eos_token or EOS)
        if eos_token and eos is None:
            raise ValueError(f'config.data.eos_token={eos_token!r} is not in the tokenizer {name}')
        self.eos_id = eos if eos is not None else self.vocab_size - 1
        self.name = f'{name}-eos{self.eos_id}' if eos_token else name

    @classmethod
    def from_file(cls, path: str, eos_token: str = '') -> HFTokenizer:
        if not os.path.isfile(path):
            raise FileNotFoundError(f'config.data.tokenizer: {path!r} is not a file')
        with open(path, 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        try:
            tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the Rust library raises a bare Exception
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f'config.data.tokenizer: {path!r} is not a tokenizer.json that HF tokenizers '
                f'can read ({first})'
            ) from None
        return cls(tok, f'json-{digest}', eos_token)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text).ids, np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids))

    def hf_tokenizer(self) -> tokenizers.Tokenizer:
        return self.tok


def is_byte_tokenizer(tok: tokenizers.Tokenizer) -> bool:
    """Whether `tok` (e.g. read from an exported tokenizer.json) is `ByteTokenizer`'s vocabulary:
    the same tokens at the same ids, text encoded byte by byte."""
    byte = ByteTokenizer()
    probe = 'Tëxt\t\r\n  with 日本 and 🎉'
    return (
        tok.get_vocab(with_added_tokens=True) == byte.hf_tokenizer().get_vocab(True)
        and tok.encode(probe).ids == byte.encode(probe)
        and tok.decode(byte.encode(probe)) == probe
    )


def train_bpe(texts: Iterator[str], vocab_size: int, path: str) -> HFTokenizer:
    """Trains a byte-level BPE on `texts` and saves it to `path` (a tokenizer.json)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tok.save(path + '.tmp')
    os.replace(path + '.tmp', path)
    return HFTokenizer.from_file(path)


def check_tokenizer_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for a bad `config.data.tokenizer`, before any data is read."""
    name = data.tokenizer
    if name in ('byte', 'bpe'):
        if name == 'bpe' and data.bpe_vocab_size < 512:
            raise ValueError(
                f'config.data.bpe_vocab_size must be >= 512, got {data.bpe_vocab_size}'
            )
        return
    if not name.endswith('.json'):
        raise ValueError(
            f"config.data.tokenizer must be 'byte', 'bpe' or a tokenizer.json path, got {name!r}"
        )
    if not os.path.isfile(name):
        raise FileNotFoundError(f'config.data.tokenizer: {name!r} is not a file')
