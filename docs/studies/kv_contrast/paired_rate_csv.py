r"""The paired-rates question's power analysis and per-seed CSVs (paired_rate_statement.md):
does the cost per halving of the KV heads differ between the recipe's rate 1e-3 and 2e-3, the
rate every arm chose, on the same seeds?

  python docs/studies/kv_contrast/paired_rate_csv.py --power_only
  python docs/studies/kv_contrast/paired_rate_csv.py --recipe_sweep=runs/paired_rate_1e3 \
      --own_sweep=runs/paired_rate_2e3 --check_sweep=runs/paired_rate_check \
      --layout_sweep=runs/paired_rate_layout

Each (arm, seed, rate) loss comes from the run that exists (the sources in LOSSES_AT) or from
this question's sweeps: all four arms at 1e-3 on seeds 44-58 (`--recipe_sweep`), GQA-4 and
GQA-2 at 2e-3 on seeds 5-19 (`--own_sweep`); their losses are copied to
results/paired_rate_runs.csv (point, seed, eval_loss), which the script reads without the sweeps.
`--check_sweep` re-trains reused runs (MHA at 1e-3, GQA-4 and MHA at 2e-3, seed 0: one per
source sweep file) and prints how far each lies from its record, against REUSE_TOLERANCE. It
writes results/paired_rate_seeds.csv (arm, x = halvings of the KV heads, seed, loss_change =
loss at 1e-3 minus loss at 2e-3): the 'trend' table of that CSV is the stated test (the slope
of the change is the per-seed slope at 1e-3 minus that at 2e-3); and
results/paired_rate_recipe_seeds.csv (arm, x, seed, eval_loss: the four arms at 1e-3 on seeds
44-58, described).
"""

import csv
import os

import numpy as np
from absl import flags
from rate_rows import HERE, mha, read
from slope_rate_sweep import ARMS, point_name

from lm.cli import run_app
from lm.experiments import (
    per_seed_contrasts,
    sd_upper_bound,
    t_test_power,
    trend_contrasts,
    write_csv,
)

RECIPE, OWN = 1e-3, 2e-3
PILOT = range(5)  # the seeds where every arm has run at both rates before this question
TESTED = (range(5, 20), range(44, 59))  # where every arm has run at one of the two rates
ALPHA = 0.025  # Holm's first step over the two contrasts
EFFECT = 0.0025  # nats per halving: +0.0055 at 1e-3 (seeds 0-19) minus +0.0030 at 2e-3 (44-58)
GAP_EFFECT = 0.0083  # nats: half of MQA - MHA at 1e-3 (+0.0165), for the second contrast's power
REUSE_TOLERANCE = 1e-5  # nats: 5x the 2e-6 an ensemble member moved from its single run
RESULTS = os.path.join(HERE, 'results')
NEW = os.path.join(RESULTS, 'paired_rate_runs.csv')

_RECIPE = flags.DEFINE_string('recipe_sweep', 'runs/paired_rate_1e3', 'Every arm at 1e-3, 44-58.')
_OWN = flags.DEFINE_string('own_sweep', 'runs/paired_rate_2e3', 'GQA-4, GQA-2 at 2e-3, 5-19.')
_CHECK = flags.DEFINE_string('check_sweep', 'runs/paired_rate_check', 'Reused runs re-trained.')
_LAYOUT = flags.DEFINE_string(
    'layout_sweep', 'runs/paired_rate_layout', "GQA-4 at 2e-3, seeds 0-4, as the pilot's ensemble."
)
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The power analysis only.')


def _csv(name: str) -> str:
    return os.path.join(RESULTS, f'{name}.csv')


def existing(arm: str, lr: float, seeds: range) -> dict[tuple[str, int], str]:
    """{(arm, seed): eval_loss} of the runs made before this question (LOSSES_AT's sources)."""
    found = {}
    for path, name, have in LOSSES_AT[arm, lr]:
        part = range(max(have.start, seeds.start), min(have.stop, seeds.stop))
        found |= read(path, name, part, arm)
    return found


LOSSES_AT = {  # (arm, rate): the per-seed CSVs holding its runs, each (path, arm/point, seeds)
    **{(a, RECIPE): ((_csv('kv_contrast_seeds'), a, range(20)),) for a in ARMS},
    ('mqa', OWN): (
        (_csv('mqa_rate_pilot_seeds'), 'mqa_lr0.002', range(5)),
        (_csv('mqa_rate_contrast_seeds'), 'mqa', range(5, 14)),
        (_csv('mqa_retest_contrast_seeds'), 'mqa', range(14, 44)),
        (_csv('slope_rate_seeds'), 'mqa', range(44, 59)),
    ),
    **{
        (a, OWN): (
            (_csv('slope_rate_pilot_seeds'), f'{a}_lr0.002', range(5)),
            (_csv('slope_rate_seeds'), a, range(44, 59)),
        )
        for a in ('gqa4', 'gqa2')
    },
    ('mha', OWN): ((_csv('slope_rate_seeds'), 'mha', range(44, 59)),),  # 0-29: rate_rows.mha
}


