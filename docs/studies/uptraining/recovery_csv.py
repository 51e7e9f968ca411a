r"""How much of a conversion's gap uptraining closes, per budget (the contiguous protocol, Results
0-0c; described, not a stated test: asked after every run was made, no new run).

  python docs/studies/uptraining/recovery_csv.py

Per target, method, schedule and budget α, and per seed (the seeds pair the runs: one MHA
source each), the fraction of the gap between the converted model (α = 0) and its target
trained from scratch for 1,000 × (1 + α) steps (1,050 or 1,100) that uptraining closes:

    closed = (L_converted − L_uptrained) / (L_converted − L_scratch)

(held-out loss; 1 = as good as from scratch, above 1 = better). This protocol's `uptrain` part
lies next to the held-out text (the re-cut, which supersedes it for comparisons with from-scratch
targets, has no α = 0 arm to measure a share against). Reads the committed per-seed CSVs
(uptrain1k_a0: α = 0 and scratch at 1,000 steps; uptrain1k_parts: α = 0.05, scratch at 1,050;
uptrain1k_a01: α = 0.1, scratch at 1,100); a run two CSVs hold must be the same bit for bit.
Writes results/uptrain1k_recovery.csv: per arm the mean gap at conversion, the mean share closed
over seeds with its 95% t-interval, the mean gap left and the mean difference from the arm's own
unconverted MHA source (nats), and the seeds.
"""

import csv
import os

from lm.cli import run_app
from lm.experiments import estimate, write_csv

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ('uptrain1k_a0_seeds', 'uptrain1k_parts_seeds', 'uptrain1k_a01_seeds')
SOURCE_STEPS = 1000
# The uptrained arms: (target, conversion at α = 0, conversion as uptrained, schedule)
ARMS = tuple(
    (target, method, f'{prefix}{method}', schedule)
    for target, methods in (('GQA-2', ('mean', 'aligned')), ('MQA', ('mean', 'aligned')))
    for method in methods
    for prefix, schedule in (('', 'continue'), ('rewarm-', 'rewarm'))
) + (
    ('MLA-32', 'joint_svd', 'joint_svd', 'continue'),
    ('MLA-32', 'joint_svd', 'rewarm-joint_svd', 'rewarm'),
)
ALPHAS = ('0.05', '0.1')


def losses() -> dict[tuple[str, str, str, int], float]:
    """{(model, conversion, alpha_or_steps, seed): held-out loss} of the three CSVs."""
    found: dict[tuple[str, str, str, int], float] = {}
    for name in SOURCES:
        with open(os.path.join(HERE, 'results', f'{name}.csv'), newline='') as f:
            for r in csv.DictReader(f):
                key = (r['model'], r['conversion'], r['alpha_or_steps'], int(r['seed']))
                loss = float(r['heldout_loss'])
                if key in found and found[key] != loss:
                    raise SystemExit(f'{name}.csv: {key} differs from the run another CSV holds')
                found[key] = loss
    return found


def arm_row(found: dict, arm: tuple[str, str, str, str], alpha: str) -> dict:
    """One arm's row: the share closed and the gap left, over the seeds it has."""
    target, method, uptrained, schedule = arm
    scratch = str(round(SOURCE_STEPS * (1 + float(alpha))))
    seeds = sorted(s for m, c, a, s in found if (m, c, a) == (target, uptrained, alpha))
    if not seeds:
        raise SystemExit(f'no run of {target} {uptrained} at alpha {alpha}')
    closed, gap, left, source = [], [], [], []
    for s in seeds:
        start, end = found[target, method, '0.0', s], found[target, uptrained, alpha, s]
        goal = found[target, 'scratch', scratch, s]
        closed.append((start - end) / (start - goal))
        gap.append(start - goal)
        left.append(end - goal)
        source.append(end - found['MHA', 'scratch', '0.0', s])
    share = estimate(closed)
    return {
        'target': target,
        'method': method,
        'schedule': schedule,
        'alpha': alpha,
        'uptraining_steps': round(SOURCE_STEPS * float(alpha)),
        'gap_at_conversion': f'{estimate(gap).mean:.3f}',
        'share_closed': f'{share.mean:.1%}',
        'share_95ci': f'[{share.lo:.1%}, {share.hi:.1%}]',
        'gap_left': f'{estimate(left).mean:+.4f}',
        'vs_source': f'{estimate(source).mean:+.4f}',
        'seeds_behind_source': sum(v > 0 for v in source),
        'seeds': len(seeds),
    }


def run() -> int:
    found = losses()
    rows = [arm_row(found, arm, alpha) for alpha in ALPHAS for arm in ARMS]
    write_csv(os.path.join(HERE, 'results', 'uptrain1k_recovery.csv'), rows)
    for alpha in ALPHAS:
        shares = [float(r['share_closed'][:-1]) for r in rows if r['alpha'] == alpha]
        print(f'alpha {alpha}: {len(shares)} arms close {min(shares):.1f}%-{max(shares):.1f}%')
    return 0


if __name__ == '__main__':
    run_app(run)
