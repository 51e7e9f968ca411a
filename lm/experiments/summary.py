"""The one summary path of every experiment (sweeps and the uptraining ablation): a value per
run, grouped by arm and seed; per arm its mean, sample std (ddof 1) and 95% t-interval over seeds;
between arms the paired difference over the seeds both ran (same seed = same initialisation and
data order), resolved when its 95% interval excludes 0 (`lm.experiments.stats`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Hashable, Mapping

from lm.experiments import stats
from lm.experiments.runner import Spec

Values = Mapping[int, float]  # {seed: value} of one arm


def by_arm(
    specs: list[Spec], found: Mapping[str, dict], value: Callable[[dict], float]
) -> dict[Hashable, dict[int, float]]:
    """{arm: {seed: value(result)}} over the runs in `found` ({name: result}), arms in plan
    order."""
    out: dict[Hashable, dict[int, float]] = {}
    for spec in specs:
        if spec.name in found:
            out.setdefault(spec.arm, {})[spec.seed] = value(found[spec.name])
    return out


def loss(result: dict) -> float:
    """A run's final eval loss (what lm.train.loop returns and writes as results.json)."""
    return result['eval']['loss']


def mean_std(mean: float, std: float, n: int, digits: int = 4) -> str:
    """'mean ± std', or 'mean (n = 1)' for one seed, which has no spread."""
    return f'{mean:.{digits}f} ± {std:.{digits}f}' if n > 1 else f'{mean:.{digits}f} (n = {n})'


def spread(values: Values, digits: int = 4) -> str:
    """`mean_std` of an arm's values over seeds."""
    est = stats.estimate(list(values.values()))
    return mean_std(est.mean, est.std, est.n, digits)


def cell(values: Values) -> str:
    """'mean ± std | [lo, hi]': an arm's estimate and its 95% interval as two table cells
    ('mean (n = 1) | n/a (1 seed)' for one seed)."""
    return f'{spread(values)} | {stats.estimate(list(values.values())).interval()}'


def diff_cell(a: Values, b: Values) -> str:
    """'+0.0833 [0.0116, 0.1550] ✓': the paired difference a − b, ✓ = resolved at 95%."""
    d = stats.paired_difference(a, b)
    return f'{d.mean:+.4f} {d.interval()}{" ✓" if d.resolved else ""}'


def estimate_columns(name: str, values: Values) -> dict:
    """CSV columns of an arm's estimate: name, name_std, name_ci_lo, name_ci_hi."""
    est = stats.estimate(list(values.values()))
    return {
        name: est.mean,
        f'{name}_std': est.std,
        f'{name}_ci_lo': est.lo,
        f'{name}_ci_hi': est.hi,
    }


def pair(a: str, b: str, values: Mapping[str, Values]) -> dict:
    """The paired difference of arms a − b as a row: loss_diff, its std and 95% interval, the
    seeds paired, whether it is resolved and the ordering it resolves."""
    d = stats.paired_difference(values[a], values[b])
    return {
        'a': a,
        'b': b,
        'loss_diff': d.mean,
        'loss_diff_std': d.std,
        'ci_lo': d.lo,
        'ci_hi': d.hi,
        'seeds': d.n,
        'resolved': d.resolved,
        'ordering': stats.ordering(a, b, d),
    }


def all_pairs(values: Mapping[str, Values]) -> list[dict]:
    """`pair` of every two arms, in order (a before b)."""
    names = list(values)
    return [pair(a, b, values) for i, a in enumerate(names) for b in names[i + 1 :]]


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['point'])
        writer.writeheader()
        writer.writerows(rows)
