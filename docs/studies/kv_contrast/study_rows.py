"""The kv_contrast study scripts' shared reading and writing of per-seed losses."""

import csv
import os

from lm.experiments import write_csv

HERE = os.path.dirname(os.path.abspath(__file__))


def read(path: str) -> list[dict]:
    """A CSV's rows, `path` relative to this study's folder (or absolute)."""
    with open(os.path.join(HERE, path), newline='') as f:
        return list(csv.DictReader(f))


def committed(path: str, rename: dict[str, str], seeds: range) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of a committed CSV's arms in `rename` (its arm -> ours)."""
    return {
        (rename[r['arm']], int(r['seed'])): r['eval_loss']
        for r in read(path)
        if r['arm'] in rename and int(r['seed']) in seeds
    }


def swept(sweep: str, rename: dict[str, str] | None = None) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of a sweep's summary_seeds.csv, points renamed."""
    rows = read(os.path.join(os.path.abspath(sweep), 'summary_seeds.csv'))
    return {
        ((rename or {}).get(r['point'], r['point']), int(r['seed'])): r['eval_loss'] for r in rows
    }


def write_seeds(name: str, found: dict[tuple[str, int], str], arms: tuple, seeds: range) -> None:
    """results/<name>.csv (arm, seed, eval_loss) of every arm at every seed, or one line naming
    the runs missing."""
    missing = [f'{a} seed {s}' for a in arms for s in seeds if (a, s) not in found]
    if missing:
        raise SystemExit(f'incomplete: no run for {", ".join(missing)}')
    rows = [{'arm': a, 'seed': s, 'eval_loss': found[a, s]} for a in arms for s in seeds]
    write_csv(os.path.join(HERE, 'results', f'{name}.csv'), rows)
    print(f'{len(rows)} rows: {len(arms)} arms x seeds {seeds.start}-{seeds.stop - 1}')
