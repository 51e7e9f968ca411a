r"""The third round's rate choices and power figures (own_rate_statement.md): GQA-2's and MQA's
rate grid at 8 pairs (seeds 0-1, the grid sweep's summary_seeds.csv: validation accuracy on the
rows of `recall_seed` 0 at step 4000) as results/own_rate_grid.csv for the page's 'lr_screen'
table, each arm's rate by `lm.experiments.lr_grid.choose_by_accuracy`, the 3e-3 runs beside the
earlier rounds' runs of the same seeds, and the power of the tested family at 8 seeds:

  python docs/studies/mqar_capacity/own_rate_csv.py --grid_sweep=runs/mqc/r3_grid

The last line printed is `tested POINTS`: the tested sweep's points (each arm at its rate).
"""

import csv
import importlib.util
import os
import statistics

from absl import flags

from lm.cli import run_app
from lm.experiments import screen_choices, t_test_power, write_csv

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ('gqa2_p8', 'mqa_p8')  # the tested arms, as the earlier rounds named their 3e-3 cells
SEEDS = (0, 1)  # the grid's seeds
TESTED = 8  # seeds per arm in the tested sweep (8-15)
ALPHA = 0.025  # Holm's first step over the family of two
EFFECTS = (10.0, 20.0, 40.0)  # points of accuracy
EARLIER = os.path.join(HERE, 'results', 'round2_seeds.csv')  # both arms' 3e-3 runs at 8 pairs
SWEEP = os.path.join(HERE, *[os.pardir] * 3, 'configs', 'sweeps', 'mqar_capacity.py')


def own_rates() -> tuple[float, ...]:
    """The grid's rates: OWN_RATES of configs/sweeps/mqar_capacity.py."""
    spec = importlib.util.spec_from_file_location('_mqar_capacity', SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OWN_RATES


_GRID = flags.DEFINE_string('grid_sweep', 'runs/mqc/r3_grid', 'The grid sweep (seeds 0-1).')
_OUT = flags.DEFINE_string(
    'out', os.path.join(HERE, 'results', 'own_rate_grid.csv'), 'The grid CSV to write.'
)


def read_rows(path: str) -> list[dict]:
    """A CSV's rows, or one line naming the file."""
    if not os.path.isfile(path):
        raise SystemExit(f'{path}: no such file (has the sweep finished?)')
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def grid_rows(summary: list[dict]) -> list[dict]:
    """The lr_screen rows (point = arm, lr, seed, eval_loss, eval_recall_accuracy) of a grid
    sweep's per-seed rows, whose points are '<arm>_lr<rate>'; every arm needs every rate's seeds."""
    rows = []
    for r in summary:
        arm, _, lr = r['point'].rpartition('_lr')
        if arm in ARMS and int(r['seed']) in SEEDS:
            rows.append(
                {
                    'point': arm,
                    'lr': lr,
                    'seed': int(r['seed']),
                    'eval_loss': r['eval_loss'],
                    'eval_recall_accuracy': r['eval_recall_accuracy'],
                }
            )
    for arm in ARMS:
        have = {(float(r['lr']), r['seed']) for r in rows if r['point'] == arm}
        missing = [f'{lr:g} seed {s}' for lr in own_rates() for s in SEEDS if (lr, s) not in have]
        if missing:
            raise SystemExit(f'{arm}: grid incomplete (no run for {", ".join(missing)})')
    return sorted(rows, key=lambda r: (r['point'], float(r['lr']), r['seed']))


def reruns(rows: list[dict]) -> list[str]:
    """The grid's 3e-3 runs beside the earlier rounds' runs of the same arm and seeds (their
    validation accuracy at step 4000): a check that the code still trains them alike."""
    earlier = {(r['point'], int(r['seed'])): r for r in read_rows(EARLIER)}
    lines = []
    for r in rows:
        if float(r['lr']) == 3e-3 and (r['point'], r['seed']) in earlier:
            old = float(earlier[r['point'], r['seed']]['validation_recall_accuracy'])
            new = float(r['eval_recall_accuracy'])
            lines.append(
                f'{r["point"]} seed {r["seed"]} at 3e-3: {new:.6f} now, {old:.6f} in the earlier '
                f'round ({"same" if new == old else f"differs by {new - old:+.6f}"})'
            )
    return lines


def power_lines() -> list[str]:
    """The tested family's power at TESTED seeds for EFFECTS, at the per-seed sd of each earlier
    arm's difference from MHA (round2_seeds.csv, seeds 0-7, points of accuracy)."""
    acc: dict[str, dict[int, float]] = {}
    for r in read_rows(EARLIER):
        acc.setdefault(r['point'], {})[int(r['seed'])] = 100 * float(r['eval_recall_accuracy'])
    lines = []
    for arm in ('gqa2_p8', 'mqa_p8', 'mqa_hd32_p8'):
        sd = statistics.stdev(acc[arm][s] - acc['mha_p8'][s] for s in acc['mha_p8'])
        power = ', '.join(f'{e:g} points {t_test_power(e, sd, ALPHA, TESTED):.2f}' for e in EFFECTS)
        lines.append(f'sd of {arm} - mha_p8 at 3e-3: {sd:.1f} points; power at {TESTED}: {power}')
    return lines


def main() -> int:
    rows = grid_rows(read_rows(os.path.join(_GRID.value, 'summary_seeds.csv')))
    write_csv(_OUT.value, rows)
    print(f'{_OUT.value}: {len(rows)} rows')
    for line in reruns(rows) + power_lines():
        print(line)
    chosen = screen_choices(rows)
    for arm in ARMS:
        print(f'{arm}: lr {chosen[arm]:g}')
    print('tested ' + ','.join(f'{arm}_lr{chosen[arm]:g}' for arm in ARMS))
    return 0


if __name__ == '__main__':
    run_app(main)
