"""The capacity tables of a recall sweep over KV state and pairs (the 'capacity' kind of
`lm.experiments.tables`), from a per-seed CSV with columns point, kv_dims, kv_bytes_per_token,
pairs, seed, eval_recall_accuracy (and kv_heads, head_dim where arms of equal KV dims differ in
layout, e.g. 2 KV heads of 16 against one of 32):

- the grid: per pairs count (rows) and KV arm (columns) the mean held-out accuracy over seeds,
  its 95% t-interval, the lowest seed's and how many seeds reached FITS;
- question 1, KV state: at each pairs count, each smaller KV arm against the largest;
- question 2, pairs: at each KV arm, each larger pairs count against the smallest;
- head width, where two arms hold equal KV dims: the wider KV head against the narrower.

Each question is one family: paired t-tests (same seed), Holm-corrected over the family's
comparisons, with the exact sign-flip p of the same differences beside each (`sign_flip_p`).
"""

from __future__ import annotations

import itertools
import math

from lm.experiments import stats, summary

FITS = 0.9  # held-out accuracy at which a seed counts as recalling the cell's pairs
KV_FAMILY = 'each arm against the largest at equal pairs'
PAIRS_FAMILY = 'each count against the fewest at equal KV'
WIDTH_FAMILY = 'the wider KV head against the narrower'


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided sign-flip (permutation) p of paired differences: the share of the 2^n
    sign patterns whose |mean| is at least the observed one. Its smallest value is 2^(1 - n)."""
    observed = abs(math.fsum(diffs)) - 1e-12
    hits = sum(
        abs(math.fsum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(diffs))
    )
    return hits / 2 ** len(diffs)


def _arm(r: dict) -> tuple[int, str]:
    """A row's KV arm: (KV dims per token per layer, its label), e.g. (32, 'KV 2×16 = 32') where
    the CSV has kv_heads and head_dim columns, else (32, 'KV 32')."""
    d = int(r['kv_dims'])
    if r.get('kv_heads') and r.get('head_dim'):
        return d, f'KV {int(r["kv_heads"])}×{int(r["head_dim"])} = {d}'
    return d, f'KV {d}'


def _cells(rows: list[dict]) -> tuple[dict, list[int], list[tuple[tuple[int, str], int]]]:
    """({(pairs, arm): {seed: accuracy}}, pairs counts, KV arms as (arm, bytes per token)), the
    arms from the largest down (at equal dims, the wider head first)."""
    cells: dict[tuple[int, tuple[int, str]], dict[int, float]] = {}
    arms = {}
    for r in rows:
        key = (int(r['pairs']), _arm(r))
        cells.setdefault(key, {})[int(r['seed'])] = float(r['eval_recall_accuracy'])
        arms[_arm(r)] = (int(r['kv_bytes_per_token']), int(r.get('head_dim') or 0))
    pairs = sorted({p for p, _ in cells})
    order = sorted(arms, key=lambda a: (a[0], arms[a][1]), reverse=True)
    return cells, pairs, [(a, arms[a][0]) for a in order]


def _grid(cells: dict, pairs: list[int], arms: list[tuple[tuple[int, str], int]]) -> list[str]:
    lines = [
        '| pairs | ' + ' | '.join(f'{label} dims ({b} B/token)' for (_, label), b in arms) + ' |',
        '|---|' + '---|' * len(arms),
    ]
    for p in pairs:
        out = []
        for arm, _ in arms:
            seeds = cells.get((p, arm), {})
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


def _comparisons(cells: dict, pairs: list[int], arms: list) -> tuple[list, list, list]:
    """The comparisons (label a, label b, {seed: a}, {seed: b}) of the KV-state, pairs and
    head-width families over the cells a table holds."""
    top = arms[0][0]

    def at(p: int, arm: tuple[int, str]) -> str:
        return f'{arm[1]}, {p} pairs'

    kv_tests = [
        (at(p, arm), at(p, top), cells[(p, arm)], cells[(p, top)])
        for p in pairs
        for arm, _ in arms[1:]
        if (p, arm) in cells and (p, top) in cells
    ]
    pair_tests = [
        (
            f'{p} pairs, {arm[1]}',
            f'{pairs[0]} pairs, {arm[1]}',
            cells[(p, arm)],
            cells[(pairs[0], arm)],
        )
        for arm, _ in arms
        for p in pairs[1:]
        if (p, arm) in cells and (pairs[0], arm) in cells
    ]
    width_tests = [
        (at(p, wide), at(p, narrow), cells[(p, wide)], cells[(p, narrow)])
        for p in pairs
        for i, (wide, _) in enumerate(arms)
        for narrow, _ in arms[i + 1 :]
        if wide[0] == narrow[0] and (p, wide) in cells and (p, narrow) in cells
    ]
    return kv_tests, pair_tests, width_tests


def capacity_table(rows: list[dict]) -> str:
    """The grid, then the KV-state family, the pairs family and, where two arms hold equal KV
    dims in different layouts, the head-width family (module docstring); a family whose axis
    the table does not span (one pairs count, one arm) is left out, so one cell (a gate run
    alone) is its grid row only."""
    cells, pairs, arms = _cells(rows)
    lines = _grid(cells, pairs, arms)
    if len(cells) == 1:
        return '\n'.join(lines)
    kv_tests, pair_tests, width_tests = _comparisons(cells, pairs, arms)
    if len(arms) > 1:
        lines += ['', *_family(f'Question 1, KV state: {KV_FAMILY}', kv_tests)]
    if len(pairs) > 1:
        lines += ['', *_family(f'Question 2, pairs: {PAIRS_FAMILY}', pair_tests)]
    if width_tests:
        lines += ['', *_family(f'Head width at equal KV state: {WIDTH_FAMILY}', width_tests)]
    n = min(len(s) for s in cells.values())
    m = max(len(kv_tests), len(pair_tests), len(width_tests))
    lines += [
        '',
        f'With {n} seeds the sign-flip p is at least {2.0 ** (1 - n):.3g}: times a family of '
        f'{m} it {"can" if 2.0 ** (1 - n) * m < 0.05 else "cannot"} pass Holm at 0.05 on its own.',
    ]
    return '\n'.join(lines)
