"""Recall sources (lm/data/recall.py): every answer re-derived from its row in plain Python,
determinism by seed, the answer-only loss against a float64 reference, and training a recall
config logging eval/recall_accuracy to TensorBoard."""

import csv
import json
import re

import jax
import numpy as np
import pytest
from conftest import ROOT, read_scalars, run_entry, tiny_config

from lm.config import default_values, with_values
from lm.data.checks import check_data_config, check_idle_data
from lm.data.corpus import check_corpus_size, load_corpus
from lm.data.recall import FILLER, QUESTION, TARGET_FLAG, nth_answer_only
from lm.train.evaluation import evaluate
from lm.train.loop import train
from lm.train.run import assemble
from lm.train.step import batch_loss, init_state, make_eval_step


def recall_config(tmp_path, source='mqar', **overrides):
    config = tiny_config(attention='mha')
    config.model.vocab_size = 0
    config.data.update(source=source, recall_eval_examples=40, recall_pairs=4, recall_vocab=64)
    config.data.update(seq_len=32 if source == 'mqar' else 128)
    if source == 'passkey':  # the other tasks refuse passkey's grid (they would not read it)
        config.data.update(passkey_lengths='110,129', passkey_depths='0,0.5,1')
    config.train.update(batch_size=8, steps=6, lr=3e-3, warmup_steps=2)
    config.update(eval_every=3, eval_batch_size=16, log_every=3, checkpoint_every=6)
    config.update(async_checkpointing=False)
    return with_values(config, overrides)


def unpack(row):
    """(tokens, indices of the scored tokens) of a packed row, in plain Python."""
    return [int(t) % TARGET_FLAG for t in row], [i for i, t in enumerate(row) if t >= TARGET_FLAG]


def check_mqar_row(row, pairs, vocab):
    tokens, answers = unpack(row)
    kv = {}
    for i in range(0, 2 * pairs, 2):
        key, value = tokens[i], tokens[i + 1]
        assert 1 <= key < vocab // 2 <= value < vocab - 1, (key, value)
        assert key not in kv and value not in kv.values()
        kv[key] = value
    assert len(answers) == pairs
    asked = []
    for a in answers:
        query = tokens[a - 1]  # the target of position a - 1 is token a
        assert a - 1 >= 2 * pairs and (a - 1 - 2 * pairs) % 2 == 0  # a query slot
        assert tokens[a] == kv[query], (query, tokens[a], kv)
        asked.append(query)
    assert sorted(asked) == sorted(kv)  # every key asked once


def test_mqar_answers_rederived_from_each_row(tmp_path):
    corpus = load_corpus(recall_config(tmp_path).data)
    rows, _ = corpus.task.split('validation')
    assert rows.shape == (40, 33) and corpus.tokenizer.vocab_size == 64
    for row in rows:
        check_mqar_row(row, 4, 64)
    batch = corpus.task.call_batch(seed=3, step=7, steps=1, batch_size=8)
    for row in batch:
        check_mqar_row(row, 4, 64)
    # Zoology's power law (a = 0.01) puts most queries in the first slots.
    first = [unpack(r)[1][0] for r in rows]
    assert np.mean(np.asarray(first) <= 2 * 4 + 6) > 0.3


def test_passkey_answers_rederived_from_each_row(tmp_path):
    corpus = load_corpus(recall_config(tmp_path, 'passkey').data)
    rows, cells = corpus.task.split('validation')
    groups = corpus.task.groups
    assert groups == [f'depth{d}_len{n}' for n in (110, 129) for d in ('0', '0.5', '1')]
    for row, cell in zip(rows, cells, strict=True):
        tokens, answers = unpack(row)
        length = int(groups[cell].split('len')[1])
        depth = float(groups[cell].split('_')[0][5:])
        text = bytes(t for t in tokens if t < 256).decode()
        assert len(text) == length and all(t == 256 for t in tokens[: 129 - length])
        key = re.search(r'The pass key is (\d{5})\. Remember it\. (\d{5}) is', text)
        assert key and key[1] == key[2]
        assert text.endswith(QUESTION + key[1])
        assert answers == list(range(129 - 5, 129))  # the key's digits, the row's last tokens
        filler = text[: key.start()] + text[text.index('pass key. ') + 10 : -len(QUESTION) - 5]
        assert filler == (FILLER * 3)[: len(filler)]
        assert abs(key.start() / len(filler) - depth) <= 1 / len(filler)


