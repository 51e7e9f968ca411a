"""Data sources, tokenizers, the token cache and batch determinism."""

import dataclasses
import re

import numpy as np
import pytest
from conftest import stdlib_text, tiny_config

from lm.config import default_values
from lm.config_migration import upgrade_config
from lm.data.checks import (
    check_data_config,
    check_idle_data,
    idle_data_settings,
    reset_idle_data,
)
from lm.data.corpus import (
    check_corpus_size,
    eval_batches,
    eval_windows,
    load_corpus,
    load_tokenizer,
    train_batch,
    window_targets,
)
from lm.data.files import _in_validation, stdlib_files
from lm.data.tokenizer import ByteTokenizer


def data_config(tmp_path, **overrides):
    data = tiny_config().data
    data.update(cache_dir=str(tmp_path / 'cache'), seq_len=16)
    data.update(overrides)
    return data


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding='utf-8')
    return str(path)


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = 'To be, or not to be — ¿qué?'
    assert tok.encode(text) == list(text.encode('utf-8'))
    assert tok.decode(tok.encode(text) + [tok.eos_id]) == text
    assert tok.vocab_size == 258


def test_text_source_holds_out_last_tenth_of_characters(tmp_path):
    text = ''.join(chr(ord('a') + i % 26) for i in range(1000))
    corpus = load_corpus(data_config(tmp_path, source='text', path=write(tmp_path, 'a.txt', text)))
    tok = corpus.tokenizer
    assert tok.decode(corpus.tokens['train']) == text[:900]
    assert tok.decode(corpus.tokens['validation']) == text[900:]
    assert corpus.num_bytes == {'train': 900, 'validation': 100}
    assert corpus.tokens['train'].dtype == np.uint16


def test_several_text_files_are_concatenated(tmp_path):
    paths = [write(tmp_path, f'{i}.txt', str(i) * 50) for i in range(2)]
    corpus = load_corpus(data_config(tmp_path, source='text', path=','.join(paths)))
    assert corpus.tokenizer.decode(corpus.tokens['train']) == ('0' * 50 + '1' * 50)[:90]


def test_a_file_listed_twice_is_refused(tmp_path, monkeypatch):
    a, b = write(tmp_path, 'a.txt', 'a' * 50), write(tmp_path, 'b.txt', 'b' * 50)
    monkeypatch.chdir(tmp_path)
    for twice in (f'{a},{b},{a}', f'{b},a.txt,{a}'):  # by one path, or a relative and absolute
        with pytest.raises(ValueError, match=r'^config.data.path names one file twice \('):
            check_data_config(data_config(tmp_path, source='text', path=twice))
    copy = write(tmp_path, 'copy.txt', 'b' * 50)  # the same bytes under another name
    check_data_config(data_config(tmp_path, source='text', path=f'{a},{b},{copy}'))
    with pytest.raises(
        ValueError, match=r"^config.data.path: '.*copy.txt' holds the same bytes as '.*b.txt'"
    ):
        load_corpus(data_config(tmp_path, source='text', path=f'{a},{b},{copy}'))


def test_a_file_whose_name_holds_a_comma_is_refused_by_name(tmp_path):
    """data.path is comma-separated, so a file named 'a,b.txt' reads as files 'a' and 'b.txt':
    the error names the file and the comma, not a missing 'a'."""
    other = write(tmp_path, 'other.txt', 'o' * 50)
    comma = write(tmp_path, 'one,two.txt', 'c' * 50)
    for value in (comma, f'{other}, {comma}', f'{comma},{other}'):
        with pytest.raises(ValueError, match=r"^config.data.path: '.*one,two.txt' is a file whose"):
            check_data_config(data_config(tmp_path, source='text', path=value))
    with pytest.raises(FileNotFoundError, match=r"^config.data.path: '.*three' does not exist"):
        check_data_config(data_config(tmp_path, source='text', path=f'{other},{tmp_path}/three'))


def test_cache_is_reused_and_keyed_by_content(tmp_path, monkeypatch):
    path = write(tmp_path, 'a.txt', 'hello world ' * 50)
    first = load_corpus(data_config(tmp_path, source='text', path=path))
    monkeypatch.setattr('lm.data.cache.write_split', lambda *a: pytest.fail('tokenised twice'))
    again = load_corpus(data_config(tmp_path, source='text', path=path))
    assert again.fingerprint == first.fingerprint
    monkeypatch.undo()
    write(tmp_path, 'a.txt', 'another text ' * 50)
    assert load_corpus(data_config(tmp_path, source='text', path=path)).fingerprint != (
        first.fingerprint
    )


