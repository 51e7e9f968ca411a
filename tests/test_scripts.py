"""Benchmark scripts run end to end at tiny size (timings are not checked, only the output)."""

import json
import math

import pytest
from conftest import run_entry, stdlib_text

from lm.train import perf

pytestmark = pytest.mark.slow  # each test starts a benchmark script


def run(script, *args):
    return run_entry(f'scripts/{script}', *args, check=True).stdout


def test_bench_decode_smoke(tmp_path):
    stdout = run(
        'bench_decode.py',
        '--contexts=32',
        '--repeats=1',
        '--new_tokens=2',
        '--d_model=64',
        '--num_layers=1',
        '--batch=2',
        f'--json={tmp_path / "d.json"}',
    )
    rows = json.loads((tmp_path / 'd.json').read_text())
    assert [r['variant'] for r in rows] == ['mha', 'gqa2', 'mqa', 'mla']
    for r in rows:
        assert r['cache_bytes_per_token_measured'] == r['cache_bytes_per_token_formula']
        assert r['decode_tokens_per_sec'] > 0
    assert stdout.count('\n| ') == 5  # header + 4 rows


@pytest.fixture
def text_file(tmp_path):
    """The benchmarks' --data_path (their default, data/tinyshakespeare.txt, is fetched by
    scripts/get_data.py and absent from a fresh clone)."""
    path = tmp_path / 'text.txt'
    path.write_text(stdlib_text(40_000), encoding='utf-8')
    return path


def test_bench_train_smoke(tmp_path, text_file):
    stdout = run(
        'bench_train.py',
        f'--data_path={text_file}',
        '--variants=mla',
        '--steps=2',
        '--warmup=1',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
        '--torch_baseline=false',
        f'--json={tmp_path / "t.json"}',
    )
    rows = json.loads((tmp_path / 't.json').read_text())
    assert [r['variant'] for r in rows] == ['mla']
    assert f'on {perf.cpu_model()},' in stdout.splitlines()[0]  # the header names the CPU
    assert 'eager PyTorch baseline: off' in stdout and 'torch ÷ ours' not in stdout
    assert all(r['torch_over_ours'] is None for r in rows)
    for r in rows:
        for key in ('step_time_ms', 'tokens_per_sec', 'model_flops_per_token', 'peak_flops', 'mfu'):
            assert r[key] > 0, key
        assert r['tokens_per_sec'] == pytest.approx(4 * 16 / (r['step_time_ms'] / 1e3))
        assert r['steps_per_call'] == 2
    assert 'MFU' in stdout and stdout.count('\n| ') == 2  # header + one row


def test_bench_train_torch_ratio(tmp_path, text_file):
    """With PyTorch importable, the baseline runs interleaved and each row gets the ratio."""
    pytest.importorskip('torch')  # optional: the baseline needs PyTorch, lm does not
    stdout = run(
        'bench_train.py',
        f'--data_path={text_file}',
        '--variants=mha',
        '--steps=4',
        '--warmup=1',
        '--rounds=2',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
        f'--json={tmp_path / "t.json"}',
    )
    (row,) = json.loads((tmp_path / 't.json').read_text())
    assert row['torch_step_time_ms'] > 0
    assert row['torch_over_ours'] == pytest.approx(row['torch_step_time_ms'] / row['step_time_ms'])
    lines = stdout.splitlines()
    assert f'on {perf.cpu_model()},' in lines[0]
    assert 'eager PyTorch' in lines[1] and 'interleaved' in lines[1]
    header = next(ln for ln in lines if ln.startswith('| variant'))
    assert header.endswith('| torch ms | torch ÷ ours |')
    mha = next(ln for ln in lines if ln.startswith('| mha |'))
    assert mha.endswith(f'| {row["torch_over_ours"]:.2f}x |')


def test_bench_torch_baseline_smoke():
    pytest.importorskip('torch')  # optional: the baseline needs PyTorch, lm does not
    stdout = run('bench_torch_baseline.py', '--steps=2', '--warmup=1')
    assert '| torch eager |' in stdout and 'ms/step' in stdout


def test_bench_torch_baseline_time_to_loss(text_file):
    """--target_loss trains the baseline on the recipe's data and evaluates every N steps until
    the target (here never reached: every evaluation up to the last step is printed)."""
    pytest.importorskip('torch')
    stdout = run(
        'bench_torch_baseline.py',
        f'--data_path={text_file}',
        '--target_loss=0.001',
        '--eval_every=2',
        '--set=train.steps=4',
        '--set=train.warmup_steps=1',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=eval_batch_size=8',
    )
    rows = [ln.split(' | ') for ln in stdout.splitlines() if ln[:3] in ('| 0', '| 2', '| 4')]
    assert [r[0] for r in rows] == ['| 0', '| 2', '| 4']
    losses = [float(r[1]) for r in rows]
    assert losses[0] == pytest.approx(math.log(258), rel=0.05)  # nanoGPT init: near uniform
    assert losses[-1] < losses[0]


def test_bench_xla_options_smoke(text_file):
    stdout = run(
        'bench_xla_options.py',
        f'--data_path={text_file}',
        '--option=eigen1:xla_cpu_multi_thread_eigen=false',
        '--rounds=1',
        '--calls=1',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
    )
    assert '2 steps per call' in stdout
    rows = [ln for ln in stdout.splitlines() if ln.startswith('| ') and 'ms' not in ln]
    assert [r.split(' | ')[0] for r in rows] == ['| base', '| eigen1']
    assert rows[0].endswith('| 1.00x |')


def test_bench_xla_options_rejects_a_malformed_option():
    out = run_entry('scripts/bench_xla_options.py', '--option=a:x', timeout=120)
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: --option='a:x': 'x' is not key=value"


def test_bench_data_smoke(tmp_path, text_file):
    stdout = run(
        'bench_data.py',
        f'--text={text_file}',
        f'--workdir={tmp_path / "work"}',
        '--tokenizers=byte',
        '--num_proc=1,2',
        '--batches=2',
        '--repeats=1',
        f'--json={tmp_path / "d.json"}',
    )
    rows = json.loads((tmp_path / 'd.json').read_text())
    tokenise, loader = rows[:2], rows[2:]
    assert [(r['tokenizer'], r['processes']) for r in tokenise] == [('byte', 1), ('byte', 2)]
    assert all(r['same_as_first'] and r['mb_per_s'] > 0 for r in tokenise)
    assert tokenise[0]['tokens'] == 40_002  # every byte and two EOS
    assert [r['sampling'] for r in loader] == ['random', 'epochs']
    assert all(r['batches_per_s'] > 0 and r['steps_per_s_needed'] > 0 for r in loader)
    assert stdout.count('\n| ') == 6  # two tables: a header and two rows each