def test_same_seed_same_examples_other_seed_others(tmp_path):
    task = load_corpus(recall_config(tmp_path).data).task
    again = load_corpus(recall_config(tmp_path).data).task
    np.testing.assert_array_equal(task.split('validation')[0], again.split('validation')[0])
    other = load_corpus(recall_config(tmp_path, **{'data.recall_seed': 1}).data).task
    assert (task.split('validation')[0] != other.split('validation')[0]).mean() > 0.5
    assert (task.split('train')[0] != task.split('validation')[0]).mean() > 0.5
    # A call of 3 steps holds the 3 single-step batches; two processes split each batch.
    three = task.call_batch(seed=0, step=4, steps=3, batch_size=8)
    for i in range(3):
        one = task.call_batch(seed=0, step=4 + i, steps=1, batch_size=8)
        np.testing.assert_array_equal(three[i], one)
        halves = [
            task.call_batch(
                seed=0, step=4 + i, steps=1, batch_size=8, process_index=p, process_count=2
            )
            for p in (0, 1)
        ]
        np.testing.assert_array_equal(np.concatenate(halves), one)
    assert (task.call_batch(seed=1, step=4, steps=1, batch_size=8) != three[0]).mean() > 0.5


@pytest.mark.slow
def test_loss_counts_the_answers_only(tmp_path):
    """batch_loss against a float64 reference over the flagged targets, from the same logits;
    and the eval step's accuracy against numpy's argmax."""
    run = assemble(recall_config(tmp_path), data=True)
    params = init_state(run.ctx, run.model_cfg, 0)['params']
    rows = run.corpus.task.call_batch(seed=0, step=0, steps=1, batch_size=8)
    tokens = rows % TARGET_FLAG
    model = jax.tree.map(np.asarray, params)
    from flax import nnx

    logits = np.asarray(nnx.merge(run.ctx.graphdef, model)(tokens[:, :-1]), np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll = logz - np.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0]
    flagged = rows[:, 1:] >= TARGET_FLAG
    with jax.set_mesh(run.mesh):
        got = float(jax.jit(lambda p, b: batch_loss(run.ctx, p, b))(params, rows))
        per_row = np.asarray(make_eval_step(run.ctx)(params, rows))
    np.testing.assert_allclose(got, nll[flagged].mean(), rtol=1e-5)  # float32 vs float64
    assert abs(nll[flagged].mean() - nll.mean()) > 1e-3  # the mask changes the loss
    right = (logits.argmax(-1) == tokens[:, 1:]) & flagged
    np.testing.assert_allclose(per_row[:, 0], np.where(flagged, nll, 0).sum(1), rtol=1e-5)
    np.testing.assert_array_equal(per_row[:, 1], right.sum(1))
    np.testing.assert_array_equal(per_row[:, 2], flagged.sum(1))


@pytest.mark.slow
def test_passkey_eval_reports_accuracy_by_depth_and_length(tmp_path):
    run = assemble(recall_config(tmp_path, 'passkey'), data=True)
    params = init_state(run.ctx, run.model_cfg, 0)['params']
    with jax.set_mesh(run.mesh):
        got = evaluate(
            make_eval_step(run.ctx),
            params,
            run.corpus,
            'validation',
            batch_size=16,
            seq_len=128,
            eval_tokens=0,
            batch_sharding=run.ctx.batch_sharding,
        )
    assert got['tokens'] == 40 * 5
    cells = [f'depth{d}_len{n}' for n in (110, 129) for d in ('0', '0.5', '1')]
    parts = ['depth0', 'depth0.5', 'depth1', 'len110', 'len129']
    for name in cells + parts:
        assert 0 <= got[f'recall_accuracy/{name}'] <= 1
    # 40 examples over 6 cells: cells 0-3 hold 7, cells 4-5 hold 6; the marginal is their mean.
    by_len = (7 * sum(got[f'recall_accuracy/{c}'] for c in cells[:3])) / 21
    np.testing.assert_allclose(got['recall_accuracy/len110'], by_len, rtol=1e-6)


