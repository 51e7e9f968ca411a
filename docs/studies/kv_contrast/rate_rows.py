"""The kv_contrast rate questions' shared steps: their runs at peak rates other than the recipe's
(MHA's at 2e-3, the MLA study's; MQA's at 1e-3, this study's and the MLA study's) read from their
per-seed CSVs, a rate grid's pilot losses kept as a CSV, and the rate rule applied to one arm."""

import csv
import os

import numpy as np

from lm.experiments import lr_grid, write_csv

HERE = os.path.dirname(os.path.abspath(__file__))
MLA = os.path.join(HERE, os.pardir, 'mla', 'results')
MHA_AT_2E3 = (  # MHA's runs at 2e-3 in the MLA study: (CSV, its arm name, seeds)
    ('rate_pilot_seeds.csv', 'mha_lr0.002', range(0, 5)),
    ('rate_contrast_seeds.csv', 'mha', range(5, 9)),
    ('tuned_contrast_seeds.csv', 'mha', range(9, 29)),
    ('retest_contrast_seeds.csv', 'mha', range(29, 30)),
)
MQA_AT_1E3 = (  # MQA's runs at 1e-3: this study's seeds 0-19, the MLA study's 20-28
    (os.path.join(HERE, 'results', 'kv_contrast_seeds.csv'), range(0, 20)),
    (os.path.join(MLA, 'mla_contrast_seeds.csv'), range(20, 29)),
)


def read(path: str, arm: str, seeds: range, name: str) -> dict[tuple[str, int], str]:
    """{(name, seed): eval_loss} of `arm`'s rows at `seeds` in a per-seed CSV (its arm or point
    column)."""
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    return {
        (name, int(r['seed'])): r['eval_loss']
        for r in rows
        if r.get('arm', r.get('point')) == arm and int(r['seed']) in seeds
    }


def mha(seeds: range) -> dict[tuple[str, int], str]:
    """{('mha', seed): eval_loss} of MHA's runs at 2e-3 (the MLA study's) at `seeds`."""
    found = {}
    for name, arm, have in MHA_AT_2E3:
        found |= read(
            os.path.join(MLA, name),
            arm,
            range(max(have.start, seeds.start), min(have.stop, seeds.stop)),
            'mha',
        )
    return found


def committed_contrast(name: str, seeds: range) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of MQA and MHA in the committed results/<name>.csv: the record,
    for a script run without the sweeps."""
    path = os.path.join(HERE, 'results', f'{name}.csv')
    return read(path, 'mqa', seeds, 'mqa') | read(path, 'mha', seeds, 'mha')


def write_contrast(name: str, found: dict[tuple[str, int], str], seeds: range) -> None:
    """results/<name>.csv (arm, seed, eval_loss) of MHA and MQA at every seed, or one line
    naming the runs missing."""
    missing = [f'{a} seed {s}' for a in ('mha', 'mqa') for s in seeds if (a, s) not in found]
    if missing:
        raise SystemExit(f'incomplete: no run for {", ".join(missing)}')
    rows = [{'arm': a, 'seed': s, 'eval_loss': found[a, s]} for a in ('mha', 'mqa') for s in seeds]
    write_csv(os.path.join(HERE, 'results', f'{name}.csv'), rows)
    print(f'{len(rows)} rows: 2 arms x seeds {seeds.start}-{seeds.stop - 1}')


def pilot_losses(sweep_dir: str, name: str, seeds: range) -> dict[tuple[str, int], str]:
    """{(point, seed): eval_loss} of a rate grid at `seeds`, copied from `sweep_dir` to
    results/<name>.csv (point, seed, eval_loss) when that is here, else read from the copy (none
    before the grid has run)."""
    copy = os.path.join(HERE, 'results', f'{name}.csv')
    if os.path.isdir(sweep_dir):
        with open(os.path.join(sweep_dir, 'summary_seeds.csv'), newline='') as f:
            rows = [r for r in csv.DictReader(f) if int(r['seed']) in seeds]
        keep = ('point', 'seed', 'eval_loss')
        rows.sort(key=lambda r: (r['point'], int(r['seed'])))
        write_csv(copy, [{k: r[k] for k in keep} for r in rows])
    if not os.path.isfile(copy):
        return {}
    with open(copy, newline='') as f:
        return {(r['point'], int(r['seed'])): r['eval_loss'] for r in csv.DictReader(f)}


def choose_rate(
    arm: str, by_lr: dict[float, dict[int, float]], grid: tuple, ladder: list, past: int
) -> tuple[float, float | None]:
    """(the rate lr_grid.choose gives `arm` over its runs {lr: {seed: loss}}, the rate to train
    next when that choice lies at an edge, else None); prints the means by rate. Stops with one
    line when a rate of `grid` is missing."""
    missing = [lr for lr in grid if lr not in by_lr]
    if missing:
        raise SystemExit(f'incomplete: {arm} has no pilot seeds at {missing}')
    lr = lr_grid.choose(by_lr)
    means = ', '.join(f'{r:g}: {np.mean(list(v.values())):.4f}' for r, v in sorted(by_lr.items()))
    seeds = sorted(next(iter(by_lr.values())))
    print(f'{arm}: mean loss of seeds {seeds[0]}-{seeds[-1]} by rate {means}; chosen {lr:g}')
    return lr, lr_grid.next_rate(lr, list(by_lr), ladder, grid, past)
