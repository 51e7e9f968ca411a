"""Output files the scripts write (CSV tables, figures, reports), checked before any work: a
writable file path that replaces nothing a run, a sweep or an uptraining ablation wrote
(`check_output_file`, `check_not_record_file`)."""

from __future__ import annotations

import fnmatch
import json
import os

from lm.experiments.runner import RESULT, STARTED
from lm.train.workdir import (
    A_RUN,
    A_SWEEP,
    ABLATION_MARK,
    AN_ABLATION,
    SWEEP_MARK,
    TB_FILE,
    directory_kind,
)

# The files a sweep's summary leaves in the sweep directory (lm.experiments.sweep_summary).
SWEEP_FILES = (
    'summary.md',
    'summary.csv',
    'summary_pairs.csv',
    'summary_pairs_recall.csv',
    'summary_seeds.csv',
    'summary.png',
)
# The record files a run keeps at the top of its directory, beside checkpoints/ and its
# side files (lm.train.workdir.RUN_FILES, a subdirectory: refused as one).
RUN_RECORDS = ('results.json', RESULT, STARTED, TB_FILE)
# What scripts/uptrain_ablation.py writes at the top of its out_dir, beside its runs and tb/.
ABLATION_FILES = ('seeds.csv', 'lr_grid.csv', ABLATION_MARK, 'pareto_*.png', 'seed*.log')


def mark_ablation(out_dir: str, settings: dict) -> None:
    """Marks `out_dir` as an uptraining ablation's (`ABLATION_MARK`, holding its settings), so
    its files are refused as other tools' outputs (`check_not_record_file`)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ABLATION_MARK)
    with open(f'{path}.{os.getpid()}.tmp', 'w') as f:
        json.dump({'settings': settings}, f, indent=1, sort_keys=True)
    os.replace(f'{path}.{os.getpid()}.tmp', path)


def check_output_file(path: str, flag: str, suffix: str = '', sweep_dir: str = '') -> None:
    """One-line error unless `path` names a file (ending in `suffix` when given) that can be
    written: not a directory, in an existing writable directory, and none of a run's or a
    sweep's own files (`check_output_path`). Writes nothing."""
    check_output_path(path, flag, suffix, sweep_dir)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f'{flag}={path}: its directory {parent} does not exist')
    if not os.access(parent, os.W_OK):
        raise ValueError(f'{flag}={path}: its directory {parent} is not writable')


def check_output_path(path: str, flag: str, suffix: str = '', sweep_dir: str = '') -> None:
    """One-line error unless `path` names a file ending in `suffix` (.csv, .json; any when '')
    that is none of a run's or a sweep's own files (`check_not_record_file`): a table or a
    benchmark's rows never replace a README, a data file, a run's result.json or a directory.
    Its directory is checked (and made) by the caller (`check_output_file` checks it)."""
    ending = f' ending in {suffix}' if suffix else ''
    if os.path.isdir(path):
        raise ValueError(f'{flag}={path} is a directory; give a file path{ending}')
    if suffix and not path.endswith(suffix):
        raise ValueError(f'{flag}={path}: expected a file name ending in {suffix}')
    check_not_record_file(path, flag, sweep_dir)


def check_not_record_file(path: str, flag: str, sweep_dir: str = '') -> None:
    """One-line ValueError when output file `path` would replace what a sweep (`sweep_dir`, or
    any sweep directory above `path`) or a run (any run directory above it) wrote
    (`check_not_sweep_file`, `check_not_run_file`). Object stores (gs://...) pass."""
    if '://' in path:
        return
    if sweep_dir:
        check_not_sweep_file(path, sweep_dir, flag)
    top = os.path.dirname(os.path.realpath(path))
    while True:
        kind = directory_kind(top)
        if kind == A_SWEEP:
            check_not_sweep_file(path, top, flag)
        elif kind == AN_ABLATION:
            check_not_ablation_file(path, top, flag)
        elif kind == A_RUN:
            check_not_run_file(path, top, flag)
        if top == os.path.dirname(top):
            return
        top = os.path.dirname(top)


def check_not_sweep_file(path: str, sweep_dir: str, flag: str) -> None:
    """One-line ValueError when output file `path` would replace what the sweep in `sweep_dir`
    wrote: its summary files (`SWEEP_FILES`), Pareto figures (pareto_*.png,
    lm.experiments.pareto_plot) or fairness record (`SWEEP_MARK`), or anything in its
    subdirectories (its runs, TensorBoard files)."""
    mine, sweep = os.path.realpath(path), os.path.realpath(sweep_dir)
    if mine == sweep or os.path.commonpath([mine, sweep]) != sweep:
        return
    name = os.path.relpath(mine, sweep)
    if os.sep in name:
        raise ValueError(
            f'{flag}={path} is inside {os.path.join(sweep_dir, name.split(os.sep)[0])}, a '
            f'directory of the sweep {sweep_dir} (its runs, TensorBoard files); give a path '
            'outside it'
        )
    if name in (*SWEEP_FILES, SWEEP_MARK) or fnmatch.fnmatch(name, 'pareto_*.png'):
        raise ValueError(
            f"{flag}={path} is the sweep's own {name} (scripts/sweep.py writes it in "
            f'{sweep_dir}); give another file'
        )


def check_not_ablation_file(path: str, out_dir: str, flag: str) -> None:
    """One-line ValueError when output file `path` is one of the uptraining ablation's own
    files in `out_dir` (`ABLATION_FILES`) or inside its subdirectories (its runs, tb/); a report
    or another file beside them is the user's."""
    name = os.path.relpath(os.path.realpath(path), os.path.realpath(out_dir))
    if os.sep in name or any(fnmatch.fnmatch(name, f) for f in ABLATION_FILES):
        raise ValueError(
            f"{flag}={path} would replace the uptraining ablation {out_dir}'s own "
            f'{name.split(os.sep)[0]}; give a path outside it'
        )


def check_not_run_file(path: str, run_dir: str, flag: str) -> None:
    """One-line ValueError when output file `path` is in a subdirectory of the run in
    `run_dir` (its checkpoints, TensorBoard files) or is one of its record files
    (`RUN_RECORDS`); another file beside them is the user's."""
    name = os.path.relpath(os.path.realpath(path), os.path.realpath(run_dir))
    if os.sep in name or name in RUN_RECORDS:
        raise ValueError(
            f"{flag}={path} would replace the run {run_dir}'s own "
            f'{name.split(os.sep)[0]}; give a path outside it'
        )
