r"""The per-halving-slope-at-own-rates question's rate choices, power analysis and per-seed CSV
(slope_rate_statement.md).

  python docs/studies/kv_contrast/slope_rate_csv.py --power_only --grid_sweep=runs/slope_rate_grid
  python docs/studies/kv_contrast/slope_rate_csv.py --grid_sweep=runs/slope_rate_grid \
      --tested_sweep=runs/slope_rate_tested

GQA-4's and GQA-2's rates are chosen on seeds 0-4 by lm.experiments.lr_grid (choose, then
next_rate), reading at 1e-3 this study's runs (results/kv_contrast_seeds.csv) and at the other
rates the grid's sweep (`--grid_sweep`, whose losses it copies to
results/slope_rate_pilot_seeds.csv; without it, that copy). MHA's and MQA's rates are 2e-3, the
same rule's choices in the MLA study and the MQA-rate question. `--power_only` prints the choices,
the pilot's power analysis and, last, either `train POINTS` (an edge choice: the grid's next
rung, seeds 0-4) or `tested POINTS N` (the tested sweep's points and seeds per arm). Without it,
it writes results/slope_rate_seeds.csv (arm, x = halvings of the KV heads, seed, eval_loss) from
`--tested_sweep` (seeds 44 onwards), for the page's 'trend' table.
"""

import csv
import os

import numpy as np
from absl import flags
from rate_rows import HERE, choose_rate, mha, pilot_losses, read
from slope_rate_sweep import ARMS, LADDER, point_name

from lm.cli import run_app
from lm.experiments import (
    per_seed_contrasts,
    sd_upper_bound,
    seeds_needed,
    stats,
    t_test_power,
    trend_contrasts,
    write_csv,
)

GRID = (5e-4, 1e-3, 2e-3, 4e-3)  # the rates GQA-4 and GQA-2 run; LADDER holds the extensions
RECIPE = 1e-3  # the recipe's rate: that of this study's runs
PAST = 2  # at most this many rates past each edge of GRID
CHOSEN = {'mha': 2e-3, 'mqa': 2e-3}  # the same rule's choices, made before (see the docstring)
SMALLEST = 0.01 / 3  # nats per halving: 0.01 nats over the three halvings
ALPHA = 0.025  # Holm's first step over the two contrasts
FLOOR, CAP = 5, 25  # seeds per arm: at least, and at most (this session's CPU time)
PILOT = range(5)
FIRST = 44  # the first tested seed: new to every arm at every rate
KV = os.path.join(HERE, 'results', 'kv_contrast_seeds.csv')
MQA_GRID = os.path.join(HERE, 'results', 'mqa_rate_pilot_seeds.csv')

_GRID = flags.DEFINE_string('grid_sweep', 'runs/slope_rate_grid', "GQA's rate grid (seeds 0-4).")
_TESTED = flags.DEFINE_string('tested_sweep', 'runs/slope_rate_tested', 'The tested seeds.')
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The choices and power analysis only.')


def choices(losses: dict[tuple[str, int], str]) -> tuple[dict[str, float], list[str]]:
    """({arm: rate}, the points to train first): GQA-4's and GQA-2's rates by the rule over every
    rate run on seeds 0-4; MHA's and MQA's as chosen before."""
    rates, train = dict(CHOSEN), []
    for arm in ('gqa4', 'gqa2'):
        by_lr = {
            lr: {s: float(losses[point_name(arm, lr), s]) for s in PILOT}
            for lr in LADDER
            if all((point_name(arm, lr), s) in losses for s in PILOT)
        }
        rates[arm], nxt = choose_rate(arm, by_lr, GRID, list(LADDER), PAST)
        if nxt:
            train.append(point_name(arm, nxt))
    return rates, train


def trend_rows(found: dict[tuple[str, int], str], seeds: range) -> list[dict]:
    """Rows (arm, x, seed, eval_loss) of the four arms at `seeds`, or one line naming the runs
    missing."""
    missing = [f'{a} seed {s}' for a in ARMS for s in seeds if (a, s) not in found]
    if missing:
        raise SystemExit(f'incomplete: no run for {", ".join(missing)}')
    return [
        {'arm': a, 'x': x, 'seed': s, 'eval_loss': found[a, s]}
        for x, a in enumerate(ARMS)
        for s in seeds
    ]


def seeds_per_arm(rows: list[dict]) -> int:
    """The statement's rule: the slope sized for max(2/3 |d|, SMALLEST) at the 90% upper bound
    on the pilot's per-seed slope sd, 80% power at ALPHA; at least FLOOR, at most CAP. Prints the
    power at N, and MQA - MHA's beside it (not sized)."""
    _, slopes, ends = per_seed_contrasts(rows)
    n = None
    for name, values, smallest in (('slope', slopes, SMALLEST), ('mqa - mha', ends, 0.01)):
        v = np.array(list(values.values()))
        d, s = v.mean(), v.std(ddof=1)
        effect, sd = max(abs(d) * 2 / 3, smallest), sd_upper_bound(s, len(v))
        need = seeds_needed(effect, sd, ALPHA)
        n = n or min(max(need, FLOOR), CAP)
        print(
            f'{name}: pilot {d:+.4f}, sd {s:.4f} (90% bound {sd:.4f}); sized for {effect:.4f}: '
            f'{need} seeds; at {n} seeds power {t_test_power(effect, sd, ALPHA, n):.2f} '
            f'({t_test_power(effect, s, ALPHA, n):.2f} at the pilot sd; for {smallest:.4f}: '
            f'{t_test_power(smallest, sd, ALPHA, n):.2f})'
        )
    return n


