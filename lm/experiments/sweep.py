"""Sweeps as a plan for the experiment runner: grid parsing and validation, run names, one
`Spec` per (point, seed), and the summary table and plot.

A point is a dict of dotted config keys to values ({'model.num_heads': 8, ...}); a sweep is the
points of a sweep file times the cartesian product of `--grid key=v1,v2` flags, times seeds.
Each run trains in its own process (the `train_command` the CLI gives, i.e. train.py) in
<sweep_dir>/<name>; its fingerprint is its whole config, of which `RESUMABLE_KEYS` (more
train.steps, ...) may change: the run then resumes from its checkpoint. The summary reports each
point's loss over seeds and every paired difference between points (lm.experiments.summary).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import types
from typing import Any

import ml_collections
import numpy as np

from lm.config import parse_assignment, with_values, write_config_file
from lm.config_migration import ADDED_KEYS
from lm.experiments import stats, summary
from lm.experiments.fairness import DESCRIPTIONS, MATCHES, match_parameters, reference_config
from lm.experiments.runner import RunFailed, RunStopped, Spec, call, stopped_by
from lm.model import accounting, attention
from lm.model.transformer import check_model_config, model_config
from lm.train.checkpoint import saved_steps
from lm.train.run import check_loop_config, stored_config
from lm.train.workdir import flat_config, resumable_key

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
    'seed': 's',
}


def parse_grid(config: ml_collections.ConfigDict, grids: list[str]) -> list[dict[str, Any]]:
    """`['model.num_heads=4,8', ...]` -> the cartesian product as a list of points."""
    axes, keys = [], set()
    for grid in grids:
        key, values = parse_assignment(config, grid, '--grid')
        if key in keys:
            raise ValueError(f'--grid: {key} is given twice; list its values once ({key}=a,b)')
        if len(set(map(repr, values))) < len(values):
            raise ValueError(f'--grid {grid!r}: a value is repeated; each value once')
        keys.add(key)
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


# Keys the kind-and-heads part of a run's name already says.
NAMED = ('seeds', 'model.attention', 'model.num_heads', 'model.num_kv_heads')


def run_name(point: dict[str, Any], config: ml_collections.ConfigDict) -> str:
    """A short name that TensorBoard shows whole: the attention kind and query heads, the KV
    heads where the kind leaves them free (`gqa_h8_kv2`, `mha_h8`, `mqa_h8`, `mla_h8`), then
    the point's other values ({'train.lr': 0.001} -> `_lr0.001`)."""
    cfg = check_model_config(config.model)
    kind = attention.variant(cfg)
    parts = [cfg.attention, f'h{cfg.num_heads}']
    implied = kind.parse_spec(cfg.attention) or {}
    if cfg.num_kv_heads and 'num_kv_heads' not in implied:  # the kind's name leaves them free
        parts.append(f'kv{cfg.num_kv_heads}')
    for key, value in point.items():
        if key not in NAMED:
            parts.append(f'{SHORT.get(key, key.split(".")[-1])}{value}')
    return '_'.join(parts)


def load_sweep_file(path: str) -> types.ModuleType:
    """The sweep file (a config file that may define get_points() and MATCH) as a module."""
    spec = importlib.util.spec_from_file_location('_lm_sweep_file', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_points(module: types.ModuleType, names: list[str] = ()) -> list[dict]:
    """The sweep file's points (`get_points()`, else one empty point); only those `names`
    names when any are given (--points), in the file's order."""
    points = module.get_points() if hasattr(module, 'get_points') else [{}]
    known = [p.get('name', '') for p in points]
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"--points: {unknown} not among the sweep file's points {known}")
    return [p for p in points if not names or p.get('name', '') in names]


def fairness(module: types.ModuleType, match: str = '') -> str:
    """`match` (--match), else the sweep file's MATCH, else 'width'."""
    match = match or getattr(module, 'MATCH', 'width')
    if match not in MATCHES:
        raise ValueError(f'--match / MATCH must be one of {MATCHES}, got {match!r}')
    return match


