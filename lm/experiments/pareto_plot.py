"""The Pareto figure (`lm.experiments.pareto`): quality against KV-cache bytes per token, one
panel per study, seeds as 95% t-interval error bars, the front of the means marked; written as a
PNG and logged to TensorBoard as an image at the end of a sweep or an uptraining ablation."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

import matplotlib
import matplotlib.ticker
import numpy as np

from lm.analysis.plots import save, to_uint8
from lm.experiments import pareto
from lm.train.summary import Summary

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

MARKERS = 'osD^v<>ph*P'  # one per family, in order of appearance
DODGE = 0.012  # log10 x-offset between arms that share a KV size, so their bars do not overlap


def _dodged(points: list[pareto.Point]) -> list[float]:
    """Each point's x: its bytes, spread a little (in log space) among arms of equal bytes."""
    xs = []
    for i, p in enumerate(points):
        same = [q for q in points if q.kv_bytes == p.kv_bytes]
        k = sum(q.kv_bytes == p.kv_bytes for q in points[:i])
        xs.append(p.kv_bytes * 10 ** (DODGE * (k - (len(same) - 1) / 2)))
    return xs


def _panel(ax, points: list[pareto.Point], metric: str, families: list[str]) -> None:
    higher = pareto.higher_is_better(metric)
    xs = _dodged(points)
    for i, family in enumerate(families):
        idx = [j for j, p in enumerate(points) if p.family == family]
        if idx:
            ax.errorbar(
                [xs[j] for j in idx],
                [points[j].quality.mean for j in idx],
                yerr=[points[j].error for j in idx],
                fmt=MARKERS[i % len(MARKERS)],
                color=f'C{i}',
                ms=6,
                capsize=3,
                label=family or None,
            )
    best = pareto.front(points, higher)
    on = [xs[points.index(p)] for p in best]
    ax.step(on, [p.quality.mean for p in best], where='post', ls='--', color='k', lw=1, zorder=0)
    ax.scatter(
        on,
        [p.quality.mean for p in best],
        s=150,
        facecolors='none',
        edgecolors='k',
        label='Pareto front (means)',
    )
    for x, p in zip(xs, points, strict=True):
        ax.annotate(
            p.label, (x, p.quality.mean), textcoords='offset points', xytext=(5, 3), fontsize=6.5
        )
    lo, hi = min(xs), max(xs)
    ax.set_xscale('log')
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f'{v:,.0f}'))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(sorted({p.kv_bytes for p in points}))
    ax.tick_params(axis='x', labelrotation=45)
    ax.set_xlim(lo / 1.3, hi * 1.8)
    ax.set_xlabel('KV cache bytes per token (bf16, all layers; log scale)')
    ax.set_ylabel(f'{metric} ({"higher" if higher else "lower"} is better)')
    ax.grid(True, which='major', alpha=0.3)
    ax.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.28), ncol=2)


def figure(points: Iterable[pareto.Point], metric: str, title: str = '') -> plt.Figure:
    """One panel per `panel` of the points (in order), each with its own front."""
    points = list(points)
    panels = list(dict.fromkeys(p.panel for p in points))
    families = list(dict.fromkeys(p.family for p in points))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.6 * len(panels), 5.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        _panel(ax, [p for p in points if p.panel == panel], metric, families)
        ax.set_title(panel, fontsize=9)
    seeds = sorted({p.quality.n for p in points})
    fig.suptitle(
        f'{title + ": " if title else ""}{metric} against KV-cache memory\nerror bars: 95% '
        f't-interval over seeds ({"/".join(map(str, seeds))} per arm)',
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def log_images(images: dict[str, np.ndarray], tb_dir: str) -> None:
    """{metric: the figure as an RGB array (`lm.analysis.plots.save`)} as images
    'pareto/<metric>' of the run 'pareto' in `tb_dir`, through one writer (writers opened in
    the same second would share an event file name)."""
    tb = Summary(os.path.join(tb_dir, pareto.TB_RUN))
    for metric, image in images.items():
        tb.image(f'pareto/{metric}', to_uint8(image))
    tb.close()


def has_metric(runs: list[pareto.Run], metric: str) -> bool:
    try:
        return all(math.isfinite(pareto.metric_value(r.result, metric)) for r in runs)
    except ValueError:
        return False


def summarise(runs: list[pareto.Run], out_dir: str, tb_dir: str, metrics: Iterable[str]) -> None:
    """The end of an experiment: for each of `metrics` that every run has, the figure as
    <out_dir>/pareto_<metric>.png and as an image in `tb_dir`."""
    title, images = os.path.basename(os.path.normpath(out_dir)), {}
    for metric in metrics:
        if runs and has_metric(runs, metric):
            fig = figure(pareto.points(runs, metric), metric, title)
            images[metric] = save(
                fig, os.path.join(out_dir, f'pareto_{metric.replace("/", "_")}.png')
            )
    if images:
        log_images(images, tb_dir)
