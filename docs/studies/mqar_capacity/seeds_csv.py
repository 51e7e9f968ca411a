r"""The capacity study's per-seed CSV (the 'capacity' table of lm.experiments.tables) from its
ensemble runs: one row per member with its cell's KV state and pairs, read from each run's
saved config and results.json.

  python docs/studies/mqar_capacity/seeds_csv.py --runs=runs/mqz/mha_p4,runs/mqz/mqa_p4 \
      --out=docs/studies/mqar_capacity/results/capacity_seeds.csv \
      --plot=docs/studies/mqar_capacity/capacity.png

Columns: point, kv_heads, head_dim, kv_dims (their product: per token per layer),
kv_bytes_per_token (bf16, K and V, every layer), pairs, seed, eval_loss, eval_recall_accuracy.

With --heldout=CSV (scripts/eval_sweep.py's per-seed rows of the runs split out of the
ensembles by `scripts/sweep.py --ensemble`, scored on a second held-out set), eval_loss and
eval_recall_accuracy are that CSV's (matched by point, the ensemble's directory name, and seed),
and the runs' own evaluation, on the rows the rate was chosen on, moves to validation_loss and
validation_recall_accuracy:

  python docs/studies/mqar_capacity/seeds_csv.py \
      --runs=runs/mqc/cells/ensembles/mha_p4,runs/mqc/cells/ensembles/mqa_p4 \
      --heldout=runs/mqc/cells_test.csv \
      --out=docs/studies/mqar_capacity/results/calibrated_seeds.csv

With --rows_from=CSV and --layouts=point=HxD,...: also those points' rows of an earlier per-seed
CSV (cells whose runs are gone), their KV heads and head_dim given (checked against kv_dims):
the second round pairs its new cells with the first round's this way.
"""

import csv
import json
import os

from absl import flags

from lm.cli import run_app
from lm.experiments import estimate, write_csv
from lm.model import kv_cache_bytes, model_config
from lm.train import stored_config

_RUNS = flags.DEFINE_list('runs', [], 'Workdirs of the ensemble runs, one per cell.')
_OUT = flags.DEFINE_string('out', None, 'CSV to write.', required=True)
_STEP = flags.DEFINE_integer(
    'step',
    0,
    "Read each member's held-out accuracy at this step from its TensorBoard run "
    '(<workdir>/tb/seed_<s>) instead of the final results.json; 0 = results.json.',
)
_PLOT = flags.DEFINE_string('plot', '', 'PNG of accuracy against KV bytes per token, if set.')
_ROWS_FROM = flags.DEFINE_string(
    'rows_from', '', 'An earlier per-seed CSV of this script: the rows of --layouts points.'
)
_LAYOUTS = flags.DEFINE_list(
    'layouts', [], 'With --rows_from: point=HxD (KV heads x head_dim) for each point to copy.'
)
_HELDOUT = flags.DEFINE_string(
    'heldout',
    '',
    "scripts/eval_sweep.py's CSV (point, seed, eval_loss, eval_recall_accuracy): the outcome; "
    "the runs' own evaluation becomes validation_loss and validation_recall_accuracy.",
)


def tb_members(workdir: str, seeds: list[int], step: int) -> list[dict]:
    """Each member's eval loss and recall accuracy at `step`, from its TensorBoard run."""
    from tensorboard.backend.event_processing import event_accumulator

    members = []
    for seed in seeds:
        logdir = os.path.join(workdir, 'tb', f'seed_{seed}')
        acc = event_accumulator.EventAccumulator(logdir, size_guidance={'scalars': 0})
        acc.Reload()
        value = {
            tag.split('/', 1)[1]: {e.step: e.value for e in acc.Scalars(tag)}.get(step)
            for tag in ('eval/loss', 'eval/recall_accuracy')
        }
        if None in value.values():
            raise ValueError(f'{logdir}: no eval/loss and eval/recall_accuracy at step {step}')
        members.append({'seed': seed, 'eval': value})
    return members