def _valid_points(base: ml_collections.ConfigDict, points: list[dict]) -> list[tuple]:
    """[(name, point, config)] of the points whose model can be built; a one-line note for each
    skipped one."""
    valid = []
    for named in points:
        point = {k: v for k, v in named.items() if k != 'name'}
        config = point_config(base, point)
        if reason := invalid_reason(config):
            print(f'skipping {named.get("name") or point}: {reason}')
            continue
        name = named.get('name') or run_name(point, config)
        valid.append((name, point, config))
    if not valid:
        raise ValueError('the sweep has no valid point')
    return valid


def plan(
    base: ml_collections.ConfigDict,
    points: list[dict],
    sweep_dir: str,
    train_command: list[str],
    seeds: int = 1,
    match: str = 'width',
    tb_dir: str = '',
) -> list[Spec]:
    """A Spec per (point, seed) after skipping invalid points; with match='params', each point's
    mlp_dim brings it within 1% of the MHA point's parameters. A point's 'seeds' overrides
    `seeds`; seed s of a point trains with config.seed + s. Runs log to `tb_dir` (default
    <sweep_dir>/tb)."""
    valid = _valid_points(base, points)
    if match == 'params':
        configs = [c for _, _, c in valid]
        matched = match_parameters(
            configs, reference_config(base, configs), [n for n, _, _ in valid]
        )
        valid = [(n, p, c) for (n, p, _), c in zip(valid, matched, strict=True)]
    tb_dir = tb_dir or os.path.join(sweep_dir, 'tb')
    specs = []
    for name, point, config in valid:
        n = point.get('seeds', seeds)
        for s in range(n):
            seeded = point_config(config, {'seed': config.seed + s})  # the point's own seed
            try:
                check_loop_config(seeded)
            except ValueError as e:
                raise ValueError(f'sweep point {name}: {e}') from None
            specs.append(
                Spec(
                    name=f'{name}_s{s}' if n > 1 else name,
                    fingerprint=flat_config(seeded),
                    run=_trainer(seeded, train_command, tb_dir),
                    arm=name,
                    seed=seeded.seed,
                    resumable=resumable_key,
                    added=ADDED_KEYS,
                )
            )
    return specs


PROGRESS = ('] eval at step ', '] resumed from ')  # train.log lines a sweep echoes


def _train_logged(argv: list[str], workdir: str) -> int:
    """Runs `argv` (`runner.call`: a stop signal is passed on to it), appending its output to
    <workdir>/train.log and echoing its evaluation lines (`<run>: eval at step N: ...`) as they
    come; returns its exit code."""
    name = os.path.basename(os.path.normpath(workdir))

    def echo(line: str) -> None:
        for marker in PROGRESS:
            if marker in line:
                print(f'{name}: {marker[2:]}{line.split(marker, 1)[1]}', end='', flush=True)

    with open(os.path.join(workdir, 'train.log'), 'a') as log:
        return call(argv, log, echo)


def _trainer(config: ml_collections.ConfigDict, command: list[str], tb_dir: str):
    """A Spec's run: `command` (train.py) trains `config` in the workdir, logging to
    <workdir>/train.log and echoing its progress; its result is the run's results.json."""

    def run(workdir: str) -> dict:
        cfg_file = write_config_file(config, os.path.join(workdir, 'sweep_config.py'))
        args = [f'--config={cfg_file}', f'--workdir={workdir}', f'--tb_dir={tb_dir}']
        code = _train_logged([*command, *args], workdir)
        if name := stopped_by(code):
            steps = saved_steps(workdir)
            kept = f'its checkpoint of step {steps[-1]} kept' if steps else 'no checkpoint yet'
            raise RunStopped(
                f'{os.path.basename(workdir)} stopped by {name}: {kept}; repeating the command '
                'resumes it'
            )
        results = os.path.join(workdir, 'results.json')
        if code != 0 or not os.path.exists(results):
            raise RunFailed(f'exit {code}; see {workdir}/train.log')
        with open(results) as f:
            return json.load(f)

    return run


def check_same_fairness(sweep_dir: str, match: str) -> None:
    """Records the sweep's fairness in <sweep_dir>/match; a re-run with another one stops with a
    one-line error."""
    path = os.path.join(sweep_dir, 'match')
    if os.path.exists(path):
        with open(path) as f:
            before = f.read().strip()
        if before != match:
            raise ValueError(
                f'--match={match}: {sweep_dir} holds a --match={before} sweep; use another '
                '--sweep_dir'
            )
    else:  # written once: a refused re-run leaves the sweep directory untouched
        os.makedirs(sweep_dir, exist_ok=True)
        with open(path, 'w') as f:
            f.write(match + '\n')


