"""The token cache at scale: streamed and parallel tokenisation give the serial whole-text
cache token for token; one process builds a cache while others wait; an interrupted build is
never reused; a damaged file is a one-line error naming it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ENV, ROOT, stdlib_text, tiny_config

import lm.data.cache
import lm.data.corpus
import lm.data.files
from lm.data.corpus import _source, load_corpus
from lm.data.tokenizer import train_bpe


def data_config(root, **overrides):
    data = tiny_config().data
    data.update(cache_dir=str(root / 'cache'), seq_len=16)
    data.update(overrides)
    return data


def odd_text() -> bytes:
    """Source text with multi-byte characters everywhere and two bytes that are not UTF-8."""
    text = stdlib_text(30_000)
    words = 'naïve café — ünïcödé 日本語 🙂 '
    mixed = ''.join(text[i : i + 700] + words for i in range(0, len(text), 700))
    return mixed[:20_000].encode() + b'\xff\xfe broken\n' + mixed[20_000:].encode()


def streamed_small(monkeypatch):
    """Reads, pieces and tasks far smaller than the text, as a multi-GB file meets them."""
    monkeypatch.setattr(lm.data.files, 'READ_BYTES', 999)  # reads end inside multi-byte characters
    monkeypatch.setattr(lm.data.files, 'PIECE_CHARS', 1000)
    monkeypatch.setattr(lm.data.cache, 'TASK_CHARS', 3000)


@pytest.mark.parametrize('tokenizer', ['byte', 'bpe'])
def test_streamed_cache_is_the_whole_text_tokenised_at_once(tmp_path, monkeypatch, tokenizer):
    raw = odd_text()
    path = tmp_path / 'a.txt'
    path.write_bytes(raw)
    streamed_small(monkeypatch)
    data = data_config(
        tmp_path,
        source='text',
        path=str(path),
        decode_errors='replace',
        tokenizer=tokenizer,
        bpe_vocab_size=600,
    )
    pieces = list(_source(data).pieces('train'))
    assert len(pieces) > 20 and max(len(text) for text, _ in pieces) < 2000
    assert [end for _, end in pieces] == [False] * (len(pieces) - 1) + [True]
    corpus = load_corpus(data)
    # The reference is the path before streaming: the whole file decoded at once, each split
    # one document tokenised by one call, EOS after it.
    text = raw.decode('utf-8', errors='replace')
    cut = int(len(text) * 0.9)
    tok = corpus.tokenizer
    if tokenizer == 'bpe':  # trained from the pieces: the same file as from the whole text
        ref_path = tmp_path / 'ref' / 'bpe.json'
        tok = train_bpe(iter([text[:cut]]), 600, str(ref_path))
        trained = next((tmp_path / 'cache' / 'tokenizers').glob('bpe-*.json'))
        assert trained.read_bytes() == ref_path.read_bytes()
    for split, part in (('train', text[:cut]), ('validation', text[cut:])):
        want = np.asarray(tok.encode(part) + [tok.eos_id])
        np.testing.assert_array_equal(corpus.tokens[split], want)
        assert corpus.num_bytes[split] == len(part.encode())


def test_a_byte_that_is_not_utf8_is_named_by_its_offset_across_reads(tmp_path, monkeypatch):
    streamed_small(monkeypatch)
    raw = odd_text()
    (tmp_path / 'a.txt').write_bytes(raw)
    with pytest.raises(ValueError, match=rf'not UTF-8 text \(byte 0xff at offset {raw.index(255)}'):
        load_corpus(data_config(tmp_path, source='text', path=str(tmp_path / 'a.txt')))


def test_parallel_tokenisation_writes_the_serial_cache(tmp_path, monkeypatch):
    text = stdlib_text(60_000)
    (tmp_path / 'a.txt').write_text(text, encoding='utf-8')
    tok_path = str(tmp_path / 'tok.json')
    train_bpe(iter([text]), 600, tok_path)
    monkeypatch.setattr(lm.data.files, 'PIECE_CHARS', 1000)
    monkeypatch.setattr(lm.data.cache, 'TASK_CHARS', 2000)
    monkeypatch.setattr(lm.data.cache, 'POOL_AFTER_BYTES', 5000)
    from_pool = []
    append = lm.data.cache._append
    monkeypatch.setattr(lm.data.cache, '_append', lambda *a: from_pool.append(1) or append(*a))
    corpora = {
        n: load_corpus(
            data_config(
                tmp_path / f'p{n}',
                source='text',
                path=str(tmp_path / 'a.txt'),
                tokenizer=tok_path,
                num_proc=n,
            )
        )
        for n in (1, 2)
    }
    assert len(from_pool) > 10  # the two-process run tokenised most tasks in its pool
    for split in ('train', 'validation'):
        np.testing.assert_array_equal(corpora[2].tokens[split], corpora[1].tokens[split])
    assert corpora[2].num_bytes == corpora[1].num_bytes


BUILDER = """
import json, os, sys, time
import ml_collections
import lm.data.corpus, lm.data.cache

data = ml_collections.ConfigDict(json.loads(sys.argv[1]))
root, name, mode = sys.argv[2:5]
lm.data.cache.TASK_CHARS = 2000
encode, build = lm.data.cache.encode_pieces, lm.data.cache.build

def slow_encode(*args):  # a slow tokenizer, so that two builds would overlap
    time.sleep(0.02)
    return encode(*args)

