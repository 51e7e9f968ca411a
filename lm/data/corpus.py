"""Text sources, tokenised once into a cached memmap (`lm.data.cache`); batches and evaluation
windows are in `lm.data.windows`, the settings' checks in `lm.data.checks`.

Sources (`config.data.source`; the file sources are read in `lm.data.files`):
- 'stdlib': the running Python's standard-library .py files (no tests, no site-packages), split
  into train / validation by a stable hash of each file's relative path. Needs no download.
- 'text': local text files, concatenated; the last `val_fraction` of characters is validation.
  Files are streamed (read, decoded and tokenised a few MB at a time), so their size is not
  bounded by memory; each split is one document.
- 'hf': a Hugging Face `datasets` dataset (hub name or a local builder such as 'text' with
  `data.path` as data_files), optionally streamed; one document per row.
- 'mqar', 'passkey': synthetic recall tasks generated from a seed (`lm.data.recall`), scored
  only on their answers; nothing is cached.

Each split is tokenised once into `<cache_dir>/<fingerprint>/<split>.bin` (uint16 or uint32),
where the fingerprint covers the source's contents and the tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

import ml_collections
import numpy as np
from absl import logging

from lm.data.cache import SPLITS, Piece, exclusive, load_or_build
from lm.data.checks import check_data_config
from lm.data.files import file_digests, file_sha256, stdlib_source, text_paths, text_source
from lm.data.parts import split_corpus
from lm.data.recall import LABEL_FLAG, MQAR_SOURCES, TASKS, RecallTask
from lm.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    check_tokenizer_config,
    train_bpe,
)
from lm.data.windows import (  # noqa: F401 - re-exported: their home was this module
    call_batch,
    eval_batches,
    eval_windows,
    train_batch,
    window_targets,
)


@dataclasses.dataclass
class Corpus:
    """Tokenised splits plus what evaluation needs to convert nats/token into bits/byte."""

    tokens: dict[str, np.ndarray]  # split -> 1-D token memmap
    num_bytes: dict[str, int]  # split -> UTF-8 bytes of raw text behind those tokens
    tokenizer: Tokenizer
    fingerprint: str
    task: RecallTask | None = None  # a recall source: batches and evaluation come from it

    def bytes_per_token(self, split: str) -> float:
        return self.num_bytes[split] / len(self.tokens[split])

    def train_call(self, data: ml_collections.ConfigDict, **where) -> np.ndarray:
        """This process's batches of one train call (`where`: seed, step, steps, batch_size,
        process_index, process_count): the recall task's, else windows of the train split
        (`lm.data.windows.call_batch`, `data.seq_len` and `data.sampling`)."""
        if self.task is not None:
            return self.task.call_batch(**where)
        return call_batch(
            self.tokens['train'], seq_len=data.seq_len, sampling=data.sampling, **where
        )


def cache_dir(data: ml_collections.ConfigDict) -> str:
    return os.path.expanduser(data.cache_dir or '~/.cache/lm')


@dataclasses.dataclass
class Source:
    """What the cache needs from a source: its fingerprint and each split's documents."""

    fingerprint: str  # covers the source's contents and settings
    pieces: Callable[[str], Iterator[Piece]]  # split -> (text, document ends) pieces
    size: Callable[[str], int | None]  # split -> about how many UTF-8 bytes (None = unknown)


def _source(data: ml_collections.ConfigDict) -> Source:
    if data.source == 'stdlib':
        key, pieces, size = stdlib_source(data)
    elif data.source == 'text':
        key, pieces, size = text_source(data)
    else:
        key = [
            data.hf_name,
            data.hf_config,
            data.hf_split,
            data.hf_eval_split,
            file_digests(text_paths(data)),  # local data files: their bytes, not their names
            data.hf_text_column,
            data.hf_max_docs,
        ]
        if data.hf_name == 'text' and data.hf_sample_by != 'line':
            key.append(data.hf_sample_by)

        def pieces(split: str) -> Iterator[Piece]:
            return ((doc, True) for doc in _hf_docs(data, split))

        def size(split: str) -> None:
            return None

    settings = [data.source, data.val_fraction, key]
    return Source(hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16], pieces, size)