def losses(lr: float, seeds: range, new: dict) -> dict[tuple[str, int], float]:
    """{(arm, seed): eval_loss} of the four arms at `lr` over `seeds`: existing runs first, this
    question's (`new`, {(point, seed): loss}) where none exists."""
    found = {}
    for arm in ARMS:
        have = existing(arm, lr, seeds)
        if arm == 'mha' and lr == OWN:
            have |= mha(range(seeds.start, min(seeds.stop, 30)))
        for s in seeds:
            if (arm, s) not in have and (point_name(arm, lr), s) in new:
                have[arm, s] = new[point_name(arm, lr), s]
        found |= {k: float(v) for k, v in have.items()}
    return found


def change_rows(seeds: list[int], new: dict) -> list[dict]:
    """Rows (arm, x, seed, loss_change) over `seeds`, or one line naming the runs missing."""
    spans = [range(s, s + 1) for s in seeds]
    at = {lr: {k: v for r in spans for k, v in losses(lr, r, new).items()} for lr in (RECIPE, OWN)}
    missing = [
        f'{a} seed {s} at {lr:g}' for lr in at for a in ARMS for s in seeds if (a, s) not in at[lr]
    ]
    if missing:
        raise SystemExit(f'incomplete: no run for {", ".join(missing)}')
    return [
        {'arm': a, 'x': x, 'seed': s, 'loss_change': at[RECIPE][a, s] - at[OWN][a, s]}
        for x, a in enumerate(ARMS)
        for s in seeds
    ]


def recipe_rows(new: dict) -> list[dict]:
    """Rows (arm, x, seed, eval_loss) of the four arms at 1e-3 on seeds 44-58 (this question's
    runs): the per-halving cost at 1e-3 on the seeds of the 2e-3 test (described)."""
    return [
        {'arm': a, 'x': x, 'seed': s, 'eval_loss': float(new[point_name(a, RECIPE), s])}
        for x, a in enumerate(ARMS)
        for s in TESTED[1]
    ]


def power(pilot: list[dict], n: int) -> None:
    """The power at `n` seeds of both contrasts, at the pilot's sd (seeds 0-4) and its 90% upper
    bound, and at the sd the project's unpaired slopes give (no within-seed correlation)."""
    _, slopes, ends = per_seed_contrasts(pilot)
    for name, values, effect in (('slope', slopes, EFFECT), ('mqa - mha', ends, GAP_EFFECT)):
        v = np.array(list(values.values()))
        s, bound = v.std(ddof=1), sd_upper_bound(v.std(ddof=1), len(v))
        print(
            f'{name} change, pilot seeds 0-4: {v.mean():+.4f}, sd {s:.4f} (90% bound '
            f'{bound:.4f}); for {effect:.4f} at {n} seeds: power '
            f'{t_test_power(effect, s, ALPHA, n):.2f} at the pilot sd, '
            f'{t_test_power(effect, bound, ALPHA, n):.2f} at its bound'
        )
    unpaired = {}
    for lr, seeds in ((RECIPE, range(20)), (OWN, range(44, 59))):
        rows = [
            {'arm': a, 'x': x, 'seed': s, 'eval_loss': v}
            for (a, s), v in losses(lr, seeds, {}).items()
            for x in [ARMS.index(a)]
        ]
        v = np.array(list(per_seed_contrasts(rows)[1].values()))
        unpaired[lr] = (v.std(ddof=1), sd_upper_bound(v.std(ddof=1), len(v)), len(v))
    for i, label in ((0, 'sds'), (1, '90% bounds (conservative)')):
        sd = float(np.hypot(unpaired[RECIPE][i], unpaired[OWN][i]))
        print(
            f"slope change at the unpaired slopes' {label} ({unpaired[RECIPE][i]:.4f} at 1e-3 "
            f'over {unpaired[RECIPE][2]} seeds, {unpaired[OWN][i]:.4f} at 2e-3 over '
            f'{unpaired[OWN][2]}; no correlation): sd {sd:.4f}, power '
            f'{t_test_power(EFFECT, sd, ALPHA, n):.2f}'
        )


