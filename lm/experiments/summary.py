"""The one summary path of every experiment (sweeps and the uptraining ablation): a value per
run, grouped by arm and seed; per arm its mean, sample std (ddof 1) and 95% t-interval over seeds;
between arms the paired difference over the seeds both ran (same seed = same initialisation and
data order) with its paired t-test p-value, Holm-corrected over every comparison the summary
reports (its family, of m comparisons) and resolved when the adjusted p is below 0.05
(`lm.experiments.stats`). Per-seed values are written as CSV (`seed_rows`) beside each table.
"""

from __future__ import annotations

import csv
import math
import os
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


def holm_resolved(p_holm: float) -> bool:
    """A comparison is resolved when its Holm-adjusted p is below 1 - 95%."""
    return p_holm < 1 - stats.CONFIDENCE


def family(pairs: list[tuple[Values, Values]]) -> list[tuple[stats.Estimate, float, float]]:
    """(paired difference a − b, p, Holm-adjusted p) of each (a, b) of one summary's family."""
    diffs = [stats.paired_difference(a, b) for a, b in pairs]
    p = [stats.p_value(d) for d in diffs]
    return list(zip(diffs, p, stats.holm(p), strict=True))


def diff_cell(diff: stats.Estimate, p_holm: float, digits: int = 4) -> str:
    """'+0.0833 [0.0116, 0.1550] p=0.012 ✓': a paired difference a − b with its 95% interval
    and Holm-adjusted p, ✓ = resolved after the correction."""
    p = '' if math.isnan(p_holm) else f' p={p_holm:.3g}'
    resolved = ' ✓' if holm_resolved(p_holm) else ''
    return f'{diff.mean:+.{digits}f} {diff.interval(digits)}{p}{resolved}'


def family_note(m: int) -> str:
    """The sentence every summary states its correction with."""
    return (
        f'p: paired t-test, Holm-corrected over the {m} comparisons of this summary; ✓ = '
        'resolved (corrected p < 0.05).'
    )


def estimate_columns(name: str, values: Values) -> dict:
    """CSV columns of an arm's estimate: name, name_std, name_ci_lo, name_ci_hi."""
    est = stats.estimate(list(values.values()))
    return {
        name: est.mean,
        f'{name}_std': est.std,
        f'{name}_ci_lo': est.lo,
        f'{name}_ci_hi': est.hi,
    }


PairPicker = Callable[[list[str]], list[tuple[str, str]]]  # arm names -> the pairs compared


def within_groups(names: list[str]) -> list[tuple[str, str]]:
    """The pairs of arms named '<group>/<arm>' that share their group, in order; raises a
    one-line ValueError naming any arm with no group or alone in its group."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split('/')[0] if '/' in name else '', []).append(name)
    lone = [n for g, members in groups.items() for n in members if not g or len(members) < 2]
    if lone:
        raise ValueError(f'arms {lone}: each must be <group>/<arm> with another arm of its group')
    return [
        (a, b)
        for members in groups.values()
        for i, a in enumerate(members)
        for b in members[i + 1 :]
    ]


def all_pairs(
    values: Mapping[str, Values], value: str = 'loss', pairs: PairPicker | None = None
) -> list[dict]:
    """Every two arms (a before b, in order; or those `pairs` picks from the names) as a row: the
    paired difference a − b of `value` (`<value>_diff`, its std and 95% interval, seeds paired),
    its p and Holm-adjusted p over these pairs (the comparisons counted), whether that resolves
    it and the ordering."""
    names = list(values)
    ab = pairs(names) if pairs else [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    results = family([(values[a], values[b]) for a, b in ab])
    rows, m = [], stats.family_size([p for _, p, _ in results])
    for (a, b), (d, p, p_holm) in zip(ab, results, strict=True):
        rows.append(
            {
                'a': a,
                'b': b,
                f'{value}_diff': d.mean,
                f'{value}_diff_std': d.std,
                'ci_lo': d.lo,
                'ci_hi': d.hi,
                'seeds': d.n,
                'p': p,
                'p_holm': p_holm,
                'comparisons': m,
                'resolved': holm_resolved(p_holm),
                'ordering': stats.ordering(a, b, d, holm_resolved(p_holm)),
            }
        )
    return rows


def seed_rows(values: Mapping[Hashable, Values], keys: tuple[str, ...], value: str) -> list[dict]:
    """Per-seed CSV rows: the arm's parts under `keys` (an arm that is a tuple fills several),
    the seed, and the value."""
    rows = []
    for arm, by_seed in values.items():
        parts = arm if isinstance(arm, tuple) else (arm,)
        for seed, v in sorted(by_seed.items()):
            rows.append({**dict(zip(keys, parts, strict=True)), 'seed': seed, value: v})
    return rows


def write_csv(path: str, rows: list[dict]) -> None:
    """Writes `rows` to the CSV file `path`, creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['point'])
        writer.writeheader()
        writer.writerows(rows)


def seeds_table(rows: list[dict], pairs: PairPicker | None = None) -> str:
    """Per arm its estimate over seeds; between arms the Holm-corrected paired differences (every
    two arms, or those `pairs` picks: `all_pairs`). The arm is the 'arm' column, else 'point' (a
    sweep's summary_seeds.csv); each further column but 'seed' is a value with its own table and
    Holm family."""
    arm = 'arm' if 'arm' in rows[0] else 'point'
    columns = [k for k in rows[0] if k not in (arm, 'seed')]
    if len(columns) == 1:
        return _value_table(rows, arm, columns[0], pairs)
    return '\n\n'.join(f'{c}:\n\n{_value_table(rows, arm, c, pairs)}' for c in columns)


def within_table(rows: list[dict]) -> str:
    """`seeds_table` comparing only the arms of one group (arms named '<group>/<arm>', e.g.
    'mqa/width' and 'mqa/params'), Holm over those pairs."""
    return seeds_table(rows, within_groups)


def _value_table(rows: list[dict], arm: str, value: str, pairs: PairPicker | None = None) -> str:
    """`seeds_table` of one value column."""
    values: dict[str, dict[int, float]] = {}
    for r in rows:
        values.setdefault(r[arm], {})[int(r['seed'])] = float(r[value])
    lines = [f'| arm | {value} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|']
    lines += [f'| {arm} | {cell(v)} | {len(v)} |' for arm, v in values.items()]
    compared = all_pairs(values, pairs=pairs)
    lines += ['', family_note(compared[0]['comparisons'] if compared else 0), '']
    lines += ['| a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|']
    for p in compared:
        d = stats.paired_difference(values[p['a']], values[p['b']])
        lines.append(f'| {p["a"]} | {p["b"]} | {diff_cell(d, p["p_holm"])} | {p["ordering"]} |')
    return '\n'.join(lines)
