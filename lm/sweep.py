"""Sweeps: grid parsing and validation, run names, and the summary table and plot.

A point is a dict of dotted config keys to values ({'model.num_heads': 8, ...}); a sweep is the
points of a sweep file times the cartesian product of `--grid key=v1,v2` flags, times seeds.
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import os
from typing import Any

import ml_collections
import numpy as np

from lm.model import model_config

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


def _get(config: ml_collections.ConfigDict, key: str):
    node = config
    for part in key.split('.'):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ValueError(f'--grid: unknown config key {key!r}')
        node = node[part]
    return node


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    *parents, leaf = key.split('.')
    node = config
    for part in parents:
        node = node[part]
    node[leaf] = value


def _coerce(key: str, raw: str, like: Any) -> Any:
    """Parses a grid value with the type of the config's current value."""
    try:
        if isinstance(like, bool):
            if raw.lower() not in ('true', 'false', '1', '0'):
                raise ValueError
            return raw.lower() in ('true', '1')
        return type(like)(raw)
    except ValueError:
        raise ValueError(f'--grid {key}: {raw!r} is not a {type(like).__name__}') from None


def parse_grid(config: ml_collections.ConfigDict, grids: list[str]) -> list[dict[str, Any]]:
    """`['model.num_heads=4,8', ...]` -> the cartesian product as a list of points."""
    axes = []
    for grid in grids:
        key, sep, values = grid.partition('=')
        key = key.strip()
        if not sep or not values.strip():
            raise ValueError(f'--grid {grid!r}: expected key=value1,value2,...')
        like = _get(config, key)
        if isinstance(like, ml_collections.ConfigDict):
            raise ValueError(f'--grid: {key!r} is a section, not a value')
        axes.append([(key, _coerce(key, v.strip(), like)) for v in values.split(',')])
    return [dict(combo) for combo in itertools.product(*axes)]


def with_overrides(
    config: ml_collections.ConfigDict, overrides: list[str]
) -> ml_collections.ConfigDict:
    """`config` with `['model.dtype=bfloat16', ...]` applied (values typed like the config's)."""
    return point_config(config, parse_grid(config, overrides)[0]) if overrides else config


def point_config(
    base: ml_collections.ConfigDict, point: dict[str, Any]
) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(copy.deepcopy(base.to_dict()))
    for key, value in point.items():
        if key != 'seeds':
            _get(config, key)
            _set(config, key, value)
    return config


def invalid_reason(config: ml_collections.ConfigDict) -> str | None:
    """Why a point's model config cannot be built, or None if it can."""
    model = copy.deepcopy(config.model.to_dict())
    model['vocab_size'] = model['vocab_size'] or 1
    try:
        model_config(ml_collections.ConfigDict(model))
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
    rows = []
    for name, seeds in by_point.items():
        results = []
        for r in seeds:
            with open(os.path.join(r['workdir'], 'results.json')) as f:
                results.append(json.load(f))
        model = results[0]['model']
        loss = [x['eval']['loss'] for x in results]
        ppl = [x['eval']['perplexity'] for x in results]
        rows.append(
            {
                'point': name,
                'attention': model['attention'],
                'num_heads': model['num_heads'],
                'num_kv_heads': model['num_kv_heads'],
                'params': results[0]['params'],
                'kv_cache_bytes_per_token': results[0]['kv_cache_bytes_per_token'],
                'tokens_per_sec': float(np.median([x['tokens_per_sec'] for x in results])),
                'eval_loss': float(np.mean(loss)),
                'eval_loss_std': float(np.std(loss)),
                'eval_perplexity': float(np.mean(ppl)),
                'eval_perplexity_std': float(np.std(ppl)),
                'seeds': len(results),
            }
        )
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
            f'| {r["point"]} | {r["attention"]} | {r["num_heads"]} | {r["num_kv_heads"]} | '
            f'{r["params"]:,} | {r["kv_cache_bytes_per_token"]:,} | {r["tokens_per_sec"]:,.0f} | '
            f'{r["eval_loss"]:.4f} ± {r["eval_loss_std"]:.4f} | '
            f'{r["eval_perplexity"]:.3f} ± {r["eval_perplexity_std"]:.3f} | {r["seeds"]} |'
        )
    with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    _plot(rows, os.path.join(sweep_dir, 'summary.png'))
    return rows


def _plot(rows: list[dict], path: str) -> None:
    """Eval perplexity against KV-cache bytes per token (log x), one marker per attention kind."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    markers = {'mha': 'o', 'gqa': 's', 'mqa': '^', 'mla': 'D'}
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for kind, marker in markers.items():
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
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
