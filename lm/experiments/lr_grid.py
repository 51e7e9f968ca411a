"""The learning-rate rule of an experiment with a grid of learning rates per arm: the rate is
chosen on the validation split and the arm is reported on the held-out split (lm.data.parts),
so the choice does not flatter the reported score.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

from lm.experiments import stats

Values = Mapping[int, float]  # {seed: loss} of one arm at one learning rate


def choose(by_lr: Mapping[float, Values]) -> float:
    """The learning rate with the lowest mean validation loss over seeds, among the rates run
    for every seed any rate was run for (a rate missing a seed is not compared); a non-finite
    mean (a diverged run) loses to any finite one; ties go to the smaller rate."""
    if not by_lr:
        raise ValueError('no learning rate to choose from')
    seeds = set().union(*(set(v) for v in by_lr.values()))
    complete = [lr for lr, values in by_lr.items() if set(values) == seeds]

    def rank(lr: float) -> tuple[float, float]:
        m = stats.mean(list(by_lr[lr].values()))
        return (m if math.isfinite(m) else math.inf, lr)

    return min(complete, key=rank)


def next_rate(
    lr: float, ran: Sequence[float], ladder: Sequence[float], grid: Sequence[float], past: int
) -> float | None:
    """The rate to train next when `lr`, chosen among the rates `ran`, is the largest or the
    smallest of them (the best may lie beyond): the next rung of `ladder` that way, while fewer
    than `past` rates run lie beyond that edge of `grid`; else None (an inner choice, or the
    extensions used up)."""
    rungs, ran = sorted(ladder), sorted(ran)
    if lr == ran[-1] and sum(r > max(grid) for r in ran) < past and lr < rungs[-1]:
        return rungs[rungs.index(lr) + 1]
    if lr == ran[0] and sum(r < min(grid) for r in ran) < past and lr > rungs[0]:
        return rungs[rungs.index(lr) - 1]
    return None


def choose_by_accuracy(
    accuracy: Mapping[float, Values], loss: Mapping[float, Values], tie: float = 0.005
) -> float:
    """The learning rate with the highest mean accuracy over seeds (a recall task's rule);
    rates within `tie` of the best are tied and go to the lower mean loss, then the higher
    rate. Every rate must have the same seeds, in both mappings."""
    if not accuracy:
        raise ValueError('no learning rate to choose from')
    seeds = {lr: set(v) for lr, v in accuracy.items()}
    first = next(iter(seeds.values()))
    for lr in accuracy:
        if seeds[lr] != first or set(loss.get(lr, {})) != first:
            raise ValueError(f'lr {lr:g}: seeds {sorted(seeds[lr])}, expected {sorted(first)}')
    acc = {lr: stats.mean(list(v.values())) for lr, v in accuracy.items()}
    best = max(acc.values())
    tied = [lr for lr, a in acc.items() if a >= best - tie]
    return min(tied, key=lambda lr: (stats.mean(list(loss[lr].values())), -lr))


def screen_grid(rows: list[dict]) -> dict[str, dict[float, tuple[dict, dict]]]:
    """{point: {lr: ({seed: accuracy}, {seed: loss})}} of a recall screen's rows (point, lr,
    seed, eval_loss, eval_recall_accuracy: docs/studies/recall/lr_screen_csv.py)."""
    grid: dict[str, dict[float, tuple[dict, dict]]] = {}
    for r in rows:
        acc, loss = grid.setdefault(r['point'], {}).setdefault(float(r['lr']), ({}, {}))
        acc[int(r['seed'])] = float(r['eval_recall_accuracy'])
        loss[int(r['seed'])] = float(r['eval_loss'])
    return grid


def screen_choices(rows: list[dict]) -> dict[str, float]:
    """{point: the rate `choose_by_accuracy` picks} of a recall screen's rows."""
    out = {}
    for point, g in screen_grid(rows).items():
        acc, loss = {lr: a for lr, (a, _) in g.items()}, {lr: lo for lr, (_, lo) in g.items()}
        try:
            out[point] = choose_by_accuracy(acc, loss)
        except ValueError as e:
            raise ValueError(f'{point}: {e}') from None
    return out


def stack(by_rate: Mapping[str, list[dict]], seeds: list[int]) -> list[dict]:
    """Per-seed rows (point, seed, values...) of one sweep per rate ({rate as written: rows}),
    cut to `seeds`, each with its 'lr' after 'point': a screen's rows."""
    return [
        {'point': r['point'], 'lr': lr, **{k: v for k, v in r.items() if k != 'point'}}
        for lr, rows in by_rate.items()
        for r in rows
        if int(r['seed']) in seeds
    ]


def check_seeds(rows: list[dict], seeds: list[int]) -> None:
    """Refuses a point and rate of `stack`'s rows that lacks one of `seeds`."""
    have: dict[tuple[str, str], set[int]] = {}
    for r in rows:
        have.setdefault((r['point'], r['lr']), set()).add(int(r['seed']))
    for (point, lr), got in have.items():
        if not set(seeds) <= got:
            raise ValueError(f'{point} at lr {lr}: seeds {sorted(got)} lack {seeds}')


def at_chosen_rates(rows: list[dict], screen: list[dict], seeds: list[int]) -> list[dict]:
    """`stack`'s rows of each point of `screen` at the rate `screen_choices` picks there, arm
    'POINT at lr LR' (a 'seeds' table of every variant at its own rate); refuses a point with
    no rows there, or missing one of `seeds` (other rates need not have them)."""
    out = []
    for point, lr in screen_choices(screen).items():
        kept = [r for r in rows if r['point'] == point and float(r['lr']) == lr]
        if not kept:
            raise ValueError(f'no rows of {point} at its chosen lr {lr:g}')
        check_seeds(kept, seeds)
        for r in kept:
            values = {k: v for k, v in r.items() if k not in ('point', 'lr')}
            out.append({'point': f'{point} at lr {r["lr"]}', **values})
    return out


def select(
    validation: Mapping[tuple, Values], report: Mapping[tuple, Values]
) -> tuple[dict[Hashable, dict[int, float]], dict[Hashable, float]]:
    """({arm: report values at its chosen rate}, {arm: chosen rate}) from values keyed
    (*arm, lr): the rate by `choose` on `validation`, the values from `report` (held-out)."""
    grids: dict[Hashable, dict[float, Values]] = {}
    for key, values in validation.items():
        grids.setdefault(tuple(key[:-1]), {})[key[-1]] = values
    chosen = {arm: choose(grid) for arm, grid in grids.items()}
    out = {arm: dict(report.get((*arm, lr), {})) for arm, lr in chosen.items()}
    return {arm: v for arm, v in out.items() if v}, chosen
