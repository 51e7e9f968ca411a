r"""The per-arm-rate question's rate choice, power analysis, reuse check and per-seed CSV
(rate_statement.md).

  python docs/studies/mla/rate_csv.py --power_only --grid_sweeps=runs/rate_grid \
      --check_sweep=runs/rate_check
  python docs/studies/mla/rate_csv.py --grid_sweeps=runs/rate_grid \
      --check_sweep=runs/rate_check --mha_sweep=runs/rate_mha --mla64_sweep=runs/rate_mla64

The choice reads each arm's seeds 0-4 at every rate run: at 1e-3 the committed runs (MHA's in
../kv_contrast/results/kv_contrast_seeds.csv, MLA-64's in
../kv_layouts/results/kv_layouts_seeds.csv), at the other rates the grid's sweeps (`--grid_sweeps`,
whose losses it copies to results/rate_pilot_seeds.csv; without them, that copy). Each arm's rate is
lm.experiments.lr_grid.choose over them; a rate chosen at the edge of the rates run names the next
rate to train, as the statement's rule says, and stops. The power analysis sizes the one contrast
from the chosen rates' pilot runs. The reuse check compares MHA's seeds 31-32 retrained now
(`--check_sweep`) with results/latent_contrast_seeds.csv. The CSV, results/rate_contrast_seeds.csv
(arm, seed, eval_loss), holds each arm at its chosen rate: the reused runs
(results/latent_contrast_seeds.csv) where that rate is 1e-3, else its tested sweep.
"""

from absl import flags
from rate_sweep import ARMS, RECIPE, choose, point_name
from study_rows import committed, grid_losses, point_losses, reuse_check, write_seeds
from study_rows import power_analysis as study_power

from lm.cli import run_app

SMALLEST = 0.01  # nats: the smallest difference worth resolving here
SD_FLOOR = 0.0117  # the smallest per-seed sd of the earlier MLA questions' seven contrasts
CAP = 24  # seeds per arm: this session's CPU time for two fresh arms
FIRST = 5  # seeds 0-4 are the pilot's
PILOT = range(FIRST)
CHECK = range(31, 33)  # MHA's seeds retrained to check the reused runs
CHECK_TOLERANCE = 1e-4  # nats: a hundredth of SMALLEST
CONTRASTS = (('mla64', 'mha'),)

_GRID = flags.DEFINE_list('grid_sweeps', ['runs/rate_grid'], 'The rate grid sweeps (seeds 0-4).')
_CHECK = flags.DEFINE_string('check_sweep', 'runs/rate_check', "MHA's seeds 31-32, retrained.")
_MHA = flags.DEFINE_string('mha_sweep', 'runs/rate_mha', "MHA's tested seeds at its rate.")
_MLA = flags.DEFINE_string('mla64_sweep', 'runs/rate_mla64', "MLA-64's tested seeds at its rate.")
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The choice, power and reuse check only.')


def pilot_losses() -> dict[tuple[str, int], str]:
    """{(point, seed): eval_loss} of every arm's seeds 0-4 at every rate run."""
    found = committed(
        '../kv_contrast/results/kv_contrast_seeds.csv', {'mha': point_name('mha', RECIPE)}, PILOT
    )
    found |= committed(
        '../kv_layouts/results/kv_layouts_seeds.csv', {'mla': point_name('mla64', RECIPE)}, PILOT
    )
    return found | grid_losses(_GRID.value, 'rate_pilot_seeds', PILOT)


def run() -> int:
    pilot = pilot_losses()
    choices = {arm: choose(arm, pilot, PILOT) for arm in ARMS}
    edges = [nxt for _, nxt in choices.values() if nxt]
    if edges:
        raise SystemExit(f'chosen at an edge: train {",".join(edges)} (seeds 0-4) and rerun')
    chosen = {arm: lr for arm, (lr, _) in choices.items()}
    renamed = {(arm, s): pilot[point_name(arm, lr), s] for arm, lr in chosen.items() for s in PILOT}
    n = study_power(renamed, CONTRASTS, PILOT, SMALLEST, SD_FLOOR, CAP)
    reused = 'results/latent_contrast_seeds.csv'
    check = point_losses(_CHECK.value, 'mha', 'mha')
    reuse_check(check, reused, 'mha', CHECK, CHECK_TOLERANCE)
    if _POWER_ONLY.value:
        return 0
    seeds = range(FIRST, FIRST + n)
    found = {}
    for arm, sweep in (('mha', _MHA.value), ('mla64', _MLA.value)):
        if chosen[arm] == RECIPE:
            found |= committed(reused, {arm: arm}, seeds)
        else:
            found |= point_losses(sweep, point_name(arm, chosen[arm]), arm)
    write_seeds('rate_contrast_seeds', found, tuple(ARMS), seeds)
    return 0


if __name__ == '__main__':
    run_app(run)
