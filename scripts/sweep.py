r"""Sweep a config over a grid (and/or the points of a sweep file) and summarise the runs.

  python scripts/sweep.py --config=configs/shakespeare_char.py \
      --config.data.path=data/tinyshakespeare.txt --sweep_dir=runs/heads \
      --grid model.attention=gqa --grid model.num_heads=4,8 --grid model.num_kv_heads=1,2,4,8
  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds \
      --seeds=3 --parallel=2
  tensorboard --logdir runs/kinds/tb

Each run trains in its own process (`train.py`) in <sweep_dir>/<name> (named by attention kind
and heads: `gqa_h4_kv2`, `mqa_h8`, ...), logging to <tb_dir>/<name> (--tb_dir, default
<sweep_dir>/tb); the sweep is a plan of runs (lm.experiments.sweep) handed to the experiment
runner (lm.experiments.runner). Re-running the command skips finished runs and resumes
interrupted ones (or ones given more train.steps); a re-run whose settings differ otherwise from
a run's is refused, naming the run and the keys. `--grid seed=...` sets each point's first seed
(runs are named <point>_s<seed>, by the seed they train with).
At the end: <sweep_dir>/summary.md, summary.csv, summary_pairs.csv, summary_seeds.csv and
summary.png: loss as mean, sample std and 95% t-interval over seeds, and paired differences
between points (same seed = same data order) marked resolved when their paired t-test p,
Holm-corrected over every pair, is below 0.05; and
pareto_eval_loss.png (pareto_eval_recall_accuracy.png where runs have it), also the image
'pareto/<metric>' of the run 'pareto' in the TensorBoard directory (scripts/plot_pareto.py).

  python scripts/sweep.py --config=configs/sweeps/kv_layouts.py --sweep_dir=runs/kv4 \
      --points=mha,mqa,cla2,mha_local           # some of a sweep file's points, by name
  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds_p \
      --seeds=5 --parallel=2 --match=params      # equal parameters instead of equal width

The same command with --status prints where each of its runs stands (finished with its final
evaluation, finished under settings a re-run resumes it to or with settings it refuses, started
with its last evaluation, checkpoint and minutes left, or not started) and exits; it reads
files only, so it is safe beside the sweep running.
"""

import os
import signal
import sys
import time

import jax
from absl import flags
from ml_collections import config_flags

from lm.cli import check_writable_dir, run_app, runs_devices
from lm.config import check_config_keys
from lm.experiments import (
    MATCHES,
    METRICS,
    RunStopped,
    StopRuns,
    check_ensembles_divide,
    check_same_fairness,
    check_specs,
    check_sweep_overrides,
    combine,
    file_points,
    load_sweep_file,
    one_seed_runs_left,
    parse_grid,
    plan_sweep,
    progress,
    run_specs,
    runs_of,
    seed_runs,
    summarise_pareto,
    summarise_sweep,
    sweep_match,
)
from lm.train import (
    A_RUN,
    AN_ABLATION,
    WorkdirLock,
    check_not_inside_a_run,
    directory_kind,
    ensemble_loop_default,
)

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Base config file; a sweep file may also define get_points().'
)
_GRID = flags.DEFINE_multi_string(
    'grid',
    [],
    "key=v1,v2,...: one axis of the grid ('key=a,b;c,d', quoted: values holding commas).",
)
_SWEEP_DIR = flags.DEFINE_string(
    'sweep_dir', None, 'Directory for runs and summary.', required=True
)
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Shared TensorBoard directory of the runs; '' = <sweep_dir>/tb."
)
_POINTS = flags.DEFINE_list(
    'points', [], "Only these of the sweep file's points, by name (default: all)."
)
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Seeds per point (a point may set its own).')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at once.')
_ENSEMBLE = flags.DEFINE_bool(
    'ensemble',
    False,
    "Train each point's seeds as one seed ensemble (config.train.ensemble), its members then "
    'split out as the runs <point>_s<seed>; the same summaries as separate runs.',
)
_PROGRAM = flags.DEFINE_enum(
    'ensemble_program',
    'auto',
    ['auto', 'vmapped', 'looped'],
    "--ensemble: how an ensemble's members train in its program (config.train.ensemble_loop); "
    "'auto': the faster measured on this backend, looped on a CPU and vmapped on an "
    'accelerator (docs/performance.md).',
)
_GROUPS = flags.DEFINE_integer(
    'ensemble_groups',
    1,
    "--ensemble: a point's seeds as this many ensembles of consecutive seeds, each a lane of its "
    'own, so --parallel of them train at once (ensembles/<point>_g<j>).',
)
_STATUS = flags.DEFINE_bool(
    'status', False, 'Print where each run of the plan stands (reads files only) and exit.'
)
_MATCH = flags.DEFINE_enum(
    'match',
    '',
    ['', *MATCHES],
    "Fairness: 'width' (same shapes) or 'params' (mlp_dim set so every point is within 1% of "
    "the MHA point's parameters); '' = the sweep file's MATCH, else 'width'.",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, 'train.py')
