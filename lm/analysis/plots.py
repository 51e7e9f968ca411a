"""Figures and TensorBoard entries of a head analysis (lm/analysis/report.py): layer x head heatmaps
per score, attention maps, KV-head similarity and loss by position."""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np

from lm.analysis.report import SCORES, RunHeads
from lm.train.summary import Summary

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)


def _score_range(score: str, runs: list[RunHeads]) -> tuple[float, float]:
    if score == 'entropy':
        return 0.0, max(math.log(len(r.loss_T)) for r in runs)
    return 0.0, 1.0


def score_figure(score: str, runs: list[RunHeads]) -> plt.Figure:
    """Layer x head heatmaps of one score, one panel per run, on one colour scale."""
    fig, axes = plt.subplots(1, len(runs), figsize=(3.4 * len(runs) + 1.0, 3.0), squeeze=False)
    fig.subplots_adjust(wspace=0.35)
    vmin, vmax = _score_range(score, runs)
    for ax, run in zip(axes[0], runs, strict=True):
        values = run.scores[score]
        im = ax.imshow(values, cmap='viridis', vmin=vmin, vmax=vmax)
        for (layer, head), v in np.ndenumerate(values):
            colour = 'black' if v > vmin + 0.6 * (vmax - vmin) else 'white'
            ax.text(head, layer, f'{v:.2f}', ha='center', va='center', fontsize=7, color=colour)
        ax.set_title(run.label, fontsize=9)
        ax.set_xlabel('head')
        ax.set_ylabel('layer')
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(score.replace('_', ' '), fontsize=10)
    return fig


def attention_figure(run: RunHeads, layer: int) -> plt.Figure:
    """One layer's attention maps, one panel per head, on a repeated random sequence."""
    probs = run.example_probs[layer]
    H = probs.shape[0]
    fig, axes = plt.subplots(1, H, figsize=(2.4 * H, 2.6), squeeze=False)
    for head, ax in enumerate(axes[0]):
        ax.imshow(probs[head], cmap='magma', vmin=0, vmax=1)
        ax.set_title(f'L{layer} H{head}', fontsize=9)
        ax.set_xlabel('key', fontsize=8)
        ax.set_ylabel('query', fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle(f'{run.label}: attention on a random sequence repeated twice', fontsize=9)
    fig.tight_layout()
    return fig


def kv_figure(run: RunHeads) -> plt.Figure:
    """KV-head similarity per layer: key and value, centred cosine and linear CKA."""
    kinds = ('key_cosine', 'value_cosine', 'key_cka', 'value_cka')
    L = len(run.kv['key_cosine'])
    fig, axes = plt.subplots(
        len(kinds), L, figsize=(2.2 * L + 0.8, 2.1 * len(kinds)), squeeze=False
    )
    for row, kind in enumerate(kinds):
        for layer in range(L):
            ax = axes[row, layer]
            sim = run.kv[kind][layer]
            im = ax.imshow(sim, cmap='coolwarm', vmin=-1, vmax=1)
            for (i, j), v in np.ndenumerate(sim):
                ax.text(j, i, f'{v:.2f}', ha='center', va='center', fontsize=6)
            ax.set_title(f'L{layer} {kind.replace("_", " ")}', fontsize=8)
            ax.set_xticks(range(sim.shape[0]))
            ax.set_yticks(range(sim.shape[0]))
            ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6)
    fig.suptitle(f'{run.label}: KV-head similarity on validation text', fontsize=9)
    return fig


def loss_figure(runs: list[RunHeads]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(5, 3))
    for run in runs:
        ax.plot(run.loss_T, label=run.label)
    ax.set_xlabel('position in context')
    ax.set_ylabel('validation loss (nats)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save(fig: plt.Figure, path: str | None = None) -> np.ndarray:
    """Writes the figure as a PNG (when `path` is given) and returns it as an RGB array (for
    TensorBoard); the figure is drawn once for both."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format='png', dpi=90)
    plt.close(fig)
    if path is not None:
        with open(path, 'wb') as f:
            f.write(buffer.getvalue())
    buffer.seek(0)
    return plt.imread(buffer)[..., :3]


def to_uint8(image: np.ndarray) -> np.ndarray:
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


def log_run(run: RunHeads, logdir: str, images: dict[str, np.ndarray]) -> None:
    """The run's scores (heads/<score>/L<l>H<h>, heads/icl_score, heads/sink_rate) and images at
    its checkpoint step in its TensorBoard directory."""
    tb = Summary(logdir)
    values = {'heads/icl_score': run.icl_score, 'heads/sink_rate': run.sink_rate}
    for score in (*SCORES, 'first_position'):
        for (layer, head), v in np.ndenumerate(run.scores[score]):
            values[f'heads/{score}/L{layer}H{head}'] = float(v)
    tb.scalars(run.step, values)
    for tag, image in images.items():
        tb.image(f'heads/{tag}', to_uint8(image), run.step)
    tb.close()
