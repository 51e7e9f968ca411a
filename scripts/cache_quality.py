r"""The quality cost of quantized KV caches over a sweep's seeds: every run of --points is
evaluated again under the sweep's protocol (its validation split, each window once), decoding
each window token by token through caches stored as each of --kv_cache_dtypes
(lm/infer/cached_eval.py). Per-seed rows arm, seed, eval_loss, the input of
scripts/make_tables.py's 'seeds' tables (mean, 95% interval, Holm-corrected paired
differences), go to --out for the --points (`mha` beside `mha+int8`, `mha+kivi4`) and, with
--sweep_out, every point of the sweep in float, so each table corrects for its own comparisons.

  python scripts/cache_quality.py --sweep_dir=runs/kv_layouts --points=mha \
      --kv_cache_dtypes=int8,kivi4 --out=docs/studies/kv_layouts/results/kv_cache_seeds.csv \
      --sweep_out=docs/studies/kv_layouts/results/kv_layouts_seeds.csv \
      --pareto_table=docs/studies/kv_layouts/results/kv_layouts_pareto.csv

--pareto_table also writes the rows with each arm's KV-cache bytes per token of one evaluation
window, for `scripts/plot_pareto.py --table`.
"""

import os

from absl import flags

from lm.cli import check_writable_dir, run_app
from lm.experiments import check_output_path, pareto_rows, quantized_rows, write_csv
from lm.train import StopRequest

_SWEEP_DIR = flags.DEFINE_string('sweep_dir', None, 'A finished sweep.', required=True)
_POINTS = flags.DEFINE_list('points', ['mha'], 'Points whose runs are evaluated again.')
_DTYPES = flags.DEFINE_list('kv_cache_dtypes', ['int8', 'kivi4'], 'Quantized caches.')
_OUT = flags.DEFINE_string('out', None, 'CSV to write (arm, seed, eval_loss).', required=True)
_SWEEP_OUT = flags.DEFINE_string('sweep_out', '', "Also the sweep's own rows (every point, float).")
_PARETO = flags.DEFINE_string('pareto_table', '', 'Also this CSV, for plot_pareto.py --table.')
_PANEL = flags.DEFINE_string('panel', 'KV layouts and caches', "The Pareto table's panel title.")


def check_flags() -> None:
    """One-line errors for empty lists and unwritable or shared output paths, and for an output
    that is one of the sweep's own files."""
    for flag in (_POINTS, _DTYPES):
        if flags.FLAGS[flag.name].present and not flag.value:
            raise ValueError(f'--{flag.name}: expected one or more values, got none')
    outputs = (('--out', _OUT.value), ('--sweep_out', _SWEEP_OUT.value))
    named = [(flag, path) for flag, path in (*outputs, ('--pareto_table', _PARETO.value)) if path]
    for flag, path in named:
        check_output_path(path, flag, '.csv', _SWEEP_DIR.value)
        check_writable_dir(os.path.dirname(os.path.abspath(path)), flag)
    for i, (flag, path) in enumerate(named):
        for other, other_path in named[:i]:
            if os.path.abspath(path) == os.path.abspath(other_path):
                raise ValueError(f'{other} and {flag} name the same file {path}; give each its own')


def run() -> int:
    check_flags()
    with StopRequest() as stop:  # SIGTERM: stop between batches; nothing written
        rows = quantized_rows(_SWEEP_DIR.value, _POINTS.value, _DTYPES.value, stop=stop)
    out = [r for r in rows if r['arm'].partition('+')[0] in _POINTS.value]
    write_csv(_OUT.value, out)
    if _SWEEP_OUT.value:
        write_csv(_SWEEP_OUT.value, [r for r in rows if '+' not in r['arm']])
    if _PARETO.value:
        write_csv(_PARETO.value, pareto_rows(_SWEEP_DIR.value, rows, _PANEL.value))
    print(f'wrote {_OUT.value}: {len(out)} rows')
    return 0


if __name__ == '__main__':
    run_app(run)
