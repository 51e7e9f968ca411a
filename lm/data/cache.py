"""The token cache: each split of a source tokenised once into `<cache_dir>/<fingerprint>/`, in
bounded memory, optionally by a pool of worker processes, by exactly one process at a time.

Layout: `<split>.bin` (raw uint16 / uint32 tokens, EOS after every document) and `meta.json`
(dtype, UTF-8 bytes and tokens per split). meta.json is the completed marker: it is written
last, after every token file is complete and synced, so a directory without it is an unfinished
(crashed, killed) build that is never read, only rebuilt. A builder holds an fcntl lock on
`<fingerprint>.lock` beside the directory (released by the OS if the builder dies; the file is
removed when the build ends): processes of one run, hosts sharing a filesystem, or two runs
started at once wait for the one that builds and then read its cache.

A source hands over a split as a stream of pieces (text, document ends here). Pieces are grouped
into tasks of about `TASK_CHARS` characters; each task becomes one array of tokens, appended to
the split's file in order, so memory holds a few tasks however large the source is. With
`num_proc` > 1 and a CPU-bound tokenizer (`Tokenizer.parallel`: BPE, not bytes), once a split
has passed `POOL_AFTER_BYTES` the rest of its tasks go to a pool of spawned processes (at most
2 tasks per process in flight), still appended in order: the file is byte-for-byte the serial
one.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from absl import logging

from lm.data.tokenizer import Tokenizer

SPLITS = ('train', 'validation')
Piece = tuple[str, bool]  # (text, a document ends after it: EOS follows)

TASK_CHARS = 1 << 20  # characters per tokenisation task (short documents are grouped)
POOL_AFTER_BYTES = 16 << 20  # a split starts the worker pool only once it has passed this size
LOG_EVERY_S = 10.0  # seconds between progress lines
_MB = 1e6


class Progress:
    """Log lines while a split is tokenised: bytes done, MB/s and, when the size is known, ETA."""

    def __init__(self, label: str, total_bytes: int | None):
        self.label, self.total, self.done = label, total_bytes, 0
        self.start = self.last = time.monotonic()

    def update(self, num_bytes: int) -> None:
        self.done += num_bytes
        now = time.monotonic()
        if now - self.last >= LOG_EVERY_S:
            self.last = now
            logging.info('data: tokenising %s', self.line(now))

    def line(self, now: float) -> str:
        rate = self.done / _MB / max(now - self.start, 1e-9)
        text = f'{self.label}: {self.done / _MB:,.1f} MB'
        if self.total:
            left = max(self.total - self.done, 0) / _MB / max(rate, 1e-9)
            text += f' of ~{self.total / _MB:,.1f} MB, {rate:.1f} MB/s, ETA {left:.0f} s'
        else:
            text += f', {rate:.1f} MB/s'
        return text

    def finish(self) -> None:
        now = time.monotonic()
        rate = self.done / _MB / max(now - self.start, 1e-9)
        logging.info(
            'data: tokenised %s: %.1f MB in %.1f s (%.1f MB/s)',
            self.label,
            self.done / _MB,
            now - self.start,
            rate,
        )


def encode_pieces(tok: Tokenizer, pieces: Iterable[Piece], dtype: np.dtype) -> tuple:
    """(tokens of `pieces` as one `dtype` array, EOS after each piece that ends a document,
    their UTF-8 byte count)."""
    arrays, num_bytes = [], 0
    eos = np.asarray([tok.eos_id], dtype)
    for text, end in pieces:
        num_bytes += len(text.encode('utf-8'))
        arrays.append(np.asarray(tok.encode_array(text), dtype))
        if end:
            arrays.append(eos)
    return (np.concatenate(arrays) if arrays else np.zeros(0, dtype)), num_bytes


def _tasks(pieces: Iterable[Piece], task_chars: int) -> Iterator[list[Piece]]:
    task, size = [], 0
    for piece in pieces:
        task.append(piece)
        size += len(piece[0])
        if size >= task_chars:
            yield task
            task, size = [], 0
    if task:
        yield task


_WORKER: dict = {}  # a pool worker's tokenizer and dtype


def _init_worker(tok: Tokenizer, dtype: np.dtype) -> None:
    _WORKER.update(tok=tok, dtype=dtype)


def _encode_task(task: list[Piece]) -> tuple[np.ndarray, int]:
    return encode_pieces(_WORKER['tok'], task, _WORKER['dtype'])


def write_split(
    f, pieces: Iterable[Piece], tok: Tokenizer, dtype: np.dtype, num_proc: int, progress: Progress
) -> int:
    """Tokenises `pieces` and appends the tokens to the binary file `f`; returns the UTF-8 byte
    count. Serial up to `POOL_AFTER_BYTES`, then (num_proc > 1, and a tokenizer for which
    workers pay: `tok.parallel`) a pool of num_proc processes."""
    num_bytes = 0
    tasks = _tasks(pieces, TASK_CHARS)
    for task in tasks:
        tokens, n = encode_pieces(tok, task, dtype)
        tokens.tofile(f)
        num_bytes += n
        progress.update(n)
        if num_proc > 1 and tok.parallel and num_bytes >= POOL_AFTER_BYTES:
            break
    else:
        return num_bytes
    context = multiprocessing.get_context('spawn')  # never fork a process that runs JAX
    with context.Pool(num_proc, _init_worker, (tok, dtype)) as pool:
        pending: collections.deque = collections.deque()
        for task in tasks:
            pending.append(pool.apply_async(_encode_task, (task,)))
            if len(pending) >= 2 * num_proc:
                num_bytes += _append(f, pending.popleft().get(), progress)
        while pending:
            num_bytes += _append(f, pending.popleft().get(), progress)
    return num_bytes


def _append(f, result: tuple[np.ndarray, int], progress: Progress) -> int:
    tokens, n = result
    tokens.tofile(f)
    progress.update(n)
    return n


@contextlib.contextmanager
def exclusive(path: str, what: str) -> Iterator[None]:
    """Holds an exclusive fcntl lock on the file `path` (created, waiting with a log line while
    another process holds it). The holder removes the file before it lets go, so nothing stays
    behind; a waiter that then gets the lock of a removed file tries again on the path."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.info('data: waiting for another process building %s (lock %s)', what, path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    try:
        yield
    finally:
        os.remove(path)  # before the lock is released: a waiter sees it gone and starts over
        os.close(fd)


