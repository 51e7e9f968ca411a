r"""The powered MQA question's sizing and per-seed CSV (mqa_powered_statement.md): on fresh seeds,
each seed's two runs (MHA and MQA, both at 2e-3) from one batch and one version of the code and
toolchain, how far is MQA behind MHA?

  python docs/studies/kv_contrast/mqa_powered_csv.py --power_only
  python docs/studies/kv_contrast/mqa_powered_csv.py --sweeps='runs/mqa_powered_*'

`--power_only` sizes the seed count from every paired MQA - MHA at 2e-3 before this question
(seeds 5-99: the three earlier tests' and the block rates question's runs, read from their
committed CSVs). Otherwise every run of the batches matching `--sweeps` is copied to
results/mqa_powered_runs.csv (sweep, point, seed, version, cpu, eval_loss), each seed is
classified by the one-version-per-seed rule (block_runs.py) and, until the first SEEDS places are
decided, only counts are printed, never a loss. Then it writes results/mqa_powered_seeds.csv
(arm, seed, eval_loss), whose paired table is the stated test, and prints the test.
"""

import os

import block_runs
import numpy as np
from absl import flags
from rate_rows import HERE, read
from slope_rate_sweep import point_name

from lm.cli import run_app
from lm.experiments import sd_upper_bound, seeds_needed, stats, t_test_power, write_csv

RATE = 2e-3  # the rate both arms chose by the rate rule
BLOCK = [point_name('mha', RATE), point_name('mqa', RATE)]  # a seed's two runs
FIRST_SEED = 100  # past every seed any kv_contrast or MLA question has trained
EFFECT = 0.005  # nats: about one halving's cost at 1e-3 (+0.0055 stated, +0.0035 described)
ALPHA = 0.05  # one test: the question's family is one contrast
POWER = 0.8
SEEDS = 63  # seeds_needed(EFFECT, the pilot's sd at its 90% bound, ALPHA, POWER)
RESULTS = os.path.join(HERE, 'results')
RUNS = os.path.join(RESULTS, 'mqa_powered_runs.csv')
PILOT = (  # every earlier paired MQA - MHA at 2e-3: (CSV, seeds)
    ('mqa_rate_contrast_seeds.csv', range(5, 14)),
    ('mqa_retest_contrast_seeds.csv', range(14, 44)),
    ('slope_rate_seeds.csv', range(44, 59)),
    ('block_rate_2e3_seeds.csv', range(59, 100)),
)

_SWEEPS = flags.DEFINE_string('sweeps', 'runs/mqa_powered_*', 'Glob of the batches of seeds.')
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'The sizing only.')


def pilot_differences() -> dict[int, float]:
    """{seed: MQA - MHA at 2e-3} over seeds 5-99, from the committed per-seed CSVs."""
    out = {}
    for name, seeds in PILOT:
        path = os.path.join(RESULTS, name)
        found = read(path, 'mqa', seeds, 'mqa') | read(path, 'mha', seeds, 'mha')
        out |= {s: float(found['mqa', s]) - float(found['mha', s]) for s in seeds}
    return out


def sizing() -> int:
    """Prints the seed count's derivation and returns it: the pilot's sd and its 90% upper
    bound, EFFECT, ALPHA, POWER."""
    diffs = np.array(list(pilot_differences().values()))
    sd, n = float(diffs.std(ddof=1)), len(diffs)
    bound = sd_upper_bound(sd, n)
    needed = seeds_needed(EFFECT, bound, ALPHA, POWER)
    print(
        f'MQA - MHA at 2e-3 over the {n} earlier seeds (5-99): mean {diffs.mean():+.4f}, sd '
        f'{sd:.4f}, 90% upper bound {bound:.4f}; for {EFFECT} nats at alpha {ALPHA}, power '
        f'{POWER}: {needed} seeds ({seeds_needed(EFFECT, sd, ALPHA, POWER)} at the sd itself)'
    )
    for effect in (0.004, EFFECT, 0.006, 0.0073):
        print(
            f'at {needed} seeds, for {effect} nats: power '
            f'{t_test_power(effect, bound, ALPHA, needed):.2f} at the bound, '
            f'{t_test_power(effect, sd, ALPHA, needed):.2f} at the sd'
        )
    return needed


def seed_rows(runs: list[dict], seeds: list[int]) -> list[dict]:
    """Rows (arm, seed, eval_loss) of both arms at the counted seeds."""
    at = {(r['point'], int(r['seed'])): r['eval_loss'] for r in runs}
    return [
        {'arm': arm, 'seed': s, 'eval_loss': at[point_name(arm, RATE), s]}
        for arm in ('mha', 'mqa')
        for s in seeds
    ]


def report(rows: list[dict]) -> None:
    """The stated test: the paired t-test of MQA - MHA with its interval, the sign-flip p beside."""
    loss = {(r['arm'], int(r['seed'])): float(r['eval_loss']) for r in rows}
    seeds = sorted({s for _, s in loss})
    mqa, mha = ({s: loss[arm, s] for s in seeds} for arm in ('mqa', 'mha'))
    diff = stats.paired_difference(mqa, mha)
    print(
        f'mqa - mha at 2e-3: {diff.mean:+.4f} [{diff.lo:+.4f}, {diff.hi:+.4f}], sd {diff.std:.4f}, '
        f'p {stats.p_value(diff):.3g}, sign-flip {stats.paired_sign_flip_p(mqa, mha):.3g}, '
        f'{diff.n} seeds'
    )


def run() -> int:
    if sizing() != SEEDS:
        raise SystemExit(f'the sizing gives another seed count than SEEDS = {SEEDS}')
    if _POWER_ONLY.value:
        return 0
    sweeps = block_runs.batches(_SWEEPS.value)
    runs = block_runs.all_runs(sweeps, RUNS, BLOCK)
    state = block_runs.classify(runs, block_runs.ended(sweeps), len(BLOCK), FIRST_SEED)
    counted = block_runs.decided(state, SEEDS)
    if counted is None:
        return 0  # nothing is computed on part of the seeds
    rows = seed_rows(runs, counted)
    write_csv(os.path.join(RESULTS, 'mqa_powered_seeds.csv'), rows)
    report(rows)
    return 0


if __name__ == '__main__':
    run_app(run)
