"""Quality against KV-cache bytes per token: each arm of an experiment (a sweep point, an
uptraining arm) as one point, its quality over seeds as a mean with a 95% t-interval
(`lm.experiments.stats`), and the Pareto front of the arms' means.

A metric is named as TensorBoard shows it: 'eval/loss' is a run's result['eval']['loss'],
'eval/recall_accuracy' its result['eval']['recall_accuracy']. A metric whose name holds
'accuracy' is better higher; the rest (loss, perplexity, bits per byte) lower.

Points come from finished runs (`runs_in`: an out_dir of the experiment runner, each run's
result.json and the config saved with its checkpoint) or from a CSV table (`read_table`) with
columns panel, family, label, kv_cache_bytes_per_token, metric and either one row per arm
(mean, std, seeds: a summary) or one row per seed (seed, value).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Hashable, Iterable, Mapping

from lm.experiments import stats
from lm.experiments.runner import Spec, arm_and_seed, read_result, workdir
from lm.experiments.table_inputs import read_csv
from lm.model import accounting
from lm.model.transformer import model_config
from lm.train.stored import stored_config

# The TensorBoard run of a sweep's tb_dir that holds the Pareto figures: no sweep point takes it.
TB_RUN = 'pareto'
METRICS = ('eval/loss', 'eval/recall_accuracy')  # what experiments plot, where their runs have it


@dataclasses.dataclass(frozen=True)
class Point:
    """An arm: its label, KV-cache bytes per token and quality over seeds."""

    label: str
    kv_bytes: float
    quality: stats.Estimate
    family: str = ''  # what the figure colours alike (an attention kind, a conversion method)
    panel: str = ''  # which panel of the figure it is drawn in

    @property
    def error(self) -> float:
        """Half-width of the 95% t-interval; 0 for a single seed (no interval)."""
        return 0.0 if self.quality.n < 2 else self.quality.hi - self.quality.mean


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished run: the arm and seed it belongs to, its result and its workdir."""

    arm: Hashable
    seed: int
    result: Mapping
    workdir: str


def higher_is_better(metric: str) -> bool:
    return 'accuracy' in metric


def metric_value(result: Mapping, metric: str) -> float:
    """A run's value of `metric` ('eval/loss' -> result['eval']['loss'])."""
    section, _, name = metric.partition('/')
    values = result.get(section)
    if not isinstance(values, Mapping) or name not in values:
        have = [
            f'{s}/{k}'
            for s, v in result.items()
            if isinstance(v, Mapping) and s != 'fingerprint'  # the run's settings
            for k in v
        ]
        raise ValueError(
            f"metric {metric!r}: not in the run's result (it has {', '.join(sorted(have))})"
        )
    return float(values[name])


def dominates(a: Point, b: Point, higher: bool) -> bool:
    """a is at least as good as b in bytes and in mean quality, and better in one of them."""
    qa, qb = a.quality.mean, b.quality.mean
    no_worse = qa >= qb if higher else qa <= qb
    better = qa > qb if higher else qa < qb
    return a.kv_bytes <= b.kv_bytes and no_worse and (a.kv_bytes < b.kv_bytes or better)


def front(points: Iterable[Point], higher: bool) -> list[Point]:
    """The points no other point dominates, by KV bytes ascending; points with equal bytes and
    equal means are all on it (neither dominates the other)."""
    points = list(points)
    kept = [p for p in points if not any(dominates(q, p, higher) for q in points)]
    return sorted(kept, key=lambda p: (p.kv_bytes, -p.quality.mean if higher else p.quality.mean))


def summary_estimate(mean: float, std: float, n: int) -> stats.Estimate:
    """The Estimate of n values given only their mean and sample std: mean ± t_{n-1}·std/√n."""
    if n < 2:
        return stats.Estimate(n, mean, math.nan, math.nan, math.nan)
    half = stats.t_quantile(n - 1) * std / math.sqrt(n)
    return stats.Estimate(n, mean, std, mean - half, mean + half)


def arm_label(arm: Hashable) -> str:
    """An arm as text: ('GQA-2', 'mean', 0.05) -> 'GQA-2 mean 0.05'."""
    parts = arm if isinstance(arm, tuple) else (arm,)
    return ' '.join(f'{p:g}' if isinstance(p, float) else str(p) for p in parts)


def run_model(workdir: str) -> tuple[str, int]:
    """A run's attention kind and bf16 KV-cache bytes per token of a training-length sequence,
    from its saved config."""
    config = stored_config(workdir)
    cfg = model_config(config.model)
    return cfg.attention, accounting.kv_cache_bytes_per_context_token(cfg, config.data.seq_len)