def load_or_build(
    directory: str,
    pieces: Callable[[str], Iterable[Piece]],
    tok: Tokenizer,
    dtype: np.dtype,
    num_proc: int,
    sizes: Callable[[str], int | None],
) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, split -> token memmap) of the cache in `directory`, built first if it has no
    completed marker, by whichever process takes the lock first."""
    meta_path = os.path.join(directory, 'meta.json')
    if not os.path.isfile(meta_path):
        try:
            os.makedirs(os.path.dirname(directory) or '.', exist_ok=True)
            with exclusive(directory + '.lock', f'the token cache {directory}'):
                if not os.path.isfile(meta_path):  # else finished while this process waited
                    build(directory, pieces, tok, dtype, num_proc, sizes)
        except PermissionError as e:
            raise ValueError(
                f'config.data.cache_dir: cannot write the token cache {directory!r} ({e.strerror})'
            ) from None
    return open_cache(directory)


def build(
    directory: str,
    pieces: Callable[[str], Iterable[Piece]],
    tok: Tokenizer,
    dtype: np.dtype,
    num_proc: int,
    sizes: Callable[[str], int | None],
) -> None:
    """Tokenises every split into `directory` (the caller holds its lock), replacing whatever an
    unfinished build left there; meta.json last. A source that fails mid-way (offline, say)
    leaves no token file behind."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):  # leftovers of a build that did not finish
        os.remove(os.path.join(directory, name))
    meta = {'dtype': dtype.name, 'num_bytes': {}, 'num_tokens': {}}
    try:
        for split in SPLITS:
            progress = Progress(split, sizes(split))
            path = os.path.join(directory, f'{split}.bin')
            with open(path + '.partial', 'wb') as f:
                meta['num_bytes'][split] = write_split(
                    f, pieces(split), tok, dtype, num_proc, progress
                )
                f.flush()
                os.fsync(f.fileno())
            progress.finish()
            meta['num_tokens'][split] = os.path.getsize(path + '.partial') // dtype.itemsize
            if not meta['num_tokens'][split]:  # else cached, then read back as 'damaged'
                raise ValueError(
                    f'config.data: the {split} split holds no text (a source of too few '
                    'documents, or none read: see hf_max_docs, hf_eval_split, val_fraction); '
                    'nothing was cached'
                )
            os.replace(path + '.partial', path)
        meta_path = os.path.join(directory, 'meta.json')
        with open(meta_path + '.partial', 'w') as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(meta_path + '.partial', meta_path)
    except BaseException:
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))
        os.rmdir(directory)
        raise


def open_cache(directory: str) -> tuple[dict, dict[str, np.ndarray]]:
    """meta.json and the token memmaps of a completed cache directory; a damaged file (empty,
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
