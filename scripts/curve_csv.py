r"""Learning curves as CSV for docs/results (the 'curve' and 'last_step' tables of
lm.experiments.tables): one or more TensorBoard scalars of each run, read from its event files.

  python scripts/curve_csv.py --tag=eval/recall_accuracy --out=docs/results/mqar_calibration.csv \
      --runs=lr3e-3=runs/mqar_lr3e-3/tb,lr1e-3=runs/mqar_lr1e-3/tb
  python scripts/curve_csv.py --out=docs/results/recall_sweep_curves.csv --sweep_dir=runs/recall

  python scripts/curve_csv.py --tag=eval/recall_accuracy,eval/recall_accuracy/depth0 \\
      --out=docs/results/passkey_calibration.csv --runs=s0=runs/passkey/tb/mha_s0

Rows: run, step, metric, value (a metric is its tag without the first part: recall_accuracy).
"""

import os

from absl import flags

from lm.cli import run_app
from lm.experiments import write_csv

_TAG = flags.DEFINE_list('tag', ['eval/recall_accuracy'], 'The scalars to read, in column order.')
_OUT = flags.DEFINE_string('out', None, 'CSV to write.', required=True)
_RUNS = flags.DEFINE_list('runs', [], 'NAME=TB_DIR of each run, in column order.')
_SWEEP_DIR = flags.DEFINE_string(
    'sweep_dir', '', "Instead of --runs: every run of a sweep (the sweep's plan order)."
)


def sweep_runs(sweep_dir: str) -> list[str]:
    """NAME=TB_DIR of every finished run of a sweep directory, in the order they started."""
    from lm.experiments import STARTED, read_result

    names = [
        n
        for n in os.listdir(sweep_dir)
        if os.path.isdir(os.path.join(sweep_dir, n)) and read_result(os.path.join(sweep_dir, n))
    ]
    if not names:
        raise ValueError(f'--sweep_dir={sweep_dir}: no finished runs')
    names.sort(key=lambda n: os.path.getmtime(os.path.join(sweep_dir, n, STARTED)))
    return [f'{n}={os.path.join(sweep_dir, "tb", n)}' for n in names]


def run() -> int:
    from tensorboard.backend.event_processing import event_accumulator

    if bool(_RUNS.value) == bool(_SWEEP_DIR.value):
        raise ValueError('give exactly one of --runs and --sweep_dir')
    rows = []
    for arg in _RUNS.value or sweep_runs(_SWEEP_DIR.value):
        name, _, logdir = arg.partition('=')
        if not logdir:
            raise ValueError(f'{arg!r}: --runs takes NAME=TB_DIR')
        acc = event_accumulator.EventAccumulator(logdir, size_guidance={'scalars': 0})
        acc.Reload()
        for tag in _TAG.value:
            if tag not in acc.Tags()['scalars']:
                raise ValueError(f'{logdir}: no scalar {tag!r}')
            by_step = {e.step: e.value for e in acc.Scalars(tag)}  # later writes win
            metric = tag.split('/', 1)[-1]
            rows += [
                {'run': name, 'step': s, 'metric': metric, 'value': f'{v:.4f}'}
                for s, v in sorted(by_step.items())
            ]
    write_csv(_OUT.value, rows)
    print(f'wrote {len(rows)} rows to {_OUT.value}')
    return 0


if __name__ == '__main__':
    run_app(run)
