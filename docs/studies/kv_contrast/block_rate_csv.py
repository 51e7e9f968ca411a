r"""The one-version-per-seed rates question's sizing and per-seed CSVs (block_rate_statement.md):
on fresh seeds, each seed's eight runs (four KV-head arms at 1e-3 and at 2e-3) trained in one
batch by one version of the code and toolchain, does the cost per halving of the KV heads differ
between the two rates?

  python docs/studies/kv_contrast/block_rate_csv.py --power_only
  python docs/studies/kv_contrast/block_rate_csv.py --sweeps='runs/block_rate_*'

`--power_only` sizes the seed count from the paired rates question's 30 seeds (their per-seed
slope changes, results/paired_rate_seeds.csv). Otherwise every run of the batches matching
`--sweeps` (each <point>_s<seed>/results.json there) is copied to results/block_rate_runs.csv
(sweep, point, seed, version, cpu, eval_loss), which the script reads without the batches; each
seed is classified (`classify`) and, until the first SEEDS seeds are decided, only the counts
are printed, never a loss. Then it writes results/block_rate_seeds.csv (arm, x = halvings of the
KV heads, seed, machine, loss_change = loss at 1e-3 minus loss at 2e-3), whose 'trend' table is
the stated test, and prints the contrasts and, per CPU, the slope change (described). Beside it,
results/block_rate_1e3_seeds.csv and block_rate_2e3_seeds.csv (arm, x, seed, eval_loss at that
rate): the losses themselves, for described tables only (added after the answer; not stated).
"""

import csv
import os

import block_runs
import numpy as np
from absl import flags
from rate_rows import HERE
from slope_rate_sweep import ARMS, point_name

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

RATES = (1e-3, 2e-3)  # the recipe's peak rate, and the rate every arm chose by the rate rule
BLOCK = [point_name(a, lr) for a in ARMS for lr in RATES]  # a seed's eight runs
FIRST_SEED = 59  # past every seed any kv_contrast or MLA question has trained
EFFECT = 0.0020  # nats per halving: the 1e-3 headline's 95% half-width (0.00196), rounded up
ALPHA = 0.025  # Holm's first step over the two contrasts
POWER = 0.8
SEEDS = 41  # seeds_needed(EFFECT, the 30 paired seeds' sd at its 90% bound, ALPHA, POWER)
RESULTS = os.path.join(HERE, 'results')
RUNS = os.path.join(RESULTS, 'block_rate_runs.csv')
SIZING = os.path.join(RESULTS, 'paired_rate_seeds.csv')  # the paired rates question's seeds

_SWEEPS = flags.DEFINE_string('sweeps', 'runs/block_rate_*', 'Glob of the batches of seeds.')
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The sizing only.')


def sizing() -> int:
    """Prints the seed count's derivation and returns it: the per-seed slope changes of the
    paired rates question's 30 seeds (their sd and its 90% upper bound), EFFECT, ALPHA, POWER."""
    with open(SIZING, newline='') as f:
        rows = list(csv.DictReader(f))
    slopes = np.array(list(per_seed_contrasts(rows)[1].values()))
    sd, n = float(slopes.std(ddof=1)), len(slopes)
    bound = sd_upper_bound(sd, n)
    needed = seeds_needed(EFFECT, bound, ALPHA, POWER)
    print(
        f"slope change over the paired rates question's {n} seeds: sd {sd:.4f}, 90% upper bound "
        f'{bound:.4f}; for {EFFECT} nats per halving at alpha {ALPHA}, power {POWER}: '
        f'{needed} seeds ({seeds_needed(EFFECT, sd, ALPHA, POWER)} at the sd itself)'
    )
    for effect in (EFFECT, 0.00196, 0.0016, 0.0015, 0.0006):
        print(
            f'at {needed} seeds, for {effect} nats: power '
            f'{t_test_power(effect, bound, ALPHA, needed):.2f} at the bound, '
            f'{t_test_power(effect, sd, ALPHA, needed):.2f} at the sd'
        )
    return needed


def all_runs(sweeps: list[str]) -> list[dict]:
    """results/block_rate_runs.csv merged with (and rewritten from) the batches present."""
    return block_runs.all_runs(sweeps, RUNS, BLOCK)


def classify(runs: list[dict], ended: set[str]) -> dict[int, str]:
    """Each seed's state by the one-version-per-seed rule (`block_runs.classify`)."""
    return block_runs.classify(runs, ended, len(BLOCK), FIRST_SEED)


def level_rows(runs: list[dict], seeds: list[int], rate: float) -> list[dict]:
    """Rows (arm, x, seed, eval_loss) of the runs at one rate: described, not a stated test."""
    at = {(r['point'], int(r['seed'])): float(r['eval_loss']) for r in runs}
    return [
        {'arm': a, 'x': x, 'seed': s, 'eval_loss': at[point_name(a, rate), s]}
        for x, a in enumerate(ARMS)
        for s in seeds
    ]


def change_rows(runs: list[dict], seeds: list[int]) -> list[dict]:
    """Rows (arm, x, seed, machine, loss_change = loss at 1e-3 minus loss at 2e-3)."""
    cpu = {(r['point'], int(r['seed'])): r['cpu'] for r in runs}
    recipe, own = (level_rows(runs, seeds, rate) for rate in RATES)
    return [
        {
            **{k: a[k] for k in ('arm', 'x', 'seed')},
            'machine': cpu[point_name(a['arm'], RATES[0]), a['seed']],
            'loss_change': a['eval_loss'] - b['eval_loss'],
        }
        for a, b in zip(recipe, own, strict=True)
    ]


def report(rows: list[dict]) -> None:
    """The two stated contrasts, then the slope change per CPU (described)."""
    for name, est, p, flip in trend_contrasts(rows):
        print(
            f'{name} of the change (1e-3 minus 2e-3): {est.mean:+.4f} [{est.lo:+.4f}, '
            f'{est.hi:+.4f}], sd {est.std:.4f}, p (Holm) {p:.3g}, sign-flip (Holm) {flip:.3g}, '
            f'{est.n} seeds'
        )
    slopes = per_seed_contrasts(rows)[1]
    machine = {r['seed']: r['machine'] for r in rows}
    for cpu in sorted(set(machine.values())):
        own = [v for s, v in slopes.items() if machine[s] == cpu]
        est = stats.estimate(own)
        print(
            f'described, {cpu}: slope change {est.mean:+.4f} [{est.lo:+.4f}, {est.hi:+.4f}], '
            f'{len(own)} seeds'
        )


def run() -> int:
    if sizing() != SEEDS:
        raise SystemExit(f'the sizing gives another seed count than SEEDS = {SEEDS}')
    if _POWER_ONLY.value:
        return 0
    sweeps = block_runs.batches(_SWEEPS.value)
    runs = all_runs(sweeps)
    counted = block_runs.decided(classify(runs, block_runs.ended(sweeps)), SEEDS)
    if counted is None:
        return 0  # nothing is computed on part of the seeds
    rows = change_rows(runs, counted)
    write_csv(os.path.join(RESULTS, 'block_rate_seeds.csv'), rows)
    for rate, name in zip(RATES, ('1e3', '2e3'), strict=True):
        levels = level_rows(runs, counted, rate)
        write_csv(os.path.join(RESULTS, f'block_rate_{name}_seeds.csv'), levels)
    report(rows)
    return 0


if __name__ == '__main__':
    run_app(run)