def points(runs: Iterable[Run], metric: str, panel: str = '') -> list[Point]:
    """One point per arm (in order of first appearance) from its runs' `metric` over seeds;
    family: its attention kind."""
    by_arm: dict[Hashable, list[Run]] = {}
    for run in runs:
        by_arm.setdefault(run.arm, []).append(run)
    out = []
    for arm, group in by_arm.items():
        values = {r.seed: metric_value(r.result, metric) for r in group}
        kind, kv = run_model(group[0].workdir)
        estimate = stats.estimate(list(values.values()))
        out.append(Point(arm_label(arm), kv, estimate, kind, panel))
    return out


def runs_of(specs: Iterable[Spec], found: Mapping[str, dict], out_dir: str) -> list[Run]:
    """The finished runs of a plan (`found`: lm.experiments.runner.results) with their arms."""
    return [
        Run(s.arm, s.seed, found[s.name], workdir(out_dir, s)) for s in specs if s.name in found
    ]


def runs_in(out_dir: str) -> list[Run]:
    """The finished runs of an experiment's out_dir (a sweep_dir, an ablation's out_dir), by
    name; a run named <arm>_s<k> is seed k of <arm>, any other is seed 0 of its own arm."""
    runs = []
    for name in sorted(os.listdir(out_dir)):
        workdir = os.path.join(out_dir, name)
        if not os.path.isdir(workdir) or (result := read_result(workdir)) is None:
            continue
        arm, seed = arm_and_seed(name)
        runs.append(Run(arm, seed, result, workdir))
    if not runs:
        raise ValueError(f'{out_dir} holds no finished run (no <run>/result.json)')
    return runs


def _table_point(rows: list[dict], metric: str) -> Point:
    """One arm's rows of a table: its summary row, or one row per seed."""
    first = rows[0]

    def number(row: dict, column: str, kind: type = float) -> float:
        try:
            return kind(row[column])
        except ValueError:
            what = 'an int' if kind is int else 'a number'
            raise ValueError(
                f'arm {row["label"]}: {column}={row[column]!r} is not {what}'
            ) from None

    if 'seed' in first and first['seed'] != '':
        estimate = stats.estimate([number(r, 'value') for r in rows])
    elif len(rows) > 1:
        raise ValueError(f'{first["label"]} ({metric}): several summary rows for one arm')
    else:
        mean, std = number(first, 'mean'), number(first, 'std')
        estimate = summary_estimate(mean, std, number(first, 'seeds', int))
    kv = number(first, 'kv_cache_bytes_per_token')
    return Point(first['label'], kv, estimate, first.get('family', ''), first.get('panel', ''))


TABLE_COLUMNS = ('label', 'kv_cache_bytes_per_token', 'metric')  # and the seed or summary ones


def read_table(path: str, metric: str, flag: str = '--table') -> list[Point]:
    """The points of `metric` in a CSV table (the module docstring says its columns); one-line
    errors naming `flag` and the file (and its line: `read_csv`) for a table that is missing,
    damaged or lacks a column."""
    if not os.path.exists(path):
        raise ValueError(f'{flag}={path}: no such file')
    try:
        rows = read_csv(path)
    except ValueError as e:
        raise ValueError(f'{flag}: {e}') from None
    header = set(rows[0])
    per_seed = {bool(r.get('seed')) for r in rows}  # a row per seed, or an arm's summary row
    need = TABLE_COLUMNS + (('value',) if True in per_seed else ())
    need += ('mean', 'std', 'seeds') if False in per_seed else ()
    if missing := [c for c in need if c not in header]:
        raise ValueError(
            f'{flag}: {path} lacks the column(s) {", ".join(missing)}: expected '
            f'{", ".join(need)} (lm/experiments/pareto.py)'
        )
    if not (chosen := [r for r in rows if r['metric'] == metric]):
        there = ', '.join(sorted({r['metric'] for r in rows}))
        raise ValueError(f'{flag}: {path} has no rows of metric {metric!r} (it has {there})')
    arms: dict[tuple, list[dict]] = {}
    for row in chosen:
        arms.setdefault((row.get('panel', ''), row.get('family', ''), row['label']), []).append(row)
    try:
        return [_table_point(group, metric) for group in arms.values()]
    except ValueError as e:  # a word where a number belongs, in the table's only such cell
        raise ValueError(f'{flag}: {path}: {e}') from None