def summarise(
    sweep_dir: str, specs: list[Spec], found: dict[str, dict], match: str = 'width'
) -> list[dict]:
    """Writes summary.csv, summary_pairs.csv, summary_seeds.csv (each run's loss),
    summary.md and summary.png from the finished runs (`found`: {name: result},
    lm.experiments.runner.results); returns the rows. Where every run is a recall run, the same
    for its held-out recall accuracy beside the loss, with its pairs in
    summary_pairs_recall.csv.

    Loss (and accuracy) per point: mean, sample std (ddof 1) and 95% t-interval over seeds;
    between points: the paired difference over the seeds both ran (same seed = same data order),
    resolved when its Holm-corrected p (over every pair of points, one family per metric) is
    below 0.05. `match` is the fairness the sweep used (`lm.experiments.fairness`).
    """
    specs = [s for s in specs if s.name in found]
    losses = summary.by_arm(specs, found, summary.loss)
    recall = all('recall_accuracy' in found[s.name]['eval'] for s in specs)
    accuracy = summary.by_arm(specs, found, _accuracy) if recall else {}
    ppl = summary.by_arm(specs, found, lambda r: r['eval']['perplexity'])
    rows = []
    for point, values in losses.items():
        results = [found[s.name] for s in specs if s.arm == point]
        first = next(s for s in specs if s.arm == point)
        perplexity = summary.estimate_columns('eval_perplexity', ppl[point])
        rows.append(
            {
                'point': point,
                **_point_model(os.path.join(sweep_dir, first.name)),
                'tokens_per_sec': float(np.median([x['tokens_per_sec'] for x in results])),
                **summary.estimate_columns('eval_loss', values),
                'eval_loss_stderr_windows': float(
                    np.mean([x['eval'].get('loss_stderr', np.nan) for x in results])
                ),
                'eval_tokens': results[0]['eval'].get('tokens', 0),
                'eval_perplexity': perplexity['eval_perplexity'],
                'eval_perplexity_std': perplexity['eval_perplexity_std'],
                'seeds': len(values),
            }
        )
        if recall:
            rows[-1].update(summary.estimate_columns('eval_recall_accuracy', accuracy[point]))
    pairs = summary.all_pairs(losses)
    summary.write_csv(os.path.join(sweep_dir, 'summary.csv'), rows)
    summary.write_csv(os.path.join(sweep_dir, 'summary_pairs.csv'), pairs)
    seeds = summary.seed_rows(losses, ('point',), 'eval_loss')
    recall_pairs = []
    if recall:
        recall_pairs = summary.all_pairs(accuracy, 'accuracy')
        summary.write_csv(os.path.join(sweep_dir, 'summary_pairs_recall.csv'), recall_pairs)
        by_seed = summary.seed_rows(accuracy, ('point',), 'eval_recall_accuracy')
        seeds = [{**a, **b} for a, b in zip(seeds, by_seed, strict=True)]
    summary.write_csv(os.path.join(sweep_dir, 'summary_seeds.csv'), seeds)
    with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
        f.write(_markdown(rows, pairs, losses, match))
        if recall:
            f.write(_recall_markdown(rows, recall_pairs, accuracy))
    _plot(rows, os.path.join(sweep_dir, 'summary.png'))
    return rows


def _accuracy(result: dict) -> float:
    """A recall run's final held-out recall accuracy."""
    return result['eval']['recall_accuracy']


def _point_model(workdir: str) -> dict:
    """A point's model columns, from its run's saved config: size, what its KV cache holds and
    its bf16 KV-cache bytes per token of a training-length sequence (local layers hold W)."""
    config = stored_config(workdir)
    cfg = model_config(config.model)
    return {
        'attention': cfg.attention,
        'num_heads': cfg.num_heads,
        'kv_heads': attention.variant(cfg).kv_heads(cfg),
        'mlp_dim': cfg.mlp_dim,
        'params': accounting.param_counts(cfg)['total'],
        'kv_cache_bytes_per_token': accounting.kv_cache_bytes_per_context_token(
            cfg, config.data.seq_len
        ),
    }