SPLIT = os.path.join(ROOT, 'scripts', 'split_ensemble.py')


def check_flags() -> None:
    """One-line errors for the flags and the sweep directory, before anything is planned."""
    if _CONFIG.value is None:
        raise ValueError('--config is required')
    if flags.FLAGS['points'].present and not _POINTS.value:  # e.g. an empty shell variable
        raise ValueError('--points: empty: name at least one point, or leave it out for all')
    for flag in (_PARALLEL, _SEEDS, _GROUPS):
        if flag.value < 1:
            raise ValueError(f'--{flag.name} must be >= 1, got {flag.value}')
    for name in ('ensemble_groups', 'ensemble_program'):
        if flags.FLAGS[name].present and not _ENSEMBLE.value:
            raise ValueError(f'--{name} applies to --ensemble sweeps only; add --ensemble')
    sweep_dir = _SWEEP_DIR.value
    if (kind := directory_kind(sweep_dir)) in (A_RUN, AN_ABLATION):  # --status too: no such runs
        raise ValueError(f'--sweep_dir: {sweep_dir} is {kind}, not a sweep directory')
    if not _STATUS.value:  # --status only reads: a read-only copy of a sweep is fine
        check_writable_dir(sweep_dir, '--sweep_dir')
        check_not_inside_a_run(sweep_dir, '--sweep_dir')
        if _TB_DIR.value:
            check_writable_dir(_TB_DIR.value, '--tb_dir')
    check_config_keys(_CONFIG.value)


def summarise(specs: list, sweep_dir: str, found: dict, match: str) -> dict:
    """summary.md and the Pareto figures of the finished seed runs (returned: {name: result}),
    then summary.md printed."""
    found = {s.name: found[s.name] for s in seed_runs(specs) if s.name in found}
    if not found:
        return found
    summarise_sweep(sweep_dir, seed_runs(specs), found, match)
    runs = runs_of(seed_runs(specs), found, sweep_dir)
    summarise_pareto(runs, sweep_dir, _TB_DIR.value or os.path.join(sweep_dir, 'tb'), METRICS)
    with open(os.path.join(sweep_dir, 'summary.md')) as f:
        print(f.read())
    return found


def run() -> int:
    # This process plans, splits nothing and trains nothing: on the CPU, so that it never holds
    # an accelerator (a GPU's memory belongs to the runs' own processes).
    jax.config.update('jax_platforms', 'cpu')
    check_flags()
    sweep_dir = _SWEEP_DIR.value
    module = load_sweep_file(config_flags.get_config_filename(flags.FLAGS['config']))
    match = sweep_match(module, _MATCH.value)
    base = _CONFIG.value
    chosen = file_points(module, _POINTS.value)
    grid = parse_grid(base, _GRID.value)
    overridden = list(config_flags.get_override_values(flags.FLAGS['config']))
    check_sweep_overrides(overridden, chosen, grid, ensemble=_ENSEMBLE.value)
    points = combine(chosen, grid)
    train = [sys.executable, TRAIN]
    loop = {'vmapped': False, 'looped': True}.get(_PROGRAM.value)
    devices = runs_devices() if _ENSEMBLE.value else None  # what each run's process gets
    if loop is None and devices:  # 'auto': the runs' backend's faster program
        loop = ensemble_loop_default(devices[0])
    specs = plan_sweep(
        base,
        points,
        sweep_dir,
        train,
        _SEEDS.value,
        match,
        _TB_DIR.value,
        _ENSEMBLE.value,
        _GROUPS.value,
        loop,
        [sys.executable, SPLIT],
        chosen=bool(_POINTS.value),
        grid_keys=list(grid[0]),
    )
    if _STATUS.value:
        print('\n'.join(progress(specs, sweep_dir)))
        return 0
    if devices:
        check_ensembles_divide(specs, base, *devices)
    t = time.time()
    with WorkdirLock(sweep_dir, '--sweep_dir'):
        check_same_fairness(sweep_dir, match)  # the more specific refusal first
        check_specs(specs, sweep_dir, '--sweep_dir')
        print(f'{len(specs)} runs in {sweep_dir}')
        for note in one_seed_runs_left(specs, sweep_dir):
            print(note)
        with StopRuns() as stop:  # SIGTERM: the run in progress saves; no new run starts
            try:
                found = run_specs(specs, sweep_dir, _PARALLEL.value, flag='--sweep_dir', stop=stop)
            except RunStopped as e:
                print(f'{e}; no further runs started', file=sys.stderr)
                return 128 + (stop.signum or signal.SIGTERM)
        found = summarise(specs, sweep_dir, found, match)
    print(f'sweep wall time: {time.time() - t:.0f} s')
    return 0 if len(found) == len(seed_runs(specs)) else 1


if __name__ == '__main__':
    run_app(run)