def new_losses() -> dict[tuple[str, int], str]:
    """{(point, seed): eval_loss} of this question's sweeps: results/paired_rate_runs.csv (none
    before the runs) updated with the losses of each sweep that is here, and written back."""
    found = {}
    if os.path.isfile(NEW):
        with open(NEW, newline='') as f:
            found = {(r['point'], int(r['seed'])): r['eval_loss'] for r in csv.DictReader(f)}
    here = [s for s in (_RECIPE.value, _OWN.value) if os.path.isdir(s)]
    for sweep in here:
        with open(os.path.join(sweep, 'summary_seeds.csv'), newline='') as f:
            found |= {(r['point'], int(r['seed'])): r['eval_loss'] for r in csv.DictReader(f)}
    if here:
        rows = [{'point': p, 'seed': s, 'eval_loss': v} for (p, s), v in sorted(found.items())]
        write_csv(NEW, rows)
    return found


def reruns() -> list[dict]:
    """Reused runs re-trained here (`--check_sweep`; `--layout_sweep`, GQA-4 at 2e-3 on seeds
    0-4 as the pilot's looped ensemble), each beside its record: copied to
    results/paired_rate_reruns.csv when the sweeps are here, else read from it."""
    out = _csv('paired_rate_reruns')
    here = [s for s in (_CHECK.value, _LAYOUT.value) if os.path.isdir(s)]
    if not here:
        with open(out, newline='') as f:
            return list(csv.DictReader(f))
    rows = []
    for sweep in here:
        with open(os.path.join(sweep, 'summary_seeds.csv'), newline='') as f:
            for r in csv.DictReader(f):
                if any((x['point'], x['seed']) == (r['point'], int(r['seed'])) for x in rows):
                    continue  # GQA-4's seed 0 is in both sweeps (equal bit for bit): listed once
                arm, lr = r['point'].split('_lr')
                seed = int(r['seed'])
                record = losses(float(lr), range(seed, seed + 1), {})[arm, seed]
                rows.append(
                    {
                        'sweep': os.path.basename(sweep),
                        'point': r['point'],
                        'seed': seed,
                        'recorded': record,
                        'eval_loss': r['eval_loss'],
                        'difference': float(r['eval_loss']) - record,
                    }
                )
    write_csv(out, rows)
    return rows


def check() -> None:
    """Each re-trained reused run against its record, the stated check's verdict, and the
    largest difference at each rate."""
    rows = reruns()
    for r in rows:
        verdict = 'within' if abs(float(r['difference'])) <= REUSE_TOLERANCE else 'PAST'
        print(
            f'rerun ({r["sweep"]}): {r["point"]} seed {r["seed"]} {float(r["eval_loss"]):.6f}, '
            f'recorded {float(r["recorded"]):.6f}: differs by {float(r["difference"]):+.3g}, '
            f'{verdict} {REUSE_TOLERANCE:g}'
        )
    for lr in (RECIPE, OWN):
        d = {(r['point'], r['seed']): abs(float(r['difference'])) for r in rows}
        at = [v for (p, _), v in d.items() if p.endswith(f'_lr{lr:g}')]
        print(f'reruns at {lr:g}: {len(at)} runs, largest |difference| {max(at):.2g} nats')


def contrasts(rows: list[dict], label: str) -> None:
    """The two contrasts of the change over `rows` (Holm over the two)."""
    for name, est, p, flip in trend_contrasts(rows):
        print(
            f'{label}{name} of the change (1e-3 minus 2e-3): {est.mean:+.4f} [{est.lo:+.4f}, '
            f'{est.hi:+.4f}], sd {est.std:.4f}, p (Holm) {p:.3g}, sign-flip {flip:.3g}, '
            f'{est.n} seeds'
        )


def run() -> int:
    seeds = [s for r in TESTED for s in r]
    pilot = change_rows(list(PILOT), {})
    power(pilot, len(seeds))
    if _POWER_ONLY.value:
        return 0
    new = new_losses()
    rows = change_rows(seeds, new)
    write_csv(_csv('paired_rate_seeds'), rows)
    write_csv(_csv('paired_rate_recipe_seeds'), recipe_rows(new))
    print(f'{len(rows)} rows: 4 arms x {len(seeds)} seeds')
    contrasts(rows, '')
    # seeds 44-58: the 1e-3 side new, the 2e-3 side from one machine (described)
    contrasts([r for r in rows if r['seed'] >= TESTED[1].start], 'described, seeds 44-58: ')
    check()
    return 0


if __name__ == '__main__':
    run_app(run)