def test_stdlib_source_has_no_tests_and_a_stable_split(tmp_path):
    files = [rel for rel, _ in stdlib_files()]
    assert len(files) > 300
    assert not any('/test/' in f'/{r}' or '/tests/' in f'/{r}' for r in files)
    assert not any(r.split('/')[-1].startswith('test_') for r in files)
    assert 'os.py' in files and 'json/decoder.py' in files
    # Stable: a file's split is a function of its relative path alone, the same in every process
    # and Python version (these memberships were recorded once and must never change), ...
    pinned = {
        'asyncio/tasks.py': True,
        'dataclasses.py': True,
        'inspect.py': True,
        'os.py': False,
        'json/decoder.py': False,
        'typing.py': False,
    }
    assert {rel: _in_validation(rel, 0.1) for rel in pinned} == pinned
    # ... so files added or removed by another Python release do not move the others. The
    # held-out share is about val_fraction.
    held_out = [rel for rel in files if _in_validation(rel, 0.1)]
    assert 0.05 < len(held_out) / len(files) < 0.15


def test_hf_source_from_local_files(tmp_path):
    lines = [f'line number {i} of a local dataset' for i in range(200)]
    path = write(tmp_path, 'docs.txt', '\n'.join(lines))
    data = data_config(
        tmp_path, source='hf', hf_name='text', path=path, val_fraction=0.1, hf_sample_by='line'
    )
    corpus = load_corpus(data)
    tok = corpus.tokenizer
    numbers = {
        split: [int(n) for n in re.findall(r'line number (\d+) ', tok.decode(corpus.tokens[split]))]
        for split in ('train', 'validation')
    }
    # val_fraction 0.1 with no hf_eval_split: every 10th document is held out, the rest trains.
    assert numbers['validation'] == list(range(9, 200, 10))
    assert numbers['train'] == [i for i in range(200) if i % 10 != 9]
    # the cache is keyed by the files' bytes: a changed file is read again, not the old tokens
    with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines[:100]))
    assert len(load_corpus(data).tokens['train']) < 0.6 * len(corpus.tokens['train'])
    copy = write(tmp_path, 'copy.txt', '\n'.join(lines[:100]))
    with pytest.raises(ValueError, match=r"'.*copy\.txt' holds the same bytes as '.*docs\.txt'"):
        load_corpus(data_config(tmp_path, source='hf', hf_name='text', path=f'{path},{copy}'))
    with pytest.raises(ValueError, match=r"^config\.data\.hf_eval_split='train' is hf_split: "):
        load_corpus(
            data_config(tmp_path, source='hf', hf_name='text', path=path, hf_eval_split='train')
        )


def test_hf_text_groups_paragraphs_into_documents_and_logs_sizes(tmp_path, caplog):
    """hf_name='text' splits train / validation by document (a paragraph by default), never
    between the lines of one document."""
    docs = [
        '\n'.join(f'doc {d} line {i}' for i in range(5)) for d in range(40)
    ]  # 40 paragraphs of 5 lines, separated by blank lines
    path = write(tmp_path, 'docs.txt', '\n\n'.join(docs) + '\n')
    data = data_config(tmp_path, source='hf', hf_name='text', path=path, val_fraction=0.1)
    assert data.hf_sample_by == 'paragraph'
    with caplog.at_level('INFO'):
        corpus = load_corpus(data)
    tok = corpus.tokenizer
    train_text = tok.decode(corpus.tokens['train'])
    val_text = tok.decode(corpus.tokens['validation'])
    held_out = {d for d in range(40) if f'doc {d} line 0' in val_text}
    assert held_out == {9, 19, 29, 39}  # every 10th document, whole
    for d in range(40):
        where = val_text if d in held_out else train_text
        other = train_text if d in held_out else val_text
        assert all(f'doc {d} line {i}' in where for i in range(5))
        assert f'doc {d} line' not in other
    assert 'data: hf source, text' in caplog.text
    assert f'train {len(corpus.tokens["train"]):,} tokens' in caplog.text
    assert 'tokenizer byte, 258 tokens' in caplog.text


