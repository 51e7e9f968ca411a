r"""The full-rank-latent question's power analysis and per-seed CSV (latent_statement.md).

  python docs/studies/mla/latent_csv.py --power_only --pilot_sweep=runs/latent_pilot
  python docs/studies/mla/latent_csv.py --pilot_sweep=runs/latent_pilot \
      --mla128_sweep=runs/latent_mla128 --gqa4_sweep=runs/latent_gqa4

The power analysis reads MLA-128's pilot (seeds 0-4, `--pilot_sweep`, whose losses it copies to
results/latent_pilot_seeds.csv; without the sweep, that copy) beside MHA's and GQA-4's seeds 0-4
(../kv_contrast/results/kv_contrast_seeds.csv) and MLA-64's (../kv_layouts/results/
kv_layouts_seeds.csv), and fixes the seed count by the statement's rule. The CSV,
results/latent_contrast_seeds.csv (arm, seed, eval_loss), joins by seed MHA's and MLA-64's runs
(results/mla_contrast_seeds.csv, seeds 5-28; `--more_sweep` for seeds 29 on), GQA-4's seeds 5-19
(../kv_contrast/results/kv_contrast_seeds.csv) and 20 on (`--gqa4_sweep`), and MLA-128's
(`--mla128_sweep`).
"""

from absl import flags
from study_rows import baseline_pilot, committed, pilot_losses, swept, write_seeds
from study_rows import power_analysis as study_power

from lm.cli import run_app

ARMS = ('mha', 'mla64', 'mla128', 'gqa4')
CONTRASTS = (('mla128', 'mha'), ('mla64', 'mla128'), ('mla128', 'gqa4'))
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0155  # the smaller per-seed sd of the first MLA question's two MLA contrasts
CAP = 32  # seeds per arm, by CPU time
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)

_PILOT = flags.DEFINE_string('pilot_sweep', 'runs/latent_pilot', "MLA-128's pilot (seeds 0-4).")
_MLA128 = flags.DEFINE_string('mla128_sweep', 'runs/latent_mla128', "MLA-128's tested seeds.")
_GQA4 = flags.DEFINE_string('gqa4_sweep', 'runs/latent_gqa4', "GQA-4's seeds 20 on.")
_MORE = flags.DEFINE_string('more_sweep', '', "MHA's and MLA-64's seeds 29 on (N > 24 only).")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'Print the power analysis only.')


def power_analysis() -> int:
    """Print each contrast's pilot estimate and need; return the seeds per arm."""
    pilot = baseline_pilot(PILOT) | pilot_losses(
        _PILOT.value, 'mla128', 'latent_pilot_seeds', PILOT
    )
    return study_power(pilot, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP)


def run() -> int:
    n = power_analysis()
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = committed('results/mla_contrast_seeds.csv', {'mha': 'mha', 'mla': 'mla64'}, seeds)
    found |= committed('../kv_contrast/results/kv_contrast_seeds.csv', {'gqa4': 'gqa4'}, seeds)
    found |= swept(_GQA4.value) | swept(_MLA128.value, {'mla': 'mla128'})
    if _MORE.value:
        found |= swept(_MORE.value, {'mla': 'mla64'})
    write_seeds('latent_contrast_seeds', found, ARMS, seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
