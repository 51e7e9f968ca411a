r"""The fresh-seeds question's power analysis and per-seed CSV (retest_statement.md).

  python docs/studies/mla/retest_csv.py --power_only
  python docs/studies/mla/retest_csv.py --mla64_sweep=runs/retest_mla64 \
      --mha_sweep=runs/retest_mha

The pilot is both arms' seeds 0-8 at 2e-3 (results/rate_pilot_seeds.csv, 0-4;
results/rate_contrast_seeds.csv, 5-8); the effect is sized as before and the sd is the pilot
sd's one-sided 90% upper confidence bound. The CSV, results/retest_contrast_seeds.csv (arm,
seed, eval_loss), holds MHA at 2e-3 (seeds 9-28 from results/tuned_contrast_seeds.csv, later
ones from `--mha_sweep`) and MLA-64 at 2e-3 (`--mla64_sweep`) over the tested seeds. Then it
describes, untested, the gap beside the one at 1e-3 (results/mla_contrast_seeds.csv; added after
the runs); without the tested sweeps it describes from the committed CSV.
"""

import os

import numpy as np
from absl import flags
from rate_sweep import point_name
from study_rows import committed, point_losses, write_seeds
from study_rows import power_analysis as study_power

from lm.cli import run_app
from lm.experiments import gap_change, sd_upper_bound, t_test_power

RATE = 2e-3  # both arms' rate, chosen by the per-arm-rate question's rule
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
BOUND = 0.90  # the one-sided confidence of the sd's upper bound
CAP = 24  # seeds per arm at most: this session's CPU time
PILOT = range(9)  # seeds 0-4 chose the rate; 5-8 were the per-arm-rate question's test
MHA_REUSED = range(9, 29)  # MHA's seeds at 2e-3 in results/tuned_contrast_seeds.csv
CONTRASTS = (('mla64', 'mha'),)

_MLA = flags.DEFINE_string('mla64_sweep', 'runs/retest_mla64', "MLA-64's tested seeds at 2e-3.")
_MHA = flags.DEFINE_string('mha_sweep', 'runs/retest_mha', "MHA's tested seeds past 28.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis only.')


def pilot_losses() -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of both arms' seeds 0-8 at 2e-3."""
    arms = {point_name(arm, RATE): arm for arm in ('mha', 'mla64')}
    found = committed('results/rate_pilot_seeds.csv', arms, range(5))
    return found | committed(
        'results/rate_contrast_seeds.csv', {'mha': 'mha', 'mla64': 'mla64'}, range(5, 9)
    )


def sd_bound(pilot: dict[tuple[str, int], str]) -> float:
    """The one-sided BOUND upper confidence bound on the pilot's per-seed sd of MLA-64 − MHA."""
    diff = [float(pilot['mla64', s]) - float(pilot['mha', s]) for s in PILOT]
    sd = float(np.std(diff, ddof=1))
    bound = sd_upper_bound(sd, len(diff), BOUND)
    print(f'pilot sd {sd:.4f} over seeds 0-8; its {BOUND:.0%} bound {bound:.4f}')
    return bound


def run() -> int:
    pilot = pilot_losses()
    sd = sd_bound(pilot)
    n = study_power(pilot, CONTRASTS, PILOT, SMALLEST, sd, CAP)
    print(
        f'power at {n} for {SMALLEST} nats at sd {sd:.4f}: '
        f'{t_test_power(SMALLEST, sd, 0.05, n):.2f}'
    )
    if _POWER_ONLY.value:
        return 0
    seeds = range(PILOT.stop, PILOT.stop + n)
    if not os.path.isdir(_MLA.value):  # the record, without the runs
        arms = {'mha': 'mha', 'mla64': 'mla64'}
        describe(committed('results/retest_contrast_seeds.csv', arms, seeds), seeds)
        return 0
    found = committed('results/tuned_contrast_seeds.csv', {'mha': 'mha'}, MHA_REUSED)
    if seeds.stop > MHA_REUSED.stop:
        more = point_losses(_MHA.value, point_name('mha', RATE), 'mha').items()
        found |= {(a, s): v for (a, s), v in more if s >= MHA_REUSED.stop}
    found |= point_losses(_MLA.value, point_name('mla64', RATE), 'mla64')
    write_seeds('retest_contrast_seeds', found, ('mha', 'mla64'), seeds)
    describe(found, seeds)
    return 0


def describe(found: dict[tuple[str, int], str], seeds: range) -> None:
    """The gap at 2e-3 beside the gap at 1e-3 (results/latent_contrast_seeds.csv, seeds 5-36:
    its MLA-64 and MHA runs are mla_contrast_seeds.csv's over 5-28) over the seeds both hold, its
    change paired by seed and each arm's means: described, not tested."""
    at_1e3 = committed('results/latent_contrast_seeds.csv', {'mla64': 'mla64', 'mha': 'mha'}, seeds)
    for line in gap_change(at_1e3, found, 'mla64', 'mha', ('1e-3', '2e-3')):
        print(f'described, {line}')


if __name__ == '__main__':
    run_app(run)