def at_rates(rates: dict[str, float], seeds: range, losses: dict) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of the four arms' pilot runs at their rates."""
    found = mha(seeds) | read(MQA_GRID, point_name('mqa', rates['mqa']), seeds, 'mqa')
    for arm in ('gqa4', 'gqa2'):
        if rates[arm] == RECIPE:
            found |= read(KV, arm, seeds, arm)
        else:
            found |= {(arm, s): losses[point_name(arm, rates[arm]), s] for s in seeds}
    return found


def run() -> int:
    losses = pilot_losses(_GRID.value, 'slope_rate_pilot_seeds', PILOT)
    for arm in ('gqa4', 'gqa2'):  # at 1e-3: this study's runs
        losses |= read(KV, arm, PILOT, point_name(arm, RECIPE))
    rates, train = choices(losses)
    if train:
        print(f'train {",".join(train)}')
        return 0 if _POWER_ONLY.value else 1
    pilot = trend_rows(at_rates(rates, PILOT, losses), PILOT)
    n = seeds_per_arm(pilot)
    seeds = range(FIRST, FIRST + n)
    points = [point_name(a, rates[a]) for a in ARMS]
    if _POWER_ONLY.value:
        print(f'tested {",".join(points)} {n}')
        return 0
    out = os.path.join(HERE, 'results', 'slope_rate_seeds.csv')
    if os.path.isdir(_TESTED.value):
        with open(os.path.join(_TESTED.value, 'summary_seeds.csv'), newline='') as f:
            rows = [r for r in csv.DictReader(f) if int(r['seed']) in seeds]
        found = {
            (a, int(r['seed'])): r['eval_loss']
            for a, p in zip(ARMS, points, strict=True)
            for r in rows
            if r['point'] == p
        }
        write_csv(out, trend_rows(found, seeds))
        print(f'{4 * n} rows: 4 arms x seeds {seeds.start}-{seeds.stop - 1}')
    else:
        print(f'no {_TESTED.value}: reading the committed {os.path.relpath(out)}')
    with open(out, newline='') as f:
        describe(list(csv.DictReader(f)))
    return 0


def describe(rows: list[dict]) -> None:
    """The stated contrasts (lm.experiments.trend), each seed's slope sign, and each arm's mean
    beside this study's at 1e-3 (other seeds: described, not tested)."""
    for name, est, p, flip in trend_contrasts(rows):
        print(
            f'{name}: {est.mean:+.4f} [{est.lo:+.4f}, {est.hi:+.4f}], sd {est.std:.4f}, '
            f'p (Holm) {p:.3g}, sign-flip {flip:.3g}, {est.n} seeds'
        )
    _, slopes, ends = per_seed_contrasts(rows)
    print(
        f'slope > 0 in {sum(v > 0 for v in slopes.values())} of {len(slopes)} seeds; '
        f'mqa - mha > 0 in {sum(v > 0 for v in ends.values())}'
    )
    blocks(rows)
    with open(KV, newline='') as f:
        at_1e3 = list(csv.DictReader(f))
    for arm in ARMS:
        here = np.mean([float(r['eval_loss']) for r in rows if r['arm'] == arm])
        there = np.mean([float(r['eval_loss']) for r in at_1e3 if r['arm'] == arm])
        print(f'described: {arm} mean {here:.4f} at 2e-3 (seeds 44+), {there:.4f} at 1e-3 (0-19)')


def blocks(rows: list[dict]) -> None:
    """MQA - MHA at 2e-3 in the three tests of that pair (seeds 5-13, 14-43 and this question's),
    each block's mean and sd, pooled with its 95% interval, and a one-way F-test across the
    blocks: described, not tested (none of it was stated)."""
    from scipy import stats as scipy_stats

    found = {}
    for name in ('mqa_rate_contrast_seeds', 'mqa_retest_contrast_seeds'):
        with open(os.path.join(HERE, 'results', f'{name}.csv'), newline='') as f:
            found[name] = list(csv.DictReader(f))
    found['this question'] = [r for r in rows if r['arm'] in ('mha', 'mqa')]
    gaps = []
    for name, block in found.items():
        loss = {(r['arm'], int(r['seed'])): float(r['eval_loss']) for r in block}
        seeds = sorted(s for a, s in loss if a == 'mqa')
        gap = np.array([loss['mqa', s] - loss['mha', s] for s in seeds])
        gaps.append(gap)
        print(
            f'described: mqa - mha, seeds {seeds[0]}-{seeds[-1]} ({name}): {gap.mean():+.4f}, '
            f'sd {gap.std(ddof=1):.4f}'
        )
    pooled = stats.estimate(list(np.concatenate(gaps)))
    print(
        f'described: mqa - mha pooled over the three tests ({pooled.n} seeds): '
        f'{pooled.mean:+.4f} [{pooled.lo:+.4f}, {pooled.hi:+.4f}]; across the blocks, one-way '
        f'F-test p {scipy_stats.f_oneway(*gaps).pvalue:.3f} (post hoc)'
    )


if __name__ == '__main__':
    run_app(run)
