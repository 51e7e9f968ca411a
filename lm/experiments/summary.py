"""The one summary path of every experiment (sweeps and the uptraining ablation): a value per
run, grouped by arm and seed; per arm its mean, sample std (ddof 1) and 95% t-interval over seeds;
between arms the paired difference over the seeds both ran (same seed = same initialisation and
data order) with its paired t-test p-value, Holm-corrected over every comparison the summary
reports (its family, of m comparisons) and resolved when the adjusted p is below 0.05
(`lm.experiments.stats`). Per-seed values are written as CSV (`seed_rows`) beside each table.
"""

from __future__ import annotations

import csv
import dataclasses
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


def sign_flips(pairs: list[tuple[Values, Values]]) -> list[float]:
    """The exact sign-flip p of each (a, b) of one family (`stats.paired_sign_flip_p`),
    Holm-adjusted over the same family as the t-test's."""
    return stats.holm([stats.paired_sign_flip_p(a, b) for a, b in pairs])


def _digits(value: float, digits: int) -> int:
    """`digits`, or more where `value` would show fewer than two significant figures (two then:
    0.000068, not 0.0001)."""
    if value == 0 or not math.isfinite(value) or abs(value) >= 10.0 ** (1 - digits):
        return digits
    return 1 - math.floor(math.log10(abs(value)))


def diff_cell(
    diff: stats.Estimate, p_holm: float, digits: int = 4, flip_holm: float | None = None
) -> str:
    """'+0.0833 [0.0116, 0.1550] p=0.012 ✓ (sign-flip 0.25)': a paired difference a − b with its
    95% interval and Holm-adjusted t-test p, ✓ = resolved after the correction, and where given
    the Holm-adjusted exact sign-flip p beside it. A difference that would show fewer than two
    significant figures gets two."""
    digits = _digits(diff.mean, digits)
    p = '' if math.isnan(p_holm) else f' p={p_holm:.3g}'
    resolved = ' ✓' if holm_resolved(p_holm) else ''
    flip = '' if flip_holm is None or math.isnan(flip_holm) else f' (sign-flip {flip_holm:.3g})'
    return f'{diff.mean:+.{digits}f} {diff.interval(digits)}{p}{resolved}{flip}'


def comparisons(m: int) -> str:
    """'1 comparison', '3 comparisons'."""
    return f'{m} comparison' + ('' if m == 1 else 's')


RESOLVED_NOTE = '✓ = resolved (corrected p < 0.05).'  # the family note's key to ✓


