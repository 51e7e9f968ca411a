"""The uptraining ablation's doc-table kinds (lm.experiments.tables): 'ablation', 'targets' and
'lr_grid', made from an ablation's seeds.csv and lr_grid.csv (columns model, conversion,
alpha_or_steps, [lr,] seed, value...). They read CSVs only: no training stack is imported.
"""

from __future__ import annotations

from lm.experiments import lr_grid, stats, summary


def _ablation_arm(conversion: str, at: str) -> str:
    """An uptraining ablation's arm as its tables name it (at: α, or a baseline's steps)."""
    return f'from scratch, {at} steps' if conversion == 'scratch' else f'{conversion}, α = {at}'


def ablation_table(rows: list[dict], source: str = 'MHA') -> str:
    """Per target model its trained arms' estimates and Holm-corrected paired differences;
    a target's untrained conversions (α = 0) are left out unless it has no trained one (an
    ablation at α = 0 alone, compared with its from-scratch baselines). The source's own rows
    are left out, but MHA trained from scratch at a budget (`--mha_scratch`) joins every
    target's table and Holm family. `source`: the
    ablation's label of its MHA source (lm.experiments.ablation.SOURCE, not imported: this
    module reads CSVs without the training stack)."""
    value = list(rows[0])[-1]

    def untrained(r: dict) -> bool:
        return r['conversion'] != 'scratch' and float(r['alpha_or_steps']) == 0

    def mha(r: dict) -> bool:  # the source's model trained from scratch at a budget
        return r['model'] == source and r['conversion'] == 'scratch' and float(r['alpha_or_steps'])

    trained = {r['model'] for r in rows if r['conversion'] != 'scratch' and not untrained(r)}
    shared = [
        {
            'arm': f'MHA from scratch, {r["alpha_or_steps"]} steps',
            'seed': r['seed'],
            value: r[value],
        }
        for r in rows
        if mha(r)
    ]
    models: dict[str, list[dict]] = {}
    for r in rows:
        conversion, at = r['conversion'], r['alpha_or_steps']
        if r['model'] == source or (untrained(r) and r['model'] in trained):
            continue
        arm = _ablation_arm(conversion, at)
        models.setdefault(r['model'], []).append({'arm': arm, 'seed': r['seed'], value: r[value]})
    return '\n\n'.join(
        f'{model}:\n\n{summary.seeds_table(arms + shared)}' for model, arms in models.items()
    )


def targets_table(rows: list[dict], source: str = 'MHA') -> str:
    """Targets side by side in each arm they share; one Holm family over all arms."""
    value = list(rows[0])[-1]
    by_arm: dict[str, dict[str, dict[int, float]]] = {}
    for r in rows:
        if r['model'] != source:
            arm = _ablation_arm(r['conversion'], r['alpha_or_steps'])
            by_arm.setdefault(arm, {}).setdefault(r['model'], {})[int(r['seed'])] = float(r[value])
    shared = {arm: targets for arm, targets in by_arm.items() if len(targets) > 1}
    pairs = [
        (arm, a, b) for arm, t in shared.items() for i, a in enumerate(t) for b in list(t)[i + 1 :]
    ]
    lines = [f'| arm | target | {value} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|---|']
    lines += [
        f'| {arm} | {target} | {summary.cell(v)} | {len(v)} |'
        for arm, targets in shared.items()
        for target, v in targets.items()
    ]
    tests = [(shared[arm][a], shared[arm][b]) for arm, a, b in pairs]
    results, flips = summary.family(tests), summary.sign_flips(tests)
    seeds = min((d.n for d, _, _ in results if d.n > 1), default=None)
    lines += ['', summary.family_note(len(pairs), seeds), '']
    lines += ['| arm | a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|---|']
    for (arm, a, b), (d, _, p_holm), flip in zip(pairs, results, flips, strict=True):
        order = stats.ordering(a, b, d, summary.holm_resolved(p_holm))
        cell = summary.diff_cell(d, p_holm, flip_holm=flip)
        lines.append(f'| {arm} | {a} | {b} | {cell} | {order} |')
    return '\n'.join(lines)


def lr_grid_table(rows: list[dict]) -> str:
    """An experiment's learning-rate grid (columns model, conversion, alpha_or_steps, lr, seed,
    validation_loss, heldout_loss): per arm its mean ± std validation loss at each rate, the
    rate `lr_grid.choose` picks (bold; 'edge' where it is the grid's smallest or largest) and
    the arm's held-out loss there."""
    arms: dict[tuple, dict[float, dict[int, tuple[float, float]]]] = {}
    for r in rows:
        arm = (r['model'], r['conversion'], r['alpha_or_steps'])
        by_seed = arms.setdefault(arm, {}).setdefault(float(r['lr']), {})
        by_seed[int(r['seed'])] = (float(r['validation_loss']), float(r['heldout_loss']))
    lrs = sorted({lr for grid in arms.values() for lr in grid})
    lines = [
        f'| model | arm | {" | ".join(f"validation, lr {lr:g}" for lr in lrs)} | chosen lr | '
        'held-out there |',
        '|---|---|' + '---|' * (len(lrs) + 2),
    ]
    for (model, conversion, at), grid in arms.items():
        chosen = lr_grid.choose({lr: {s: v for s, (v, _) in g.items()} for lr, g in grid.items()})
        cells = []
        for lr in lrs:
            text = summary.spread({s: v for s, (v, _) in grid[lr].items()}) if lr in grid else ''
            cells.append(f'**{text}**' if lr == chosen else text)
        edge = ' (edge)' if chosen in (min(grid), max(grid)) and len(grid) > 2 else ''
        arm = _ablation_arm(conversion, at)
        held = summary.spread({s: h for s, (_, h) in grid[chosen].items()})
        lines.append(f'| {model} | {arm} | {" | ".join(cells)} | {chosen:g}{edge} | {held} |')
    return '\n'.join(lines)
