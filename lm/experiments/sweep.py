"""Sweeps as a plan for the experiment runner: sweep files, points combined with the grid, one
`Spec` per (point, seed). Grid values, run names and which points can run are
lm/experiments/sweep_points.py's; the summary table and plot of a finished sweep are
lm/experiments/sweep_summary.py's.

A point is a dict of dotted config keys to values ({'model.num_heads': 8, ...}); a sweep is the
points of a sweep file times the cartesian product of `--grid key=v1,v2` flags, times seeds.
Each run trains in its own process (the `train_command` the CLI gives, i.e. train.py) in
<sweep_dir>/<name>; its fingerprint is its whole config, of which `RESUMABLE_KEYS` (more
train.steps, ...) may change: the run then resumes from its checkpoint.
"""

from __future__ import annotations

import os
import types
from collections.abc import Collection
from typing import Any

import ml_collections

from lm.config import load_module, write_config_file
from lm.experiments.fairness import MATCHES, match_parameters, reference_config
from lm.experiments.runner import RunFailed, RunStopped, Spec, call, stopped_by
from lm.experiments.sweep_ensemble import PointSpecs
from lm.experiments.sweep_points import valid_points, value_parts
from lm.model import attention
from lm.train.checkpoint import saved_steps
from lm.train.workdir import RUN_LOG, SWEEP_CONFIG, SWEEP_MARK, read_json_object


def combine(points: list[dict], grid: list[dict]) -> list[dict]:
    """Each sweep-file point with each grid point. A named point's name gains the grid's values
    other than `seed` (a run's name ends with the seed it trains with), so `--points=mha
    --grid model.mlp_dim=256,512` gives `mha_mlp_dim256` and `mha_mlp_dim512`. A grid key that
    a point sets itself is refused (the grid would replace the point's value)."""
    combined = []
    for point in points:
        if shared := [k for k in grid[0] if k in point]:
            raise ValueError(
                f'--grid {shared[0]}: sweep point {point.get("name") or point} sets {shared[0]}='
                f"{point[shared[0]]!r} itself, and the grid's values would replace it; leave the "
                'point out (--points) or give the key in one place'
            )
        for values in grid:
            both = {**point, **values}
            if point.get('name'):
                rest = {k: v for k, v in values.items() if k != 'seed'}
                both['name'] = '_'.join([point['name'], *value_parts(rest)])
            combined.append(both)
    return combined


def load_sweep_file(path: str) -> types.ModuleType:
    """The sweep file (a config file that may define get_points() and MATCH) as a module;
    `path` may end with its get_config's argument, as --config passes it (`recall_width.py:64`)."""
    if not os.path.exists(path) and ':' in path:
        path = path.rsplit(':', 1)[0]
    return load_module(path)


def variant_points(specs: list[str]) -> list[dict[str, Any]]:
    """Sweep points named by attention-variant specs, each setting the model keys
    `lm.model.attention.parse_variant` gives for its spec."""
    return [
        {'name': spec, **{f'model.{k}': v for k, v in attention.parse_variant(spec).items()}}
        for spec in specs
    ]


def _points_of(module: types.ModuleType) -> list[dict]:
    """The sweep file's `get_points()` (else one empty point); one line for a list that is not
    one of dicts of settings."""
    if not hasattr(module, 'get_points'):
        return [{}]
    where = f'get_points() of {getattr(module, "__file__", "the sweep file")}'
    try:
        points = module.get_points()
    except Exception as e:  # noqa: BLE001  (the sweep file's own code: said in one line)
        raise ValueError(f'{where} failed: {type(e).__name__}: {e}') from None
    if not isinstance(points, list | tuple):
        raise ValueError(f'{where} returned {type(points).__name__}, not a list of points')
    if not points:
        raise ValueError(f'{where} returned no points: list at least one (a dict of settings)')
    for i, point in enumerate(points):
        if not isinstance(point, dict) or not all(isinstance(k, str) for k in point):
            raise ValueError(
                f'{where}: point {i + 1} is {point!r}, not a dict of settings ("key": value)'
            )
        seeds = point.get('seeds', 1)
        if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
            raise ValueError(f'{where}: point {i + 1} has seeds={seeds!r}; expected >= 1')
    return list(points)


