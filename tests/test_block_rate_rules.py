"""docs/studies/kv_contrast/block_rate_csv.py's rules, on made-up batches: which seeds count
(eight finite runs from one batch and one recorded version), which keep their place without
counting, which are replaced, that nothing is computed before the stated 41 places are decided,
and that the stated contrasts then match an independent least-squares computation."""

import csv
import importlib.util
import json
import math
import re
import sys

import numpy as np
import pytest
from absl import flags
from conftest import ROOT

HERE = ROOT / 'docs' / 'studies' / 'kv_contrast'
RECORD = {'code': 'digest-a', 'cpu': 'Xeon', 'jax': '0.10.2', 'commit': 'c1', 'devices': 'cpu:0'}


@pytest.fixture(scope='module')
def study():
    """The script as a module (its directory on sys.path for its sibling imports), imported once:
    it defines absl flags."""
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location('block_rate_csv', HERE / 'block_rate_csv.py')
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HERE))
    return module


@pytest.fixture
def results(study, tmp_path, monkeypatch):
    """The script's results/ redirected to a scratch directory."""
    out = tmp_path / 'results'
    out.mkdir()
    monkeypatch.setattr(study, 'RESULTS', str(out))
    monkeypatch.setattr(study, 'RUNS', str(out / 'block_rate_runs.csv'))
    return out


def write_run(batch, point, seed, loss, sessions=None):
    run = batch / f'{point}_s{seed}'
    run.mkdir(parents=True, exist_ok=True)
    sessions = sessions or [{'steps': [0, 1000], **RECORD}]
    (run / 'results.json').write_text(
        json.dumps({'trained_by_sessions': sessions, 'eval': {'loss': loss}})
    )


def write_block(study, batch, seed, loss=lambda point: 1.5, skip=(), sessions=None):
    for point in study.BLOCK:
        if point not in skip:
            write_run(batch, point, seed, loss(point), (sessions or {}).get(point))


def test_each_seed_is_counted_kept_or_replaced_by_its_runs(study, tmp_path, results):
    a, b = tmp_path / 'block_rate_59', tmp_path / 'block_rate_66'
    first = study.BLOCK[0]
    write_block(study, a, 59)
    write_block(study, a, 60, loss=lambda p: math.nan if p == first else 1.5)
    write_block(study, a, 61, skip={first})
    write_block(study, a, 62, sessions={first: [{'steps': [0, 1000], **RECORD, 'cpu': 'EPYC'}]})
    unrecorded = [{'steps': [0, 500]}, {'steps': [500, 1000], **RECORD}]  # a resume without one
    write_block(study, a, 63, sessions=dict.fromkeys(study.BLOCK, unrecorded))
    write_block(study, a, 64, skip={first})
    write_run(b, first, 64, 1.5)
    # a docs-only commit or other devices are not another version
    write_block(study, a, 65, sessions={first: [{'steps': [0, 1000], **RECORD, 'commit': 'c2'}]})
    runs = study.all_runs([str(a), str(b)])
    assert len(runs) == 7 * 8 - 2 + 1  # seeds 61 and 64 lack a run in a; b holds 64's
    state = study.classify(runs, ended={'block_rate_59', 'block_rate_66'})
    assert state == {
        59: 'counted',
        60: 'diverged',
        61: 'failed',
        62: 'out',
        63: 'out',
        64: 'out',
        65: 'counted',
    }
    assert study.classify(runs, ended={'block_rate_66'})[61] == 'training'


