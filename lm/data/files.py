"""Local sources read from files: the running Python's standard-library .py files (split by a
stable hash of each file's path) and text files, streamed (read, decoded and cut into pieces a
few MB at a time, so a file's size is not bounded by memory). Each returns (fingerprint key,
split -> pieces, split -> about how many bytes) for `lm.data.corpus`."""

from __future__ import annotations

import codecs
import hashlib
import itertools
import os
import re
import sysconfig
from collections.abc import Callable, Iterator

import ml_collections

from lm.data.cache import Piece

READ_BYTES = 1 << 22  # bytes of a text file read (and decoded) at a time
PIECE_CHARS = 1 << 16  # a text split is tokenised in pieces of about this many characters
_SAFE_CUT = re.compile(r'(?<=\S) (?=\S)')  # a space between two non-space characters
_TEST_DIRS = {'test', 'tests', 'idle_test', 'site-packages', 'dist-packages', '__pycache__'}


def text_paths(data: ml_collections.ConfigDict) -> list[str]:
    """`config.data.path`'s files (comma-separated)."""
    return split_paths(data.path)


def split_paths(path: str) -> list[str]:
    """The files of a `data.path` value: comma-separated, blanks dropped."""
    return [p.strip() for p in path.split(',') if p.strip()]


def stdlib_files() -> list[tuple[str, str]]:
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


def _not_utf8(path: str, byte: int, offset: int) -> str:
    return (
        f'config.data.path: {path!r} is not UTF-8 text (byte 0x{byte:02x} at offset {offset}); '
        "set config.data.decode_errors='replace' to read it anyway"
    )


def _decoded(path: str, errors: str, digest=None) -> Iterator[str]:
    """The UTF-8 text of `path`, read and decoded `READ_BYTES` at a time (exactly as one
    `bytes.decode`); `digest` (a hashlib object) is fed the raw bytes. With errors='strict', a
    byte that is not UTF-8 is a one-line error naming the file and its offset."""
    decoder = codecs.getincrementaldecoder('utf-8')(errors)
    offset = 0
    with open(path, 'rb') as f:
        while True:
            raw = f.read(READ_BYTES)
            if digest is not None:
                digest.update(raw)
            pending = len(decoder.getstate()[0])  # bytes of a character split between reads
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                where = offset - pending + e.start
                raise ValueError(_not_utf8(path, e.object[e.start], where)) from None
            offset += len(raw)
            if text:
                yield text
            if not raw:
                return


def _cut(buffer: str, start: int) -> int | None:
    """Where a piece of `buffer` that starts at `start` ends: the first space at or after
    start + PIECE_CHARS that sits between two non-space characters (byte-level BPE's
    pre-tokenizer, GPT-2's pattern, always splits there, so pieces tokenise exactly as the whole
    text); at start + PIECE_CHARS if 64 pieces' worth hold no such space; None = read more."""
    if match := _SAFE_CUT.search(buffer, start + PIECE_CHARS):
        return match.start()
    return start + PIECE_CHARS if len(buffer) - start >= 64 * PIECE_CHARS else None


def _text_pieces(paths: list[str], errors: str, start: int, stop: int) -> Iterator[Piece]:
    """Characters [start, stop) of the files' concatenated text, one document in pieces of
    about PIECE_CHARS characters (`_cut`), streamed: memory holds a read and a piece."""
    buffer, first, pos = '', 0, 0  # buffer[first:] is not yet handed out
    for text in itertools.chain.from_iterable(_decoded(p, errors) for p in paths):
        lo, hi = max(start - pos, 0), min(stop - pos, len(text))
        pos += len(text)
        if lo < hi:
            buffer, first = buffer[first:] + text[lo:hi], 0
        while len(buffer) - first > PIECE_CHARS and (cut := _cut(buffer, first)) is not None:
            yield buffer[first:cut], False
            first = cut
        if pos >= stop:
            break
    yield buffer[first:], True


def stdlib_source(data: ml_collections.ConfigDict) -> tuple[list, Callable, Callable]:
    files = stdlib_files()
    key = [(rel, os.path.getsize(full)) for rel, full in files]

    def in_split(rel: str, split: str) -> bool:
        return _in_validation(rel, data.val_fraction) == (split == 'validation')

    def pieces(split: str) -> Iterator[Piece]:
        for rel, full in files:
            if in_split(rel, split):
                yield _read(full), True

    def size(split: str) -> int:
        return sum(os.path.getsize(full) for rel, full in files if in_split(rel, split))

    return key, pieces, size


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes, read a few MB at a time."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def file_digests(paths: list[str]) -> list[str]:
    """`file_sha256` of each file; two files of the same bytes are refused (their text would be
    read twice, and could then be in both splits)."""
    digests: list[str] = []
    for path in paths:
        _check_new_digest(file_sha256(path), digests, paths, path)
    return digests


def _check_new_digest(h: str, digests: list[str], paths: list[str], path: str) -> None:
    """Appends `path`'s digest `h` to `digests`, refusing one already there."""
    if h in digests:
        raise ValueError(
            f'config.data.path: {path!r} holds the same bytes as {paths[digests.index(h)]!r}: '
            'its text would be read twice, and could then be in both splits; list it once'
        )
    digests.append(h)


def text_source(data: ml_collections.ConfigDict) -> tuple[list, Callable, Callable]:
    """The files are hashed and checked for UTF-8 in one streaming pass before anything is
    tokenised (two files of the same bytes are refused); the last `val_fraction` of their
    characters is validation."""
    paths = text_paths(data)
    key, chars = [], 0
    for p in paths:
        digest = hashlib.sha256()
        chars += sum(len(text) for text in _decoded(p, data.decode_errors, digest))
        _check_new_digest(digest.hexdigest(), key, paths, p)
    cut = int(chars * (1 - data.val_fraction))
    total = sum(os.path.getsize(p) for p in paths)

    def pieces(split: str) -> Iterator[Piece]:
        start, stop = (0, cut) if split == 'train' else (cut, chars)
        return _text_pieces(paths, data.decode_errors, start, stop)

    def size(split: str) -> int:
        return round(total * (1 - data.val_fraction if split == 'train' else data.val_fraction))

    return key, pieces, size
