"""Text sources, tokenisation into a cached memmap, and batches that are pure functions of
(seed, step, process).

Sources (`config.data.source`):
- 'stdlib': the running Python's standard-library .py files (no tests, no site-packages), split
  into train / validation by a stable hash of each file's relative path. Needs no download.
- 'text': local text files, concatenated; the last `val_fraction` of characters is validation.
- 'hf': a Hugging Face `datasets` dataset (hub name or a local builder such as 'text' with
  `data.path` as data_files), optionally streamed.

Each split is tokenised once into `<cache_dir>/<fingerprint>/<split>.bin` (uint16 or uint32),
where the fingerprint covers the source's contents and the tokenizer. A training batch is the
`step`-th draw of random windows from a generator seeded with (seed, step); process p of P takes
rows [p·B/P, (p+1)·B/P), so resuming is exact and hosts read disjoint rows. Evaluation scores
non-overlapping windows of the held-out split (`eval_windows`), each target token once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sysconfig
from collections.abc import Callable, Iterator

import ml_collections
import numpy as np
from absl import logging

from lm.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    check_tokenizer_config,
    train_bpe,
)

SOURCES = ('stdlib', 'text', 'hf')
DECODE_ERRORS = ('strict', 'replace')
HF_SAMPLE_BY = ('line', 'paragraph', 'document')
SPLITS = ('train', 'validation')
_TEST_DIRS = {'test', 'tests', 'idle_test', 'site-packages', 'dist-packages', '__pycache__'}


@dataclasses.dataclass
class Corpus:
    """Tokenised splits plus what evaluation needs to convert nats/token into bits/byte."""

    tokens: dict[str, np.ndarray]  # split -> 1-D token memmap
    num_bytes: dict[str, int]  # split -> UTF-8 bytes of raw text behind those tokens
    tokenizer: Tokenizer
    fingerprint: str

    def bytes_per_token(self, split: str) -> float:
        return self.num_bytes[split] / len(self.tokens[split])


def cache_dir(data: ml_collections.ConfigDict) -> str:
    return os.path.expanduser(data.cache_dir or '~/.cache/lm')


def text_paths(data: ml_collections.ConfigDict) -> list[str]:
    return [p.strip() for p in data.path.split(',') if p.strip()]


def check_data_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for bad data settings, before anything is read or compiled."""
    if data.source not in SOURCES:
        raise ValueError(f'config.data.source must be one of {SOURCES}, got {data.source!r}')
    if not 0 < data.val_fraction < 1:
        raise ValueError(f'config.data.val_fraction must be in (0, 1), got {data.val_fraction}')
    if data.seq_len <= 0:
        raise ValueError(f'config.data.seq_len must be > 0, got {data.seq_len}')
    if data.decode_errors not in DECODE_ERRORS:
        raise ValueError(
            f'config.data.decode_errors must be one of {DECODE_ERRORS}, got {data.decode_errors!r}'
        )
    if data.hf_sample_by not in HF_SAMPLE_BY:
        raise ValueError(
            f'config.data.hf_sample_by must be one of {HF_SAMPLE_BY}, got {data.hf_sample_by!r}'
        )
    check_tokenizer_config(data)
    if data.source == 'text':
        if not text_paths(data):
            raise ValueError("config.data.path must name at least one text file for source='text'")
    if data.source in ('text', 'hf'):
        for path in text_paths(data):
            if os.path.isdir(path):
                raise ValueError(
                    f'config.data.path: {path!r} is a directory; name text files (comma-separated)'
                )
            if not os.path.isfile(path):
                hint = ''
                if os.path.basename(path) == 'tinyshakespeare.txt':
                    hint = ' (fetch it: python scripts/get_data.py tinyshakespeare)'
                raise FileNotFoundError(f'config.data.path: {path!r} does not exist{hint}')
            if data.source == 'text' and os.path.getsize(path) == 0:
                raise ValueError(f'config.data.path: {path!r} is empty')
    if data.source == 'hf' and not data.hf_name:
        raise ValueError("config.data.hf_name must be set for source='hf'")
    if data.source == 'stdlib' and data.path:
        logging.log_first_n(
            logging.WARNING,
            "config.data.path=%r is ignored: source='stdlib' reads this Python's own .py "
            "files (set config.data.source='text' to train on it)",
            1,
            data.path,
        )