def _hf_docs(data: ml_collections.ConfigDict, split: str) -> Iterator[str]:
    import datasets  # heavy import, only for this source

    held_out = split == 'validation' and not data.hf_eval_split
    name = data.hf_eval_split if split == 'validation' and data.hf_eval_split else data.hf_split
    kwargs = {'sample_by': data.hf_sample_by} if data.hf_name == 'text' else {}
    try:
        ds = datasets.load_dataset(
            data.hf_name,
            data.hf_config or None,
            split=name,
            streaming=data.hf_streaming,
            data_files=text_paths(data) or None,
            **kwargs,
        )
    except (ConnectionError, OSError) as e:  # offline, unknown name, unreachable hub
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f'config.data.hf_name={data.hf_name!r} could not be loaded ({first}); offline, '
            'use a local builder: --config.data.hf_name=text --config.data.path=FILE'
        ) from None
    except ValueError as e:
        if not str(e).startswith('Unknown split'):
            raise
        key = 'hf_eval_split' if name == data.hf_eval_split else 'hf_split'
        raise ValueError(f'config.data.{key}={name!r}: {e}') from None
    columns = ds.column_names  # None for some streamed datasets: checked per row then
    if columns is not None and data.hf_text_column not in columns:
        raise ValueError(
            f'config.data.hf_text_column={data.hf_text_column!r} is not a column of '
            f'config.data.hf_name={data.hf_name!r}; its columns are {columns}'
        )
    every = round(1 / data.val_fraction)
    count = 0
    for i, row in enumerate(ds):
        if not data.hf_eval_split and (i % every == every - 1) != held_out:
            continue
        if data.hf_max_docs and count >= data.hf_max_docs:
            break
        count += 1
        if data.hf_text_column not in row:
            raise ValueError(
                f'config.data.hf_text_column={data.hf_text_column!r} is not a column of '
                f'config.data.hf_name={data.hf_name!r}; its columns are {sorted(row)}'
            )
        yield row[data.hf_text_column]