def test_text_that_is_not_utf8_is_refused_unless_replaced(tmp_path):
    tokens = tmp_path / 'train.bin'  # a nanoGPT-style uint16 token file
    tokens.write_bytes(np.arange(1000, 3000, dtype=np.uint16).tobytes())  # starts e8 03
    with pytest.raises(ValueError, match=r"train.bin' is not UTF-8 text \(byte 0xe8 at offset 0"):
        load_corpus(data_config(tmp_path, source='text', path=str(tokens)))
    path = tmp_path / 'latin1.txt'
    path.write_bytes(b'hello world\n' * 100 + 'caf\xe9\n'.encode('latin-1') * 100)
    data = data_config(tmp_path, source='text', path=str(path))
    with pytest.raises(
        ValueError,
        match=r"latin1.txt' is not UTF-8 text \(byte 0xe9 at offset 1203\); "
        r"set config.data.decode_errors='replace'",
    ):
        load_corpus(data)
    assert not (tmp_path / 'cache').exists()  # refused before anything was tokenised
    data.decode_errors = 'replace'
    corpus = load_corpus(data)
    assert 'caf\ufffd\n' in corpus.tokenizer.decode(corpus.tokens['train'])
    with pytest.raises(ValueError, match='decode_errors must be one of'):
        load_corpus(data_config(tmp_path, source='text', path=str(path), decode_errors='ignore'))


def test_configs_written_before_the_data_keys_read_as_before():
    saved = tiny_config().to_dict()
    del saved['data']['decode_errors'], saved['data']['hf_sample_by']
    data = upgrade_config(saved).data
    assert data.decode_errors == 'replace' and data.hf_sample_by == 'line'  # the old behaviour


def test_bpe_is_trained_once_and_cached(tmp_path):
    text = stdlib_text(200_000)
    path = write(tmp_path, 's.txt', text)
    data = data_config(tmp_path, source='text', path=path, tokenizer='bpe', bpe_vocab_size=600)
    corpus = load_corpus(data)
    tok = corpus.tokenizer
    assert tok.vocab_size == 600
    assert len(corpus.tokens['train']) < 0.7 * corpus.num_bytes['train']  # it compresses
    sample = text[1000:1300]
    assert tok.decode(tok.encode(sample)) == sample
    json_path = next((tmp_path / 'cache' / 'tokenizers').glob('bpe-*.json'))
    again = load_corpus(data_config(tmp_path, source='text', path=path, tokenizer=str(json_path)))
    assert again.tokenizer.encode(sample) == tok.encode(sample)


def test_tokenizer_identity_tells_a_bpe_trained_on_other_text_without_training_it(tmp_path):
    """eval.py's check that other data is tokenised as the run was: a BPE is named by its
    cached file (equal to a tokenizer.json naming that file), a BPE not yet trained by its text,
    and nothing is trained to tell them apart."""
    from lm.data.corpus import tokenizer_identity

    a, b = write(tmp_path, 'a.txt', stdlib_text(50_000)), write(tmp_path, 'b.txt', 'other ' * 9000)
    bpe_a = data_config(tmp_path, source='text', path=a, tokenizer='bpe', bpe_vocab_size=600)
    untrained = tokenizer_identity(bpe_a)
    assert untrained.key[0] == 'bpe' and untrained.file == ''
    assert not (tmp_path / 'cache' / 'tokenizers').exists()  # nothing trained to tell
    load_corpus(bpe_a)
    trained = tokenizer_identity(bpe_a)
    assert trained.file and trained.name == f'the BPE {trained.file}'
    as_file = data_config(tmp_path, source='text', path=b, tokenizer=trained.file)
    assert tokenizer_identity(as_file).key == trained.key  # other text, the run's BPE
    bpe_b = data_config(tmp_path, source='text', path=b, tokenizer='bpe', bpe_vocab_size=600)
    assert tokenizer_identity(bpe_b).key != trained.key  # a BPE of other text: other ids
    eos = data_config(tmp_path, source='text', path=b, tokenizer=trained.file, eos_token='<pad>')
    assert tokenizer_identity(eos).key != trained.key
    byte = tokenizer_identity(data_config(tmp_path, source='text', path=b))
    assert byte.key == tokenizer_identity(data_config(tmp_path, source='passkey')).key
    assert byte.key != tokenizer_identity(data_config(tmp_path, source='mqar')).key


def test_train_batches_are_pure_and_hosts_disjoint():
    tokens = np.arange(10_000, dtype=np.uint16)
    kw = dict(seed=3, batch_size=8, seq_len=16)
    a, b = train_batch(tokens, step=5, **kw), train_batch(tokens, step=5, **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, train_batch(tokens, step=6, **kw))
    assert a.shape == (8, 17) and a.dtype == np.int32
    np.testing.assert_array_equal(a[:, 1:], a[:, :-1] + 1)  # consecutive windows
    halves = [train_batch(tokens, step=5, process_index=p, process_count=2, **kw) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), a)