def family_note(
    m: int, seeds: int | None = None, test: str = 'paired t-test', family: str = 'this summary'
) -> str:
    """The sentence every summary states its correction with (over the comparisons of
    `family`); with `seeds` (the fewest paired seeds of a comparison in the family) also the
    sign-flip test's floor at that n."""
    if m == 0:
        return f'p: {test}; none here: a paired test needs two or more seeds of both arms.'
    note = f'p: {test}, Holm-corrected over the {comparisons(m)} of {family}; {RESOLVED_NOTE}'
    if seeds is None or seeds < 1:
        return note
    floor = stats.sign_flip_floor(seeds)
    if floor >= 0.05:
        can = 'above 0.05: no comparison here can pass it'
    elif floor * m >= 0.05:
        can = f'and Holm over {m} makes it at least {floor * m:.3g}: no comparison here can pass it'
    else:
        can = f'{floor * m:.3g} after Holm over {m}, below 0.05: it can pass'
    if seeds <= stats.EXACT_SIGN_FLIP_N:
        how = 'the exact sign-flip (permutation) test of the same paired differences'
        smallest = f'2/2^{seeds} = {floor:.3g}'
    else:
        draws = stats.SIGN_FLIP_DRAWS.bit_length() - 1
        how = (
            f'the sign-flip (permutation) test of the same paired differences, over 2^{draws} '
            'seeded random sign patterns'
        )
        smallest = f'1/(2^{draws} + 1) = {floor:.3g}'
    return (
        f'{note} Sign-flip: {how}, Holm-corrected alike; at {seeds} paired seeds its smallest p '
        f'is {smallest}, {can}.'
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
    its p and Holm-adjusted p over these pairs (the comparisons counted), the exact sign-flip
    p Holm-adjusted alike, whether the t-test resolves it and the ordering."""
    names = list(values)
    ab = pairs(names) if pairs else [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    results = family([(values[a], values[b]) for a, b in ab])
    flips = sign_flips([(values[a], values[b]) for a, b in ab])
    rows, m = [], stats.family_size([p for _, p, _ in results])
    for (a, b), (d, p, p_holm), flip in zip(ab, results, flips, strict=True):
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
                'p_sign_flip_holm': flip,
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


# Recall accuracy at which a run counts as having left the no-recall plateau (MQAR: the plateau
# sits near 40%, runs that leave it end at 89-99%; any threshold between gives the same counts
# on the committed runs); a CSV with the RECALL column has these counts as a metric too
LEARNED = 0.8
RECALL = 'eval_recall_accuracy'


@dataclasses.dataclass(frozen=True)
class Test:
    """One comparison of a question's family: a paired t-test of a value column (`diff` set) or
    Fisher's exact test of the runs that learned (metric 'learned', `diff` None)."""

    metric: str
    a: str
    b: str
    diff: stats.Estimate | None
    p: float
    p_holm: float
    flip_holm: float  # nan for a Fisher test


def question(
    rows: list[dict], pairs: PairPicker | None = None
) -> tuple[dict[str, dict[str, Values]], list[Test]]:
    """A CSV's values ({column: {arm: {seed: value}}}) and its ONE Holm family: the paired
    t-tests of every value column over the arm pairs (every two, or those `pairs` picks) and,
    where the CSV has the RECALL column and every pair is compared, Fisher's exact test of the
    runs that reached LEARNED: a question's claim may use any of its metrics, so the correction
    counts them all. The sign-flip p's are Holm-corrected over the t-tests alike."""
    arm = 'arm' if 'arm' in rows[0] else 'point'
    columns = [k for k in rows[0] if k not in (arm, 'seed')]
    values: dict[str, dict[str, dict[int, float]]] = {c: {} for c in columns}
    for r in rows:
        for c in columns:
            values[c].setdefault(r[arm], {})[int(r['seed'])] = float(r[c])
    names = list(values[columns[0]])
    ab = pairs(names) if pairs else [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    keys = [(c, a, b) for c in columns for a, b in ab]
    diffs = [stats.paired_difference(values[c][a], values[c][b]) for c, a, b in keys]
    p = [stats.p_value(d) for d in diffs]
    flips = [stats.paired_sign_flip_p(values[c][a], values[c][b]) for c, a, b in keys]
    if RECALL in columns and pairs is None:
        hits = {n: [v >= LEARNED for v in values[RECALL][n].values()] for n in names}
        for a, b in ab:
            keys.append(('learned', a, b))
            diffs.append(None)
            p.append(stats.count_p_value(sum(hits[a]), len(hits[a]), sum(hits[b]), len(hits[b])))
            flips.append(math.nan)
    tests = zip(keys, diffs, p, stats.holm(p), stats.holm(flips), strict=True)
    return values, [Test(*k, d, raw, adj, f) for k, d, raw, adj, f in tests]


def question_note(tests: list[Test]) -> str:
    """`family_note` for a question's family, naming what it holds."""
    metrics = list(dict.fromkeys(t.metric for t in tests))
    seeds = min((t.diff.n for t in tests if t.diff is not None and t.diff.n > 1), default=None)
    test = 'paired t-test'
    if 'learned' in metrics:
        test += " of a value, Fisher's exact test of the runs that learned"
    note = family_note(stats.family_size([t.p for t in tests]), seeds, test)
    if len(metrics) > 1:
        held = ', '.join('runs that learned' if m == 'learned' else m for m in metrics)
        note += f' One family over every metric of the question: {held}.'
    return note


def seeds_table(rows: list[dict], pairs: PairPicker | None = None) -> str:
    """Per arm its estimate over seeds; between arms the paired differences (every two arms, or
    those `pairs` picks), Holm-corrected as one family over every metric of the CSV
    (`question`). The arm is the 'arm' column, else 'point' (a sweep's summary_seeds.csv);
    each further column but 'seed' is a value with its own table."""
    values, tests = question(rows, pairs)
    note, tables = question_note(tests), []
    for c, by_arm in values.items():
        lines = [f'| arm | {c} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|']
        lines += [f'| {name} | {cell(v)} | {len(v)} |' for name, v in by_arm.items()]
        lines += ['', note, '']
        lines += ['| a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|']
        for t in tests:
            if t.metric == c:
                order = stats.ordering(t.a, t.b, t.diff, holm_resolved(t.p_holm))
                cell_ = diff_cell(t.diff, t.p_holm, flip_holm=t.flip_holm)
                lines.append(f'| {t.a} | {t.b} | {cell_} | {order} |')
        tables.append('\n'.join(lines))
    if len(values) == 1:
        return tables[0]
    return '\n\n'.join(f'{c}:\n\n{t}' for c, t in zip(values, tables, strict=True))


def within_table(rows: list[dict]) -> str:
    """`seeds_table` comparing only the arms of one group (arms named '<group>/<arm>', e.g.
    'mqa/width' and 'mqa/params'), Holm over those pairs."""
    return seeds_table(rows, within_groups)
