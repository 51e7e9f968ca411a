"""The one-version-per-seed rule shared by the kv_contrast questions that train their seeds in
batches (block_rate_csv.py, mqa_powered_csv.py): a seed's runs (its block, one run per point)
count when they come from one batch directory and one recorded version of the code and
toolchain (`lm.train.version`); every run found is kept in a committed runs CSV (sweep, point,
seed, version, cpu, eval_loss), so the study stands without its batches."""

import csv
import glob
import hashlib
import json
import math
import os
import re

from lm.experiments import write_csv
from lm.train import SESSIONS, version


def version_of(result: dict) -> str:
    """12 hex digits naming what trained and evaluated a run (`lm.train.version` of each session
    and of 'evaluated_by'); 'unrecorded' where a record lacks the code or the CPU."""
    records = result.get(SESSIONS) or [result.get('trained_by') or {}]
    records = [*records, *([result['evaluated_by']] if 'evaluated_by' in result else [])]
    if not all(r.get('code') and r.get('cpu') for r in records):
        return 'unrecorded'
    kept = sorted({json.dumps(version(r), sort_keys=True) for r in records})
    return hashlib.sha256('\n'.join(kept).encode()).hexdigest()[:12]


def batch_runs(sweep: str, block: list[str]) -> list[dict]:
    """A batch's finished runs of the points in `block`: (sweep, point, seed, version, cpu,
    eval_loss) from each <point>_s<seed>/results.json."""
    out = []
    for path in sorted(glob.glob(os.path.join(sweep, '*_s*', 'results.json'))):
        point, seed = re.fullmatch(r'(.+)_s(\d+)', os.path.basename(os.path.dirname(path))).groups()
        if point not in block:
            continue
        with open(path) as f:
            result = json.load(f)
        cpus = {r.get('cpu', '?') for r in result.get(SESSIONS) or [result.get('trained_by', {})]}
        out.append(
            {
                'sweep': os.path.basename(os.path.normpath(sweep)),
                'point': point,
                'seed': int(seed),
                'version': version_of(result),
                'cpu': ' | '.join(sorted(cpus)),
                'eval_loss': result['eval']['loss'],
            }
        )
    return out


def batches(pattern: str) -> list[str]:
    """The batch directories matching `pattern`, in the order of their first seed."""
    found = [d for d in glob.glob(pattern) if os.path.isdir(d)]
    return sorted(found, key=lambda d: int(re.search(r'(\d+)$', os.path.normpath(d))[1]))


def ended(sweeps: list[str]) -> set[str]:
    """The names of the batches whose sweep has ended (its summary.md written)."""
    return {
        os.path.basename(os.path.normpath(s))
        for s in sweeps
        if os.path.isfile(os.path.join(s, 'summary.md'))
    }


def all_runs(sweeps: list[str], path: str, block: list[str]) -> list[dict]:
    """The runs CSV at `path` merged with (and rewritten from) the batches present; a run in two
    batches, or recorded twice with another loss or version, is refused in one line."""
    found = {}
    if os.path.isfile(path):
        with open(path, newline='') as f:
            found = {
                (r['point'], int(r['seed'])): {**r, 'seed': int(r['seed'])}
                for r in csv.DictReader(f)
            }
    for sweep in sweeps:
        for r in batch_runs(sweep, block):
            old = found.get((r['point'], r['seed']))
            same = ('sweep', 'version', 'eval_loss')
            if old and any(str(old[k]) != str(r[k]) for k in same):
                raise SystemExit(
                    f'{r["point"]} seed {r["seed"]}: in {old["sweep"]} and {r["sweep"]}, or '
                    f'recorded with another version or loss: a seed is trained in one batch only'
                )
            found[r['point'], r['seed']] = r
    if sweeps:
        order = sorted(found, key=lambda k: (k[1], block.index(k[0])))
        write_csv(path, [found[k] for k in order])
    return list(found.values())


def classify(runs: list[dict], ended: set[str], size: int, first_seed: int) -> dict[int, str]:
    """Each seed's state: 'counted' (`size` finite runs, one batch, one recorded version),
    'diverged' (all runs, one not finite) or 'failed' (its batch ended without one of its runs):
    both keep their place; 'out' (two batches or versions, or one unrecorded): replaced by the
    next seed; 'training' (its batch has not ended)."""
    by_seed: dict[int, list[dict]] = {}
    for r in runs:
        by_seed.setdefault(int(r['seed']), []).append(r)
    early = sorted(s for s in by_seed if s < first_seed)
    if early:
        raise SystemExit(f'seeds {early}: this question trains seeds from {first_seed} on')
    state = {}
    for seed, block in sorted(by_seed.items()):
        sweeps, versions = {r['sweep'] for r in block}, {r['version'] for r in block}
        if len(sweeps) > 1 or len(versions) > 1 or 'unrecorded' in versions:
            state[seed] = 'out'
        elif len(block) < size:
            state[seed] = 'failed' if sweeps <= ended else 'training'
        elif not all(math.isfinite(float(r['eval_loss'])) for r in block):
            state[seed] = 'diverged'
        else:
            state[seed] = 'counted'
    return state


def decided(state: dict[int, str], seeds: int) -> list[int] | None:
    """The counted seeds among the first `seeds` places, once every place is decided, else None;
    prints each seed not counted and the count of places decided, never a loss."""
    places = [s for s, v in state.items() if v in ('counted', 'diverged', 'failed', 'training')]
    chosen = places[:seeds]
    for s, v in state.items():
        if v != 'counted':
            print(f'seed {s}: {v}')
    done = [s for s in chosen if state[s] != 'training']
    counted = [s for s in done if state[s] == 'counted']
    print(f'{len(done)} of {seeds} places decided ({len(counted)} counted)')
    return counted if len(done) == seeds else None
