r"""Roofline plot of decode speed: tokens/s against bytes read per token, one point per variant,
context and batch of scripts/bench_decode.py's --json rows, and its reference bandwidth's line
(tokens/s = bandwidth / bytes per token). A point on the line reads memory at that rate.

  python scripts/bench_decode.py --contexts=1024,8192,32768 --batch=1,4,8 --json=decode.json
  python scripts/plot_roofline.py --json=decode.json,more.json \
      --out=docs/studies/decoding/decoding_roofline.png
"""

import json
import os

import matplotlib
from absl import flags

from lm.cli import run_app
from lm.experiments import check_output_file

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_JSON = flags.DEFINE_list('json', [], 'bench_decode.py --json files (comma-separated).')
_OUT = flags.DEFINE_string('out', 'decoding_roofline.png', 'The PNG to write.')

MARKERS = {1: 'o', 4: 's', 8: '^'}


def plot(rows: list[dict], out: str) -> None:
    """Draws `rows` (bench_decode.py's JSON rows, with the roofline fields) into `out`."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    variants = sorted({r['variant'] for r in rows}, key=[r['variant'] for r in rows].index)
    colors = dict(zip(variants, plt.rcParams['axes.prop_cycle'].by_key()['color'], strict=False))
    dtypes = list(dict.fromkeys(r.get('dtype', 'float32') for r in rows))  # the first: filled
    for r in rows:
        bytes_per_token = r['bytes_per_step'] / r['batch']
        hollow = r.get('dtype', 'float32') != dtypes[0]
        ax.scatter(
            bytes_per_token,
            r['decode_tokens_per_sec'],
            marker=MARKERS.get(r['batch'], 'D'),
            facecolors='none' if hollow else colors[r['variant']],
            edgecolors=colors[r['variant']],
            s=40,
        )
    x = np.array([min(r['bytes_per_step'] / r['batch'] for r in rows) / 2, 0])
    x[1] = max(r['bytes_per_step'] / r['batch'] for r in rows) * 2
    bandwidth = float(np.median([r['bandwidth_GBps'] for r in rows])) * 1e9
    ax.plot(x, bandwidth / x, 'k-', lw=1, label=f'reference bandwidth {bandwidth / 1e9:.1f} GB/s')
    ax.plot(x, 0.6 * bandwidth / x, 'k:', lw=1, label='60% of it')
    for v in variants:
        ax.scatter([], [], color=colors[v], marker='s', label=v)
    for b in sorted({r['batch'] for r in rows}):
        ax.scatter([], [], color='gray', marker=MARKERS.get(b, 'D'), label=f'batch {b}')
    if len(dtypes) > 1:
        ax.scatter([], [], facecolors='none', edgecolors='gray', label=f'{dtypes[1]} (hollow)')
    ax.set(
        xscale='log',
        yscale='log',
        xlabel='bytes read per token (weights / batch + filled KV cache)',
        ylabel='decode tokens/s (all rows)',
        title='Decode against the memory roofline (scripts/bench_decode.py)',
    )
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8, loc='lower left')
    fig.tight_layout()
    fig.savefig(out, dpi=120)


# What plot() reads of each bench_decode.py --json row.
KEYS = ('variant', 'batch', 'bytes_per_step', 'decode_tokens_per_sec', 'bandwidth_GBps')


def read_rows(path: str) -> list[dict]:
    """The rows of one bench_decode.py --json file; a one-line error naming the file unless it
    is a non-empty JSON list of objects with the keys plot() reads."""
    with open(path) as f:
        try:
            rows = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f'--json: {path} is not JSON ({e})') from None
    want = f'a non-empty list of bench_decode.py --json rows (objects with {", ".join(KEYS)})'
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f'--json: {path} is not {want}')
    for i, r in enumerate(rows):
        if missing := [k for k in KEYS if k not in r]:
            raise ValueError(f'--json: {path}: row {i} lacks {", ".join(missing)}; expected {want}')
    return rows


def run() -> int:
    if not _JSON.value:
        raise ValueError('--json: name at least one bench_decode.py --json file')
    check_output_file(_OUT.value, '--out', '.png')
    for path in _JSON.value:
        if not os.path.isfile(path):
            raise FileNotFoundError(f'--json: {path!r} does not exist')
    rows = [r for path in _JSON.value for r in read_rows(path)]
    plot(rows, _OUT.value)
    print(f'wrote {_OUT.value} ({len(rows)} points)')
    return 0


if __name__ == '__main__':
    run_app(run)
