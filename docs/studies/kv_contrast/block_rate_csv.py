r"""The one-machine-per-seed rates question's sizing and per-seed CSVs (block_rate_statement.md):
on fresh seeds, each seed's eight runs (four KV-head arms at 1e-3 and at 2e-3) trained together
on one machine, does the cost per halving of the KV heads differ between the two rates?

  python docs/studies/kv_contrast/block_rate_csv.py --power_only
  python docs/studies/kv_contrast/block_rate_csv.py --sweeps='runs/block_rate_*'

`--power_only` sizes the seed count from the paired rates question's 30 seeds (its per-seed slope
changes, results/paired_rate_seeds.csv). Otherwise each sweep matching `--sweeps` (a batch of
seeds, all eight points of BLOCK) has its runs' losses and machines copied to
results/block_rate_runs.csv (point, seed, cpu, commit, eval_loss), which the script reads
without the sweeps. A seed counts when its eight runs exist, each trained on one machine, all on
the same one; until SEEDS of them count, it prints how many do and computes nothing else. Then it
writes results/block_rate_seeds.csv (arm, x = halvings of the KV heads, seed, machine,
loss_change = loss at 1e-3 minus loss at 2e-3), whose 'trend' table is the stated test.
"""

import csv
import glob
import json
import os

import numpy as np
from absl import flags
from rate_rows import HERE
from slope_rate_sweep import ARMS, point_name

from lm.cli import run_app
from lm.experiments import (
    per_seed_contrasts,
    sd_upper_bound,
    seeds_needed,
    t_test_power,
    trend_contrasts,
    write_csv,
)

RATES = (1e-3, 2e-3)  # the recipe's peak rate, and the rate every arm chose by the rate rule
BLOCK = [point_name(a, lr) for a in ARMS for lr in RATES]  # a seed's eight runs
FIRST_SEED = 59  # past every seed any kv_contrast or MLA question has trained
EFFECT = 0.0020  # nats per halving: the 1e-3 headline's own 95% half-width (0.0019-0.0020)
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
    print(
        f'at {needed} seeds: power {t_test_power(EFFECT, bound, ALPHA, needed):.2f} at the bound, '
        f'{t_test_power(EFFECT, sd, ALPHA, needed):.2f} at the sd; for 0.0015 nats '
        f'{t_test_power(0.0015, bound, ALPHA, needed):.2f} and '
        f'{t_test_power(0.0015, sd, ALPHA, needed):.2f}'
    )
    return needed


def machines(result: dict) -> set[str]:
    """The CPUs that trained a run (each session's, or its one 'trained_by')."""
    sessions = result.get('trained_by_sessions') or [result.get('trained_by', {})]
    return {s.get('cpu', '?') for s in sessions}


def sweep_runs(sweep: str) -> list[dict]:
    """A batch's runs: (point, seed, cpu, commit, eval_loss) from summary_seeds.csv and each
    run's results.json; a run trained on two machines has cpu 'mixed: ...'."""
    with open(os.path.join(sweep, 'summary_seeds.csv'), newline='') as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        with open(os.path.join(sweep, f'{r["point"]}_s{r["seed"]}', 'results.json')) as f:
            result = json.load(f)
        cpus = sorted(machines(result))
        out.append(
            {
                'point': r['point'],
                'seed': int(r['seed']),
                'cpu': cpus[0] if len(cpus) == 1 else 'mixed: ' + ' | '.join(cpus),
                'commit': result.get('trained_by', {}).get('commit', ''),
                'eval_loss': r['eval_loss'],
            }
        )
    return out


def all_runs() -> list[dict]:
    """results/block_rate_runs.csv merged with (and rewritten from) the batches present."""
    found = {}
    if os.path.isfile(RUNS):
        with open(RUNS, newline='') as f:
            found = {(r['point'], int(r['seed'])): r for r in csv.DictReader(f)}
    sweeps = sorted(glob.glob(_SWEEPS.value))
    for sweep in sweeps:
        found |= {(r['point'], r['seed']): r for r in sweep_runs(sweep)}
    if sweeps:
        write_csv(RUNS, [found[k] for k in sorted(found, key=lambda k: (k[1], BLOCK.index(k[0])))])
    return list(found.values())


def complete_seeds(runs: list[dict]) -> dict[int, dict]:
    """{seed: {'machine': cpu, point: loss}} of every seed whose eight runs exist on one machine;
    prints each seed left out and why."""
    by_seed: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_seed.setdefault(int(r['seed']), {})[r['point']] = r
    out = {}
    for seed, block in sorted(by_seed.items()):
        cpus = {r['cpu'] for r in block.values()}
        if set(block) != set(BLOCK):
            print(f'seed {seed}: {len(block)} of its 8 runs')
        elif len(cpus) > 1 or any(c.startswith('mixed') for c in cpus):
            print(f'seed {seed}: left out, its runs were trained on {" and ".join(sorted(cpus))}')
        else:
            out[seed] = {
                'machine': cpus.pop(),
                **{p: float(r['eval_loss']) for p, r in block.items()},
            }
    return out


def change_rows(seeds: dict[int, dict]) -> list[dict]:
    """Rows (arm, x, seed, machine, loss_change = loss at 1e-3 minus loss at 2e-3)."""
    return [
        {
            'arm': a,
            'x': x,
            'seed': s,
            'machine': block['machine'],
            'loss_change': block[point_name(a, RATES[0])] - block[point_name(a, RATES[1])],
        }
        for x, a in enumerate(ARMS)
        for s, block in seeds.items()
    ]


def run() -> int:
    if sizing() != SEEDS:
        raise SystemExit(f'the sizing gives another seed count than SEEDS = {SEEDS}')
    if _POWER_ONLY.value:
        return 0
    seeds = complete_seeds(all_runs())
    print(f'{len(seeds)} of {SEEDS} seeds complete (eight runs, one machine each)')
    if len(seeds) < SEEDS:
        return 0  # nothing is computed on part of the seeds
    chosen = dict(sorted(seeds.items())[:SEEDS])
    rows = change_rows(chosen)
    write_csv(os.path.join(RESULTS, 'block_rate_seeds.csv'), rows)
    for name, est, p, flip in trend_contrasts(rows):
        print(
            f'{name} of the change (1e-3 minus 2e-3): {est.mean:+.4f} [{est.lo:+.4f}, '
            f'{est.hi:+.4f}], sd {est.std:.4f}, p (Holm) {p:.3g}, sign-flip {flip:.3g}, '
            f'{est.n} seeds'
        )
    print('machines:', ', '.join(sorted({b['machine'] for b in chosen.values()})))
    return 0


if __name__ == '__main__':
    run_app(run)
