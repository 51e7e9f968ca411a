"""The uptraining ablation's tables (lm.experiments.ablation): each arm at the learning rate
chosen on the validation part (lm.experiments.lr_grid), reported on the held-out part, with
paired differences between arms (same seed = same source, initialisation and data order).
"""

from __future__ import annotations

import os

from lm.data.checks import eval_text_settings
from lm.experiments import lr_grid, pareto, stats, summary
from lm.experiments.ablation import kv_bytes
from lm.experiments.ablation_arms import SOURCE, Ablation, arms
from lm.experiments.runner import Spec, read_result, workdir
from lm.train.identity import flat_config
from lm.train.stored import stored_config

PLOTTED = ('heldout/loss',)  # the Pareto figure's metric: the loss the tables report


def heldout_loss(result: dict) -> float:
    """A run's final loss on the held-out part (lm.data.parts)."""
    return result['heldout']['loss']


def report(specs: list[Spec], found: dict[str, dict]) -> tuple[dict, dict]:
    """({(label, method, alpha): {seed: held-out loss}}, {that arm: learning rate}): every arm
    at the rate with the lowest mean validation loss (`lr_grid.select`)."""
    validation = summary.by_arm(specs, found, summary.loss)
    return lr_grid.select(validation, summary.by_arm(specs, found, heldout_loss))


def chosen_runs(
    specs: list[Spec], found: dict[str, dict], chosen: dict, out_dir: str
) -> list[pareto.Run]:
    """The finished runs at their arm's chosen learning rate (`report`), the arm without its
    rate: the Pareto figure has one point per arm, as the tables have one row."""
    return [
        pareto.Run(s.arm[:-1], s.seed, found[s.name], workdir(out_dir, s))
        for s in specs
        if s.name in found and chosen.get(tuple(s.arm[:-1])) == s.arm[-1]
    ]


def lr_grid_rows(specs: list[Spec], found: dict[str, dict]) -> list[dict]:
    """Per-seed CSV rows (model, conversion, alpha_or_steps, lr, seed, validation and held-out
    loss) of every trained run but the source (given, not tuned); the untrained α = 0
    conversions have no rate. The table kind 'lr_grid' (lm.experiments.tables) shows each
    arm's choice from them."""
    rows = []
    for spec in specs:
        result = found.get(spec.name)
        label, method, at, lr = spec.arm
        if result is None or (method != 'scratch' or label == SOURCE) and at == 0:
            continue
        rows.append(
            {
                'model': label,
                'conversion': method,
                'alpha_or_steps': at,
                'lr': lr,
                'seed': spec.seed,
                'validation_loss': summary.loss(result),
                'heldout_loss': heldout_loss(result),
            }
        )
    return rows


def _lr(chosen: dict, arm: tuple) -> str:
    return f'{chosen[arm]:g}' if arm in chosen else '—'


def _family(ab: Ablation, values: dict, methods: dict[str, list[str]]) -> dict[tuple, tuple]:
    """Every comparison of the report, one family for Holm's correction: each conversion arm
    against from-scratch training of its target at the same total steps (where trained), and
    every two conversions (methods and schedules) of a target at an alpha, and (where MHA was
    trained from scratch at that total) each conversion arm and from-scratch target against it.
    {(arm a, arm b): (paired difference a − b, p, Holm-adjusted p, Holm-adjusted sign-flip p)}."""
    pairs = []
    for label, names in methods.items():
        for alpha in ab.fractions:
            scratch = (label, 'scratch', ab.steps + ab.up_steps(alpha))
            mha = (SOURCE, 'scratch', ab.steps + ab.up_steps(alpha))
            present = [(label, m, alpha) for m in names if (label, m, alpha) in values]
            pairs += [(arm, scratch) for arm in present if scratch in values]
            pairs += [(a, b) for i, a in enumerate(present) for b in present[i + 1 :]]
            if mha in values:
                pairs += [(arm, mha) for arm in present + [scratch] if arm in values]
    tests = [(values[a], values[b]) for a, b in pairs]
    done = summary.family(tests)
    flips = summary.sign_flips(tests)
    return {ab: (*d, f) for ab, d, f in zip(pairs, done, flips, strict=True)}


