"""Golden runs (lm/train/golden.py, scripts/golden_run.py): this checkout trains the recorded cases
bit for bit as tests/fixtures/golden_runs.json says (under its toolchain; within TOOLCHAIN_RTOL
under another), the golden run is what train.py logs, and a changed bit is reported."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, USER_XLA_FLAGS, read_scalars, run_entry

from lm.train.golden import (
    TOOLCHAIN_RTOL,
    compare,
    first_difference,
    params_digest,
    relative_difference,
)
from lm.train.provenance import toolchain

RECORD = ROOT / 'tests' / 'fixtures' / 'golden_runs.json'
# As a user's shell runs it: compiled at XLA's default optimisation (not the tests' -O0 and loop
# emitters, which give other numerics), one fresh Python.
USER_ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': USER_XLA_FLAGS}


def run_as_user(script: str, *args: str) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` in a fresh Python from the repository root, as a user's shell does."""
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=ROOT,
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )


def exact_here(record: dict) -> bool:
    """Whether a user's process here (XLA optimising, XLA_FLAGS = USER_XLA_FLAGS) has the
    record's toolchain, so that its golden runs must be bitwise equal."""
    saved = os.environ['XLA_FLAGS']
    os.environ['XLA_FLAGS'] = USER_XLA_FLAGS
    try:
        ours = {**toolchain(), 'optimized': True}  # this process compiles at -O0
    finally:
        os.environ['XLA_FLAGS'] = saved
    return record['toolchain'] == ours


def hexes(values):
    return [[float(np.float32(v)).hex() for v in row] for row in values]


