r"""Quality against KV-cache bytes per token, with the Pareto front: one point per arm (sweep
point, uptraining arm), seeds as 95% t-interval error bars (lm.experiments.pareto).

  python scripts/plot_pareto.py --run_dir=runs/kinds5 --out=runs/kinds5/pareto.png
  python scripts/plot_pareto.py --run_dir=width=runs/kinds5 --run_dir=params=runs/kinds5_params \
      --metric=eval/recall_accuracy --out=pareto.png --tb_dir=runs/kinds5/tb
  python scripts/plot_pareto.py --table=docs/studies/sweeps/results/pareto_reported.csv \
      --out=pareto.png

--run_dir reads an experiment's out_dir (a --sweep_dir, an ablation's --out_dir): each finished
run's result.json and its saved config (KV bytes); runs named <arm>_s<k> are seeds of <arm>.
Several --run_dir share one panel, each a family (NAME=PATH names it; default: the directory's
name); without NAME=, a single directory's points are coloured by attention kind. --table reads
a CSV (columns in lm/experiments/pareto.py), whose `panel` column splits the figure. sweep.py
and uptrain_ablation.py draw the same figure at their end (<out_dir>/pareto_eval_loss.png, the
ablation's pareto_heldout_loss.png at each arm's chosen learning rate, and an image in their
TensorBoard directory).
"""

import dataclasses
import os

from absl import flags

from lm.analysis import save
from lm.cli import run_app
from lm.experiments import (
    Point,
    check_output_file,
    front,
    higher_is_better,
    log_images,
    pareto_figure,
    pareto_points,
    read_table,
    runs_in,
)

_RUN_DIR = flags.DEFINE_multi_string('run_dir', [], '[NAME=]PATH of an experiment out_dir.')
_TABLE = flags.DEFINE_string('table', '', 'A CSV of points (instead of --run_dir).')
_METRIC = flags.DEFINE_string(
    'metric', 'eval/loss', "Quality: 'eval/loss', 'eval/recall_accuracy', any eval/<name>."
)
_OUT = flags.DEFINE_string('out', 'pareto.png', 'The PNG to write.')
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Also log the image to this TensorBoard dir's 'pareto'."
)
_TITLE = flags.DEFINE_string('title', '', 'Title prefix.')
_EXCLUDE = flags.DEFINE_multi_string('exclude', [], 'Leave out arms whose label has this text.')


def dir_points(specs: list[str], metric: str) -> list[Point]:
    points = []
    for spec in specs:
        name, _, path = spec.rpartition('=')
        if not os.path.isdir(path):
            raise ValueError(f'--run_dir: {path} is not a directory')
        found = pareto_points(runs_in(path), metric)
        if name or len(specs) > 1:
            family = name or os.path.basename(os.path.normpath(path))
            found = [dataclasses.replace(p, family=family) for p in found]
        points += found
    return points


def run() -> int:
    if bool(_RUN_DIR.value) == bool(_TABLE.value):
        raise ValueError('give either --run_dir (one or more) or --table')
    check_output_file(_OUT.value, '--out', '.png')
    metric = _METRIC.value
    if _TABLE.value:
        points = read_table(_TABLE.value, metric)
    else:
        points = dir_points(_RUN_DIR.value, metric)
    kept = [p for p in points if not any(text in p.label for text in _EXCLUDE.value)]
    if points and not kept:
        raise ValueError(f'--exclude left no points (it matches every one of the {len(points)})')
    points = kept
    image = save(pareto_figure(points, metric, _TITLE.value), _OUT.value)
    if _TB_DIR.value:
        log_images({metric: image}, _TB_DIR.value)
    print(f'wrote {_OUT.value}: {len(points)} arms; Pareto front of each panel:')
    for panel in dict.fromkeys(p.panel for p in points):
        best = front([p for p in points if p.panel == panel], higher_is_better(metric))
        on = [f'{p.label} ({p.kv_bytes:,.0f} B, {p.quality.mean:.4f})' for p in best]
        print(f'  {panel or "-"}: {", ".join(on)}')
    return 0


if __name__ == '__main__':
    run_app(run)