def _reference(rows: list[dict]) -> dict:
    """The row differences are taken against: the first MHA point, else the first point."""
    mha = attention.baseline()['attention']
    return next((r for r in rows if r['attention'] == mha), rows[0])


def _markdown(rows: list[dict], pairs: list[dict], losses: dict, match: str) -> str:
    ref = _reference(rows)
    spread = max(abs(r['params'] - ref['params']) / ref['params'] for r in rows)
    tokens = sorted({r['eval_tokens'] for r in rows})
    lines = [
        f'Fairness: {DESCRIPTIONS[match]} (largest parameter gap to {ref["point"]}: {spread:.2%}).',
        f'Evaluation: {", ".join(f"{t:,}" for t in tokens)} validation tokens per run, each '
        'scored once (lm.train.evaluation). Loss: mean ± sample std (ddof 1) over seeds, with its '
        '95% '
        f't-interval; Δ vs {ref["point"]}: paired difference over seeds (same seed = same data '
        'order) with its 95% interval. '
        + summary.family_note(pairs[0]['comparisons'] if pairs else 0),
        '',
        '| run | attention | H | KV heads | mlp_dim | params | KV cache B/token (bf16) | '
        'train tok/s | eval loss | 95% CI | eval perplexity | seeds | '
        f'Δ loss vs {ref["point"]} (95% CI) |',
        '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    p_holm = {frozenset((p['a'], p['b'])): p['p_holm'] for p in pairs}
    for r in rows:
        point = r['point']
        diff = stats.paired_difference(losses[point], losses[ref['point']])
        delta = (
            '—' if r is ref else summary.diff_cell(diff, p_holm[frozenset((point, ref['point']))])
        )
        lines.append(
            f'| {point} | {r["attention"]} | {r["num_heads"]} | {r["kv_heads"]} | '
            f'{r["mlp_dim"]} | {r["params"]:,} | {r["kv_cache_bytes_per_token"]:,} | '
            f'{r["tokens_per_sec"]:,.0f} | {summary.cell(losses[point])} | '
            f'{summary.mean_std(r["eval_perplexity"], r["eval_perplexity_std"], r["seeds"], 3)} | '
            f'{r["seeds"]} | '
            f'{delta} |'
        )
    return '\n'.join(lines + _orderings(pairs, 'loss', 'eval loss')) + '\n'


def _recall_markdown(rows: list[dict], pairs: list[dict], accuracy: dict) -> str:
    """The recall table: each point's held-out recall accuracy against its KV bytes, and its
    orderings (their own Holm family)."""
    lines = [
        '',
        'Recall accuracy on the held-out examples (answers whose argmax is right): mean ± sample '
        'std over seeds, with its 95% t-interval. '
        + summary.family_note(pairs[0]['comparisons'] if pairs else 0),
        '',
        '| run | KV cache B/token (bf16) | recall accuracy | 95% CI | seeds |',
        '|---|---|---|---|---|',
    ]
    for r in rows:
        lines.append(
            f'| {r["point"]} | {r["kv_cache_bytes_per_token"]:,} | '
            f'{summary.cell(accuracy[r["point"]])} | {r["seeds"]} |'
        )
    return '\n'.join(lines + _orderings(pairs, 'accuracy', 'recall accuracy')) + '\n'


def _orderings(pairs: list[dict], value: str, label: str) -> list[str]:
    """The lines of an orderings table: every pair's paired difference of `value`."""
    lines = [
        '',
        f'Orderings ({label}, paired over seeds; resolved when the Holm-corrected p over these '
        f'{len(pairs)} comparisons is below 0.05):',
        '',
        f'| a | b | Δ {value} a − b | 95% CI | seeds | p | p (Holm) | ordering |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for p in pairs:
        diff = p[f'{value}_diff']
        d = stats.Estimate(p['seeds'], diff, p[f'{value}_diff_std'], p['ci_lo'], p['ci_hi'])
        lines.append(
            f'| {p["a"]} | {p["b"]} | {diff:+.4f} | {d.interval()} | {p["seeds"]} | '
            f'{_p(p["p"])} | {_p(p["p_holm"])} | {p["ordering"]}{" ✓" if p["resolved"] else ""} |'
        )
    return lines


def _p(p: float) -> str:
    """A p-value cell: 'n/a' where one seed gives no test."""
    return 'n/a' if math.isnan(p) else f'{p:.3g}'


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
