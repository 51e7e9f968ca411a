r"""The capacity study's per-seed CSV (the 'capacity' table of lm.experiments.tables) from its
ensemble runs: one row per member with its cell's KV state and pairs, read from each run's
saved config and results.json.

  python docs/studies/mqar_capacity/seeds_csv.py --runs=runs/mqz/mha_p4,runs/mqz/mqa_p4 \
      --out=docs/studies/mqar_capacity/results/capacity_seeds.csv

Columns: point, kv_dims (KV heads x head_dim, per token per layer), kv_bytes_per_token (bf16,
K and V, every layer), pairs, seed, eval_loss, eval_recall_accuracy.
"""

import json
import os

from absl import flags

from lm.cli import run_app
from lm.experiments import write_csv
from lm.model import kv_cache_bytes, model_config
from lm.train import stored_config

_RUNS = flags.DEFINE_list('runs', [], 'Workdirs of the ensemble runs, one per cell.')
_OUT = flags.DEFINE_string('out', None, 'CSV to write.', required=True)


def cell_rows(workdir: str) -> list[dict]:
    """One row per member of the ensemble run in `workdir`."""
    config = stored_config(workdir)
    cfg = model_config(config.model)
    with open(os.path.join(workdir, 'results.json')) as f:
        members = json.load(f)['members']
    kv_bytes = kv_cache_bytes(cfg, 1)  # bf16 K and V of every layer
    common = {
        'point': os.path.basename(os.path.normpath(workdir)),
        'kv_dims': kv_bytes // (2 * 2 * cfg.num_layers),
        'kv_bytes_per_token': kv_bytes,
        'pairs': config.data.recall_pairs,
    }
    return [
        {
            **common,
            'seed': m['seed'],
            'eval_loss': m['eval']['loss'],
            'eval_recall_accuracy': m['eval']['recall_accuracy'],
        }
        for m in members
    ]


def run() -> int:
    rows = [row for workdir in _RUNS.value for row in cell_rows(workdir)]
    write_csv(_OUT.value, rows)
    print(f'wrote {len(rows)} rows to {_OUT.value}')
    return 0


if __name__ == '__main__':
    run_app(run)