def file_points(module: types.ModuleType, names: list[str] = ()) -> list[dict]:
    """The sweep file's points (`get_points()`, else one empty point); only those `names`
    names when any are given (--points), in the file's order."""
    points = _points_of(module)
    known = [p.get('name', '') for p in points]
    if names and known == ['']:
        raise ValueError(f'--points: {list(names)}: this sweep file defines no named points')
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"--points: {unknown} not among the sweep file's points {known}")
    if twice := sorted({n for n in names if list(names).count(n) > 1}):
        raise ValueError(f'--points: {twice} named twice')
    return [p for p in points if not names or p.get('name', '') in names]


def fairness(module: types.ModuleType, match: str = '') -> str:
    """`match` (--match), else the sweep file's MATCH, else 'width'."""
    match = match or getattr(module, 'MATCH', 'width')
    if match not in MATCHES:
        raise ValueError(f'--match / MATCH must be one of {MATCHES}, got {match!r}')
    return match


# What --ensemble sets in each run's config itself (`PointSpecs.ensemble`), and from which flag.
ENSEMBLE_SETS = {
    'train.ensemble': '--seeds and --ensemble_groups',
    'train.ensemble_loop': '--ensemble_program (auto, vmapped or looped)',
}


def check_overrides(
    overridden: list[str], points: list[dict], grid: list[dict], ensemble: bool = False
) -> None:
    """One-line error for a --config.KEY override that the sweep would drop: a KEY that one of
    the chosen `points` (the sweep file's) sets itself, or that the `grid` sets, or, with
    `ensemble` (--ensemble), one of ENSEMBLE_SETS in an override, a point or the grid."""
    if ensemble:
        for key, flag in ENSEMBLE_SETS.items():
            given = [f'--config.{key}'] if key in overridden else []
            given += [f'--grid {key}'] if any(key in values for values in grid) else []
            given += [f'sweep point {n.get("name") or n}' for n in points if key in n]
            if given:
                raise ValueError(
                    f'{given[0]} sets {key}, but with --ensemble the sweep sets it from {flag}: '
                    'leave it out and use that flag'
                )
    for key in overridden:
        for named in points:
            if key in named and key not in ('name', 'seeds'):
                raise ValueError(
                    f'--config.{key}: sweep point {named.get("name") or named} sets {key}='
                    f'{named[key]!r} itself, so the override would do nothing; leave it out, or '
                    'choose points that leave it to the config (--points)'
                )
        if any(key in values for values in grid):
            raise ValueError(
                f"--config.{key}: --grid sets {key} too, and the grid's values replace the "
                'override; give it in one place'
            )


