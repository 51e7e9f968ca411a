r"""The MQA fresh-seeds question's power analysis and per-seed CSV (mqa_retest_statement.md).

  python docs/studies/kv_contrast/mqa_retest_csv.py --power_only
  python docs/studies/kv_contrast/mqa_retest_csv.py --mqa_sweep=runs/mqa_retest_mqa \
      --mha_sweep=runs/mqa_retest_mha

The pilot is both arms' seeds 0-13 at 2e-3: MQA's from results/mqa_rate_pilot_seeds.csv (0-4)
and results/mqa_rate_contrast_seeds.csv (5-13), MHA's the MLA study's runs (rate_rows.mha). The
effect is sized as before and the sd is the pilot sd's one-sided 90% upper confidence bound. The
CSV, results/mqa_retest_contrast_seeds.csv (arm, seed, eval_loss), holds both at 2e-3 over the
tested seeds: MQA's from `--mqa_sweep`, MHA's the MLA study's runs to seed 29 and `--mha_sweep`'s
past it. Then it describes, untested, the gap beside the same seeds' at 1e-3; without the
tested sweeps it describes from the committed CSV.
"""

import os

import numpy as np
from absl import flags
from rate_rows import HERE, MQA_AT_1E3, committed_contrast, mha, read, write_contrast

from lm.cli import run_app
from lm.experiments import gap_change, sd_upper_bound, seeds_needed, stats, t_test_power

SMALLEST = 0.01  # nats: the smallest difference worth resolving here
BOUND = 0.90  # the one-sided confidence of the sd's upper bound
FLOOR, CAP = 4, 30  # seeds per arm: at least, and at most (this session's CPU time)
PILOT = range(14)  # 0-4 chose the rate; 5-13 were the MQA-rate question's test
MHA_REUSED = range(14, 30)  # MHA's runs at 2e-3 in the MLA study past the pilot
POINT = 'mqa_lr0.002'  # MQA at 2e-3 in mqa_rate_sweep.py (MHA's: mla/rate_sweep.py's mha_lr0.002)

_MQA = flags.DEFINE_string('mqa_sweep', 'runs/mqa_retest_mqa', "MQA's tested seeds at 2e-3.")
_MHA = flags.DEFINE_string('mha_sweep', 'runs/mqa_retest_mha', "MHA's tested seeds past 29.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis only.')


def pilot_losses() -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of both arms' seeds 0-13 at 2e-3."""
    results = os.path.join(HERE, 'results')
    found = read(os.path.join(results, 'mqa_rate_pilot_seeds.csv'), POINT, range(5), 'mqa')
    found |= read(os.path.join(results, 'mqa_rate_contrast_seeds.csv'), 'mqa', PILOT, 'mqa')
    return found | mha(PILOT)


def seeds_per_arm(pilot: dict[tuple[str, int], str]) -> int:
    """The statement's rule: sized for max(2/3 |d|, SMALLEST) at the BOUND upper bound of the
    pilot's sd, 80% power, alpha 0.05; at least FLOOR, at most CAP."""
    diff = np.array([float(pilot['mqa', s]) - float(pilot['mha', s]) for s in PILOT])
    d, s = diff.mean(), diff.std(ddof=1)
    effect, sd = max(abs(d) * 2 / 3, SMALLEST), sd_upper_bound(s, len(diff), BOUND)
    need = seeds_needed(effect, sd, 0.05)
    n = min(max(need, FLOOR), CAP)
    print(
        f'mqa - mha: pilot {d:+.4f}, sd {s:.4f} (its {BOUND:.0%} bound {sd:.4f}) over seeds '
        f'0-13; sized for {effect:.4f}: {need} seeds; seeds per arm {n} (power '
        f'{t_test_power(effect, sd, 0.05, n):.2f}; at the pilot sd '
        f'{t_test_power(effect, s, 0.05, n):.2f})'
    )
    return n


def describe(found: dict[tuple[str, int], str], seeds: range) -> None:
    """MQA - MHA at 2e-3 beside the same seeds at 1e-3 (this study's and the MLA study's runs),
    its change paired by seed and each arm's means, and both tests' seeds pooled: described, not
    tested."""
    at_1e3 = {}
    for path, have in MQA_AT_1E3:
        at_1e3 |= read(path, 'mqa', have, 'mqa') | read(path, 'mha', have, 'mha')
    for line in gap_change(at_1e3, found, 'mqa', 'mha', ('1e-3', '2e-3')):
        print(f'described, {line}')
    tested = found | committed_contrast('mqa_rate_contrast_seeds', range(5, 14))
    pooled = stats.paired_difference(
        {s: float(v) for (a, s), v in tested.items() if a == 'mqa'},
        {s: float(v) for (a, s), v in tested.items() if a == 'mha'},
    )
    print(
        f'described, seeds 5-{seeds.stop - 1} (both tests pooled): mqa - mha {pooled.mean:+.4f} '
        f'[{pooled.lo:+.4f}, {pooled.hi:+.4f}]'
    )


def run() -> int:
    n = seeds_per_arm(pilot_losses())
    if _POWER_ONLY.value:
        return 0
    seeds = range(PILOT.stop, PILOT.stop + n)
    if not os.path.isdir(_MQA.value):  # the record, without the runs
        describe(committed_contrast('mqa_retest_contrast_seeds', seeds), seeds)
        return 0
    found = read(os.path.join(_MQA.value, 'summary_seeds.csv'), POINT, seeds, 'mqa')
    found |= mha(seeds)
    if seeds.stop > MHA_REUSED.stop:
        more = range(MHA_REUSED.stop, seeds.stop)
        found |= read(os.path.join(_MHA.value, 'summary_seeds.csv'), 'mha_lr0.002', more, 'mha')
    write_contrast('mqa_retest_contrast_seeds', found, seeds)
    describe(found, seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