def _stdlib_files() -> list[tuple[str, str]]:
    root = sysconfig.get_paths()['stdlib']
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _TEST_DIRS)
        for name in sorted(filenames):
            if name.endswith('.py') and not name.startswith('test_'):
                full = os.path.join(dirpath, name)
                files.append((os.path.relpath(full, root), full))
    return files


def _in_validation(key: str, val_fraction: float) -> bool:
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return h % 10_000 < val_fraction * 10_000


def _read(path: str) -> str:
    with open(path, encoding='utf-8', errors='replace') as f:
        return f.read()


def _read_bytes(path: str) -> bytes:
    with open(path, 'rb') as f:
        return f.read()


def decode_text(raw: bytes, path: str, errors: str) -> str:
    """`raw` as UTF-8 text; with errors='strict', a one-line error naming the file and the
    offset of the first byte that is not UTF-8 (binary data, a token .bin, another encoding)."""
    try:
        return raw.decode('utf-8', errors=errors)
    except UnicodeDecodeError as e:
        raise ValueError(
            f'config.data.path: {path!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset '
            f"{e.start}); set config.data.decode_errors='replace' to read it anyway"
        ) from None


def _source(data: ml_collections.ConfigDict) -> tuple[str, Callable[[str], Iterator[str]]]:
    """(fingerprint of the source's contents and settings, split -> iterator over documents)."""
    if data.source == 'stdlib':
        files = _stdlib_files()
        key = [(rel, os.path.getsize(full)) for rel, full in files]

        def docs(split: str) -> Iterator[str]:
            for rel, full in files:
                if _in_validation(rel, data.val_fraction) == (split == 'validation'):
                    yield _read(full)

    elif data.source == 'text':
        paths = text_paths(data)
        key = []
        for p in paths:  # hashed and checked for UTF-8 before anything is tokenised
            raw = _read_bytes(p)
            key.append(hashlib.sha256(raw).hexdigest())
            decode_text(raw, p, data.decode_errors)

        def docs(split: str) -> Iterator[str]:
            text = ''.join(decode_text(_read_bytes(p), p, data.decode_errors) for p in paths)
            cut = int(len(text) * (1 - data.val_fraction))
            yield text[:cut] if split == 'train' else text[cut:]

    else:
        key = [
            data.hf_name,
            data.hf_config,
            data.hf_split,
            data.hf_eval_split,
            data.path,
            data.hf_text_column,
            data.hf_max_docs,
        ]
        if data.hf_name == 'text' and data.hf_sample_by != 'line':
            key.append(data.hf_sample_by)

        def docs(split: str) -> Iterator[str]:
            yield from _hf_docs(data, split)

    settings = [data.source, data.val_fraction, key]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16], docs


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
    every = round(1 / data.val_fraction)
    count = 0
    for i, row in enumerate(ds):
        if not data.hf_eval_split and (i % every == every - 1) != held_out:
            continue
        if data.hf_max_docs and count >= data.hf_max_docs:
            break
        count += 1
        yield row[data.hf_text_column]


def _tokenizer(data: ml_collections.ConfigDict, source_fp: str, docs) -> Tokenizer:
    if data.tokenizer == 'byte':
        return ByteTokenizer()
    if data.tokenizer == 'bpe':
        path = os.path.join(
            cache_dir(data), 'tokenizers', f'bpe-{source_fp}-{data.bpe_vocab_size}.json'
        )
        if os.path.isfile(path):
            try:
                return HFTokenizer.from_file(path)
            except ValueError as e:
                raise ValueError(f'{e}; delete {path!r} to train it again') from None
        return train_bpe(docs('train'), data.bpe_vocab_size, path)
    return HFTokenizer.from_file(data.tokenizer, data.eos_token)