def cell_rows(workdir: str, step: int = 0) -> list[dict]:
    """One row per member of the ensemble run in `workdir` (at `step`, else its end)."""
    config = stored_config(workdir)
    cfg = model_config(config.model)
    if step:
        seeds = list(range(config.seed, config.seed + config.train.ensemble))
        members = tb_members(workdir, seeds, step)
    else:
        with open(os.path.join(workdir, 'results.json')) as f:
            members = json.load(f)['members']
    kv_bytes = kv_cache_bytes(cfg, 1)  # bf16 K and V of every layer
    common = {
        'point': os.path.basename(os.path.normpath(workdir)),
        'kv_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
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


def with_heldout(rows: list[dict], path: str) -> list[dict]:
    """`rows` with eval_* from the held-out CSV at `path` and their own as validation_*;
    refuses a row the CSV lacks."""
    with open(path, newline='') as f:
        heldout = {(r['point'], int(r['seed'])): r for r in csv.DictReader(f)}
    out = []
    for r in rows:
        h = heldout.get((r['point'], int(r['seed'])))
        if h is None:
            raise ValueError(f'--heldout={path}: no row for point {r["point"]} seed {r["seed"]}')
        out.append(
            {
                **{k: v for k, v in r.items() if not k.startswith('eval_')},
                'eval_loss': float(h['eval_loss']),
                'eval_recall_accuracy': float(h['eval_recall_accuracy']),
                'validation_loss': r['eval_loss'],
                'validation_recall_accuracy': r['eval_recall_accuracy'],
            }
        )
    return out


def earlier_rows(path: str, layouts: list[str]) -> list[dict]:
    """The rows of each `point=HxD` of `layouts` from the per-seed CSV at `path`, with kv_heads
    and head_dim set; refuses a point the CSV lacks or a layout whose product is not kv_dims."""
    with open(path, newline='') as f:
        table = list(csv.DictReader(f))
    out = []
    for spec in layouts:
        point, _, layout = spec.partition('=')
        heads, _, dim = layout.partition('x')
        if not (heads.isdigit() and dim.isdigit()):
            raise ValueError(f'--layouts: {spec!r} is not point=HxD (e.g. mha_p8=4x16)')
        rows = [r for r in table if r['point'] == point]
        if not rows:
            raise ValueError(f'--rows_from={path}: no rows of point {point!r}')
        for r in rows:
            if int(heads) * int(dim) != int(r['kv_dims']):
                raise ValueError(
                    f'--layouts: {spec} is {int(heads) * int(dim)} dims, the CSV '
                    f'says {r["kv_dims"]}'
                )
            out.append({**r, 'kv_heads': int(heads), 'head_dim': int(dim)})
    return out


def plot(rows: list[dict], path: str) -> None:
    """Mean held-out accuracy (95% t-interval as error bars, seeds as dots) against KV bytes
    per token (log x), one line per pairs count (and head_dim, where the rows have it)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)

    def series(r: dict) -> tuple[int, int]:
        return int(r['pairs']), int(r.get('head_dim') or 0)

    for pairs, head_dim in sorted({series(r) for r in rows}):
        by_bytes: dict[int, list[float]] = {}
        for r in rows:
            if series(r) == (pairs, head_dim):
                by_bytes.setdefault(int(r['kv_bytes_per_token']), []).append(
                    float(r['eval_recall_accuracy'])
                )
        xs = sorted(by_bytes)
        es = [estimate(by_bytes[x]) for x in xs]
        line = ax.errorbar(
            xs,
            [e.mean for e in es],
            yerr=[[e.mean - e.lo for e in es], [e.hi - e.mean for e in es]],
            marker='o',
            capsize=3,
            label=f'{pairs} pairs'
            + (f', head_dim {head_dim}' if head_dim else '')
            + ' (1/pairs dashed)',
        )
        for x in xs:
            ax.scatter([x] * len(by_bytes[x]), by_bytes[x], s=6, color=line[0].get_color())
        ax.axhline(1 / pairs, ls='--', lw=0.8, color=line[0].get_color())
    ax.set_xscale('log', base=2)
    ax.set_xticks(sorted({int(r['kv_bytes_per_token']) for r in rows}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel('KV cache bytes per token (bf16, K and V, 2 layers)')
    ax.set_ylabel('held-out recall accuracy')
    ax.set_ylim(0, 1.02)
    ax.legend()
    ax.set_title('mqar_zoology, d_model 64: seeds, mean and 95% CI')
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run() -> int:
    rows = [row for workdir in _RUNS.value for row in cell_rows(workdir, _STEP.value)]
    if _HELDOUT.value:
        rows = with_heldout(rows, _HELDOUT.value)
    if _ROWS_FROM.value:
        rows += earlier_rows(_ROWS_FROM.value, _LAYOUTS.value)
    write_csv(_OUT.value, rows)
    print(f'wrote {len(rows)} rows to {_OUT.value}')
    if _PLOT.value:
        plot(rows, _PLOT.value)
        print(f'wrote {_PLOT.value}')
    return 0


if __name__ == '__main__':
    run_app(run)