@pytest.mark.slow
def test_training_a_recall_config_logs_recall_accuracy(tmp_path):
    """train.py on configs/recall/mqar.py (made tiny) logs eval/recall_accuracy, which rises
    from chance; eval.py logs the same value for the same checkpoint."""
    workdir = tmp_path / 'run'
    args = [
        f'--config={ROOT / "configs" / "recall" / "mqar.py"}',
        f'--workdir={workdir}',
        '--config.model.d_model=32',
        '--config.model.num_heads=2',
        '--config.data.recall_eval_examples=64',
        '--config.data.recall_vocab=32',
        '--config.data.recall_pairs=2',
        '--config.data.seq_len=16',
        '--config.train.steps=300',
        '--config.train.batch_size=64',
        '--config.train.warmup_steps=20',
        '--config.eval_every=150',
        '--config.eval_batch_size=64',
        '--config.mesh.cpu_devices=1',
        '--config.compilation_cache_dir=',
    ]
    run_entry('train.py', *args, check=True)
    acc = read_scalars(workdir / 'tb', 'eval/recall_accuracy')
    assert sorted(acc) == [150, 300]
    chance = read_scalars(workdir / 'tb', 'eval_init/recall_accuracy')[0]
    assert acc[300] > chance + 0.1, (chance, acc)
    out = run_entry('eval.py', f'--workdir={workdir}', check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result['recall_accuracy'] == pytest.approx(acc[300], abs=1e-6)


@pytest.mark.slow
def test_train_loop_logs_recall_accuracy_in_process(tmp_path):
    """The fast tier's end-to-end: a few steps of the normal loop write eval/recall_accuracy."""
    workdir = tmp_path / 'run'
    train(recall_config(tmp_path), str(workdir))
    acc = read_scalars(workdir / 'tb', 'eval/recall_accuracy')
    assert sorted(acc) == [3, 6] and all(0 <= v <= 1 for v in acc.values())
    results = json.loads((workdir / 'results.json').read_text())
    assert results['eval']['recall_accuracy'] == pytest.approx(acc[6])


@pytest.mark.parametrize('name', ['mqar', 'passkey'])
@pytest.mark.parametrize('variant', ['mha', 'gqa2', 'mqa', 'mla'])
def test_recall_configs_build(name, variant):
    from lm.config import load_config_file
    from lm.model.transformer import check_model_config
    from lm.train.run import check_config

    config = check_config(
        load_config_file(str(ROOT / 'configs' / 'recall' / f'{name}.py'), variant)
    )
    assert config.data.source == name and config.model.attention == variant.rstrip('2')
    check_model_config(config.model)


def test_bad_recall_settings_name_their_key(tmp_path):
    for key, value, words in [
        ('data.recall_pairs', 9, 'config.data.recall_pairs=9'),
        ('data.recall_vocab', 8, 'config.data.recall_vocab=8'),
        ('data.passkey_lengths', '300', "config.data.passkey_lengths='300'"),
        ('data.passkey_depths', '1.5', "config.data.passkey_depths='1.5'"),
        # was "each length must be in [102, 65]": what seq_len passkey needs, said
        (
            'data.seq_len',
            64,
            'config.data.seq_len=64 is too short for passkey: its shortest example (the needle, '
            'the question and the key) is 102 tokens, so seq_len must be >= 101',
        ),
        ('data.passkey_lengths', '128,,256', "passkey_lengths='128,,256' must be comma-separated"),
        ('data.passkey_depths', '0,x', "config.data.passkey_depths='0,x' must be comma-separated"),
        (
            'data.recall_power_a',
            float('inf'),
            'config.data.recall_power_a must be a finite number > 0, got inf',
        ),
        ('data.recall_seed', -1, 'config.data.recall_seed must be >= 0, got -1'),
        ('data.document_mask', True, 'config.data.document_mask=True does not apply'),
    ]:
        source = 'passkey' if 'passkey' in key + words else 'mqar'
        with pytest.raises(ValueError, match=re.escape(words)):
            load_corpus(recall_config(tmp_path, source, **{key: value}).data)


@pytest.mark.parametrize(
    'key,value,message',
    [
        ('data.sampling', 'bogus', r"^config.data.sampling must be one of \('random', 'epochs'\)"),
        ('data.tokenizer', 'nonexist.json', r"^config.data.tokenizer: 'nonexist.json' is not a"),
        ('data.num_proc', -1, r'^config.data.num_proc must be an integer >= 0'),
        ('data.split', 'bogus', r"^config.data.split must be '' or one of"),
        ('data.val_fraction', 1.5, r'^config.data.val_fraction must be in \(0, 1\), got 1.5$'),
        (
            'data.val_fraction',
            0.5,
            r"^config.data.val_fraction=0.5 does nothing for source='mqar' \(its rows are "
            r"generated\): leave it at configs/base.py's 0.1$",
        ),
        ('data.sampling', 'epochs', r"^config.data.sampling='epochs' does nothing for source="),
        ('data.tokenizer', 'bpe', r"^config.data.tokenizer='bpe' does nothing for source="),
        ('data.path', 'x.txt', r"^config.data.path='x.txt' does nothing for source='mqar'"),
        ('data.split', 'uptrain', r"^config.data.split='uptrain' does nothing for source="),
    ],
)
def test_a_recall_source_checks_every_data_value_and_refuses_those_it_ignores(
    tmp_path, key, value, message
):
    """Values no source takes are refused for a recall source too; a valid text setting that
    its generated rows would ignore is refused, not silently dropped."""
    data = recall_config(tmp_path, **{key: value}).data
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        check_data_config(data)
        check_idle_data(data, default_values('data'))


def test_a_recall_source_warns_about_the_machines_data_settings(tmp_path, caplog, monkeypatch):
    """data.cache_dir, num_proc (this machine's) and eval_tokens, settings that may be given to
    every run (the doc commands' TINY), are warned about in one line each."""
    from absl import logging as absl_logging

    from lm.train.evaluation import check_eval_config

    # log_first_n's counts, fresh: another test in this process may have had the warning
    monkeypatch.setattr(absl_logging, '_log_counter_per_token', {})
    config = recall_config(tmp_path, **{'data.cache_dir': '/tmp/c', 'data.num_proc': 2})
    with caplog.at_level('WARNING'):
        check_idle_data(config.data, default_values('data'))
    lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert lines == [
        "config.data.cache_dir='/tmp/c', num_proc=2 ignored: source='mqar' generates its rows "
        '(nothing is read or cached)'
    ]
    for tokens in (64, 5):  # not a window count here: TINY's 64 within passkey's 128 too
        caplog.clear()
        with caplog.at_level('WARNING'):
            check_eval_config(with_values(config, {'eval_tokens': tokens}), 1)
        lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
        assert lines == [
            f"config.eval_tokens={tokens} is ignored: source='mqar' scores "
            'config.data.recall_eval_examples=40 examples'
        ]


def test_nth_answer_only_keeps_each_rows_nth_flag():
    """Against a plain loop over random flag patterns: flag n of a row stays, the others are
    cleared to their token, and rows with at most n flags keep none."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (20, 17))
    flags = rng.random((20, 17)) < 0.3
    rows = np.where(flags, tokens | TARGET_FLAG, tokens).astype(np.int32)
    for n in range(4):
        got = nth_answer_only(rows, n)
        for b in range(20):
            where = [i for i in range(17) if flags[b, i]]
            kept = [where[n]] if n < len(where) else []
            want = [int(t) | TARGET_FLAG if i in kept else int(t) for i, t in enumerate(tokens[b])]
            assert got[b].tolist() == want


@pytest.mark.slow
def test_eval_sweep_scores_every_run_on_a_second_heldout_set(tmp_path):
    """scripts/eval_sweep.py: on the runs' own data it gives back each run's final eval (same
    protocol), points in the sweep's order; with recall_seed 1 (other held-out examples) other
    values; a --config override outside data, and a sweep with no finished run, are refused in
    one line."""
    from conftest import sweep_file

    base = recall_config(tmp_path, **{'mesh.cpu_devices': 1, 'compilation_cache_dir': ''})
    cfg = sweep_file(tmp_path, base, [{'name': 'mqa', 'model.attention': 'mqa'}, {'name': 'mha'}])
    sweep_dir = tmp_path / 'sw'
    run_entry('scripts/sweep.py', f'--config={cfg}', f'--sweep_dir={sweep_dir}', check=True)
    rows = {}
    for seed in (0, 1):
        out = tmp_path / f'seed{seed}.csv'
        args = [f'--sweep_dir={sweep_dir}', f'--config={cfg}', f'--out={out}']
        run_entry('scripts/eval_sweep.py', *args, f'--config.data.recall_seed={seed}', check=True)
        rows[seed] = {(r['point'], int(r['seed'])): r for r in csv.DictReader(out.open())}
    # in the sweep's order, not by name; one seed: runs named by their point
    assert list(rows[0]) == list(rows[1]) == [('mqa', 0), ('mha', 0)]
    for (point, seed), row in rows[0].items():
        final = json.loads((sweep_dir / point / 'result.json').read_text())['eval']
        assert float(row['eval_loss']) == pytest.approx(final['loss'], abs=1e-6)
        assert float(row['eval_recall_accuracy']) == pytest.approx(final['recall_accuracy'])
        assert float(rows[1][point, seed]['eval_loss']) != pytest.approx(final['loss'], abs=1e-4)
    args = [f'--config={cfg}', f'--out={tmp_path / "x.csv"}']
    bad = run_entry('scripts/eval_sweep.py', f'--sweep_dir={sweep_dir}', *args,
                    '--config.model.d_model=64')  # fmt: skip
    assert bad.stderr.strip().splitlines()[-1] == (
        'error: eval_sweep.py takes only --config.data.* from --config; --config.model.d_model '
        "would be ignored (the model, training and mesh settings are the checkpoint's)"
    )
    (tmp_path / 'empty').mkdir()
    bad = run_entry('scripts/eval_sweep.py', f'--sweep_dir={tmp_path / "empty"}', *args)
    assert bad.stderr.strip().splitlines()[-1].endswith('holds no finished run <arm>_s<seed>')


def test_eval_sweep_refuses_runs_of_another_task_unless_the_key_is_set():
    """--config.data scores every run: a run that trained at other recall pairs than it gives
    (a sweep mixing pair counts, or a config file of another count) is refused in one line
    naming the run and the key, unless the key is set on the command line."""
    from lm.experiments import check_one_task

    runs = {
        'mha_p4_s0': {'recall_pairs': 4, 'seq_len': 16, 'recall_seed': 0},
        'mha_p4_s1': {'recall_pairs': 4, 'seq_len': 16, 'recall_seed': 0},
        'mha_p8_s0': {'recall_pairs': 8, 'seq_len': 16, 'recall_seed': 0},
    }
    given = {'recall_pairs': 4, 'seq_len': 16, 'recall_seed': 1}
    check_one_task(dict(list(runs.items())[:2]), given, {'data.recall_seed'})
    with pytest.raises(ValueError) as e:
        check_one_task(runs, given, {'data.recall_seed'})
    assert str(e.value) == (
        'run mha_p8_s0 trained with data.recall_pairs=8 and --config has 4; set '
        '--config.data.recall_pairs to score at that value anyway, or give each group of runs '
        'its own --config'
    )
    with pytest.raises(ValueError, match='data.recall_seed=0 and --config has 1'):
        check_one_task(runs, given, {'data.recall_pairs'})  # recall_seed not set: refused
    check_one_task(runs, given, {'data.recall_pairs', 'data.recall_seed'})
    # one file written two ways (a sweep file's relative path) is the same data.path
    check_one_task(
        {'a': {'path': 'configs/sweeps/../../x.txt, y.txt'}}, {'path': 'x.txt,y.txt'}, set()
    )
    with pytest.raises(ValueError, match=r"data.path='x.txt' and --config has 'y.txt'"):
        check_one_task({'a': {'path': 'x.txt'}}, {'path': 'y.txt'}, set())
    trained_apart = {'mha': {**given, 'sampling': 'epochs', 'cache_dir': 'c', 'num_proc': 4}}
    check_one_task(trained_apart, given, set())  # settings that do not change the scoring


def test_mqar_training_mixture_draws_pairs_per_row_and_keeps_heldout(tmp_path):
    mixed = recall_config(tmp_path, **{'data.recall_train_pairs': '1,2,4'})
    corpus, plain = load_corpus(mixed.data), load_corpus(recall_config(tmp_path).data)
    # Held-out rows are the plain config's, so every run of a sweep scores the same examples.
    np.testing.assert_array_equal(
        corpus.task.split('validation')[0], plain.task.split('validation')[0]
    )
    assert corpus.fingerprint != plain.fingerprint
    counts = []
    for rows in (
        corpus.task.split('train')[0],
        corpus.task.call_batch(seed=0, step=0, steps=1, batch_size=64),
    ):
        for row in rows:
            pairs = len(unpack(row)[1])
            check_mqar_row(row, pairs, 64)
            counts.append(pairs)
    assert set(counts) == {1, 2, 4}
    with pytest.raises(ValueError, match=r"recall_train_pairs='2' applies to source='mqar' only"):
        load_corpus(recall_config(tmp_path, 'passkey', **{'data.recall_train_pairs': '2'}).data)
    for bad in ('2,9', '0,2', 'two', ',', '2,,4'):
        with pytest.raises(ValueError, match=re.escape(f'config.data.recall_train_pairs={bad!r}')):
            load_corpus(recall_config(tmp_path, **{'data.recall_train_pairs': bad}).data)


def test_a_recall_set_smaller_than_a_training_batch_is_not_refused(tmp_path):
    """Recall batches are generated and its example sets scored in padded batches: 40 examples
    against a batch of 64 (fewer tokens than one batch of windows) is fine."""
    corpus = load_corpus(recall_config(tmp_path).data)
    assert corpus.tokens['train'].size < 64 * 32 + 1
    check_corpus_size(corpus, batch_size=64, seq_len=32)