def next_float32(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def test_one_changed_bit_is_a_difference_and_a_toolchain_allows_last_bits():
    rows = hexes([[6.0, 5.0], [4.5, 4.25], [4.0, 3.5]])
    want = {
        'loss': rows,
        'grad_norm': hexes([[1.0, 2.0]] * 3),
        'params_sha256': 'a',
        'eval_loss': hexes([[3.5, 3.25]])[0],
    }
    got = json.loads(json.dumps(want))
    assert compare('c', got, want, exact=True) == (
        True,
        'c: bitwise equal (3 steps, the parameters, the evaluation)',
    )
    got['loss'][1][1] = float(next_float32(4.25)).hex()  # one ulp, step 2, second member
    assert first_difference(got['loss'], want['loss']) == 2
    assert relative_difference(got['loss'], want['loss']) == pytest.approx(2**-21 / 4.25, rel=1e-6)
    ok, line = compare('c', got, want, exact=True)
    assert not ok and line.startswith('c: differs from step 2;') and 'beyond' in line
    ok, line = compare('c', got, want, exact=False)  # another toolchain: last bits may move
    assert ok and 'within' in line
    got['loss'][2][0] = float(4.0 * (1 + 3 * TOOLCHAIN_RTOL)).hex()
    assert not compare('c', got, want, exact=False)[0]  # beyond the tolerance
    norm = json.loads(json.dumps(want))  # the losses equal, one gradient norm one ulp off
    norm['grad_norm'][2][1] = float(next_float32(2.0)).hex()
    ok, line = compare('c', norm, want, exact=True)
    assert not ok and line.startswith('c: differs from step 3;')
    same = {**want, 'params_sha256': 'b'}
    assert compare('c', same, want, exact=True) == (
        False,
        'c: every loss, gradient norm and the evaluation equal, the parameters differ',
    )
    assert compare('c', same, want, exact=False)[0]
    scored = {**want, 'eval_loss': [want['eval_loss'][0], float(next_float32(3.25)).hex()]}
    ok, line = compare('c', scored, want, exact=True)  # training equal, the evaluation not
    assert not ok and line.startswith('c: differs in the validation loss;')
    assert compare('c', scored, want, exact=False)[0]
    scored['eval_loss'][0] = float(3.5 * (1 + 3 * TOOLCHAIN_RTOL)).hex()
    assert not compare('c', scored, want, exact=False)[0]
    assert first_difference(want['loss'][:2], want['loss']) == 3
    short = {**want, 'loss': rows[:2], 'grad_norm': want['grad_norm'][:2]}
    assert compare('c', short, want, False) == (False, 'c: 2 steps, the record has 3')
    one = {**want, 'eval_loss': want['eval_loss'][:1]}
    assert compare('c', one, want, False) == (False, 'c: 1 validation losses, the record has 2')


def test_params_digest_sees_one_bit_and_each_name():
    rng = np.random.default_rng(0)
    params = {'a': {'w': rng.normal(size=(3, 4)).astype(np.float32)}, 'b': np.zeros(2, np.float32)}
    digest = params_digest(params)
    assert digest == params_digest({k: v for k, v in reversed(params.items())})  # order-free
    flipped = params['a']['w'].copy()
    flipped.view(np.uint32)[1, 2] ^= 1  # the lowest mantissa bit of one entry
    assert params_digest({**params, 'a': {'w': flipped}}) != digest
    assert params_digest({'a': {'v': params['a']['w']}, 'b': params['b']}) != digest
    assert params_digest({**params, 'b': params['b'].astype(np.float64)}) != digest


@pytest.mark.slow
def test_a_missing_damaged_or_unwritable_record_is_one_line_before_training(tmp_path):
    out = run_entry('scripts/golden_run.py', f'--record={tmp_path / "none.json"}')
    assert out.returncode == 1
    assert f'--record={tmp_path / "none.json"}: no such file (write one with --write)' in out.stderr
    (tmp_path / 'other.json').write_text(json.dumps({'toolchain': {}, 'taken': {}, 'cases': {}}))
    out = run_entry('scripts/golden_run.py', f'--record={tmp_path / "other.json"}')
    assert out.returncode == 1 and 'its cases differ from scripts/golden_run.py CASES' in out.stderr
    out = run_entry('scripts/golden_run.py', '--cases=mqar_mla,nope')
    assert out.returncode == 1 and '--cases=mqar_mla,nope: expected names among' in out.stderr
    out = run_entry('scripts/golden_run.py', '--write', '--cases=mqar_mla', f'--record={tmp_path}')
    assert out.returncode == 1 and '--cases: --write records every case' in out.stderr
    out = run_entry('scripts/golden_run.py', '--write', f'--record={tmp_path}')  # a directory
    assert out.returncode == 1
    assert f'--record={tmp_path} is a directory; give a file path ending in .json' in out.stderr


@pytest.mark.slow
def test_this_checkout_trains_the_recorded_golden_runs():
    """The cases train.py's test below does not train (each case trained once in the suite)."""
    record = json.loads(RECORD.read_text())
    names = [n for n in record['cases'] if n not in TRAINED_BY_TRAIN_PY]
    assert names and set(TRAINED_BY_TRAIN_PY) < set(record['cases'])
    out = run_as_user('scripts/golden_run.py', f'--cases={",".join(names)}')
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    word = 'bitwise equal' if exact_here(record) else 'within'
    reported = [line.split(':')[0] for line in out.stdout.splitlines() if word in line]
    assert reported == names, out.stdout


TRAINED_BY_TRAIN_PY = ['mqar_mla', 'mqar_gqa2_ensemble', 'mqar_mqa_accumulated']


@pytest.mark.slow
@pytest.mark.parametrize('name', TRAINED_BY_TRAIN_PY)
def test_the_golden_run_is_what_train_py_logs(tmp_path, name):
    """train.py, logging every step (1-step calls, where the golden run groups its steps by
    its case's train.steps_per_call; one case accumulates 2 micro-batches per step), logs
    the recorded losses and scores the recorded validation loss: a single run's, and each
    member's of an ensemble."""
    record = json.loads(RECORD.read_text())
    case = record['cases'][name]
    overrides = [f'--config.{k}={v}' for k, v in case['overrides'].items()]
    steps = case['steps']
    out = run_as_user(
        'train.py',
        f'--config={ROOT / case["config"]}',
        f'--workdir={tmp_path / "run"}',
        *overrides,
        f'--config.train.steps={steps}',
        '--config.log_every=1',
        f'--config.eval_every={steps}',
        f'--config.checkpoint_every={steps}',
        '--config.eval_at_start=False',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    tb = tmp_path / 'run' / 'tb'
    logdirs = sorted(tb.glob('seed_*')) if 'ensemble' in name else [tb]
    logged = [read_scalars(d, 'train/loss') for d in logdirs]
    got = hexes([[member[s] for member in logged] for s in range(1, steps + 1)])
    results = json.loads((tmp_path / 'run' / 'results.json').read_text())  # the final evaluation
    evals = [m['eval'] for m in results['members']] if 'ensemble' in name else [results['eval']]
    scored = [float(e['loss']).hex() for e in evals]
    if exact_here(record):
        assert got == case['loss'] and scored == case['eval_loss']
    else:
        assert relative_difference(got, case['loss']) <= TOOLCHAIN_RTOL
        assert relative_difference([scored], [case['eval_loss']]) <= TOOLCHAIN_RTOL


def test_the_machine_paragraphs_accuracies_are_the_csvs():
    results = ROOT / 'docs' / 'studies' / 'mqar_capacity' / 'results'

    def accuracies(name: str) -> list[str]:
        with open(results / name, encoding='utf-8') as f:
            rows = [r for r in csv.DictReader(f) if r['point'] == 'gqa2_p8']
        rows = [r for r in rows if float(r['lr']) == 3e-3]
        return [
            f'{100 * float(r["eval_recall_accuracy"]):g}%'
            for r in sorted(rows, key=lambda r: r['seed'])
        ]

    epyc, xeon = accuracies('own_rate_grid.csv'), accuracies('machine_rerun.csv')
    text = ' '.join((ROOT / 'docs' / 'train.md').read_text().split())
    assert (
        f'accuracy {epyc[0]} and {epyc[1]} on the EPYC, {xeon[0]} and {xeon[1]} on the Xeon' in text
    )
