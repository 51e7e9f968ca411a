r"""The wider-RoPE question's power analysis, reuse check and per-seed CSV (width_statement.md).

  python docs/studies/mla/width_csv.py --power_only --pilot_sweep=runs/width_pilot \
      --check_sweep=runs/width_check
  python docs/studies/mla/width_csv.py --pilot_sweep=runs/width_pilot \
      --check_sweep=runs/width_check --p16_sweep=runs/width_mla64p16

The power analysis reads MLA-64-P16's pilot (seeds 0-4, `--pilot_sweep`, whose losses it copies to
results/width_pilot_seeds.csv; without the sweep, that copy) beside MHA's seeds 0-4
(../kv_contrast/results/kv_contrast_seeds.csv) and MLA-64's
(../kv_layouts/results/kv_layouts_seeds.csv), and fixes the seed count by the statement's rule. The
reuse check compares MLA-64's seeds 29-30 retrained now (`--check_sweep`) with their losses in
results/latent_contrast_seeds.csv. The CSV, results/width_contrast_seeds.csv (arm, seed, eval_loss),
joins by seed MHA's and MLA-64's runs (results/latent_contrast_seeds.csv) with MLA-64-P16's
(`--p16_sweep`).
"""

from absl import flags
from study_rows import (
    baseline_pilot,
    committed,
    pilot_losses,
    point_losses,
    reuse_check,
    write_seeds,
)
from study_rows import power_analysis as study_power

from lm.cli import run_app

ARMS = ('mha', 'mla64', 'mla64p16')
CONTRASTS = (('mla64p16', 'mla64'), ('mla64p16', 'mha'))
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0145  # the smallest per-seed sd of the full-rank-latent question's three contrasts
CAP = 32  # seeds per arm: the reused arms have seeds 5-36
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)
CHECK = range(29, 31)  # MLA-64's seeds retrained to check the reused runs
CHECK_TOLERANCE = 1e-4  # nats: a hundredth of SMALLEST

_PILOT = flags.DEFINE_string('pilot_sweep', 'runs/width_pilot', "MLA-64-P16's pilot (seeds 0-4).")
_CHECK = flags.DEFINE_string('check_sweep', 'runs/width_check', "MLA-64's seeds 29-30, retrained.")
_P16 = flags.DEFINE_string('p16_sweep', 'runs/width_mla64p16', "MLA-64-P16's tested seeds.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis and reuse check only.')


def run() -> int:
    pilot = baseline_pilot(PILOT) | pilot_losses(
        _PILOT.value, 'mla64p16', 'width_pilot_seeds', PILOT
    )
    n = study_power(pilot, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP)
    reused = 'results/latent_contrast_seeds.csv'
    check = point_losses(_CHECK.value, 'mla', 'mla64')
    reuse_check(check, reused, 'mla64', CHECK, CHECK_TOLERANCE)
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = committed(reused, {'mha': 'mha', 'mla64': 'mla64'}, seeds)
    found |= point_losses(_P16.value, 'mla', 'mla64p16')
    write_seeds('width_contrast_seeds', found, ARMS, seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