def scored(batches):
    """(input token, target token) of every weighted position of a list of eval batches."""
    pairs = []
    for batch, weights in batches:
        assert batch.dtype == np.int32 and weights.dtype == np.float32
        assert set(np.unique(weights)) <= {0.0, 1.0}
        r, t = np.nonzero(weights)
        pairs += list(zip(batch[r, t].tolist(), batch[r, t + 1].tolist(), strict=True))
    return pairs


@pytest.mark.parametrize('n', [1000, 1001, 1003, 11])
def test_eval_windows_score_every_target_exactly_once(n):
    tokens = np.arange(n, dtype=np.uint16)  # token i sits at position i
    starts = eval_windows(n, 10, 0)
    assert len(starts) == -(-(n - 1) // 10)  # the last, partial window included
    np.testing.assert_array_equal(window_targets(n, starts, 10).sum(), n - 1)
    batches = list(eval_batches(tokens, starts, batch_size=4, seq_len=10))
    assert {b.shape for b, _ in batches} == {(4, 11)} and {w.shape for _, w in batches} == {(4, 10)}
    assert scored(batches) == [(i, i + 1) for i in range(n - 1)]  # each target once, in order
    halves = [
        list(
            eval_batches(tokens, starts, batch_size=4, seq_len=10, process_index=p, process_count=2)
        )
        for p in (0, 1)
    ]
    for whole, *parts in zip(batches, *halves, strict=True):  # hosts: disjoint rows, same set
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), whole[0])
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), whole[1])


def test_eval_tokens_spreads_whole_windows_over_the_split():
    starts = eval_windows(1001, 10, 0)
    np.testing.assert_array_equal(starts, np.arange(100) * 10)
    some = eval_windows(1001, 10, 95)  # ceil(95 / 10) = 10 windows, one in every ten
    np.testing.assert_array_equal(some, np.arange(10) * 100)
    np.testing.assert_array_equal(eval_windows(1001, 10, 10**9), starts)  # capped at the split
    np.testing.assert_array_equal(eval_windows(1001, 10, 95), some)  # deterministic


@pytest.mark.parametrize(
    'overrides,error,message',
    [
        (
            dict(source='text', path='/nonexistent/file.txt'),
            FileNotFoundError,
            r"config.data.path: '/nonexistent/file.txt' does not exist",
        ),
        (
            dict(source='text', path='no/such.txt'),
            FileNotFoundError,
            r"^config.data.path: 'no/such.txt' does not exist \(relative to the current "
            r'directory /\S+\)$',
        ),
        (dict(source='text', path='/dev/null'), ValueError, r"'/dev/null' is not a regular file$"),
        (dict(source='text', path=''), ValueError, r'config.data.path must name at least one'),
        (dict(source='web'), ValueError, r'config.data.source must be one of'),
        (dict(source='hf', hf_name=''), ValueError, r'config.data.hf_name must be set'),
        (dict(tokenizer='sentencepiece'), ValueError, r'config.data.tokenizer must be'),
        (dict(tokenizer='/missing/tokenizer.json'), FileNotFoundError, r'is not a file'),
        (dict(val_fraction=1.5), ValueError, r'val_fraction must be in \(0, 1\)'),
        (dict(sampling='shuffle'), ValueError, r"config.data.sampling must be one of \('random'"),
        (dict(num_proc=-1), ValueError, r'config.data.num_proc must be an integer >= 0'),
    ],
)
def test_bad_data_settings(tmp_path, overrides, error, message):
    with pytest.raises(error, match=message):
        check_data_config(data_config(tmp_path, **overrides))


@pytest.mark.parametrize(
    'source,key,value',
    [
        ('text', 'recall_pairs', 4),
        ('text', 'passkey_lengths', '64'),
        ('text', 'hf_name', 'someone/data'),
        ('stdlib', 'hf_max_docs', 10),
        ('hf', 'recall_vocab', 64),
        # one task's own keys on another (each was taken and entered the eval's fingerprint)
        ('mqar', 'passkey_lengths', '64'),
        ('mqar_zoology', 'recall_power_a', 0.5),
        ('passkey', 'recall_power_a', 0.5),
    ],
)
def test_a_setting_the_source_never_reads_is_refused(tmp_path, source, key, value):
    base = default_values('data')
    check_idle_data(data_config(tmp_path, source=source), base)  # the defaults: nothing said
    with pytest.raises(ValueError, match=rf'^config.data.{key}={value!r} does nothing for source'):
        check_idle_data(data_config(tmp_path, source=source, **{key: value}), base)
    check_idle_data(data_config(tmp_path, source='hf', hf_name='someone/data'), base)  # read


