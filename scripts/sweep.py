"""Sweep a config over a grid (and/or the points of a sweep file) and summarise the runs.

  python scripts/sweep.py --config=configs/shakespeare_char.py \
      --config.data.path=data/tinyshakespeare.txt --sweep_dir=runs/heads \
      --grid model.attention=gqa --grid model.num_heads=4,8 --grid model.num_kv_heads=1,2,4,8
  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds \
      --seeds=3 --parallel=2
  tensorboard --logdir runs/kinds/tb

Each run trains in its own process (`train.py`) in <sweep_dir>/<name>, logging to
<sweep_dir>/tb/<name>. Re-running the command skips finished runs and resumes interrupted ones.
At the end: <sweep_dir>/summary.md, summary.csv and summary.png.
"""

import importlib.util
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from absl import flags
from ml_collections import config_flags

from lm.cli import check_config_keys, check_writable_dir, run_app
from lm.config import write_config_file
from lm.sweep import invalid_reason, parse_grid, point_config, run_name, summarise

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Base config file; a sweep file may also define get_points().'
)
_GRID = flags.DEFINE_multi_string('grid', [], 'key=v1,v2,...: one axis of the grid.')
_SWEEP_DIR = flags.DEFINE_string(
    'sweep_dir', None, 'Directory for runs and summary.', required=True
)
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per point (a point may set its own).')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at once.')

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')


def file_points(path: str) -> list[dict]:
    spec = importlib.util.spec_from_file_location('_lm_sweep_file', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_points() if hasattr(module, 'get_points') else [{}]


def plan(base, sweep_dir: str) -> list[dict]:
    """Every (point, seed) run, after skipping invalid points with a one-line note each."""
    points = [
        {**p, **g}
        for p in file_points(config_flags.get_config_filename(flags.FLAGS['config']))
        for g in (parse_grid(base, _GRID.value) or [{}])
    ]
    runs = []
    for point in points:
        name = point.get('name') or run_name(point)
        point = {k: v for k, v in point.items() if k != 'name'}
        config = point_config(base, point)
        if reason := invalid_reason(config):
            print(f'skipping {name}: {reason}')
            continue
        seeds = point.get('seeds', _SEEDS.value)
        for s in range(seeds):
            seeded = point_config(config, {'seed': base.seed + s})
            runs.append(
                {
                    'point': name,
                    'config': seeded,
                    'workdir': os.path.join(sweep_dir, f'{name}_s{s}' if seeds > 1 else name),
                }
            )
    if not runs:
        raise ValueError('the sweep has no valid point')
    return runs


def execute(run: dict, tb_dir: str) -> str:
    workdir = run['workdir']
    if os.path.exists(os.path.join(workdir, 'results.json')):
        return f'{os.path.basename(workdir)}: finished earlier, skipped'
    os.makedirs(workdir, exist_ok=True)
    cfg_file = write_config_file(run['config'], os.path.join(workdir, 'sweep_config.py'))
    t = time.time()
    with open(os.path.join(workdir, 'train.log'), 'a') as log:
        code = subprocess.call(
            [
                sys.executable,
                TRAIN,
                f'--config={cfg_file}',
                f'--workdir={workdir}',
                f'--tb_dir={tb_dir}',
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    status = 'done' if code == 0 else f'FAILED (exit {code}; see {workdir}/train.log)'
    return f'{os.path.basename(workdir)}: {status} in {time.time() - t:.0f} s'


def run() -> int:
    if _CONFIG.value is None:
        raise ValueError('--config is required')
    if _PARALLEL.value < 1 or _SEEDS.value < 1:
        raise ValueError('--parallel and --seeds must be >= 1')
    sweep_dir = _SWEEP_DIR.value
    check_writable_dir(sweep_dir, '--sweep_dir')
    check_config_keys(_CONFIG.value)
    runs = plan(_CONFIG.value, sweep_dir)
    print(f'{len(runs)} runs in {sweep_dir}')
    t = time.time()
    tb_dir = os.path.join(sweep_dir, 'tb')
    with ThreadPoolExecutor(_PARALLEL.value) as pool:
        for line in pool.map(lambda r: execute(r, tb_dir), runs):
            print(line, flush=True)
    finished = [r for r in runs if os.path.exists(os.path.join(r['workdir'], 'results.json'))]
    if finished:
        summarise(sweep_dir, finished)
        with open(os.path.join(sweep_dir, 'summary.md')) as f:
            print(f.read())
    print(f'sweep wall time: {time.time() - t:.0f} s')
    return 0 if len(finished) == len(runs) else 1


if __name__ == '__main__':
    run_app(run)
