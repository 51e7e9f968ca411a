r"""The kv_contrast study's per-seed CSV, power analysis and trade-off figure.

  python docs/studies/kv_contrast/seeds_csv.py --sweep_dir=runs/kv_contrast

Reads the sweep's summary_seeds.csv (point, seed, eval_loss) and summary.csv (its KV-cache bytes
per token), writes results/kv_contrast_seeds.csv (arm, x = halvings of the KV heads, seed,
eval_loss) for the page's 'trend' table, prints the statement's power analysis from
../kv_layouts/results/kv_layouts_seeds.csv, and draws tradeoff.png: loss against KV-cache bytes
per token, each arm's mean with its 95% interval, and the fitted slope.
"""

import csv
import math
import os

import numpy as np
from absl import flags

from lm.cli import run_app
from lm.experiments import per_seed_contrasts, seeds_needed, trend_contrasts, write_csv

HERE = os.path.dirname(os.path.abspath(__file__))
HALVINGS = {'mha': 0, 'gqa4': 1, 'gqa2': 2, 'mqa': 3}  # 8 query heads: 8, 4, 2, 1 KV heads

_SWEEP_DIR = flags.DEFINE_string('sweep_dir', 'runs/kv_contrast', 'The finished sweep.')


def read(path: str) -> list[dict]:
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def power_analysis() -> None:
    """The statement's numbers, from the same model's 5 seeds at 1,000 steps."""
    rows = read(os.path.join(HERE, '..', 'kv_layouts', 'results', 'kv_layouts_seeds.csv'))
    loss = {(r['arm'], int(r['seed'])): float(r['eval_loss']) for r in rows}
    arms, seeds = ('mha', 'gqa2', 'mqa'), range(5)
    m = np.array([[loss[a, s] for a in arms] for s in seeds])
    diff = m[:, 2] - m[:, 0]
    resid = m - m.mean(1, keepdims=True) - m.mean(0, keepdims=True) + m.mean()
    sigma = math.sqrt((resid**2).sum() / ((len(seeds) - 1) * (len(arms) - 1)))
    effect, sd = diff.mean(), diff.std(ddof=1)
    slope_sd = sigma / math.sqrt(5)  # the slope weights (h - 1.5) / 5 over h = 0..3
    print(f'MQA - MHA {effect:+.4f}, sd {sd:.4f}; residual sigma {sigma:.4f}')
    for name, e, s in (('MHA - MQA', effect * 2 / 3, sd), ('slope', effect * 2 / 9, slope_sd)):
        print(
            f'{name}: 2/3 of the estimate {e:.4f}, sd {s:.4f}: seeds for 80% power '
            f'{seeds_needed(e, s, 0.05)} at alpha 0.05, {seeds_needed(e, s, 0.025)} at 0.025'
        )


def figure(rows: list[dict], bytes_per_token: dict[str, float], out: str) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from lm.experiments import stats

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    xs, means = [], []
    for arm in HALVINGS:
        v = [float(r['eval_loss']) for r in rows if r['arm'] == arm]
        e = stats.estimate(v)
        xs.append(bytes_per_token[arm])
        means.append(e.mean)
        ax.errorbar(xs[-1], e.mean, yerr=[[e.mean - e.lo], [e.hi - e.mean]], fmt='o', capsize=3)
        ax.annotate(arm, (xs[-1], e.mean), textcoords='offset points', xytext=(6, 4))
    slope = trend_contrasts(rows)[0][1]
    h = np.array(list(HALVINGS.values()), dtype=np.float64)
    fit = np.mean(means) + slope.mean * (h - h.mean())
    ax.plot(xs, fit, '--', color='grey', label=f'{slope.mean:+.4f} nats per halving')
    ax.set_xscale('log', base=2)
    ax.set_xlabel('KV-cache bytes per token (bfloat16, 4 layers)')
    ax.set_ylabel('validation loss, mean and 95% CI')
    ax.set_title(f'Tiny Shakespeare, 1,000 steps, {slope.n} seeds per arm', fontsize=10)
    ax.legend(loc='upper right')
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def run() -> int:
    power_analysis()
    sweep = _SWEEP_DIR.value
    seeds = read(os.path.join(sweep, 'summary_seeds.csv'))
    rows = [
        {
            'arm': r['point'],
            'x': HALVINGS[r['point']],
            'seed': r['seed'],
            'eval_loss': r['eval_loss'],
        }
        for r in seeds
        if r['point'] in HALVINGS
    ]
    write_csv(os.path.join(HERE, 'results', 'kv_contrast_seeds.csv'), rows)
    rows = [{k: str(v) for k, v in r.items()} for r in rows]
    _, slopes, _ = per_seed_contrasts(rows)
    print(f'{len(slopes)} seeds with every arm')
    summary = read(os.path.join(sweep, 'summary.csv'))
    column = next(c for c in summary[0] if c.startswith('kv_cache_bytes'))
    bytes_per_token = {r['point']: float(r[column]) for r in summary if r['point'] in HALVINGS}
    figure(rows, bytes_per_token, os.path.join(HERE, 'tradeoff.png'))
    return 0


if __name__ == '__main__':
    run_app(run)