@pytest.mark.parametrize(
    'settings,key,why,reads',
    [
        ({'uptrain_fraction': 0.2}, 'uptrain_fraction', "split=''", {'split': 'uptrain'}),
        ({'heldout_fraction': 0.3}, 'heldout_fraction', "split=''", {'split': 'pretrain'}),
        ({'split_layout': 'interleaved'}, 'split_layout', "split=''", {'split': 'pretrain'}),
        (
            {'split': 'pretrain', 'split_block': 64},
            'split_block',
            "split_layout='contiguous'",
            {'split_layout': 'interleaved'},
        ),
        (
            {'split': 'pretrain+uptrain', 'uptrain_fraction': 0.3},
            'uptrain_fraction',
            "split='pretrain+uptrain' and split_layout='contiguous'",
            {'split_layout': 'interleaved'},
        ),
        ({'bpe_vocab_size': 8192}, 'bpe_vocab_size', "tokenizer='byte'", {'tokenizer': 'bpe'}),
        ({'eos_token': '</s>'}, 'eos_token', "tokenizer='byte'", {'tokenizer': 'x.json'}),
    ],
)
def test_a_setting_the_part_or_tokenizer_never_reads_is_refused(
    tmp_path, settings, key, why, reads
):
    """The parts' settings without data.split, the interleaved layout's block with the
    contiguous one, a BPE size or an EOS token with the byte tokenizer do nothing: refused in
    one line; `reset_idle_data` sets them back; with what reads them, they pass."""
    base = default_values('data')
    data = data_config(tmp_path, source='text', **settings)
    assert list(idle_data_settings(data, base)) == [key]
    with pytest.raises(
        ValueError, match=rf'^config.data.{key}=.* does nothing with {re.escape(why)}'
    ):
        check_idle_data(data, base)
    assert list(reset_idle_data(data, base)) == [f'{key}={settings[key]!r}']
    assert data[key] == base[key][0] and not idle_data_settings(data, base)
    assert not idle_data_settings(data_config(tmp_path, **{**settings, **reads}), base)


def test_empty_file_and_too_small_source(tmp_path):
    empty = write(tmp_path, 'empty.txt', '')
    with pytest.raises(ValueError, match=r'empty.txt.* is empty'):
        check_data_config(data_config(tmp_path, source='text', path=empty))
    small = load_corpus(
        data_config(tmp_path, source='text', path=write(tmp_path, 's.txt', 'x' * 500))
    )
    with pytest.raises(ValueError, match=r'^the train split has 451 tokens, fewer than one batch'):
        check_corpus_size(small, batch_size=4, seq_len=128)
    check_corpus_size(small, batch_size=4, seq_len=16)  # 51 validation tokens: 4 windows
    for size in (1, 17):  # 17 tokens: 16 targets, one window, no standard error
        val = np.zeros(size, np.int32)
        tiny = dataclasses.replace(small, tokens={**small.tokens, 'validation': val})
        with pytest.raises(
            ValueError,
            match=rf'^the validation split has {size} tokens, fewer than the 18 of two evaluation '
            r'windows of config.data.seq_len=16 targets',
        ):
            check_corpus_size(tiny, batch_size=4, seq_len=16)
    two = dataclasses.replace(small, tokens={**small.tokens, 'validation': np.zeros(18, np.int32)})
    check_corpus_size(two, batch_size=4, seq_len=16)  # 17 targets: two windows


def test_call_batch_stacks_consecutive_steps_and_is_train_batch_for_one():
    from lm.data.corpus import call_batch, train_batch

    tokens = np.arange(1000, dtype=np.int32)
    kw = dict(seed=3, batch_size=4, seq_len=8, process_index=1, process_count=2)
    stacked = call_batch(tokens, step=5, steps=3, **kw)
    assert stacked.shape == (3, 2, 9)
    for i in range(3):
        np.testing.assert_array_equal(stacked[i], train_batch(tokens, step=5 + i, **kw))
    np.testing.assert_array_equal(
        call_batch(tokens, step=5, steps=1, **kw), train_batch(tokens, step=5, **kw)
    )


def test_a_tokenizer_that_needs_no_data_loads_without_them(tmp_path):
    """Generation and export of a run whose training text has moved: the byte tokenizer (or a
    tokenizer.json) loads without the data; a BPE, cached by the data's fingerprint, needs
    them and says so in one line."""
    config = tiny_config()
    config.data.update(source='text', path=str(tmp_path / 'moved.txt'), tokenizer='byte')
    assert isinstance(load_tokenizer(config.data), ByteTokenizer)
    config.data.tokenizer = 'bpe'
    with pytest.raises(FileNotFoundError, match=r"^config.data.path: '.*moved.txt' does not exist"):
        load_tokenizer(config.data)
