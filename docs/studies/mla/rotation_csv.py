r"""The rotation-or-width question's power analysis, reuse check and per-seed CSV
(rotation_statement.md).

  python docs/studies/mla/rotation_csv.py --power_only --pilot_sweep=runs/rotation_pilot \
      --check_sweep=runs/rotation_check
  python docs/studies/mla/rotation_csv.py --pilot_sweep=runs/rotation_pilot \
      --check_sweep=runs/rotation_check --n24_sweep=runs/rotation_mla64n24 \
      --p16_sweep=runs/rotation_mla64p16

The power analysis reads MLA-64-N24's pilot (seeds 0-4, `--pilot_sweep`, whose losses it copies to
results/rotation_pilot_seeds.csv; without the sweep, that copy) beside MHA's seeds 0-4
(../kv_contrast/results/kv_contrast_seeds.csv), MLA-64's
(../kv_layouts/results/kv_layouts_seeds.csv) and MLA-64-P16's (results/width_pilot_seeds.csv), and
fixes the seed count by the statement's rule. The reuse check compares MLA-64-P16's seeds 26-27
retrained now (`--check_sweep`) with their losses in results/width_contrast_seeds.csv. The CSV,
results/rotation_contrast_seeds.csv (arm, seed, eval_loss), joins by seed MHA's and MLA-64's runs
(results/latent_contrast_seeds.csv), MLA-64-P16's (results/width_contrast_seeds.csv, seeds 5-27;
past 27, `--p16_sweep`) and MLA-64-N24's (`--n24_sweep`).
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

ARMS = ('mha', 'mla64', 'mla64p16', 'mla64n24')
CONTRASTS = (('mla64n24', 'mla64'), ('mla64p16', 'mla64n24'), ('mla64n24', 'mha'))
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0117  # the smallest per-seed sd of the earlier MLA questions' seven contrasts
CAP = 32  # seeds per arm: the reused MHA and MLA-64 have seeds 5-36
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)
CHECK = range(26, 28)  # MLA-64-P16's seeds retrained to check the reused runs
CHECK_TOLERANCE = 1e-4  # nats: a hundredth of SMALLEST
P16_RUNS = range(FIRST, 28)  # MLA-64-P16's seeds in results/width_contrast_seeds.csv

_PILOT = flags.DEFINE_string('pilot_sweep', 'runs/rotation_pilot', "MLA-64-N24's pilot (0-4).")
_CHECK = flags.DEFINE_string(
    'check_sweep', 'runs/rotation_check', "MLA-64-P16's seeds 26-27, retrained."
)
_N24 = flags.DEFINE_string('n24_sweep', 'runs/rotation_mla64n24', "MLA-64-N24's tested seeds.")
_P16 = flags.DEFINE_string(
    'p16_sweep', 'runs/rotation_mla64p16', "MLA-64-P16's seeds past 27 (only if N > 23)."
)
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis and reuse check only.')


def run() -> int:
    pilot = baseline_pilot(PILOT)
    pilot |= committed('results/width_pilot_seeds.csv', {'mla64p16': 'mla64p16'}, PILOT)
    pilot |= pilot_losses(_PILOT.value, 'mla64n24', 'rotation_pilot_seeds', PILOT)
    n = study_power(pilot, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP)
    width = 'results/width_contrast_seeds.csv'
    check = point_losses(_CHECK.value, 'mla', 'mla64p16')
    reuse_check(check, width, 'mla64p16', CHECK, CHECK_TOLERANCE)
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = committed('results/latent_contrast_seeds.csv', {'mha': 'mha', 'mla64': 'mla64'}, seeds)
    found |= committed(width, {'mla64p16': 'mla64p16'}, seeds)
    if seeds.stop > P16_RUNS.stop:
        found |= point_losses(_P16.value, 'mla', 'mla64p16')
    found |= point_losses(_N24.value, 'mla', 'mla64n24')
    write_seeds('rotation_contrast_seeds', found, ARMS, seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
