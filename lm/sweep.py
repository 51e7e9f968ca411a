"""Sweeps: grid parsing and validation, run names, and the summary table and plot.

A point is a dict of dotted config keys to values ({'model.num_heads': 8, ...}); a sweep is the
points of a sweep file times the cartesian product of `--grid key=v1,v2` flags, times seeds.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from typing import Any

import ml_collections
import numpy as np

from lm import accounting, attention
from lm.config import parse_assignment, with_values
from lm.experiment import stored_config
from lm.model import check_model_config, model_config

SHORT = {
    'model.num_heads': 'h',
    'model.num_kv_heads': 'kv',
    'model.num_layers': 'l',
    'model.d_model': 'd',
    'model.head_dim': 'hd',
    'model.kv_lora_rank': 'dc',
    'train.lr': 'lr',
    'train.batch_size': 'b',
    'data.seq_len': 't',
}


def parse_grid(config: ml_collections.ConfigDict, grids: list[str]) -> list[dict[str, Any]]:
    """`['model.num_heads=4,8', ...]` -> the cartesian product as a list of points."""
    axes = []
    for grid in grids:
        key, values = parse_assignment(config, grid, '--grid')
        axes.append([(key, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def point_config(
    base: ml_collections.ConfigDict, point: dict[str, Any]
) -> ml_collections.ConfigDict:
    """`base` with a point's values set ('seeds' is the sweep's, not a config key)."""
    return with_values(base, {k: v for k, v in point.items() if k != 'seeds'})


def invalid_reason(config: ml_collections.ConfigDict) -> str | None:
    """Why a point's model config cannot be built, or None if it can."""
    try:
        check_model_config(config.model)
    except ValueError as e:
        return str(e)
    return None


def run_name(point: dict[str, Any]) -> str:
    """A readable name: {'model.num_heads': 8, 'model.num_kv_heads': 2} -> 'h8_kv2'."""
    parts = []
    for key, value in point.items():
        if key == 'seeds':
            continue
        if key == 'model.attention':
            parts.append(str(value))
        else:
            parts.append(f'{SHORT.get(key, key.split(".")[-1])}{value}')
    return '_'.join(parts) or 'base'


def summarise(sweep_dir: str, runs: list[dict]) -> list[dict]:
    """Writes summary.csv, summary.md and summary.png; returns the rows (one per point).

    runs: [{'point': name, 'config': ConfigDict, 'workdir': path}, ...] (one per seed).
    """
    by_point: dict[str, list[dict]] = {}
    for r in runs:
        by_point.setdefault(r['point'], []).append(r)
    rows = [_summary_row(name, seeds) for name, seeds in by_point.items()]
    with open(os.path.join(sweep_dir, 'summary.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        '| run | attention | H | KV heads | params | KV cache B/token (bf16) | train tok/s | '
        'eval loss | eval perplexity | seeds |',
        '|---|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        lines.append(
            f'| {r["point"]} | {r["attention"]} | {r["num_heads"]} | {r["kv_heads"]} | '
            f'{r["params"]:,} | {r["kv_cache_bytes_per_token"]:,} | {r["tokens_per_sec"]:,.0f} | '
            f'{r["eval_loss"]:.4f} ± {r["eval_loss_std"]:.4f} | '
            f'{r["eval_perplexity"]:.3f} ± {r["eval_perplexity_std"]:.3f} | {r["seeds"]} |'
        )
    with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    _plot(rows, os.path.join(sweep_dir, 'summary.png'))
    return rows


def _summary_row(name: str, seeds: list[dict]) -> dict:
    """One point's row: its model's size and bf16 KV cache (from the run's saved config), the
    median training throughput and the mean ± std of the final eval over seeds."""
    results = []
    for r in seeds:
        with open(os.path.join(r['workdir'], 'results.json')) as f:
            results.append(json.load(f))
    cfg = model_config(stored_config(seeds[0]['workdir']).model)
    loss = [x['eval']['loss'] for x in results]
    ppl = [x['eval']['perplexity'] for x in results]
    return {
        'point': name,
        'attention': cfg.attention,
        'num_heads': cfg.num_heads,
        'kv_heads': attention.variant(cfg).kv_heads(cfg),
        'params': accounting.param_counts(cfg)['total'],
        'kv_cache_bytes_per_token': accounting.kv_cache_bytes_per_token(cfg, 'bfloat16'),
        'tokens_per_sec': float(np.median([x['tokens_per_sec'] for x in results])),
        'eval_loss': float(np.mean(loss)),
        'eval_loss_std': float(np.std(loss)),
        'eval_perplexity': float(np.mean(ppl)),
        'eval_perplexity_std': float(np.std(ppl)),
        'seeds': len(results),
    }


MARKERS = 'os^Dv<>ph*'  # one per attention kind, in registry order


def _plot(rows: list[dict], path: str) -> list[str]:
    """Eval perplexity against KV-cache bytes per token (log x), one marker per attention kind;
    returns the legend's labels."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for i, kind in enumerate(attention.VARIANTS):
        marker = MARKERS[i % len(MARKERS)]
        pts = [r for r in rows if r['attention'] == kind]
        if pts:
            ax.errorbar(
                [r['kv_cache_bytes_per_token'] for r in pts],
                [r['eval_perplexity'] for r in pts],
                yerr=[r['eval_perplexity_std'] for r in pts],
                fmt=marker,
                ms=7,
                capsize=3,
                label=kind.upper(),
            )
    for r in rows:
        ax.annotate(
            r['point'],
            (r['kv_cache_bytes_per_token'], r['eval_perplexity']),
            textcoords='offset points',
            xytext=(6, 4),
            fontsize=8,
        )
    lo = min(r['kv_cache_bytes_per_token'] for r in rows)
    hi = max(r['kv_cache_bytes_per_token'] for r in rows)
    ax.set_xscale('log')
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f'{v:,.0f}'))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([2**k for k in range(64) if lo / 1.6 <= 2**k <= hi * 2.5])
    ax.set_xlim(lo / 1.6, hi * 1.6 if hi > lo else lo * 2.5)
    ax.set_xlabel('KV cache bytes per token (bf16, all layers; log scale)')
    ax.set_ylabel('eval perplexity')
    ax.set_title('Quality vs KV-cache memory')
    ax.grid(True, which='both', alpha=0.3)
    labels = ax.get_legend_handles_labels()[1]
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return labels