def tables(ab: Ablation, values: dict[tuple, dict[int, float]], chosen: dict) -> str:
    """The ablation table (with each arm's paired difference to from-scratch training of the
    same target at the same total budget where one was trained, the target's KV-cache bytes
    per token and the chosen learning rate) and the paired method comparisons, Holm-corrected
    as one family (`_family`). `values` and `chosen` as `report` gives them."""
    n, kv, methods = ab.steps, kv_bytes(ab), {k: list(m) for k, (_, m) in arms(ab).items()}
    src = (SOURCE, 'scratch', 0.0)
    pairs = _family(ab, values, methods)
    lines = [
        f'Final loss on the held-out part over {ab.seeds} seeds (same seed = same MHA source, '
        'initialisation and data order), each arm at the learning rate with the lowest mean '
        'validation loss: mean ± sample std (ddof 1), 95% t-interval; Δ = paired difference '
        'over seeds with its 95% interval; KV cache: bytes per token over all layers in '
        'bfloat16. ' + summary.family_note(len(pairs), ab.seeds),
        '',
        '| model | conversion | α (uptraining steps) | total steps | held-out loss | 95% CI | '
        'Δ vs from scratch, same total steps | KV cache B/token | lr |',
        '|---|---|---|---|---|---|---|---|---|',
        f'| MHA (source) | — | — | {n} | {summary.cell(values[src])} | — | {kv[SOURCE]} | '
        f'{_lr(chosen, src)} |',
    ]
    for total in ab.totals():
        if (arm := (SOURCE, 'scratch', total)) in values:
            lines.append(
                f'| MHA | from scratch | — | {total} | {summary.cell(values[arm])} | — | '
                f'{kv[SOURCE]} | {_lr(chosen, arm)} |'
            )
    for label, names in methods.items():
        for method in names:
            for alpha in ab.fractions:
                if (arm := (label, method, alpha)) not in values:
                    continue  # alpha = 0 under a second schedule: the same model, not repeated
                up = ab.up_steps(alpha)
                done = pairs.get((arm, (label, 'scratch', n + up)))
                delta = (
                    summary.diff_cell(done[0], done[2], flip_holm=done[3])
                    if done
                    else '— (not trained)'
                )
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
    return '\n'.join(lines + _method_comparisons(pairs))


def _name(arm: tuple) -> str:
    """A conversion arm's method, or a from-scratch arm's model and budget."""
    if arm[1] != 'scratch':
        return arm[1]
    return f'{arm[0]} from scratch ({arm[2]} steps)'


def _method_comparisons(pairs: dict[tuple, tuple]) -> list[str]:
    """Table rows of the paired difference between every two conversions of a target (methods
    and schedules) at an alpha, and of each arm against MHA from scratch, with its
    Holm-adjusted p."""
    lines = []
    for (a, b), (diff, _, p_holm, flip) in pairs.items():
        if b[1] != 'scratch' or b[0] == SOURCE:
            names = [_name(arm) for arm in (a, b)]
            ordering = stats.ordering(*names, diff, summary.holm_resolved(p_holm))
            cell = summary.diff_cell(diff, p_holm, flip_holm=flip)
            at = '—' if a[1] == 'scratch' else f'{a[2]:g}'
            lines.append(f'| {a[0]} | {at} | {names[0]} | {names[1]} | {cell} | {ordering} |')
    header = [
        '',
        '| model | α | a | b | Δ held-out loss a − b (95% CI), p (Holm) | ordering |',
        '|---|---|---|---|---|---|',
    ]
    return header + lines if lines else []


def check_comparable(specs: list[Spec], other: str) -> None:
    """Refuses, before any run, a --compare_with out_dir that holds the result of none of this
    ablation's conversion runs (by name): its table would be empty."""
    names = [s.name for s in specs if s.arm[1] != 'scratch']
    if not any(read_result(os.path.join(other, name)) for name in names):
        raise ValueError(
            f"--compare_with={other}: it holds no result of this ablation's conversion runs "
            f'({names[0]}, ...): give an earlier --out_dir of the same arms'
        )


def _other_text(specs: list[Spec], out_dir: str, other: str) -> list[str]:
    """The settings in which the first run of `specs` held by both out_dirs scores other text
    in `other` than here (`eval_text_settings`); [] when none differs."""
    for spec in specs:
        here, there = workdir(out_dir, spec), os.path.join(other, spec.name)
        if read_result(here) is not None and read_result(there) is not None:
            a, b = (eval_text_settings(flat_config(stored_config(d))) for d in (here, there))
            return sorted(k for k in a | b if a.get(k) != b.get(k))
    return []


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
    cached results, on the held-out part; Holm-corrected over the rows."""
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
    keys = [k for k, ours in values.items() if set(theirs.get(k, {})) >= set(ours) > set()]
    tests = [(values[k], theirs[k]) for k in keys]
    done = zip(keys, summary.family(tests), summary.sign_flips(tests), strict=True)
    rows = [
        f'| {label} | {method} | {alpha:g} | {summary.diff_cell(d, p_holm, flip_holm=f)} | {d.n} |'
        for (label, method, alpha), (d, _, p_holm), f in done
    ]
    if not rows:
        return (
            f'No paired difference with {other}: no conversion arm has held-out results for '
            'all of its seeds in both out_dirs.'
        )
    if differ := _other_text(specs, out_dir, other):
        return (
            f'No paired difference with {other}: its runs score other held-out text '
            f'({", ".join(differ)} differ), so their losses are not paired by seed.'
        )
    now = ab.settings()
    changed = ', '.join(
        f'{k} {settings[k]} there' for k in now if settings and settings.get(k) != now[k]
    )
    return '\n'.join(
        [
            f'Paired difference over seeds on the held-out part, this run ({out_dir}) minus '
            f'{other} ({changed or "same settings"}). {summary.family_note(len(rows))}',
            '',
            '| model | conversion | α | Δ held-out loss this − that (95% CI) | seeds |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )
