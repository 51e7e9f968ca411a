"""A finished sweep's summary (`summarise`): per point its loss (and recall accuracy) over
seeds, the paired orderings between points with Holm's correction, and the files a sweep leaves
at its end (summary.md, summary.csv, summary_pairs*.csv, summary_seeds.csv, summary.png).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from lm.data.checks import eval_text_settings
from lm.experiments import stats, summary
from lm.experiments.fairness import DESCRIPTIONS
from lm.experiments.runner import Spec
from lm.model import accounting, attention
from lm.model.transformer import model_config
from lm.train.provenance import SESSIONS, version
from lm.train.stored import stored_config


def summarise(
    sweep_dir: str, specs: list[Spec], found: dict[str, dict], match: str = 'width'
) -> list[dict]:
    """Writes summary.csv, summary_pairs.csv, summary_seeds.csv (each run's loss), summary.md
    and summary.png from the finished runs (`found`: {name: result}, runner.results); returns
    the rows. Where every run is a recall run, the same for its held-out recall accuracy beside
    the loss, with its pairs in summary_pairs_recall.csv.

    Loss (and accuracy) per point: mean, sample std (ddof 1) and 95% t-interval over seeds;
    between points: the paired difference over the seeds both ran (same seed = same data order),
    resolved when its Holm-corrected p (over every pair of points, one family per metric) is
    below 0.05. `match` is the fairness the sweep used (`lm.experiments.fairness`). A planned
    run without a result (failed, or not yet run) is named at the top of summary.md.
    """
    missing = [s.name for s in specs if s.name not in found]
    specs = [s for s in specs if s.name in found]
    losses = summary.by_arm(specs, found, summary.loss)
    recall = all('recall_accuracy' in found[s.name]['eval'] for s in specs)
    accuracy = summary.by_arm(specs, found, _accuracy) if recall else {}
    rows = _rows(sweep_dir, specs, found, losses)
    for row in rows if recall else ():
        row.update(summary.estimate_columns('eval_recall_accuracy', accuracy[row['point']]))
    texts = {s.arm: eval_text_settings(dict(s.fingerprint)) for s in specs}
    same_text = _same_text_pairs(texts)
    pairs = summary.all_pairs(losses, pairs=same_text)
    summary.write_csv(os.path.join(sweep_dir, 'summary.csv'), rows)
    summary.write_csv(os.path.join(sweep_dir, 'summary_pairs.csv'), pairs)
    seeds = summary.seed_rows(losses, ('point',), 'eval_loss')
    recall_pairs = []
    if recall:
        recall_pairs = summary.all_pairs(accuracy, 'accuracy', same_text)
        summary.write_csv(os.path.join(sweep_dir, 'summary_pairs_recall.csv'), recall_pairs)
        by_seed = summary.seed_rows(accuracy, ('point',), 'eval_recall_accuracy')
        seeds = [{**a, **b} for a, b in zip(seeds, by_seed, strict=True)]
    summary.write_csv(os.path.join(sweep_dir, 'summary_seeds.csv'), seeds)
    with open(os.path.join(sweep_dir, 'summary.md'), 'w') as f:
        f.write(_incomplete_note(missing, len(missing) + len(specs)))
        f.write(_text_note(texts))
        f.write(_provenance_note(found, specs))
        f.write(_markdown(rows, pairs, losses, match))
        if recall:
            f.write(_recall_markdown(rows, recall_pairs, accuracy))
    _plot(rows, os.path.join(sweep_dir, 'summary.png'))
    return rows


def _rows(sweep_dir: str, specs: list[Spec], found: dict, losses: dict) -> list[dict]:
    """summary.csv's row of each point: its model, train tokens/s, eval loss and perplexity
    over seeds."""
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
    return rows


def _same_text_pairs(texts: dict) -> summary.PairPicker:
    """The pairs of points scored on the same text (`eval_text_settings`): only those are
    paired by seed; a point trained on another val_fraction or part is scored elsewhere."""

    def pick(names: list[str]) -> list[tuple[str, str]]:
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if texts[a] == texts[b]]

    return pick


def _text_note(texts: dict) -> str:
    """summary.md's line when points are scored on different text ('' when all share one):
    which settings differ; their pairs are not compared."""
    first = next(iter(texts.values()))
    differ = sorted({k for t in texts.values() for k in t | first if t.get(k) != first.get(k)})
    if not differ:
        return ''
    return (
        f'**Points differ in what their evaluation scores ({", ".join(differ)}): only points '
        'scored on the same text are compared below.**\n\n'
    )


def _provenance_note(found: dict[str, dict], specs: list[Spec]) -> str:
    """summary.md's lines when the runs were trained by more than one version of the code (its
    `lm/` and `configs/`, else the commit) or toolchain (results.json's 'trained_by' and
    'trained_by_sessions', `lm.train.provenance.version`), when a run changed version part-way,
    or when some do not record it ('' when all record one and agree): a paired difference across
    two of them holds the code's or the toolchain's effect as well as the arms' (docs/train.md,
    golden runs)."""
    arm = {s.name: s.arm for s in specs}
    groups: dict[str, list[str]] = {}  # the versions a run was trained by, in order: its runs
    unknown, parts = [], {}
    for name, result in sorted(found.items()):
        steps = _versions_by_steps(result)
        if not steps:
            unknown.append(name)
            continue
        versions = [v for i, (_, v) in enumerate(steps) if i == 0 or v != steps[i - 1][1]]
        groups.setdefault(json.dumps(versions, sort_keys=True), []).append(name)
        if len(versions) > 1:
            parts[name] = steps
    told = [json.loads(k) for k in groups]
    fields = _differing_fields([v for versions in told for v in versions])
    lines = []
    if len({json.dumps(v, sort_keys=True) for versions in told for v in versions}) > 1:

        def described(versions: list[dict], names: list[str]) -> str:
            points = ', '.join(dict.fromkeys(arm.get(n, n) for n in names))
            return f'{len(names)} by {" then ".join(map(fields, versions))} (points: {points})'

        shown = '; '.join(described(v, n) for v, n in zip(told, groups.values(), strict=True))
        lines.append(
            f'**Runs trained by more than one version of the code or toolchain: {shown}. A '
            "paired difference between runs of two of them holds the code's or the toolchain's "
            "effect as well as the arms' (docs/train.md, golden runs).**"
        )
    if parts:
        name, steps = next(iter(parts.items()))
        shown = ', '.join(f'steps {a + 1}-{b} under {fields(v)}' for (a, b), v in steps)
        lines.append(
            f'**Runs whose code or toolchain changed part-way: {len(parts)} of {len(found)} '
            f'(e.g. {name}: {shown}; its results.json lists them as {SESSIONS}).**'
        )
    if unknown and groups:
        lines.append(
            f'**Runs without a record of what trained them (finished before results.json held '
            f'it): {len(unknown)} of {len(found)}, e.g. {unknown[0]}.**'
        )
    return ''.join(line + '\n\n' for line in lines)


def _versions_by_steps(result: dict) -> list[tuple[list[int], dict]]:
    """A run's ([from, to] steps, `version`) pairs: its recorded sessions, or one pair of its
    'trained_by' where it lists none; [] where it records neither."""
    sessions = [(e['steps'], version(e)) for e in result.get(SESSIONS, []) if version(e)]
    by = version(result.get('trained_by', {}))
    return sessions or ([([0, result.get('step')], by)] if by else [])


def _differing_fields(versions: list[dict]):
    """A version's 'key value, ...' on the keys where `versions` differ (digests shortened to 10
    digits, an edit's '+digest' kept)."""
    differ = sorted(k for k in set().union(*versions) if len({str(v.get(k)) for v in versions}) > 1)

    def shown(key: str, value) -> str:
        if key in ('commit', 'code') and value:
            digest, plus, edit = value.partition('+')
            return digest[:10] + plus + edit
        return str(value)

    return lambda v: ', '.join(f'{k} {shown(k, v.get(k))}' for k in differ)


def _incomplete_note(missing: list[str], planned: int) -> str:
    """summary.md's first line when planned runs have no result ('' when none is missing)."""
    if not missing:
        return ''
    shown = ', '.join(missing[:5]) + (f' and {len(missing) - 5} more' if len(missing) > 5 else '')
    return (
        f'**Incomplete: {len(missing)} of {planned} planned runs have no result ({shown}).** '
        'The tables below cover the others; re-run the sweep to complete them.\n\n'
    )


def _accuracy(result: dict) -> float:
    """A recall run's final held-out recall accuracy."""
    return result['eval']['recall_accuracy']


def _point_model(workdir: str) -> dict:
    """A point's model columns, from its run's saved config: size, what its KV cache holds and
    its bf16 KV-cache bytes per token of a training-length sequence (local layers hold W)."""
    config = stored_config(workdir, f'the sweep run {os.path.basename(workdir)}')
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


def _family_note(pairs: list[dict], points: int) -> str:
    """The p-values' note (`summary.family_note`); with several points and no pair, none of
    them scores the same text as another (`_same_text_pairs`)."""
    if not pairs and points > 1:
        return 'p: none here: no two points score the same text.'
    return summary.family_note(pairs[0]['comparisons'] if pairs else 0)


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
        'order) with its 95% interval. ' + _family_note(pairs, len(rows)),
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
        pair = frozenset((point, ref['point']))
        delta = (
            '—'
            if r is ref
            else summary.diff_cell(diff, p_holm[pair])
            if pair in p_holm
            else 'other text'
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
        'std over seeds, with its 95% t-interval. ' + _family_note(pairs, len(rows)),
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
    """The lines of an orderings table: every pair's paired difference of `value`; the count
    is Holm's, as the family note's (pairs without a p-value, e.g. on one seed, not counted);
    one line with no pair (one point)."""
    if not pairs:
        return ['', f'Orderings ({label}): none, no two points to compare.']
    m = pairs[0]['comparisons']
    over = 'this comparison' if m == 1 else f'these {summary.comparisons(m)}'
    resolved = (
        f'resolved when the Holm-corrected p over {over} is below 0.05'
        if m
        else 'none can be resolved: a paired test needs two or more seeds of two or more points'
    )
    lines = [
        '',
        f'Orderings ({label}, paired over seeds; {resolved}; the exact sign-flip p of the same '
        'differences, Holm-corrected alike, beside it: at n seeds it cannot go below 2/2^n):',
        '',
        f'| a | b | Δ {value} a − b | 95% CI | seeds | p | p (Holm) | sign-flip p (Holm) | '
        'ordering |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for p in pairs:
        diff = p[f'{value}_diff']
        d = stats.Estimate(p['seeds'], diff, p[f'{value}_diff_std'], p['ci_lo'], p['ci_hi'])
        lines.append(
            f'| {p["a"]} | {p["b"]} | {diff:+.4f} | {d.interval()} | {p["seeds"]} | '
            f'{_p(p["p"])} | {_p(p["p_holm"])} | {_p(p["p_sign_flip_holm"])} | '
            f'{p["ordering"]}{" ✓" if p["resolved"] else ""} |'
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
