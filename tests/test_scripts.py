"""Benchmark scripts run end to end at tiny size (timings are not checked, only the output)."""

import json
import os
import subprocess
import sys

from conftest import ROOT


def run(script, *args):
    out = subprocess.run(
        [sys.executable, str(ROOT / 'scripts' / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


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