def _tokenizer(data: ml_collections.ConfigDict, source: Source | None) -> Tokenizer:
    if data.tokenizer == 'byte':
        return ByteTokenizer()
    if data.tokenizer == 'bpe':
        path = _bpe_path(data, source)
        if not os.path.isfile(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with exclusive(path + '.lock', f'the tokenizer {path}'):
                if not os.path.isfile(path):  # else trained while this process waited
                    texts = (text for text, _ in source.pieces('train'))
                    return train_bpe(texts, data.bpe_vocab_size, path)
        try:
            return HFTokenizer.from_file(path)
        except ValueError as e:
            raise ValueError(f'{e}; delete {path!r} to train it again') from None
    return HFTokenizer.from_file(data.tokenizer, data.eos_token)


MAX_AUTO_PROC = 16  # num_proc = 0 stops here: each spawned worker imports the entry point anew


def num_proc(data: ml_collections.ConfigDict) -> int:
    """Tokenisation processes: `config.data.num_proc`, or if 0 every CPU up to MAX_AUTO_PROC."""
    return data.num_proc or min(os.cpu_count() or 1, MAX_AUTO_PROC)


def load_tokenizer(data: ml_collections.ConfigDict) -> Tokenizer:
    """The tokenizer `config.data` describes (a BPE is trained only if not cached). Only a BPE
    reads the data (its cache is keyed by their fingerprint): the byte tokenizer or a
    tokenizer.json serves a run whose training text has moved (generation, export)."""
    if data.source not in TASKS and data.tokenizer != 'bpe':
        check_tokenizer_config(data)
        return _tokenizer(data, None)
    check_data_config(data)
    if data.source in TASKS:
        return RecallTask(data).tokenizer()
    return _tokenizer(data, _source(data))


def _bpe_path(data: ml_collections.ConfigDict, source: Source) -> str:
    """Where the BPE of `data` trained on `source` is cached."""
    name = f'bpe-{source.fingerprint}-{data.bpe_vocab_size}.json'
    return os.path.join(cache_dir(data), 'tokenizers', name)


class TokenizerIdentity(NamedTuple):
    """What decides a tokenizer's ids (`key`), its name for messages, and its tokenizer.json
    (`file`, '' if none)."""

    key: tuple
    name: str
    file: str = ''


def tokenizer_identity(data: ml_collections.ConfigDict) -> TokenizerIdentity:
    """The identity of `data`'s tokenizer, without training one: the byte tokenizer (a passkey
    task's too); an MQAR task's symbols; a tokenizer.json's bytes and EOS token; a BPE by its
    cached file (as a tokenizer.json naming that file would be) or, not yet trained, by its
    training text and size: a BPE trained on other text gives other ids."""
    if data.source in MQAR_SOURCES:
        return TokenizerIdentity(('symbols', data.recall_vocab), f'the {data.source} symbols')
    if data.source in TASKS or data.tokenizer == 'byte':  # passkey writes bytes
        return TokenizerIdentity(('byte',), "config.data.tokenizer='byte'")
    if data.tokenizer != 'bpe':
        key = ('json', file_sha256(data.tokenizer), data.eos_token)
        return TokenizerIdentity(key, f'config.data.tokenizer={data.tokenizer!r}', data.tokenizer)
    source = _source(data)
    if os.path.isfile(path := _bpe_path(data, source)):
        return TokenizerIdentity(('json', file_sha256(path), ''), f'the BPE {path}', path)
    where = f'config.data.source={data.source!r}' + (f', path={data.path!r}' if data.path else '')
    key = ('bpe', source.fingerprint, data.bpe_vocab_size)
    return TokenizerIdentity(key, f'a BPE to be trained on {where}')


def tokenizer_file_digest(data: ml_collections.ConfigDict) -> str:
    """The sha256 of `data`'s tokenizer.json; '' for the byte tokenizer, a BPE trained here, a
    recall task's, or a file that is not there."""
    if data.source in TASKS or data.tokenizer in ('byte', 'bpe'):
        return ''
    return file_sha256(data.tokenizer) if os.path.isfile(data.tokenizer) else ''


def check_tokenizer_file(data: ml_collections.ConfigDict, recorded: str, where: str) -> None:
    """One-line ValueError when the tokenizer.json `data` names is no longer the file a run
    trained with (`recorded`: its sha256 in the checkpoint; '' = not recorded): the checkpoint
    embeds that tokenizer's ids, so an edited file would encode and decode others silently."""
    if recorded and (now := tokenizer_file_digest(data)) and now != recorded:
        raise ValueError(
            f'{where}: config.data.tokenizer={data.tokenizer!r} changed since the run trained '
            f'with it (sha256 {now[:12]}, recorded {recorded[:12]}); the checkpoint embeds that '
            "file's token ids: restore it"
        )


def check_same_tokenizer(
    run_data: ml_collections.ConfigDict, data: ml_collections.ConfigDict, flag: str
) -> None:
    """Other data for a trained run (`flag`'s) must be tokenised as the run's was (`run_data`:
    its checkpoint embeds its tokenizer's ids): the same byte or tokenizer.json tokenizer, or
    the run's own BPE (trained on its text, named by its cached file), never a BPE trained on
    other text."""
    try:
        run = tokenizer_identity(run_data)
    except (OSError, ValueError) as e:  # a BPE's training text that is not here
        raise ValueError(
            f"{flag}: cannot tell the run's tokenizer, a BPE trained on its text "
            f'({type(e).__name__}: {e}): give that tokenizer.json as --config.data.tokenizer'
        ) from None
    given = tokenizer_identity(data)
    if given.key != run.key:
        hint = f': give --config.data.tokenizer={run.file}' if run.file else ''
        raise ValueError(
            f"{flag}: the data would be tokenised by {given.name}, not by the run's "
            f'({run.name}), whose token ids the checkpoint embeds{hint}'
        )


def check_vocab_fits(data: ml_collections.ConfigDict, vocab_size: int) -> None:
    """Refuses, before any text is read or a BPE trained, a text tokenizer with more tokens than
    a given `vocab_size` (config.model.vocab_size; 0 = the tokenizer's) can embed: a BPE is
    trained to config.data.bpe_vocab_size tokens (at most), a byte or tokenizer.json one has
    its own size. A recall task's tokenizer is checked once it is built."""
    if not vocab_size or data.source in TASKS:
        return
    if data.tokenizer == 'bpe':
        if data.bpe_vocab_size > vocab_size:
            raise ValueError(
                f'config.model.vocab_size={vocab_size} is smaller than config.data.bpe_vocab_size'
                f'={data.bpe_vocab_size}, the vocabulary the BPE is trained to (the model must '
                'embed every token of its tokenizer)'
            )
    elif (size := load_tokenizer(data).vocab_size) > vocab_size:
        raise ValueError(
            f'config.model.vocab_size={vocab_size} is smaller than the tokenizer vocabulary '
            f'({size}, config.data.tokenizer={data.tokenizer!r})'
        )


def load_corpus(data: ml_collections.ConfigDict) -> Corpus:
    """Tokenised train and validation splits, built once (by one process) and cached by
    fingerprint (`lm.data.cache`), cut into the parts `config.data.split` names
    (`lm.data.parts`); a recall source's splits are its held-out example sets."""
    check_data_config(data)
    if data.source in TASKS:
        return _recall_corpus(data)
    source = _source(data)
    tok = _tokenizer(data, source)
    fingerprint = hashlib.sha256(f'{source.fingerprint}-{tok.name}'.encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir(data), fingerprint)
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 2**16 else np.uint32)
    meta, tokens = load_or_build(directory, source.pieces, tok, dtype, num_proc(data), source.size)
    logging.info(
        'data: %s source, %s; train %s tokens (%s bytes), validation %s tokens (%s bytes); '
        'tokenizer %s, %s tokens',
        data.source,
        data.hf_name or data.path or 'stdlib .py files',
        f'{len(tokens["train"]):,}',
        f'{meta["num_bytes"]["train"]:,}',
        f'{len(tokens["validation"]):,}',
        f'{meta["num_bytes"]["validation"]:,}',
        tok.name,
        f'{tok.vocab_size:,}',
    )
    return split_corpus(Corpus(tokens, meta['num_bytes'], tok, fingerprint), data)


