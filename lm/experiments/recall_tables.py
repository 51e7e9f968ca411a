"""The recall studies' doc-table kinds (lm.experiments.tables): 'learned' and 'recall_pairs'
(the runs that left the no-recall plateau, Fisher's exact test on the counts), 'steps_to' (the
step each seed first reached an accuracy) and 'lr_screen' (a learning-rate screen by accuracy).
They read CSVs only: no training stack is imported.
"""

from __future__ import annotations

import math

from lm.experiments import lr_grid, stats, summary
from lm.experiments.runner import arm_and_seed

LEARNED = summary.LEARNED  # recall accuracy at which a run left the plateau


def _learned_counts(rows: list[dict]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per arm (learned, seeds): the runs whose recall accuracy (summary.RECALL) reached
    LEARNED, and the table of those counts with each rate's exact 95% interval."""
    arm, value = 'arm' if 'arm' in rows[0] else 'point', summary.RECALL
    hits: dict[str, list[bool]] = {}
    for r in rows:
        hits.setdefault(r[arm], []).append(float(r[value]) >= LEARNED)
    counts = {name: (sum(h), len(h)) for name, h in hits.items()}
    lines = [f'| arm | runs with {value} ≥ {LEARNED} | rate, 95% CI (exact) |', '|---|---|---|']
    for name, (k, n) in counts.items():
        lo, hi = stats.rate_interval(k, n)
        lines.append(f'| {name} | {k} of {n} | [{lo:.2f}, {hi:.2f}] |')
    return counts, lines


def _fisher_rows(counts: dict[str, tuple[int, int]], tests: list[summary.Test]) -> list[str]:
    """The Fisher tests' table: p, Holm-adjusted p and the ordering of each pair's counts."""
    lines = ['| a | b | p | p (Holm) | ordering |', '|---|---|---|---|---|']
    for t in tests:
        (k_a, n_a), (k_b, n_b) = counts[t.a], counts[t.b]
        if summary.holm_resolved(t.p_holm):
            order = f'{t.a} > {t.b}' if k_a / n_a > k_b / n_b else f'{t.b} > {t.a}'
        else:
            order = f'{t.a} ~ {t.b} (unresolved)'
        lines.append(f'| {t.a} | {t.b} | {t.p:.3g} | {t.p_holm:.3g} | {order} |')
    return lines


def learned_table(rows: list[dict]) -> str:
    """Per arm the seeds whose recall accuracy (summary.RECALL) reached LEARNED; between arms
    Fisher's exact test on the counts, Holm-corrected in the CSV's one family with the t-tests
    of its values (`summary.question`; the 'seeds' table of the same CSV shows those)."""
    counts, lines = _learned_counts(rows)
    _, tests = summary.question(rows)
    lines += ['', summary.question_note(tests), '']
    lines += _fisher_rows(counts, [t for t in tests if t.metric == 'learned'])
    return '\n'.join(lines)


def recall_pairs_table(rows: list[dict]) -> str:
    """A recall CSV tested as a statement that named two families, each Holm-corrected over the
    arm pairs on its own (recall's ten seeds per variant): the runs that learned (counts,
    Fisher's exact test) and the per-seed recall accuracy (paired t-test, the exact sign-flip p
    beside it). The loss is not tested. The 'learned' and 'seeds' tables of the same CSV give
    the stricter family: every pair of counts, accuracy and loss together."""
    counts, lines = _learned_counts(rows)
    lines = ['runs that learned:', '', *lines]
    arm = 'arm' if 'arm' in rows[0] else 'point'
    acc: dict[str, dict[int, float]] = {}
    for r in rows:
        acc.setdefault(r[arm], {})[int(r['seed'])] = float(r[summary.RECALL])
    names = list(acc)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    fisher = [stats.count_p_value(*counts[a], *counts[b]) for a, b in pairs]
    tests = [
        summary.Test('learned', a, b, None, p, adj, math.nan)
        for (a, b), p, adj in zip(pairs, fisher, stats.holm(fisher), strict=True)
    ]
    lines += [
        '',
        summary.family_note(
            len(pairs), test="Fisher's exact test of the runs that learned", family='this family'
        ),
        '',
    ]
    lines += _fisher_rows(counts, tests)
    values = [(acc[a], acc[b]) for a, b in pairs]
    family, flips = summary.family(values), summary.sign_flips(values)
    seeds = min((d.n for d, _, _ in family if d.n > 1), default=None)
    lines += ['', f'{summary.RECALL} per seed:', '']
    lines += [f'| arm | {summary.RECALL} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|']
    lines += [f'| {name} | {summary.cell(v)} | {len(v)} |' for name, v in acc.items()]
    size = stats.family_size([p for _, p, _ in family])
    lines += ['', summary.family_note(size, seeds, family='this family'), '']
    lines += ['| a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|']
    for (a, b), (d, _, adj), flip in zip(pairs, family, flips, strict=True):
        order = stats.ordering(a, b, d, summary.holm_resolved(adj))
        lines.append(f'| {a} | {b} | {summary.diff_cell(d, adj, flip_holm=flip)} | {order} |')
    return '\n'.join(lines)


# Accuracy a recall run must reach to count as calibrated (docs/studies/recall/README.md): the step
# it first does measures how fast a variant learns the task
REACHED = 0.9


def steps_to_table(rows: list[dict]) -> str:
    """Per arm the step at which each seed's first metric first reached REACHED (the curve's
    resolution is its eval interval); between arms the paired differences of those steps."""
    metric = rows[0]['metric']
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for r in rows:
        if r['metric'] == metric:
            arm, seed = arm_and_seed(r['run'])
            point = (int(r['step']), float(r['value']))
            curves.setdefault(arm, {}).setdefault(seed, []).append(point)
    steps: dict[str, dict[int, float]] = {arm: {} for arm in curves}  # {arm: {seed: step}}
    missed: dict[str, int] = dict.fromkeys(curves, 0)  # {arm: runs that never reached}
    for arm, by_seed in curves.items():
        for seed, curve in by_seed.items():
            reached = [step for step, v in sorted(curve) if v >= REACHED]
            if reached:
                steps[arm][seed] = float(reached[0])
            else:
                missed[arm] += 1
    lines = [
        f'| arm | first step with {metric} ≥ {REACHED} (mean ± std) | 95% CI | seeds reached '
        '| not reached |',
        '|---|---|---|---|---|',
    ]
    for arm, by_seed in steps.items():
        est = stats.estimate(list(by_seed.values())) if by_seed else None
        text = (
            f'{summary.mean_std(est.mean, est.std, est.n, 0)} | {est.interval(0)}'
            if est
            else 'n/a | n/a'
        )
        lines.append(f'| {arm} | {text} | {len(by_seed)} | {missed[arm]} |')
    arms = list(curves)
    pairs = [(a, b) for i, a in enumerate(arms) for b in arms[i + 1 :]]
    tested = [(a, b) for a, b in pairs if not missed[a] and not missed[b]]
    tests = [(steps[a], steps[b]) for a, b in tested]
    family = summary.family(tests)
    flips = summary.sign_flips(tests)
    results = dict(zip(tested, zip(family, flips, strict=True), strict=True))
    seeds = min((d.n for d, _, _ in family if d.n > 1), default=None)
    lines += ['', summary.family_note(len(tested), seeds), '']
    lines += ['| a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|']
    for a, b in pairs:
        if (a, b) not in results:
            n = missed[a] + missed[b]
            lines.append(f'| {a} | {b} | not tested | {n} run(s) never reached {REACHED} |')
            continue
        (d, _, p_holm), flip = results[(a, b)]
        order = stats.ordering(a, b, d, summary.holm_resolved(p_holm))
        cell = summary.diff_cell(d, p_holm, digits=0, flip_holm=flip)
        lines.append(f'| {a} | {b} | {cell} | {order} |')
    return '\n'.join(lines)


def lr_screen_table(rows: list[dict]) -> str:
    """A recall task's learning-rate screen: per arm and rate the mean accuracy and answer loss
    over the seeds, and the rate `lr_grid.choose_by_accuracy` picks (bold)."""
    arms, choices = lr_grid.screen_grid(rows), lr_grid.screen_choices(rows)
    lrs = sorted({lr for grid in arms.values() for lr in grid}, reverse=True)
    lines = [
        f'| arm | {" | ".join(f"lr {lr:g}: accuracy, loss" for lr in lrs)} | chosen lr |',
        '|---|' + '---|' * (len(lrs) + 1),
    ]
    for arm, grid in arms.items():
        chosen = choices[arm]
        cells = []
        for lr in lrs:
            a, lo = grid.get(lr, ({}, {}))
            text = (
                f'{100 * stats.mean(list(a.values())):.2f}%, {stats.mean(list(lo.values())):.4f}'
                if a
                else ''
            )
            cells.append(f'**{text}**' if lr == chosen else text)
        lines.append(f'| {arm} | {" | ".join(cells)} | {chosen:g} |')
    return '\n'.join(lines)
