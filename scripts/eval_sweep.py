r"""Every finished run of a sweep (`<arm>_s<seed>`) evaluated again, its final checkpoint under
its own protocol, with the data replaced by --config's (only --config.data.* may change: the
model and training are the checkpoint's). Per-seed rows point, seed, eval_loss (and
eval_recall_accuracy for a recall task) go to --out, the input of scripts/make_tables.py's
'seeds' tables (mean, 95% interval, Holm-corrected paired differences).

A run that trained with a data setting other than --config's (a sweep over recall pairs, say,
or a config file of another pair count) is refused unless that key is set on the command line.

Its use: a second held-out set for a sweep whose settings were chosen on its first, e.g. the
passkey sweep at 1e-3 (the rate picked on recall_seed 0's held-out examples) scored on
recall_seed 1's:

  python scripts/eval_sweep.py --sweep_dir=runs/passkey_lr1e-3 \
      --config=configs/recall/passkey.py --config.data.recall_seed=1 \
      --out=docs/studies/recall/results/passkey_lr1e-3_test.csv
"""

import os

from absl import flags
from ml_collections import config_flags

from lm.cli import bootstrap, check_data_overrides, check_writable_dir, run_app
from lm.experiments import check_output_path, finished_runs, heldout_rows, write_csv
from lm.train import StopRequest, stored_config

_SWEEP_DIR = flags.DEFINE_string('sweep_dir', None, 'A sweep with finished runs.', required=True)
_CONFIG = config_flags.DEFINE_config_file(
    'config',
    None,
    "Config whose data replaces each run's (only --config.data.* overrides).",
)
_OUT = flags.DEFINE_string(
    'out', None, 'CSV to write (point, seed, eval_loss, ...).', required=True
)


def run() -> int:
    if _CONFIG.value is None:
        raise ValueError('--config is required: the data to evaluate on')
    check_data_overrides('eval_sweep.py')
    check_output_path(_OUT.value, '--out', '.csv', _SWEEP_DIR.value)
    check_writable_dir(os.path.dirname(os.path.abspath(_OUT.value)), '--out')
    if not os.path.isdir(_SWEEP_DIR.value):
        raise FileNotFoundError(f'--sweep_dir={_SWEEP_DIR.value} does not exist')
    runs = finished_runs(_SWEEP_DIR.value)
    overridden = set(config_flags.get_override_values(flags.FLAGS['config']))
    bootstrap(stored_config(runs[0][1]))
    with StopRequest() as stop:  # SIGTERM: stop between batches; nothing written
        rows = heldout_rows(runs, _CONFIG.value.data, overridden, stop=stop)
    write_csv(_OUT.value, rows)
    print(f'wrote {_OUT.value}: {len(rows)} rows')
    return 0


if __name__ == '__main__':
    run_app(run)
