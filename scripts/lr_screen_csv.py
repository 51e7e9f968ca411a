r"""A learning-rate screen as one CSV for docs/results (the 'lr_screen' table of
lm.experiments.tables): the per-seed CSVs of one sweep per rate, stacked with an 'lr' column and
cut to the screened seeds.

  python scripts/lr_screen_csv.py --seeds=0,1 --out=docs/results/passkey_lr_screen.csv \
      --rates=3e-3=docs/results/passkey_seeds.csv,1e-3=docs/results/passkey_lr1e-3_seeds.csv,3e-4=runs/passkey_lr3e-4/summary_seeds.csv

Rows: point, lr, seed, then the per-seed CSVs' value columns (which must agree).

With --choose_on=SCREEN_CSV (such a screen), the rows of each of the screen's points at the rate
the screen chose for it instead (lm.experiments.lr_grid.screen_choices; only those rows need
every seed), arms named 'POINT at lr LR' and no lr column: a 'seeds' table of every variant at
its own rate, e.g. on a second held-out set (scripts/eval_sweep.py's CSVs):

  python scripts/lr_screen_csv.py --seeds=0,1,2,3,4 --choose_on=docs/results/passkey_lr_screen.csv \
      --out=docs/results/passkey_chosen_test.csv \
      --rates=1e-3=docs/results/passkey_lr1e-3_test.csv,3e-4=docs/results/passkey_lr3e-4_test.csv
"""

import csv

from absl import flags

from lm.cli import run_app
from lm.experiments import at_chosen_rates, check_seeds, stack, write_csv

_RATES = flags.DEFINE_list('rates', [], 'LR=CSV of each rate: a per-seed CSV (point, seed, ...).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1'], 'The screened seeds (every rate must have them).')
_OUT = flags.DEFINE_string('out', None, 'CSV to write.', required=True)
_CHOOSE_ON = flags.DEFINE_string(
    'choose_on', '', "A screen CSV: keep each of its points' rows at the rate it chose there."
)


def read_rates(rates: list[str]) -> dict[str, list[dict]]:
    """{LR: rows} of every LR=CSV; refuses a CSV that is not per-seed, or whose columns differ
    from the first's."""
    if not rates:
        raise ValueError('--rates: none given, expected LR=CSV,...')
    out, columns = {}, None
    for item in rates:
        lr, sep, path = item.partition('=')
        if not sep or not path:
            raise ValueError(f'--rates: {item!r}, expected LR=CSV')
        try:
            float(lr)
        except ValueError:
            raise ValueError(f'--rates: {item!r}, LR must be a number') from None
        with open(path, newline='') as f:
            rows = list(csv.DictReader(f))
        if not rows or list(rows[0])[:2] != ['point', 'seed']:
            raise ValueError(f'--rates: {path} is not a per-seed CSV (point, seed, values...)')
        if columns is None:
            columns = list(rows[0])
        elif list(rows[0]) != columns:
            raise ValueError(f'--rates: {path} has columns {list(rows[0])}, expected {columns}')
        out[lr] = rows
    return out


def main() -> int:
    seeds = [int(s) for s in _SEEDS.value]
    rows = stack(read_rates(_RATES.value), seeds)
    try:
        if _CHOOSE_ON.value:
            with open(_CHOOSE_ON.value, newline='') as f:
                rows = at_chosen_rates(rows, list(csv.DictReader(f)), seeds)
        else:
            check_seeds(rows, seeds)
    except ValueError as e:
        raise ValueError(f'--rates: {e}') from None
    write_csv(_OUT.value, rows)
    print(f'{_OUT.value}: {len(rows)} rows')
    return 0


if __name__ == '__main__':
    run_app(main)
