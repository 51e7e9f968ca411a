r"""The per-head-RoPE question's power analysis, reuse check and per-seed CSV (rope_statement.md).

  python docs/studies/mla/rope_csv.py --power_only --pilot_sweep=runs/rope_pilot \
      --check_sweep=runs/rope_check
  python docs/studies/mla/rope_csv.py --pilot_sweep=runs/rope_pilot \
      --check_sweep=runs/rope_check --r8_sweep=runs/rope_mla64r8

The power analysis reads MLA-64-R8's pilot (seeds 0-4, `--pilot_sweep`, whose losses it copies to
results/rope_pilot_seeds.csv; without the sweep, that copy) beside MHA's and GQA-4's seeds 0-4
(../kv_contrast/results/kv_contrast_seeds.csv) and MLA-64's
(../kv_layouts/results/kv_layouts_seeds.csv), and fixes the seed count by the statement's rule. The
reuse check compares MHA's seeds 29-30 retrained now (`--check_sweep`) with their losses in
results/latent_contrast_seeds.csv. The CSV, results/rope_contrast_seeds.csv (arm, seed, eval_loss),
joins by seed MHA's, MLA-64's and GQA-4's runs (results/latent_contrast_seeds.csv) with MLA-64-R8's
(`--r8_sweep`).
"""

from absl import flags
from study_rows import baseline_pilot, committed, pilot_losses, reuse_check, swept, write_seeds
from study_rows import power_analysis as study_power

from lm.cli import run_app

ARMS = ('mha', 'mla64', 'gqa4', 'mla64r8')
CONTRASTS = (('mla64r8', 'mla64'), ('mla64r8', 'mha'), ('mla64r8', 'gqa4'))
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0145  # the smallest per-seed sd of the full-rank-latent question's three contrasts
CAP = 32  # seeds per arm: the reused arms have seeds 5-36
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)
CHECK = range(29, 31)  # MHA's seeds retrained to check the reused runs
CHECK_TOLERANCE = 1e-4  # nats: a hundredth of SMALLEST

_PILOT = flags.DEFINE_string('pilot_sweep', 'runs/rope_pilot', "MLA-64-R8's pilot (seeds 0-4).")
_CHECK = flags.DEFINE_string('check_sweep', 'runs/rope_check', "MHA's seeds 29-30, retrained.")
_R8 = flags.DEFINE_string('r8_sweep', 'runs/rope_mla64r8', "MLA-64-R8's tested seeds.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis and reuse check only.')


def power_analysis() -> int:
    """Print each contrast's pilot estimate and need; return the seeds per arm."""
    pilot = baseline_pilot(PILOT) | pilot_losses(_PILOT.value, 'mla64r8', 'rope_pilot_seeds', PILOT)
    return study_power(pilot, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP)


def run() -> int:
    n = power_analysis()
    reuse_check(
        swept(_CHECK.value), 'results/latent_contrast_seeds.csv', 'mha', CHECK, CHECK_TOLERANCE
    )
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = committed(
        'results/latent_contrast_seeds.csv', {a: a for a in ('mha', 'mla64', 'gqa4')}, seeds
    )
    found |= swept(_R8.value, {'mla': 'mla64r8'})
    write_seeds('rope_contrast_seeds', found, ARMS, seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