def _write_split(path: str, docs: Iterator[str], tok: Tokenizer, dtype: np.dtype) -> int:
    """Tokenises docs (EOS after each) into a raw binary file; returns the UTF-8 byte count."""
    num_bytes = 0
    with open(path, 'wb') as f:
        for doc in docs:
            num_bytes += len(doc.encode('utf-8'))
            np.asarray(tok.encode(doc) + [tok.eos_id], dtype).tofile(f)
    return num_bytes


def load_tokenizer(data: ml_collections.ConfigDict) -> Tokenizer:
    """The tokenizer `config.data` describes (a BPE is trained only if not cached)."""
    check_data_config(data)
    source_fp, docs = _source(data)
    return _tokenizer(data, source_fp, docs)


def load_corpus(data: ml_collections.ConfigDict) -> Corpus:
    """Tokenised train and validation splits, built once and cached by fingerprint."""
    check_data_config(data)
    source_fp, docs = _source(data)
    tok = _tokenizer(data, source_fp, docs)
    fingerprint = hashlib.sha256(f'{source_fp}-{tok.name}'.encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir(data), fingerprint)
    meta_path = os.path.join(directory, 'meta.json')
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 2**16 else np.uint32)
    if not os.path.isfile(meta_path):
        try:
            _build_cache(directory, docs, tok, dtype)
        except PermissionError as e:
            raise ValueError(
                f'config.data.cache_dir: cannot write the token cache {directory!r} ({e.strerror})'
            ) from None
    meta, tokens = _open_cache(directory)
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
    return Corpus(tokens, meta['num_bytes'], tok, fingerprint)


def _build_cache(directory: str, docs, tok: Tokenizer, dtype: np.dtype) -> None:
    """Tokenises both splits into `directory`; a source that fails mid-way (offline, say)
    leaves no partial file behind."""
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    meta = {'dtype': dtype.name, 'num_bytes': {}, 'num_tokens': {}}
    tmp = ''
    try:
        for split in SPLITS:
            tmp = os.path.join(directory, f'{split}.bin.{os.getpid()}')
            meta['num_bytes'][split] = _write_split(tmp, docs(split), tok, dtype)
            meta['num_tokens'][split] = os.path.getsize(tmp) // dtype.itemsize
            os.replace(tmp, os.path.join(directory, f'{split}.bin'))
        meta_path = os.path.join(directory, 'meta.json')
        with open(meta_path + f'.{os.getpid()}', 'w') as f:
            json.dump(meta, f)
        os.replace(meta_path + f'.{os.getpid()}', meta_path)
    except BaseException:
        if tmp and os.path.exists(tmp):
            os.remove(tmp)
        if created and not os.listdir(directory):
            os.rmdir(directory)
        raise


def _open_cache(directory: str) -> tuple[dict, dict[str, np.ndarray]]:
    """meta.json and the token memmaps of a cache directory; a damaged file (empty,
    truncated, not JSON) is a one-line error naming it."""
    meta_path = os.path.join(directory, 'meta.json')
    fix = f'delete {directory!r} to rebuild it'
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        np.dtype(meta['dtype'])
        meta['num_bytes']['train'], meta['num_bytes']['validation']
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f'data cache file {meta_path!r} is corrupt ({e}); {fix}') from None
    tokens = {}
    for split in SPLITS:
        path = os.path.join(directory, f'{split}.bin')
        size = os.path.getsize(path) if os.path.isfile(path) else -1
        itemsize = np.dtype(meta['dtype']).itemsize
        want = meta.get('num_tokens', {}).get(split)  # absent in caches written before it
        if size <= 0 or size % itemsize or (want is not None and size != want * itemsize):
            state = 'missing' if size < 0 else 'empty' if size == 0 else f'{size} bytes'
            raise ValueError(
                f'data cache file {path!r} is damaged ({state}'
                + (f', expected {want * itemsize} bytes' if want is not None else '')
                + f'); {fix}'
            )
        tokens[split] = np.memmap(path, dtype=meta['dtype'], mode='r')
    return meta, tokens


