"""The uptraining ablation's tables (lm.experiments.ablation): each arm at the learning rate
chosen on the validation part (lm.experiments.lr_grid), reported on the held-out part, with
paired differences between arms (same seed = same source, initialisation and data order).
"""

from __future__ import annotations

import os

from lm.experiments import lr_grid, summary
from lm.experiments.ablation import SOURCE, Ablation, arms, kv_bytes
from lm.experiments.runner import Spec, read_result


def heldout_loss(result: dict) -> float:
    """A run's final loss on the held-out part (lm.data.parts)."""
    return result['heldout']['loss']


def report(specs: list[Spec], found: dict[str, dict]) -> tuple[dict, dict]:
    """({(label, method, alpha): {seed: held-out loss}}, {that arm: learning rate}): every arm
    at the rate with the lowest mean validation loss (`lr_grid.select`)."""
    validation = summary.by_arm(specs, found, summary.loss)
    return lr_grid.select(validation, summary.by_arm(specs, found, heldout_loss))


def _lr(chosen: dict, arm: tuple) -> str:
    return f'{chosen[arm]:g}' if arm in chosen else '—'


def tables(ab: Ablation, values: dict[tuple, dict[int, float]], chosen: dict) -> str:
    """The ablation table (with each arm's paired difference to from-scratch training of the
    same target at the same total budget where one was trained, the target's KV-cache bytes
    per token and the chosen learning rate) and the paired method comparisons; ✓ = resolved at
    95%. `values` and `chosen` as `report` gives them."""
    n, kv, methods = ab.steps, kv_bytes(ab), {k: list(m) for k, (_, m) in arms(ab).items()}
    src = (SOURCE, 'scratch', 0.0)
    lines = [
        f'Final loss on the held-out part over {ab.seeds} seeds (same seed = same MHA source, '
        'initialisation and data order), each arm at the learning rate with the lowest mean '
        'validation loss: mean ± sample std (ddof 1), 95% t-interval; Δ = paired difference '
        'over seeds with its 95% interval, ✓ = resolved (the interval excludes 0); KV cache: '
        'bytes per token over all layers in bfloat16.',
        '',
        '| model | conversion | α (uptraining steps) | total steps | held-out loss | 95% CI | '
        'Δ vs from scratch, same total steps | KV cache B/token | lr |',
        '|---|---|---|---|---|---|---|---|---|',
        f'| MHA (source) | — | — | {n} | {summary.cell(values[src])} | — | {kv[SOURCE]} | '
        f'{_lr(chosen, src)} |',
    ]
    for label, names in methods.items():
        for method in names:
            for alpha in ab.fractions:
                if (arm := (label, method, alpha)) not in values:
                    continue  # alpha = 0 under a second schedule: the same model, not repeated
                up = ab.up_steps(alpha)
                scratch = values.get((label, 'scratch', n + up))
                delta = summary.diff_cell(values[arm], scratch) if scratch else '— (not trained)'
                lines.append(
                    f'| {label} | {method} | {alpha:g} ({up}) | {n + up} | '
                    f'{summary.cell(values[arm])} | {delta} | {kv[label]} | '
                    f'{_lr(chosen, arm) if alpha else "—"} |'
                )
        for total in ab.totals():
            arm = (label, 'scratch', total)
            lines.append(
                f'| {label} | from scratch | — | {total} | {summary.cell(values[arm])} | — | '
                f'{kv[label]} | {_lr(chosen, arm)} |'
            )
    return '\n'.join(lines + _method_comparisons(ab, values, methods))


def _method_comparisons(ab: Ablation, values: dict, methods: dict[str, list[str]]) -> list[str]:
    """Table rows of the paired difference between every two conversions of a target (methods
    and schedules) at an alpha."""
    lines = []
    for label, names in methods.items():
        for alpha in ab.fractions:
            arms_at = {m: values[(label, m, alpha)] for m in names if (label, m, alpha) in values}
            for row in summary.all_pairs(arms_at):
                a, b = row['a'], row['b']
                diff = summary.diff_cell(arms_at[a], arms_at[b])
                lines.append(f'| {label} | {alpha:g} | {a} | {b} | {diff} | {row["ordering"]} |')
    header = [
        '',
        '| model | α | a | b | Δ held-out loss a − b (95% CI) | ordering |',
        '|---|---|---|---|---|---|',
    ]
    return header + lines if lines else []


def compare_table(
    ab: Ablation,
    specs: list[Spec],
    chosen: dict,
    values: dict[tuple, dict[int, float]],
    out_dir: str,
    other: str,
) -> str:
    """Paired differences (same seed = same source) between this out_dir's conversion arms and
    the same runs (same name: same learning rate) in `other`, an earlier out_dir, read from its
    cached results, on the held-out part; ✓ = resolved at 95%."""
    theirs: dict[tuple, dict[int, float]] = {}
    settings = None
    for spec in specs:
        arm = spec.arm[:3]
        if arm[1] == 'scratch' or chosen.get(arm) != spec.arm[3]:
            continue
        saved = read_result(os.path.join(other, spec.name))
        if saved is not None and 'heldout' in saved:
            theirs.setdefault(arm, {})[spec.seed] = heldout_loss(saved)
            settings = saved['fingerprint']
    rows = []
    for (label, method, alpha), ours in values.items():
        that = theirs.get((label, method, alpha), {})
        if that and set(that) >= set(ours):
            diff = summary.diff_cell(ours, that)
            rows.append(f'| {label} | {method} | {alpha:g} | {diff} | {len(ours)} |')
    now = ab.settings()
    changed = ', '.join(
        f'{k} {settings[k]} there' for k in now if settings and settings.get(k) != now[k]
    )
    return '\n'.join(
        [
            f'Paired difference over seeds on the held-out part, this run ({out_dir}) minus '
            f'{other} ({changed or "same settings"}); ✓ = resolved at 95% (the interval '
            'excludes 0).',
            '',
            '| model | conversion | α | Δ held-out loss this − that (95% CI) | seeds |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )
