"""The capacity tables of a recall sweep over KV state and pairs (the 'capacity' kind of
`lm.experiments.tables`), from a per-seed CSV with columns point, kv_dims, kv_bytes_per_token,
pairs, seed, eval_recall_accuracy:

- the grid: per pairs count (rows) and KV arm (columns) the mean held-out accuracy over seeds,
  its 95% t-interval, the lowest seed's and how many seeds reached FITS;
- question 1, KV state: at each pairs count, each smaller KV arm against the largest;
- question 2, pairs: at each KV arm, each larger pairs count against the smallest.

Each question is one family: paired t-tests (same seed), Holm-corrected over the family's
comparisons, with the exact sign-flip p of the same differences beside each (`sign_flip_p`).
"""

from __future__ import annotations

import itertools
import math

from lm.experiments import stats, summary

FITS = 0.9  # held-out accuracy at which a seed counts as recalling the cell's pairs


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided sign-flip (permutation) p of paired differences: the share of the 2^n
    sign patterns whose |mean| is at least the observed one. Its smallest value is 2^(1 - n)."""
    observed = abs(math.fsum(diffs)) - 1e-12
    hits = sum(
        abs(math.fsum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(diffs))
    )
    return hits / 2 ** len(diffs)


def _cells(rows: list[dict]) -> tuple[dict, list[int], list[tuple[int, int]]]:
    """({(pairs, kv_dims): {seed: accuracy}}, pairs counts, KV arms as (dims, bytes)), the
    arms from the largest down."""
    cells: dict[tuple[int, int], dict[int, float]] = {}
    arms = {}
    for r in rows:
        key = (int(r['pairs']), int(r['kv_dims']))
        cells.setdefault(key, {})[int(r['seed'])] = float(r['eval_recall_accuracy'])
        arms[int(r['kv_dims'])] = int(r['kv_bytes_per_token'])
    pairs = sorted({p for p, _ in cells})
    return cells, pairs, sorted(arms.items(), reverse=True)


def _grid(cells: dict, pairs: list[int], arms: list[tuple[int, int]]) -> list[str]:
    lines = [
        '| pairs | ' + ' | '.join(f'KV {d} dims ({b} B/token)' for d, b in arms) + ' |',
        '|---|' + '---|' * len(arms),
    ]
    for p in pairs:
        out = []
        for d, _ in arms:
            seeds = cells.get((p, d), {})
            if not seeds:
                out.append('')
                continue
            e = stats.estimate(list(seeds.values()))
            fit = sum(v >= FITS for v in seeds.values())
            out.append(
                f'{100 * e.mean:.1f}% [{100 * e.lo:.1f}, {100 * e.hi:.1f}], '
                f'lowest {100 * min(seeds.values()):.1f}%, {fit}/{len(seeds)} ≥ {FITS:.0%}'
            )
        lines.append(f'| {p} | ' + ' | '.join(out) + ' |')
    return lines


def _family(title: str, tests: list[tuple[str, str, dict, dict]]) -> list[str]:
    """A question's comparisons (label a, label b, {seed: a}, {seed: b}): a − b, t-test p,
    Holm over the family, sign-flip p."""
    if not tests:
        return [f'{title}: no comparison (a cell it needs was not run).']
    diffs = [stats.paired_difference(a, b) for _, _, a, b in tests]
    p = [stats.p_value(d) for d in diffs]
    flips = [sign_flip_p([a[s] - b[s] for s in sorted(set(a) & set(b))]) for *_, a, b in tests]
    lines = [
        f'{title} ({len(tests)} comparison{"s" if len(tests) > 1 else ""}, Holm over them):',
        '',
        '| a | b | a − b (points) | 95% CI | p (t) | p (Holm) | p (sign-flip) | resolved |',
        '|---|---|---|---|---|---|---|---|',
    ]
    holm = stats.holm(p)
    for (na, nb, _, _), d, raw, adj, flip in zip(tests, diffs, p, holm, flips, strict=True):
        lines.append(
            f'| {na} | {nb} | {100 * d.mean:+.1f} | [{100 * d.lo:+.1f}, {100 * d.hi:+.1f}] | '
            f'{raw:.3g} | {adj:.3g} | {flip:.3g} | '
            f'{"yes" if summary.holm_resolved(adj) else "no"} |'
        )
    return lines


def capacity_table(rows: list[dict]) -> str:
    """The grid, then the KV-state family and the pairs family (module docstring)."""
    cells, pairs, arms = _cells(rows)
    top = arms[0][0]
    kv_tests = [
        (f'KV {d}, {p} pairs', f'KV {top}, {p} pairs', cells[(p, d)], cells[(p, top)])
        for p in pairs
        for d, _ in arms[1:]
        if (p, d) in cells and (p, top) in cells
    ]
    pair_tests = [
        (f'{p} pairs, KV {d}', f'{pairs[0]} pairs, KV {d}', cells[(p, d)], cells[(pairs[0], d)])
        for d, _ in arms
        for p in pairs[1:]
        if (p, d) in cells and (pairs[0], d) in cells
    ]
    n = min(len(s) for s in cells.values())
    lines = _grid(cells, pairs, arms) + ['']
    lines += _family('Question 1, KV state: each arm against the largest at equal pairs', kv_tests)
    lines += ['']
    lines += _family('Question 2, pairs: each count against the fewest at equal KV', pair_tests)
    lines += [
        '',
        f'With {n} seeds the sign-flip p is at least {2.0 ** (1 - n):.3g}: times a family of '
        f'{max(len(kv_tests), len(pair_tests))} it '
        f'{"can" if 2.0 ** (1 - n) * max(len(kv_tests), len(pair_tests)) < 0.05 else "cannot"} '
        'pass Holm at 0.05 on its own.',
    ]
    return '\n'.join(lines)