def loud_build(*args):
    print('BUILDING', flush=True)
    build(*args)

lm.data.cache.encode_pieces, lm.data.cache.build = slow_encode, loud_build
if mode == 'crash':  # dies as the completed marker is written: every token file is done
    lm.data.cache.json.dump = lambda *args, **kwargs: os._exit(3)
open(os.path.join(root, 'ready-' + name), 'w').close()
while not os.path.exists(os.path.join(root, 'go')):
    time.sleep(0.01)
corpus = lm.data.corpus.load_corpus(data)
train = corpus.tokens['train']
print('TOKENS', len(train), int(train.astype('int64').sum()), flush=True)
"""


def start_builder(tmp_path, data, name, mode='build'):
    argv = [sys.executable, '-c', BUILDER, json.dumps(data.to_dict()), str(tmp_path), name, mode]
    return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)


def byte_reference(text):
    cut = int(len(text) * 0.9)
    return {
        split: np.asarray(list(part.encode()) + [256])
        for split, part in (('train', text[:cut]), ('validation', text[cut:]))
    }


@pytest.mark.slow
def test_two_processes_building_one_cache_build_it_once(tmp_path):
    text = stdlib_text(60_000)
    (tmp_path / 'a.txt').write_text(text, encoding='utf-8')
    data = data_config(tmp_path, source='text', path=str(tmp_path / 'a.txt'))
    procs = [start_builder(tmp_path, data, name) for name in 'ab']
    while not all((tmp_path / f'ready-{name}').exists() for name in 'ab'):
        assert all(p.poll() is None for p in procs)
    (tmp_path / 'go').touch()  # both look for the cache at the same moment
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(out.count('BUILDING') for out in outputs) == 1, outputs
    corpus = load_corpus(data)
    want = byte_reference(text)
    for split in ('train', 'validation'):
        np.testing.assert_array_equal(corpus.tokens[split], want[split])
    seen = f'TOKENS {len(want["train"])} {want["train"].sum()}'
    assert all(seen in out for out in outputs), outputs  # both read the one correct cache
    assert len(os.listdir(tmp_path / 'cache')) == 1  # the cache directory; no lock file left


@pytest.mark.slow
def test_an_interrupted_build_is_not_reused(tmp_path, monkeypatch):
    text = stdlib_text(20_000)
    (tmp_path / 'a.txt').write_text(text, encoding='utf-8')
    data = data_config(tmp_path, source='text', path=str(tmp_path / 'a.txt'))
    (tmp_path / 'go').touch()
    crashed = start_builder(tmp_path, data, 'a', mode='crash')
    crashed.communicate(timeout=120)
    assert crashed.returncode == 3
    (directory,) = [p for p in (tmp_path / 'cache').iterdir() if p.is_dir()]
    assert {'train.bin', 'validation.bin'} <= set(os.listdir(directory))  # whole token files
    assert not (directory / 'meta.json').exists()
    builds = []
    build = lm.data.cache.build
    monkeypatch.setattr(lm.data.cache, 'build', lambda *a: builds.append(1) or build(*a))
    corpus = load_corpus(data)
    assert builds == [1]  # rebuilt, not read
    for split, want in byte_reference(text).items():
        np.testing.assert_array_equal(corpus.tokens[split], want)
    assert sorted(os.listdir(directory)) == ['meta.json', 'train.bin', 'validation.bin']


def test_a_truncated_token_file_is_a_one_line_error_naming_it(tmp_path):
    (tmp_path / 'a.txt').write_text(stdlib_text(5_000), encoding='utf-8')
    data = data_config(tmp_path, source='text', path=str(tmp_path / 'a.txt'))
    load_corpus(data)
    (path,) = (tmp_path / 'cache').glob('*/validation.bin')
    size = path.stat().st_size
    with open(path, 'r+b') as f:
        f.truncate(size - 2)
    with pytest.raises(ValueError) as error:
        load_corpus(data)
    message = str(error.value)
    assert '\n' not in message
    assert f"data cache file '{path}' is damaged ({size - 2} bytes, expected {size} bytes)" in (
        message
    )
    assert 'to rebuild it' in message


def test_progress_lines_give_the_rate_and_time_left(tmp_path, monkeypatch, caplog):
    progress = lm.data.cache.Progress('train', 100_000_000)
    progress.done = 25_000_000
    assert progress.line(progress.start + 5.0) == (
        'train: 25.0 MB of ~100.0 MB, 5.0 MB/s, ETA 15 s'
    )
    unknown = lm.data.cache.Progress('validation', None)  # an hf source: size unknown
    unknown.done = 3_000_000
    assert unknown.line(unknown.start + 2.0) == 'validation: 3.0 MB, 1.5 MB/s'
    monkeypatch.setattr(lm.data.cache, 'LOG_EVERY_S', 0.0)
    monkeypatch.setattr(lm.data.cache, 'TASK_CHARS', 1000)
    (tmp_path / 'a.txt').write_text(stdlib_text(5_000), encoding='utf-8')
    with caplog.at_level('INFO'):
        load_corpus(data_config(tmp_path, source='text', path=str(tmp_path / 'a.txt')))
    assert 'data: tokenising train: ' in caplog.text and ' MB/s, ETA ' in caplog.text
    assert 'data: tokenised validation: ' in caplog.text
