"""A pre-registered trend over ordered arms: per seed, the least-squares slope of a value against
the arms' coordinate x (e.g. the number of times the KV heads were halved), and the difference
between the two end arms (largest x minus smallest), the two tested as one Holm family.

The doc-table kind 'trend' (lm.experiments.tables) reads a per-seed CSV with columns arm, x,
seed and one value column; a seed counts only where every arm has it (the slope needs them all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from lm.experiments import stats, summary


def per_seed_contrasts(rows: list[dict]) -> tuple[dict[str, float], dict, dict]:
    """(x per arm, slope per seed, last − first arm per seed) from the CSV rows; the value is the
    CSV's last column. Raises a one-line ValueError on an arm with two x's or fewer than two x's."""
    value = list(rows[0])[-1]
    xs: dict[str, float] = {}
    by_seed: dict[int, dict[str, float]] = {}
    for r in rows:
        x = float(r['x'])
        if xs.setdefault(r['arm'], x) != x:
            raise ValueError(f'trend: arm {r["arm"]} has two x values ({xs[r["arm"]]}, {x})')
        by_seed.setdefault(int(r['seed']), {})[r['arm']] = float(r[value])
    if len(set(xs.values())) < 2:
        raise ValueError(f'trend: needs at least two distinct x values, got {sorted(xs.values())}')
    arms = sorted(xs, key=xs.get)
    x = np.array([xs[a] for a in arms], dtype=np.float64)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()  # least-squares slope weights
    complete = {s: v for s, v in sorted(by_seed.items()) if set(v) == set(arms)}
    slopes = {s: float(w @ np.array([v[a] for a in arms])) for s, v in complete.items()}
    ends = {s: v[arms[-1]] - v[arms[0]] for s, v in complete.items()}
    return xs, slopes, ends


def contrasts(rows: list[dict]) -> list[tuple[str, stats.Estimate, float, float]]:
    """(name, estimate over seeds, Holm-adjusted t-test p, Holm-adjusted sign-flip p) of the
    slope and of the end-arm difference, one family of two."""
    xs, slopes, ends = per_seed_contrasts(rows)
    arms = sorted(xs, key=xs.get)
    named = {
        'slope per unit of x': list(slopes.values()),
        f'{arms[-1]} − {arms[0]}': list(ends.values()),
    }
    estimates = {k: stats.estimate(v) for k, v in named.items()}
    p_holm = stats.holm([stats.p_value(e) for e in estimates.values()])
    flip_holm = stats.holm([stats.sign_flip_p(v) for v in named.values()])
    return [(k, e, p, f) for (k, e), p, f in zip(estimates.items(), p_holm, flip_holm, strict=True)]


def trend_table(rows: list[dict]) -> str:
    """Per arm (in x order) its mean ± std and 95% t-interval; then the slope and the end-arm
    difference with their intervals, Holm-adjusted t-test p and sign-flip p."""
    value = list(rows[0])[-1]
    xs, slopes, _ = per_seed_contrasts(rows)
    lines = [f'| arm | x | {value} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|---|']
    for arm in sorted(xs, key=xs.get):
        v = {int(r['seed']): float(r[value]) for r in rows if r['arm'] == arm}
        lines.append(f'| {arm} | {xs[arm]:g} | {summary.cell(v)} | {len(v)} |')
    n = len(slopes)
    note = summary.family_note(2, n, family='the contrasts below')
    lines += ['', note, '', '| contrast | seeds | estimate (95% CI), p (Holm) |', '|---|---|---|']
    for name, est, p, flip in contrasts(rows):
        lines.append(f'| {name} | {est.n} | {summary.diff_cell(est, p, flip_holm=flip)} |')
    return '\n'.join(lines)


def t_test_power(effect: float, sd: float, alpha: float, n: int) -> float:
    """The power of a two-sided one-sample t-test at level `alpha` over `n` paired seeds whose
    per-seed values have mean `effect` and sd `sd` (noncentral t)."""
    from scipy import stats as scipy_stats  # ~1 s to import: only for power analyses

    df, nc = n - 1, effect / sd * math.sqrt(n)
    t = scipy_stats.t.ppf(1 - alpha / 2, df)
    # P(T > t) + P(T < -t), the second as P(T' > t) for T' with noncentrality -nc: scipy's
    # lower-tail cdf returns nan for some large nc where this is finite
    return float(scipy_stats.nct.sf(t, df, nc) + scipy_stats.nct.sf(t, df, -nc))


def seeds_needed(effect: float, sd: float, alpha: float, power: float = 0.8) -> int:
    """The fewest paired seeds at which that t-test reaches `power` (`t_test_power`)."""
    for n in range(3, 1000):
        if t_test_power(effect, sd, alpha, n) >= power:
            return n
    raise ValueError(f'power {power} needs over 1,000 seeds (effect {effect}, sd {sd})')


def sd_upper_bound(sd: float, n: int, confidence: float = 0.9) -> float:
    """The one-sided `confidence` upper bound on a normal population's sd from the sample sd
    `sd` of `n` values: sd·sqrt((n - 1) / q), q the (1 - confidence) quantile of chi-square
    with n - 1 degrees of freedom (a seed count sized with it is not undersized by a pilot sd
    that came out low)."""
    if n < 2:
        raise ValueError(f'an sd bound needs at least 2 values, got {n}')
    from scipy import stats as scipy_stats  # ~1 s to import: only for power analyses

    return sd * math.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - confidence, n - 1))


def gap_change(
    before: Mapping[tuple[str, int], float | str],
    after: Mapping[tuple[str, int], float | str],
    a: str,
    b: str,
    labels: tuple[str, str],
) -> list[str]:
    """Lines describing a - b under two settings ({(arm, seed): value} each, e.g. two learning
    rates) over the seeds both hold: the gap under each, its change (after - before) paired by
    seed with a 95% t-interval, and each arm's means. A description, not a test. Raises a
    one-line ValueError when no seed has both arms under both settings."""
    seeds = sorted(
        s
        for arm, s in after
        if arm == a and all((x, s) in v for x in (a, b) for v in (before, after))
    )
    if not seeds:
        raise ValueError(f'{a} and {b} share no seed at both {labels[0]} and {labels[1]}')
    gap = [{s: float(v[a, s]) - float(v[b, s]) for s in seeds} for v in (before, after)]
    change = stats.paired_difference(gap[1], gap[0])
    span = f'seeds {seeds[0]}-{seeds[-1]}'
    lines = [
        f'{span}: {a} - {b} {stats.mean(list(gap[0].values())):+.4f} at {labels[0]}, '
        f'{stats.mean(list(gap[1].values())):+.4f} at {labels[1]}; change {change.mean:+.4f} '
        f'[{change.lo:+.4f}, {change.hi:+.4f}]'
    ]
    for arm in (a, b):
        means = [stats.mean([float(v[arm, s]) for s in seeds]) for v in (before, after)]
        lines.append(f'{span}: {arm} {means[0]:.4f} at {labels[0]}, {means[1]:.4f} at {labels[1]}')
    return lines
