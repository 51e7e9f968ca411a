"""The MLA study scripts' shared reading and writing of per-seed losses."""

import csv
import os

import numpy as np

from lm.experiments import seeds_needed, t_test_power, write_csv

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


def point_losses(sweep: str, point: str, arm: str) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of one point of a sweep, named `arm`."""
    return {(arm, s): loss for (p, s), loss in swept(sweep).items() if p == point}


def write_seeds(name: str, found: dict[tuple[str, int], str], arms: tuple, seeds: range) -> None:
    """results/<name>.csv (arm, seed, eval_loss) of every arm at every seed, or one line naming
    the runs missing."""
    missing = [f'{a} seed {s}' for a in arms for s in seeds if (a, s) not in found]
    if missing:
        raise SystemExit(f'incomplete: no run for {", ".join(missing)}')
    rows = [{'arm': a, 'seed': s, 'eval_loss': found[a, s]} for a in arms for s in seeds]
    write_csv(os.path.join(HERE, 'results', f'{name}.csv'), rows)
    print(f'{len(rows)} rows: {len(arms)} arms x seeds {seeds.start}-{seeds.stop - 1}')


def power_analysis(
    pilot: dict[tuple[str, int], str],
    contrasts: tuple,
    seeds: range,
    smallest: float,
    sd_floor: float,
    cap: int,
) -> int:
    """Print each contrast's pilot estimate and need; return the seeds per arm.

    The statements' rule: each paired contrast (a, b) is sized for max(2/3 of its pilot mean
    |d|, `smallest`) at sd max(pilot sd, `sd_floor`), 80% power, alpha = 0.05 / contrasts
    (Holm's first step); seeds per arm are the largest need, capped at `cap`."""
    alpha = 0.05 / len(contrasts)
    needs = []
    for a, b in contrasts:
        diff = np.array([float(pilot[a, s]) - float(pilot[b, s]) for s in seeds])
        d, s = diff.mean(), diff.std(ddof=1)
        effect, sd = max(abs(d) * 2 / 3, smallest), max(s, sd_floor)
        needs.append(seeds_needed(effect, sd, alpha))
        print(
            f'{a} - {b}: pilot {d:+.4f}, sd {s:.4f}; sized for {effect:.4f} at sd {sd:.4f}: '
            f'{needs[-1]} seeds (power at {cap}: {t_test_power(effect, sd, alpha, cap):.2f})'
        )
    n = min(max(needs), cap)
    capped = '; the cap binds' if n < max(needs) else ''
    print(f'seeds per arm: {n} (seeds {seeds.stop}-{seeds.stop + n - 1}){capped}')
    return n


def pilot_losses(sweep: str, arm: str, name: str, seeds: range) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of a pilot: its sweep's point 'mla' or other single point,
    copied to results/<name>.csv when the sweep is here, else read from that committed copy."""
    if os.path.isdir(sweep):
        rows = {(arm, s): loss for (_, s), loss in swept(sweep).items()}
        write_seeds(name, rows, (arm,), seeds)
    return committed(f'results/{name}.csv', {arm: arm}, seeds)


def baseline_pilot(seeds: range) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of MHA's, GQA-4's and MLA-64's first seeds at this config and
    1,000 steps (the first study's and the kv_layouts study's runs)."""
    pilot = committed(
        '../kv_contrast/results/kv_contrast_seeds.csv', {'mha': 'mha', 'gqa4': 'gqa4'}, seeds
    )
    return pilot | committed('../kv_layouts/results/kv_layouts_seeds.csv', {'mla': 'mla64'}, seeds)


def reuse_check(
    now: dict[tuple[str, int], str], reused_csv: str, arm: str, seeds: range, tolerance: float
) -> None:
    """Print how far `arm`'s seeds retrained now ({(arm, seed): eval_loss}) lie from the reused
    runs' losses in `reused_csv`; stop past `tolerance` nats."""
    reused = committed(reused_csv, {arm: arm}, seeds)
    for s in seeds:
        gap = abs(float(now[arm, s]) - float(reused[arm, s]))
        print(
            f'reuse check, {arm.upper()} seed {s}: {now[arm, s]} now, {reused[arm, s]} reused, '
            f'|gap| {gap:.2e}'
        )
        if gap > tolerance:
            raise SystemExit(
                f'reuse check failed: {arm.upper()} seed {s} moved {gap:.2e} > {tolerance}'
            )


def grid_losses(sweeps: list[str], name: str, seeds: range) -> dict[tuple[str, int], str]:
    """{(point, seed): eval_loss} of a rate grid: its sweeps' points at `seeds`, copied to
    results/<name>.csv when sweeps are given, else read from that committed copy."""
    sweeps = [s for s in sweeps if s]
    if sweeps:
        grid = {k: v for sweep in sweeps for k, v in swept(sweep).items()}
        write_seeds(name, grid, tuple(sorted({p for p, _ in grid})), seeds)
    return {(r['arm'], int(r['seed'])): r['eval_loss'] for r in read(f'results/{name}.csv')}
