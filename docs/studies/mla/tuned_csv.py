r"""The tuned-MLA-64-P16 question's rate choice, power analysis and per-seed CSV
(tuned_statement.md).

  python docs/studies/mla/tuned_csv.py --power_only --grid_sweeps=runs/tuned_grid
  python docs/studies/mla/tuned_csv.py --grid_sweeps=runs/tuned_grid \
      --p16_sweep=runs/tuned_p16 --mha_sweep=runs/tuned_mha

The choice reads MLA-64-P16's seeds 0-4 at every rate run: at 1e-3 the wider-RoPE question's
pilot (results/width_pilot_seeds.csv), at the other rates the grid's sweeps (`--grid_sweeps`,
whose losses it copies to results/tuned_pilot_seeds.csv; without them, that copy), by
rate_sweep.choose. MHA's rate is 2e-3, the per-arm-rate question's choice: its seeds 0-4 from
results/rate_pilot_seeds.csv size the contrast. The CSV, results/tuned_contrast_seeds.csv (arm,
seed, eval_loss), holds MHA at 2e-3 (seeds 5-8 from results/rate_contrast_seeds.csv, later ones
from `--mha_sweep`) and MLA-64-P16 at its rate (results/rotation_contrast_seeds.csv if that is
1e-3, else `--p16_sweep`).
"""

from absl import flags
from rate_sweep import RECIPE, choose, point_name
from study_rows import committed, grid_losses, point_losses, write_seeds
from study_rows import power_analysis as study_power

from lm.cli import run_app

MHA_RATE = 2e-3  # the per-arm-rate question's choice for MHA
SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0269  # the per-arm-rate question's tested per-seed sd at 2e-3 (amendment 1)
FLOOR = 4  # seeds per arm at least: MHA's seeds 5-8 at 2e-3 exist
CAP = 24  # seeds per arm at most: this session's CPU time
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)
MHA_TESTED = range(FIRST, 9)  # MHA's seeds at 2e-3 in results/rate_contrast_seeds.csv
CONTRASTS = (('mla64p16', 'mha'),)

_GRID = flags.DEFINE_list('grid_sweeps', ['runs/tuned_grid'], "MLA-64-P16's rate grid (0-4).")
_P16 = flags.DEFINE_string('p16_sweep', 'runs/tuned_p16', "MLA-64-P16's tested seeds.")
_MHA = flags.DEFINE_string('mha_sweep', 'runs/tuned_mha', "MHA's seeds past 8 at 2e-3.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The choice and power analysis only.')


def pilot_losses() -> dict[tuple[str, int], str]:
    """{(point, seed): eval_loss} of MLA-64-P16's seeds 0-4 at every rate run and MHA's at 2e-3."""
    found = committed(
        'results/width_pilot_seeds.csv', {'mla64p16': point_name('mla64p16', RECIPE)}, PILOT
    )
    mha = point_name('mha', MHA_RATE)
    found |= committed('results/rate_pilot_seeds.csv', {mha: mha}, PILOT)
    return found | grid_losses(_GRID.value, 'tuned_pilot_seeds', PILOT)


def run() -> int:
    pilot = pilot_losses()
    lr, edge = choose('mla64p16', pilot, PILOT)
    if edge:
        raise SystemExit(f'chosen at an edge: train {edge} (seeds 0-4) and rerun')
    rates = {'mla64p16': lr, 'mha': MHA_RATE}
    renamed = {(arm, s): pilot[point_name(arm, r), s] for arm, r in rates.items() for s in PILOT}
    n = max(study_power(renamed, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP), FLOOR)
    print(f'seeds per arm with the floor of {FLOOR}: {n}')
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = committed('results/rate_contrast_seeds.csv', {'mha': 'mha'}, MHA_TESTED)
    mha = point_name('mha', MHA_RATE)
    if seeds.stop > MHA_TESTED.stop:
        more = point_losses(_MHA.value, mha, 'mha').items()
        found |= {(a, s): v for (a, s), v in more if s >= MHA_TESTED.stop}
    if lr == RECIPE:
        found |= committed('results/rotation_contrast_seeds.csv', {'mla64p16': 'mla64p16'}, seeds)
    else:
        found |= point_losses(_P16.value, point_name('mla64p16', lr), 'mla64p16')
    write_seeds('tuned_contrast_seeds', found, ('mha', 'mla64p16'), seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