def plan(
    base: ml_collections.ConfigDict,
    points: list[dict],
    sweep_dir: str,
    train_command: list[str],
    seeds: int = 1,
    match: str = 'width',
    tb_dir: str = '',
    ensemble: bool = False,
    ensemble_groups: int = 1,
    ensemble_loop: bool | None = None,
    split_command: list[str] = (),
    chosen: bool = False,
    grid_keys: Collection[str] = (),
) -> list[Spec]:
    """A Spec per (point, seed) after skipping invalid points; with match='params', each point's
    mlp_dim brings it within 1% of the MHA point's parameters. A point's 'seeds' overrides
    `seeds`; its k-th run trains with seed config.seed + k and is named `<point>_s<seed>` (so
    `--grid seed=5` gives mha_s5, mha_s6, ...). Runs log to `tb_dir` (default <sweep_dir>/tb).
    With `ensemble`, a point's seeds (when more than one) train as one seed ensemble
    (`config.train.ensemble`), a run of its own in <sweep_dir>/ensembles/<point>, and each
    seed's run is its member split out (`lm.train.split_member`): the same runs, names and
    results as separate training, for the summaries (`seed_runs`, lm.experiments.sweep_ensemble);
    `ensemble_groups` > 1 splits a point's seeds over that many ensembles (lanes that can train at
    once, <point>_g<j>), `ensemble_loop` sets their train.ensemble_loop (None: the config's);
    `split_command` (scripts/split_ensemble.py) splits the members out, in a process of its own.
    `chosen`: the points were named in --points, so an invalid one is refused, not skipped;
    `grid_keys`: the keys of --grid, a value of which no point can run with is refused."""
    valid = valid_points(base, points, chosen, grid_keys)
    if match == 'params':
        configs = [c for _, _, c in valid]
        matched = match_parameters(
            configs, reference_config(base, configs), [n for n, _, _ in valid]
        )
        valid = [(n, p, c) for (n, p, _), c in zip(valid, matched, strict=True)]
    names = [n for n, _, _ in valid]
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(
            f'two sweep points share the run name {repeated[0]!r}: give each its own name or '
            'values (several seeds: --seeds=K, with --grid seed=FIRST)'
        )
    most = max(point.get('seeds', seeds) for _, point, _ in valid)
    if ensemble and ensemble_groups > most:
        raise ValueError(
            f'--ensemble_groups={ensemble_groups} is more than the {most} seeds of any point: '
            f'each group is an ensemble of at least one seed (at most {most})'
        )
    tb_dir = tb_dir or os.path.join(sweep_dir, 'tb')
    specs = []
    for name, point, config in valid:
        n = point.get('seeds', seeds)
        make = PointSpecs(name, train_command, tb_dir, sweep_dir, _trainer, list(split_command))
        if ensemble and n > 1:
            loop = config.train.ensemble_loop if ensemble_loop is None else ensemble_loop
            specs += make.ensemble(config, n, ensemble_groups, loop)
        else:
            specs += make.separate(config, n)
    return specs


PROGRESS = ('] eval at step ', '] resumed from ')  # train.log lines a sweep echoes


def _train_logged(argv: list[str], workdir: str) -> tuple[int, str]:
    """Runs `argv` (`runner.call`: a stop signal is passed on to it), appending its output to
    <workdir>/train.log and echoing its evaluation lines (`<run>: eval at step N: ...`) as they
    come; returns its exit code and its last one-line `error: ...` ('' if none)."""
    name = os.path.basename(os.path.normpath(workdir))
    errors = ['']

    def echo(line: str) -> None:
        if line.startswith('error: '):
            errors.append(line.strip())
        for marker in PROGRESS:
            if marker in line:
                print(f'{name}: {marker[2:]}{line.split(marker, 1)[1]}', end='', flush=True)

    with open(os.path.join(workdir, RUN_LOG), 'a') as log:
        return call(argv, log, echo), errors[-1]


def _trainer(config: ml_collections.ConfigDict, command: list[str], tb_dir: str):
    """A Spec's run: `command` (train.py) trains `config` in the workdir, logging to
    <workdir>/train.log and echoing its progress; its result is the run's results.json."""

    def run(workdir: str) -> dict:
        cfg_file = write_config_file(config, os.path.join(workdir, SWEEP_CONFIG))
        args = [f'--config={cfg_file}', f'--workdir={workdir}', f'--tb_dir={tb_dir}']
        code, error = _train_logged([*command, *args], workdir)
        if name := stopped_by(code):
            steps = saved_steps(workdir)
            kept = (
                f'its checkpoint of step {steps[-1]} kept; repeating the command resumes it'
                if steps
                else 'no checkpoint yet; repeating the command starts it again'
            )
            raise RunStopped(f'{os.path.basename(workdir)} stopped by {name}: {kept}')
        results = os.path.join(workdir, 'results.json')
        if code != 0 or not os.path.exists(results):
            said = f': {error}' if error else ''
            raise RunFailed(f'exit {code}{said}; see {workdir}/train.log')
        return read_json_object(results)

    return run


def check_same_fairness(sweep_dir: str, match: str) -> None:
    """Records the sweep's fairness in <sweep_dir>/match; a re-run with another one stops with a
    one-line error."""
    path = os.path.join(sweep_dir, SWEEP_MARK)
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