def check_corpus_size(corpus: Corpus, batch_size: int | None, seq_len: int) -> None:
    """A run that trains (`batch_size` given) needs one batch of windows in the training split;
    every split evaluated needs more than one window's targets (its evaluation windows are cut
    from what it has, the last one partial, `lm.data.windows`; the standard error is over
    windows, as for config.eval_tokens): the validation split always, the training split when
    nothing trains on it. A recall task generates its batches, and its example sets are
    scored in padded batches."""
    if corpus.task is not None:
        return
    size = len(corpus.tokens['train'])
    if batch_size is not None and size < batch_size * seq_len + 1:
        raise ValueError(
            f'the train split has {size} tokens, fewer than one batch '
            f'(config.train.batch_size={batch_size} x config.data.seq_len={seq_len} + 1)'
        )
    for split in ('validation',) if batch_size is not None else ('validation', 'train'):
        if (size := len(corpus.tokens[split])) < seq_len + 2:
            raise ValueError(
                f'the {split} split has {size} tokens, fewer than the {seq_len + 2} of two '
                f'evaluation windows of config.data.seq_len={seq_len} targets (the standard error '
                'is over windows): give more text'
                + (', a larger config.data.val_fraction' if split == 'validation' else '')
                + ' or a smaller config.data.seq_len'
            )


def _recall_corpus(data: ml_collections.ConfigDict) -> Corpus:
    """A recall source as a Corpus: each split's example rows, flattened, as its tokens."""
    task = RecallTask(ml_collections.ConfigDict(data.to_dict()))
    tokens = {s: task.split(s)[0].reshape(-1) & (LABEL_FLAG - 1) for s in SPLITS}
    # Unset ('') settings stay out, so a newly added optional one keeps existing fingerprints.
    keys = sorted(
        k
        for k in data
        if (k.startswith(('recall_', 'passkey_')) or k == 'seq_len') and data[k] != ''
    )
    settings = [data.source] + [(k, data[k]) for k in keys]
    fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
    return Corpus(
        tokens, {s: len(t) for s, t in tokens.items()}, task.tokenizer(), fingerprint, task
    )