def test_a_run_in_two_batches_or_changed_since_the_csv_is_refused(study, tmp_path, results):
    a, b = tmp_path / 'block_rate_59', tmp_path / 'block_rate_67'
    write_block(study, a, 59, loss=lambda p: 1.5 + 1e-7 * study.BLOCK.index(p))
    study.all_runs([str(a)])
    assert len(study.all_runs([str(a)])) == 8  # the CSV read back agrees with the batch
    assert len(study.all_runs([])) == 8  # and stands without it
    write_run(b, study.BLOCK[0], 59, 1.5)
    with pytest.raises(SystemExit, match='a seed is trained in one batch only'):
        study.all_runs([str(a), str(b)])
    write_run(a, study.BLOCK[1], 59, 1.25)
    with pytest.raises(SystemExit, match='recorded with another version or loss'):
        study.all_runs([str(a)])
    with pytest.raises(SystemExit, match='from 59 on'):
        study.classify([{'seed': 58, 'sweep': 'x', 'version': 'v', 'eval_loss': 1.0}], set())


def run_script(study, pattern, capsys) -> str:
    """The script's run() on the batches matching `pattern`, its output (the sizing, which
    reads the committed paired-rates CSV, left out: `study.sizing` is patched)."""
    flags.FLAGS(['block_rate_csv.py', f'--sweeps={pattern}'])
    try:
        assert study.run() == 0
    finally:
        flags.FLAGS.unparse_flags()
    return capsys.readouterr().out


def test_nothing_is_computed_before_41_places_then_the_stated_contrasts(
    study, tmp_path, results, capsys, monkeypatch
):
    monkeypatch.setattr(study, 'sizing', lambda: study.SEEDS)
    rng = np.random.default_rng(0)
    a, b = tmp_path / 'block_rate_59', tmp_path / 'block_rate_79'
    losses = {}
    for seed in range(59, 79):
        losses[seed] = dict(zip(study.BLOCK, 1.5 + 0.01 * rng.normal(size=8), strict=True))
        write_block(study, a, seed, loss=losses[seed].get)
    (a / 'summary.md').write_text('ended')
    out = run_script(study, f'{tmp_path}/block_rate_*', capsys)
    assert out.splitlines() == ['20 of 41 places decided (20 counted)']  # no loss printed
    assert not (results / 'block_rate_seeds.csv').exists()

    # seed 80 out (two versions), 81 diverged: 42 seeds make 41 places, 40 counted
    for seed in range(79, 101):
        losses[seed] = dict(zip(study.BLOCK, 1.5 + 0.01 * rng.normal(size=8), strict=True))
        sessions = {study.BLOCK[3]: [{'steps': [0, 1000], **RECORD, 'jax': '0.11'}]}
        loss = (lambda p: math.nan) if seed == 81 else losses[seed].get
        write_block(study, b, seed, loss=loss, sessions=sessions if seed == 80 else None)
    out = run_script(study, f'{tmp_path}/block_rate_*', capsys)
    assert 'seed 80: out' in out and 'seed 81: diverged' in out
    assert '41 of 41 places decided (40 counted)' in out
    with open(results / 'block_rate_seeds.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    counted = [s for s in range(59, 101) if s not in (80, 81)]
    assert sorted({int(r['seed']) for r in rows}) == counted and len(rows) == 4 * 40
    arms = ('mha', 'gqa4', 'gqa2', 'mqa')
    for name, lr in (('1e3', '0.001'), ('2e3', '0.002')):  # the losses at each rate, described
        with open(results / f'block_rate_{name}_seeds.csv', newline='') as f:
            got = {(r['arm'], int(r['seed'])): float(r['eval_loss']) for r in csv.DictReader(f)}
        assert got == {(a, s): losses[s][f'{a}_lr{lr}'] for a in arms for s in counted}

    # independent: per seed, np.polyfit's slope of (1e-3 minus 2e-3) over 0..3 halvings
    change = np.array(
        [[losses[s][f'{a}_lr0.001'] - losses[s][f'{a}_lr0.002'] for a in arms] for s in counted]
    )
    slopes = np.array([np.polyfit(np.arange(4.0), c, 1)[0] for c in change])
    ends = change[:, 3] - change[:, 0]
    for line, values in zip(out.splitlines()[-3:-1], (slopes, ends), strict=True):
        mean = float(re.search(r': ([+-]\d\.\d{4}) \[', line)[1])
        assert mean == pytest.approx(values.mean(), abs=5e-5), line
        assert '40 seeds' in line
