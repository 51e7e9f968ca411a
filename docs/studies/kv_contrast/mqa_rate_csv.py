r"""The MQA-rate question's rate choice, power analysis and per-seed CSV (mqa_rate_statement.md).

  python docs/studies/kv_contrast/mqa_rate_csv.py --power_only --grid_sweep=runs/mqa_rate_grid
  python docs/studies/kv_contrast/mqa_rate_csv.py --grid_sweep=runs/mqa_rate_grid \
      --mqa_sweep=runs/mqa_rate_mqa

The choice reads MQA's seeds 0-4 at every rate run: at 1e-3 this study's runs
(results/kv_contrast_seeds.csv), at the others the grid's sweep (`--grid_sweep`, whose losses it
copies to results/mqa_rate_pilot_seeds.csv; without it, that copy), by lm.experiments.lr_grid
(choose, then next_rate: a choice at an edge names the rate to train and stops). MHA's rate is
2e-3, the MLA study's per-arm-rate choice; its runs there at 2e-3 (seeds 0-29) pair with MQA's.
The CSV, results/mqa_rate_contrast_seeds.csv (arm, seed, eval_loss), holds both over the tested
seeds: MQA's from `--mqa_sweep`, or at 1e-3 this study's and the MLA study's runs. Then it
describes, untested, the gap beside the same seeds' at 1e-3 (added after the tested runs began);
without the tested sweep it describes from the committed CSV.
"""

import os

import numpy as np
from absl import flags
from mqa_rate_sweep import RATES, point_name
from rate_rows import (
    MQA_AT_1E3,
    choose_rate,
    committed_contrast,
    mha,
    pilot_losses,
    read,
    write_contrast,
)

from lm.cli import run_app
from lm.experiments import gap_change, seeds_needed, t_test_power

GRID = (5e-4, 1e-3, 2e-3, 4e-3)  # the rates MQA runs; RATES holds the edge extensions
RECIPE = 1e-3  # the recipe's rate: that of this study's runs
PAST = 2  # at most this many rates past each edge of GRID
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0134  # MQA - MHA's tested per-seed sd at 1e-3 over seeds 0-19 (this study)
FLOOR, CAP = 4, 25  # seeds per arm: at least, and at most (MHA's seeds 5-29 at 2e-3 exist)
PILOT = range(5)

_GRID = flags.DEFINE_string('grid_sweep', 'runs/mqa_rate_grid', "MQA's rate grid (seeds 0-4).")
_MQA = flags.DEFINE_string('mqa_sweep', 'runs/mqa_rate_mqa', "MQA's tested seeds at its rate.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The choice and power analysis only.')


def choose(losses: dict[tuple[str, int], str]) -> float:
    """MQA's rate by lr_grid.choose over every rate run on seeds 0-4 ({(point, seed): loss});
    a choice at an edge with a rate left past it stops, naming the point to train."""
    by_lr = {
        lr: {s: float(losses[point_name(lr), s]) for s in PILOT}
        for lr in RATES
        if all((point_name(lr), s) in losses for s in PILOT)
    }
    lr, nxt = choose_rate('mqa', by_lr, GRID, list(RATES), PAST)
    if nxt:
        raise SystemExit(f'chosen at an edge: train {point_name(nxt)} (seeds 0-4) and rerun')
    return lr


def seeds_per_arm(pilot: dict[tuple[str, int], str]) -> int:
    """The statement's rule: sized for max(2/3 |d|, SMALLEST) at sd max(s, SD_FLOOR) of the
    pilot's paired differences, 80% power, alpha 0.05; at least FLOOR, at most CAP."""
    diff = np.array([float(pilot['mqa', s]) - float(pilot['mha', s]) for s in PILOT])
    d, s = diff.mean(), diff.std(ddof=1)
    effect, sd = max(abs(d) * 2 / 3, SMALLEST), max(s, SD_FLOOR)
    need = seeds_needed(effect, sd, 0.05)
    n = min(max(need, FLOOR), CAP)
    print(
        f'mqa - mha: pilot {d:+.4f}, sd {s:.4f}; sized for {effect:.4f} at sd {sd:.4f}: {need} '
        f'seeds; seeds per arm {n} (power {t_test_power(effect, sd, 0.05, n):.2f}; '
        f'for {SMALLEST} nats {t_test_power(SMALLEST, sd, 0.05, n):.2f})'
    )
    return n


def run() -> int:
    losses = pilot_losses(_GRID.value, 'mqa_rate_pilot_seeds', PILOT) | read(
        MQA_AT_1E3[0][0], 'mqa', PILOT, point_name(RECIPE)
    )
    lr = choose(losses)
    pilot = {('mqa', s): losses[point_name(lr), s] for s in PILOT} | mha(PILOT)
    n = seeds_per_arm(pilot)
    if _POWER_ONLY.value:
        return 0
    seeds = range(PILOT.stop, PILOT.stop + n)
    if lr != RECIPE and not os.path.isdir(_MQA.value):  # the record, without the runs
        describe(committed_contrast('mqa_rate_contrast_seeds', seeds), seeds)
        return 0
    found = {}
    if lr == RECIPE:  # this study's and the MLA study's runs; a sweep for seeds past them
        found = {
            k: v for path, have in MQA_AT_1E3 for k, v in read(path, 'mqa', have, 'mqa').items()
        }
    if os.path.isdir(_MQA.value):
        found |= read(os.path.join(_MQA.value, 'summary_seeds.csv'), point_name(lr), seeds, 'mqa')
    found |= mha(seeds)
    write_contrast('mqa_rate_contrast_seeds', found, seeds)
    describe(found, seeds)
    return 0


def describe(found: dict[tuple[str, int], str], seeds: range) -> None:
    """MQA - MHA at 2e-3 beside the same seeds at 1e-3 (this study's runs), its change paired
    by seed and each arm's means: described, not tested."""
    path = MQA_AT_1E3[0][0]
    at_1e3 = read(path, 'mqa', seeds, 'mqa') | read(path, 'mha', seeds, 'mha')
    for line in gap_change(at_1e3, found, 'mqa', 'mha', ('1e-3', '2e-3')):
        print(f'described, {line}')


if __name__ == '__main__':
    run_app(run)
