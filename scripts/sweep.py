r"""Sweep a config over a grid (and/or the points of a sweep file) and summarise the runs.

  python scripts/sweep.py --config=configs/shakespeare_char.py \
      --config.data.path=data/tinyshakespeare.txt --sweep_dir=runs/heads \
      --grid model.attention=gqa --grid model.num_heads=4,8 --grid model.num_kv_heads=1,2,4,8
  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds \
      --seeds=3 --parallel=2
  tensorboard --logdir runs/kinds/tb

Each run trains in its own process (`train.py`) in <sweep_dir>/<name>, logging to
<sweep_dir>/tb/<name>. Re-running the command skips finished runs and resumes interrupted ones
(or ones given more train.steps); a re-run whose settings differ otherwise from a run's
checkpoint is refused, naming the keys. `--grid seed=...` sets each point's first seed.
At the end: <sweep_dir>/summary.md, summary.csv, summary_pairs.csv and summary.png: loss as mean,
sample std and 95% t-interval over seeds, and paired differences between points (same seed =
same data order) marked resolved when their 95% interval excludes 0.

  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds_p \
      --seeds=5 --parallel=2 --match=params      # equal parameters instead of equal width
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from absl import flags
from ml_collections import config_flags

from lm.cli import check_config_keys, check_writable_dir, run_app
from lm.config import write_config_file
from lm.experiments.fairness import MATCHES, match_parameters, reference_config
from lm.experiments.sweep import invalid_reason, parse_grid, point_config, run_name, summarise
from lm.train.checkpoint import read_latest_meta
from lm.train.run import check_loop_config
from lm.train.workdir import WorkdirLock, config_changes

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Base config file; a sweep file may also define get_points().'
)
_GRID = flags.DEFINE_multi_string('grid', [], 'key=v1,v2,...: one axis of the grid.')
_SWEEP_DIR = flags.DEFINE_string(
    'sweep_dir', None, 'Directory for runs and summary.', required=True
)
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per point (a point may set its own).')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at once.')
_MATCH = flags.DEFINE_enum(
    'match',
    '',
    ['', *MATCHES],
    "Fairness: 'width' (same shapes) or 'params' (mlp_dim set so every point is within 1% of "
    "the MHA point's parameters); '' = the sweep file's MATCH, else 'width'.",
)

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train.py')


def load_sweep_file(path: str):
    spec = importlib.util.spec_from_file_location('_lm_sweep_file', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_points(module) -> list[dict]:
    return module.get_points() if hasattr(module, 'get_points') else [{}]


def fairness(module) -> str:
    """--match, else the sweep file's MATCH, else 'width'."""
    match = _MATCH.value or getattr(module, 'MATCH', 'width')
    if match not in MATCHES:
        raise ValueError(f'--match / MATCH must be one of {MATCHES}, got {match!r}')
    return match


def plan(base, sweep_dir: str, module, match: str = 'width') -> list[dict]:
    """Every (point, seed) run, after skipping invalid points with a one-line note each; with
    match='params', each point's mlp_dim brings it within 1% of the MHA point's parameters."""
    points = [
        {**p, **g} for p in file_points(module) for g in (parse_grid(base, _GRID.value) or [{}])
    ]
    valid = []
    for point in points:
        name = point.get('name') or run_name(point)
        point = {k: v for k, v in point.items() if k != 'name'}
        config = point_config(base, point)
        if reason := invalid_reason(config):
            print(f'skipping {name}: {reason}')
            continue
        valid.append((name, point, config))
    if not valid:
        raise ValueError('the sweep has no valid point')
    if match == 'params':
        configs = [c for _, _, c in valid]
        matched = match_parameters(
            configs, reference_config(base, configs), [n for n, _, _ in valid]
        )
        valid = [(n, p, c) for (n, p, _), c in zip(valid, matched, strict=True)]
    runs = []
    for name, point, config in valid:
        seeds = point.get('seeds', _SEEDS.value)
        for s in range(seeds):
            seeded = point_config(config, {'seed': config.seed + s})  # the point's own seed
            try:
                check_loop_config(seeded)
            except ValueError as e:
                raise ValueError(f'sweep point {name}: {e}') from None
            runs.append(
                {
                    'point': name,
                    'config': seeded,
                    'workdir': os.path.join(sweep_dir, f'{name}_s{s}' if seeds > 1 else name),
                }
            )
    return runs


def check_earlier_runs(runs: list[dict]) -> None:
    """Refuses, in one line and before any run, a sweep whose runs already hold checkpoints
    trained under settings that differ from this sweep's (beyond
    lm.train.workdir.RESUMABLE_KEYS)."""
    stale = []
    for r in runs:
        try:
            meta = read_latest_meta(r['workdir'])
        except Exception:  # noqa: BLE001 - unreadable: train.py falls back or says so
            continue
        if meta is not None and (changes := config_changes(meta['config'], r['config'])):
            stale.append((r['workdir'], changes))
    if stale:
        workdir, changes = stale[0]
        more = f' (and {len(stale) - 1} more runs)' if len(stale) > 1 else ''
        raise ValueError(
            f'--sweep_dir: {workdir}{more} was trained with other settings: '
            f'{"; ".join(changes)}; use a new --sweep_dir, or delete those runs to redo them'
        )


def finished(run: dict) -> bool:
    """Whether the run holds results for the steps this sweep asks for."""
    path = os.path.join(run['workdir'], 'results.json')
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return json.load(f)['step'] == run['config'].train.steps


def check_same_fairness(sweep_dir: str, match: str) -> None:
    """Records the sweep's fairness in <sweep_dir>/match; a re-run with another one (whose
    finished runs would be skipped as done) stops with a one-line error."""
    path = os.path.join(sweep_dir, 'match')
    if os.path.exists(path):
        with open(path) as f:
            before = f.read().strip()
        if before != match:
            raise ValueError(
                f'--match={match}: {sweep_dir} holds a --match={before} sweep; use another '
                '--sweep_dir'
            )
    else:  # written once: a refused re-run leaves the sweep directory untouched
        os.makedirs(sweep_dir, exist_ok=True)
        with open(path, 'w') as f:
            f.write(match + '\n')


def execute(run: dict, tb_dir: str) -> str:
    workdir = run['workdir']
    if finished(run):
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
    module = load_sweep_file(config_flags.get_config_filename(flags.FLAGS['config']))
    match = fairness(module)
    runs = plan(_CONFIG.value, sweep_dir, module, match)
    with WorkdirLock(sweep_dir, '--sweep_dir'):
        check_same_fairness(sweep_dir, match)  # the more specific refusal first
        check_earlier_runs(runs)
        print(f'{len(runs)} runs in {sweep_dir}')
        t = time.time()
        tb_dir = os.path.join(sweep_dir, 'tb')
        with ThreadPoolExecutor(_PARALLEL.value) as pool:
            for line in pool.map(lambda r: execute(r, tb_dir), runs):
                print(line, flush=True)
        done = [r for r in runs if finished(r)]
        if done:
            summarise(sweep_dir, done, match)
            with open(os.path.join(sweep_dir, 'summary.md')) as f:
                print(f.read())
    print(f'sweep wall time: {time.time() - t:.0f} s')
    return 0 if len(done) == len(runs) else 1


if __name__ == '__main__':
    run_app(run)