def check_corpus_size(corpus: Corpus, batch_size: int, seq_len: int) -> None:
    """The source must hold at least one batch of windows in each split."""
    need = batch_size * seq_len + 1
    for split in SPLITS:
        if len(corpus.tokens[split]) < need:
            raise ValueError(
                f'the {split} split has {len(corpus.tokens[split])} tokens, fewer than one batch '
                f'(config.train.batch_size={batch_size} x config.data.seq_len={seq_len} + 1)'
            )


def _rows(global_rows: int, process_index: int, process_count: int) -> slice:
    per = global_rows // process_count
    return slice(process_index * per, (process_index + 1) * per)


def train_batch(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> np.ndarray:
    """This process's rows of step `step`'s batch: int32 [batch_size / process_count, T + 1]."""
    starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - seq_len, batch_size)
    starts = starts[_rows(batch_size, process_index, process_count)]
    return np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def call_batch(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    steps: int,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> np.ndarray:
    """This process's rows for one train-step call running steps step..step+steps-1:
    `train_batch` [B/P, T + 1] for a single step, stacked [steps, B/P, T + 1] for several."""
    rows = [
        train_batch(
            tokens,
            seed=seed,
            step=step + i,
            batch_size=batch_size,
            seq_len=seq_len,
            process_index=process_index,
            process_count=process_count,
        )
        for i in range(steps)
    ]
    return rows[0] if steps == 1 else np.stack(rows)


def eval_windows(num_tokens: int, seq_len: int, eval_tokens: int = 0) -> np.ndarray:
    """Start offsets of the evaluation windows of a split of `num_tokens` tokens.

    The split's num_tokens - 1 next-token targets are cut into W = ceil((num_tokens - 1) / T)
    non-overlapping windows of T = seq_len (the last one partial), so every target is scored
    exactly once. `eval_tokens` > 0 keeps ceil(eval_tokens / T) of them (at most W), spread
    evenly over the whole split (window floor(i · W / k) for i < k) rather than its start.
    """
    num_windows = -(-(num_tokens - 1) // seq_len)
    starts = np.arange(num_windows, dtype=np.int64) * seq_len
    if eval_tokens:
        k = min(num_windows, -(-eval_tokens // seq_len))
        starts = starts[np.arange(k, dtype=np.int64) * num_windows // k]
    return starts


def window_targets(num_tokens: int, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Targets each window scores: T, or fewer for the split's last window."""
    return np.minimum(seq_len, num_tokens - 1 - starts)


def eval_batches(
    tokens: np.ndarray,
    starts: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This process's rows of each evaluation batch: (tokens int32 [B/P, T + 1], target weights
    float32 [B/P, T]), windows `starts` in order, B per batch.

    Every batch has the same shape (one compiled eval step): the split's last window is padded
    with token 0 and the last batch with whole padding rows, all of weight 0.
    """
    n = len(tokens)
    counts = window_targets(n, starts, seq_len)
    rows = _rows(batch_size, process_index, process_count)
    for first in range(0, len(starts), batch_size):
        batch = np.zeros((batch_size, seq_len + 1), np.int32)
        weights = np.zeros((batch_size, seq_len), np.float32)
        chunk = slice(first, first + batch_size)
        for r, (s, c) in enumerate(zip(starts[chunk], counts[chunk], strict=True)):
            batch[r, : c + 1] = tokens[s : s + c + 1]
            weights[r, :c] = 1.0
        yield batch[rows], weights[rows]
