"""Sweeps end to end at tiny size: runs, TensorBoard contents, summary, resumption, errors."""

import csv
import os

import pytest
from conftest import run_entry, tiny_train_config

from lm.sweep import parse_grid, run_name


def sweep_file(tmp_path, config, points):
    path = tmp_path / 'sweep_cfg.py'
    path.write_text(
        'import json\n\nimport ml_collections\n\n\ndef get_config():\n'
        f'    return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n\n\n'
        f'def get_points():\n    return {points!r}\n'
    )
    return path


def sweep(*args):
    return run_entry('scripts/sweep.py', *args, timeout=900)


@pytest.mark.slow
def test_tiny_sweep_end_to_end(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 4, 'eval_every': 4, 'checkpoint_every': 4, 'log_every': 2},
    )
    points = [
        {'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0, 'seeds': 2},
        {'model.attention': 'gqa', 'model.num_kv_heads': 2},
        {'model.attention': 'mqa', 'model.num_kv_heads': 0},
        {'name': 'mla', 'model.attention': 'mla', 'model.num_kv_heads': 0},
        {'name': 'bad', 'model.attention': 'gqa', 'model.num_kv_heads': 3},
    ]
    cfg = sweep_file(tmp_path, config, points)
    out = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}', '--parallel=2')
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert 'skipping bad: config.model.num_heads=4 must be divisible by num_kv_heads=3' in (
        out.stdout
    )
    with open(tmp_path / 'sw' / 'summary.csv') as f:
        rows = {r['point']: r for r in csv.DictReader(f)}
    assert set(rows) == {'mha', 'gqa_kv2', 'mqa_kv0', 'mla'}
    assert rows['mha']['seeds'] == '2' and rows['mqa_kv0']['seeds'] == '1'
    assert int(rows['mha']['kv_cache_bytes_per_token']) == 4 * int(
        rows['mqa_kv0']['kv_cache_bytes_per_token']
    )
    assert float(rows['gqa_kv2']['eval_perplexity']) > 1
    assert (tmp_path / 'sw' / 'summary.png').stat().st_size > 10_000
    assert rows['mla']['kv_heads'] == 'latent 16+4'  # what MLA's cache holds, not H
    md = (tmp_path / 'sw' / 'summary.md').read_text()
    assert '| mha | mha | 4 | 4 |' in md and '| mla | mla | 4 | latent 16+4 |' in md

    from tensorboard.backend.event_processing import event_accumulator

    runs = sorted(os.listdir(tmp_path / 'sw' / 'tb'))
    assert runs == ['gqa_kv2', 'mha_s0', 'mha_s1', 'mla', 'mqa_kv0']
    for run in runs:
        acc = event_accumulator.EventAccumulator(str(tmp_path / 'sw' / 'tb' / run))
        acc.Reload()
        assert [e.step for e in acc.Scalars('eval/perplexity')] == [0, 4]
        assert acc.PluginTagToContent('hparams'), run  # an hparams entry for the HParams tab

    again = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}')
    assert again.returncode == 0 and again.stdout.count('finished earlier, skipped') == 5


@pytest.mark.slow
def test_grid_errors_before_any_run(tmp_path, small_text):
    cfg = sweep_file(tmp_path, tiny_train_config(tmp_path, small_text), [{}])
    for grid, message in [
        ('model.num_hedas=4,8', "error: --grid: unknown config key 'model.num_hedas'"),
        ('model.num_heads=4,eight', "error: --grid model.num_heads: 'eight' is not a int"),
        ('model.num_heads', "error: --grid 'model.num_heads': expected key=value1,value2,..."),
        ('model=1', "error: --grid: 'model' is a section, not a value"),
    ]:
        out = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}', f'--grid={grid}')
        assert out.returncode == 1, out.stderr
        assert out.stderr.strip().splitlines()[-1] == message
        assert not (tmp_path / 'sw').exists()


def test_grid_product_and_names(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    points = parse_grid(config, ['model.num_heads=4,8', 'model.num_kv_heads=1,2,4,8'])
    assert len(points) == 8 and points[1] == {'model.num_heads': 4, 'model.num_kv_heads': 2}
    assert run_name(points[1]) == 'h4_kv2'
    assert run_name({'model.attention': 'mla', 'train.lr': 0.001}) == 'mla_lr0.001'
    with pytest.raises(ValueError, match=r"'1.5' is not a int"):
        parse_grid(config, ['model.num_heads=1.5'])
