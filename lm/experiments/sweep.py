"""Sweeps: grid parsing and validation, run names, and the summary table and plot.

A point is a dict of dotted config keys to values ({'model.num_heads': 8, ...}); a sweep is the
points of a sweep file times the cartesian product of `--grid key=v1,v2` flags, times seeds.
The summary reports each point's loss over seeds and every paired difference between points
with `lm.experiments.stats` (sample std, 95% t-intervals, resolved orderings).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from typing import Any

import ml_collections
import numpy as np

from lm.config import parse_assignment, with_values
from lm.experiments import stats
from lm.experiments.fairness import DESCRIPTIONS
from lm.model import accounting, attention
from lm.model.transformer import check_model_config, model_config
from lm.train.run import stored_config

SHORT = {
    'model.num_heads': 'h',
    'model.num_kv_heads': 'kv',
    'model.num_layers': 'l',
    'model.d_model': 'd',
    'model.head_dim': 'hd',
    'model.mla.kv_lora_rank': 'dc',
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


def _results(runs: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    """point -> [(seed, results.json), ...] in the order points first appear."""
    by_point: dict[str, list[tuple[int, dict]]] = {}
    for r in runs:
        with open(os.path.join(r['workdir'], 'results.json')) as f:
            by_point.setdefault(r['point'], []).append((r['config'].seed, json.load(f)))
    return by_point


def _reference(rows: list[dict]) -> dict:
    """The row differences are taken against: the first MHA point, else the first point."""
    mha = attention.baseline()['attention']
    return next((r for r in rows if r['attention'] == mha), rows[0])


def summarise(sweep_dir: str, runs: list[dict], match: str = 'width') -> list[dict]:
    """Writes summary.csv, summary_pairs.csv, summary.md and summary.png; returns the rows.

    runs: [{'point': name, 'config': ConfigDict, 'workdir': path}, ...] (one per seed).
    Loss per point: mean, sample std (ddof 1) and 95% t-interval over seeds; between points:
    the paired difference over the seeds both ran (same seed = same data order), resolved when
    its 95% interval excludes 0. `match` is the fairness the sweep used (`lm.experiments.fairness`).
    """
    by_point = _results(runs)
    workdirs = {}
    for r in runs:
        workdirs.setdefault(r['point'], r['workdir'])
    losses = {p: {s: x['eval']['loss'] for s, x in res} for p, res in by_point.items()}
    rows = []
    for name, res in by_point.items():
        results = [x for _, x in res]
        model = _point_model(workdirs[name])
        loss = stats.estimate(list(losses[name].values()))
        ppl = stats.estimate([x['eval']['perplexity'] for x in results])
        rows.append(
            {
                'point': name,
                **model,
                'tokens_per_sec': float(np.median([x['tokens_per_sec'] for x in results])),
                'eval_loss': loss.mean,
                'eval_loss_std': loss.std,
                'eval_loss_ci_lo': loss.lo,
                'eval_loss_ci_hi': loss.hi,
                'eval_loss_stderr_windows': float(
                    np.mean([x['eval'].get('loss_stderr', np.nan) for x in results])
                ),
                'eval_tokens': results[0]['eval'].get('tokens', 0),
                'eval_perplexity': ppl.mean,
                'eval_perplexity_std': ppl.std,
                'seeds': loss.n,
            }
        )
    ref = _reference(rows)
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            d = stats.paired_difference(losses[a['point']], losses[b['point']])
            pairs.append(
                {
                    'a': a['point'],
                    'b': b['point'],
                    'loss_diff': d.mean,
                    'loss_diff_std': d.std,
                    'ci_lo': d.lo,
                    'ci_hi': d.hi,
                    'seeds': d.n,
                    'resolved': d.resolved,
                    'ordering': stats.ordering(a['point'], b['point'], d),
                }
            )
    _write_csv(os.path.join(sweep_dir, 'summary.csv'), rows)
    _write_csv(os.path.join(sweep_dir, 'summary_pairs.csv'), pairs)
    with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
        f.write(_markdown(rows, pairs, ref, losses, match))
    _plot(rows, os.path.join(sweep_dir, 'summary.png'))
    return rows


def _point_model(workdir: str) -> dict:
    """A point's model columns, from its run's saved config: size, what its KV cache holds and
    its bf16 KV-cache bytes per token."""
    cfg = model_config(stored_config(workdir).model)
    return {
        'attention': cfg.attention,
        'num_heads': cfg.num_heads,
        'kv_heads': attention.variant(cfg).kv_heads(cfg),
        'mlp_dim': cfg.mlp_dim,
        'params': accounting.param_counts(cfg)['total'],
        'kv_cache_bytes_per_token': accounting.kv_cache_bytes_per_token(cfg, 'bfloat16'),
    }


def _write_csv(path: str, rows: list[dict]) -> None:
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ['point'])
        writer.writeheader()
        writer.writerows(rows)


def _markdown(rows: list[dict], pairs: list[dict], ref: dict, losses: dict, match: str) -> str:
    spread = max(abs(r['params'] - ref['params']) / ref['params'] for r in rows)
    tokens = sorted({r['eval_tokens'] for r in rows})
    lines = [
        f'Fairness: {DESCRIPTIONS[match]} (largest parameter gap to {ref["point"]}: {spread:.2%}).',
        f'Evaluation: {", ".join(f"{t:,}" for t in tokens)} validation tokens per run, each '
        'scored once (lm.train.evaluation). Loss: mean ± sample std (ddof 1) over seeds, with its '
        '95% '
        f't-interval; Δ vs {ref["point"]}: paired difference over seeds (same seed = same data '
        'order), ✓ = resolved at 95% (interval excludes 0).',
        '',
        '| run | attention | H | KV heads | mlp_dim | params | KV cache B/token (bf16) | '
        'train tok/s | eval loss | 95% CI | eval perplexity | seeds | '
        f'Δ loss vs {ref["point"]} (95% CI) |',
        '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        loss = stats.estimate(list(losses[r['point']].values()))
        if r is ref:
            delta = '—'
        else:
            d = stats.paired_difference(losses[r['point']], losses[ref['point']])
            delta = f'{d.mean:+.4f} {d.interval()}{" ✓" if d.resolved else ""}'
        lines.append(
            f'| {r["point"]} | {r["attention"]} | {r["num_heads"]} | {r["kv_heads"]} | '
            f'{r["mlp_dim"]} | {r["params"]:,} | {r["kv_cache_bytes_per_token"]:,} | '
            f'{r["tokens_per_sec"]:,.0f} | {r["eval_loss"]:.4f} ± {r["eval_loss_std"]:.4f} | '
            f'{loss.interval()} | {r["eval_perplexity"]:.3f} ± '
            f'{r["eval_perplexity_std"]:.3f} | {r["seeds"]} | {delta} |'
        )
    lines += [
        '',
        'Orderings (eval loss, paired over seeds; resolved when the 95% interval of the '
        'difference excludes 0):',
        '',
        '| a | b | Δ loss a − b | 95% CI | seeds | ordering |',
        '|---|---|---|---|---|---|',
    ]
    for p in pairs:
        d = stats.Estimate(p['seeds'], p['loss_diff'], p['loss_diff_std'], p['ci_lo'], p['ci_hi'])
        lines.append(
            f'| {p["a"]} | {p["b"]} | {p["loss_diff"]:+.4f} | {d.interval()} | {p["seeds"]} | '
            f'{p["ordering"]}{" ✓" if p["resolved"] else ""} |'
        )
    return '\n'.join(lines) + '\n'


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
                yerr=[np.nan_to_num(r['eval_perplexity_std']) for r in pts],
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
