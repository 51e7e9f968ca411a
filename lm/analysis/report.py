"""Per-run head analysis of a restored checkpoint (scripts/analyze_heads.py): every head's
scores (lm/analysis/scores.py) on the run's validation text and on repeated random tokens, loss by
position, KV-head similarity, and the tables, figures and TensorBoard entries that show them."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from lm.analysis import scores as analysis
from lm.data.windows import eval_windows, window_targets
from lm.model import attention
from lm.train.checkpoint import saved_steps
from lm.train.run import assemble
from lm.train.stored import check_step, stored_config

SCORES = ('previous_token', 'induction', 'duplicate_token', 'sink', 'entropy')
CSV_COLUMNS = ('run', 'layer', 'head', *SCORES)
TEXT_SCORES = ('previous_token', 'first_position', 'sink', 'entropy')  # on validation text


@dataclasses.dataclass
class RunHeads:
    """One checkpoint's analysis; [L, H] arrays per score."""

    label: str
    workdir: str
    step: int
    attention: str
    num_kv_heads: int
    scores: dict[str, np.ndarray]  # SCORES + 'first_position'
    loss_T: np.ndarray  # mean next-token loss by position on the validation windows
    windows: int  # validation windows of seq_len tokens the text scores average over
    icl_stderr: float  # standard error of the ICL score over the windows (ddof 1)
    repeat_loss: tuple[float, float]  # loss on the 1st and 2nd copy of the random sequences
    kv: dict[str, list[np.ndarray]] | None  # 'key_cosine', 'value_cosine', 'key_cka', ...: [G, G]
    example_tokens: np.ndarray  # [T] one repeated random sequence
    example_probs: list[np.ndarray]  # per layer [H, T, T] on it

    @property
    def icl_score(self) -> float:
        return analysis.icl_score(self.loss_T)

    @property
    def sink_rate(self) -> float:
        return analysis.sink_rate(self.scores['first_position'])


def parse_run(spec: str, step: int | None = None) -> tuple[str, int | None]:
    """'WORKDIR' or 'WORKDIR@STEP' -> (workdir, step)."""
    workdir, sep, given = spec.rpartition('@') if '@' in spec else (spec, '', '')
    if sep:
        if not given.isdigit():
            raise ValueError(f'--compare={spec!r}: expected WORKDIR or WORKDIR@STEP')
        step = int(given)
    return workdir, step


def run_label(workdir: str, step: int) -> str:
    """A run's name in the outputs: '<workdir name>@<step>'."""
    return f'{os.path.basename(os.path.normpath(workdir))}@{step}'


def check_runs(specs: list[tuple[str, int | None, str]]) -> list[str]:
    """The runs' labels in the outputs (<workdir name>@<step>); refuses, before any work, a
    (workdir, step, flag) whose workdir holds no checkpoint or no checkpoint at `step` (the error
    names the steps it holds), a seed ensemble (split a member out first), and a run given twice
    (or two whose labels would clash in the outputs)."""
    seen: dict[str, str] = {}
    for workdir, step, flag in specs:
        steps = saved_steps(workdir)
        check_step(steps, None, os.path.join(workdir, 'checkpoints'), flag)  # none at all: why
        if step is not None and step not in steps:
            held = ', '.join(map(str, steps))
            raise ValueError(f'{flag}: {workdir} has no checkpoint at step {step} (steps: {held})')
        if members := stored_config(workdir, step=step).train.ensemble:  # before any analysis
            raise ValueError(
                f'{flag}: {workdir} is an ensemble of {members} members (config.train.ensemble);'
                ' split one out first: scripts/split_ensemble.py'
            )
        label = run_label(workdir, steps[-1] if step is None else step)
        if label in seen:
            raise ValueError(
                f'{flag}: run {label} is also {seen[label]}; give each run (workdir name and '
                'step) once'
            )
        seen[label] = flag
    return list(seen)


@nnx.jit
def _text_stats(model, tokens_BT1):
    """Scores on real text [L, 4, H] (TEXT_SCORES), summed loss by position [T] and, when the
    variant has per-head K/V projections, per-layer K and V moments."""
    tokens_BT = tokens_BT1[:, :-1]
    probs = analysis.attention_probs(model, tokens_BT)
    scores = jnp.stack(
        [
            jnp.stack(
                [
                    analysis.previous_token_score(p),
                    analysis.first_position_attention(p),
                    analysis.sink_fraction(p),
                    analysis.attention_entropy(p),
                ]
            )
            for p in probs
        ]
    )
    loss_BT = analysis.token_losses(model, tokens_BT1)
    early, late = analysis.icl_positions(tokens_BT.shape[1])
    moments = None
    if attention.variant(model.cfg).poolable_kv_heads and model.cfg.kv_share_every == 1:
        moments = [
            tuple(analysis.head_moments(x.reshape((-1,) + x.shape[2:])) for x in kv)
            for kv in analysis.kv_projections(model, tokens_BT)
        ]
    return scores, loss_BT.sum(axis=0), loss_BT[:, late] - loss_BT[:, early], moments


@nnx.jit
def _random_stats(model, tokens_BT):
    """Induction and duplicate-token scores [L, 2, H], the loss by position [2P - 1] and the
    first row's probabilities."""
    probs = analysis.attention_probs(model, tokens_BT)
    scores = jnp.stack(
        [
            jnp.stack(
                [
                    analysis.induction_score(p, tokens_BT),
                    analysis.duplicate_token_score(p, tokens_BT),
                ]
            )
            for p in probs
        ]
    )
    loss_T = analysis.token_losses(model, tokens_BT).mean(axis=0)
    return scores, loss_T, [p[0] for p in probs]


def _text_over(model, windows: list[np.ndarray], label: str, stop: Callable[[], None]) -> tuple:
    """Text scores averaged over the batches of `windows`, the summed per-position loss, the
    per-window ICL scores and the K/V head moments summed in float64 (None without K/V heads).
    `stop` is called before each batch (it raises to stop); progress is logged about every
    tenth of the batches."""
    text_sum, loss_sum, icl, moments = 0.0, 0.0, [], None
    every = max(1, len(windows) // 10)
    for i, tokens in enumerate(windows, 1):
        stop()
        if i % every == 0 or i == len(windows):
            logging.info('head analysis of %s: validation batch %d/%d', label, i, len(windows))
        scores, loss_T, icl_B, m = _text_stats(model, jnp.asarray(tokens))
        text_sum, loss_sum = text_sum + np.asarray(scores), loss_sum + np.asarray(loss_T)
        icl.append(np.asarray(icl_B, np.float64))
        if m is not None:  # summed in float64: the covariance subtracts the mean's square
            m = jax.tree.map(lambda x: np.asarray(x, np.float64), m)
            moments = m if moments is None else jax.tree.map(np.add, moments, m)
    return text_sum / len(windows), loss_sum, icl, moments


def _kv_similarity(moments: list) -> dict[str, list[np.ndarray]]:
    """Per layer, the centred cosine and linear CKA between K heads and between V heads."""
    kv = {f'{w}_{m}': [] for w in ('key', 'value') for m in ('cosine', 'cka')}
    for layer in moments:
        for which, mom in zip(('key', 'value'), layer, strict=True):
            cov = analysis.head_covariance(mom)
            kv[f'{which}_cosine'].append(analysis.centred_cosine(cov))
            kv[f'{which}_cka'].append(analysis.linear_cka(cov))
    return kv


def analyse_run(
    workdir: str,
    step: int | None,
    *,
    batch: int = 32,
    max_batches: int = 0,
    num_random: int = 128,
    seed: int = 0,
    flag: str = '--workdir',
    stop: Callable[[], None] = lambda: None,
) -> RunHeads:
    """Restores `workdir` (at `step`, default the latest) and scores every head. Text scores use
    the first `max_batches` batches of `batch` validation windows (0 = the whole split); `stop`
    is called between batches (e.g. `lm.train.interrupt.StopRequest.check`)."""
    restored = assemble(workdir, state='params', step=step, data=True, flag=flag)
    model = nnx.merge(restored.ctx.graphdef, restored.state['params'])
    corpus = restored.corpus
    T = restored.config.data.seq_len
    windows = _whole_windows(corpus.tokens['validation'], T, batch, max_batches)
    if not windows:
        raise ValueError(
            f'{flag}={workdir}: the validation split holds fewer than one batch of {batch} '
            f'windows of {T} tokens; lower --batch'
        )
    label = run_label(workdir, restored.step)
    logging.info('%s: scoring %d batches of %d windows', label, len(windows), batch)
    text, loss_sum, icl, moments = _text_over(model, windows, label, stop)
    logging.info('head analysis of %s: %d repeated random sequences', label, num_random)
    token_ids = np.unique(np.asarray(corpus.tokens['validation']))
    token_ids = token_ids[token_ids != corpus.tokenizer.eos_id]
    rand_tokens = analysis.repeated_random_tokens(
        np.random.default_rng(seed), num_random, T // 2, token_ids
    )
    rand, rand_loss, example = _random_stats(model, jnp.asarray(rand_tokens))
    P = T // 2
    rand = np.asarray(rand)
    scores = {name: text[:, i] for i, name in enumerate(TEXT_SCORES)}
    scores.update(induction=rand[:, 0], duplicate_token=rand[:, 1])
    kv = None if moments is None else _kv_similarity(moments)
    return RunHeads(
        label=label,
        workdir=workdir,
        step=restored.step,
        attention=restored.model_cfg.attention,
        num_kv_heads=restored.model_cfg.num_kv_heads,
        scores=scores,
        loss_T=loss_sum / (len(windows) * batch),
        windows=len(windows) * batch,
        icl_stderr=float(np.std(np.concatenate(icl), ddof=1) / math.sqrt(len(windows) * batch)),
        repeat_loss=(float(np.mean(rand_loss[: P - 1])), float(np.mean(rand_loss[P - 1 :]))),
        kv=kv,
        example_tokens=rand_tokens[0],
        example_probs=[np.asarray(p) for p in example],
    )


def write_csv(runs: list[RunHeads], path: str) -> None:
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for run in runs:
            L, H = run.scores['sink'].shape
            for layer in range(L):
                for head in range(H):
                    values = [f'{run.scores[s][layer, head]:.4f}' for s in SCORES]
                    writer.writerow([run.label, layer, head, *values])


def write_kv_csv(runs: list[RunHeads], path: str) -> None:
    """KV-head similarity as rows (run, layer, kind, head_a, head_b, value); kind is key_cosine,
    value_cosine, key_cka or value_cka. Runs without per-head K/V (mla) have no rows."""
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(('run', 'layer', 'kind', 'head_a', 'head_b', 'value'))
        for run in runs:
            for kind, matrices in (run.kv or {}).items():
                for layer, sim in enumerate(matrices):
                    for (a, b), v in np.ndenumerate(sim):
                        writer.writerow([run.label, layer, kind, a, b, f'{v:.4f}'])


def file_label(label: str) -> str:
    return label.replace('@', '_step')


def _fmt(v: float) -> str:
    return f'{v:.3f}'


def _score_table(score: str, runs: list[RunHeads]) -> list[str]:
    H = max(r.scores[score].shape[1] for r in runs)
    lines = [
        '| run | layer | ' + ' | '.join(f'H{h}' for h in range(H)) + ' |',
        '|---|---|' + '---|' * H,
    ]
    for run in runs:
        for layer, row in enumerate(run.scores[score]):
            lines.append(f'| {run.label} | {layer} | ' + ' | '.join(map(_fmt, row)) + ' |')
    return lines


def _matrix_table(title: str, matrices: list[np.ndarray]) -> list[str]:
    G = matrices[0].shape[0]
    lines = [
        f'| {title} | ' + ' | '.join(f'g{j}' for j in range(G)) + ' |',
        '|---|' + '---|' * G,
    ]
    for layer, sim in enumerate(matrices):
        for i, row in enumerate(sim):
            lines.append(f'| L{layer} g{i} | ' + ' | '.join(map(_fmt, row)) + ' |')
    return lines


def _top_heads(run: RunHeads, score: str, k: int = 3) -> str:
    values = run.scores[score]
    order = np.argsort(values, axis=None)[::-1][:k]
    return ', '.join(
        f'L{layer}H{head} {values[layer, head]:.2f}'
        for layer, head in zip(*np.unravel_index(order, values.shape), strict=True)
    )


SCORE_DOCS = {
    'previous_token': 'mean attention from t to t - 1, on validation text',
    'induction': 'attention to the token after the earlier copy, on repeated random tokens',
    'duplicate_token': 'attention to earlier copies of the same token, on repeated random tokens',
    'sink': 'fraction of queries attending > 0.3 to position 0, on validation text',
    'first_position': 'mean attention to position 0, on validation text',
    'entropy': 'attention entropy in nats, on validation text',
}


def summary_markdown(runs: list[RunHeads]) -> str:
    """summary.md: run-level numbers, the strongest heads per score, every score as a layer x
    head table, and the KV-head similarity matrices."""
    T = len(runs[0].loss_T)
    early, late = analysis.icl_positions(T)
    lines = [
        '# Head analysis',
        '',
        'Scores are defined in lm/analysis/scores.py; every score averages over query positions '
        't >= 1.',
        '',
        *(f'- `{name}`: {doc}' for name, doc in SCORE_DOCS.items()),
        '',
        '## Runs',
        '',
        f'| run | attention | KV heads | validation windows | loss | loss at {early} | '
        f'loss at {late} | ICL score | sink rate (eps 0.3) | random: 1st copy | 2nd copy |',
        '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for r in runs:
        e, la = analysis.icl_positions(len(r.loss_T))
        lines.append(
            f'| {r.label} | {r.attention} | {r.num_kv_heads} | {r.windows} | '
            f'{_fmt(float(np.mean(r.loss_T)))} | {_fmt(r.loss_T[e])} | {_fmt(r.loss_T[la])} | '
            f'{_fmt(r.icl_score)} ± {_fmt(r.icl_stderr)} | {_fmt(r.sink_rate)} | '
            f'{_fmt(r.repeat_loss[0])} | {_fmt(r.repeat_loss[1])} |'
        )
    lines += [
        '',
        'ICL score (Olsson et al. 2022, scaled to the context): loss at the last position minus '
        'loss at position round(T/10) - 1, ± its standard error over the windows. Sink rate '
        '(Gu et al. 2024): fraction of heads whose mean attention to position 0 exceeds 0.3. '
        'Random: loss (nats) predicting the 1st and the 2nd copy of the repeated random '
        'sequences (a model with induction heads predicts the 2nd copy far better).',
        '',
        '## Strongest heads',
        '',
        '| run | ' + ' | '.join(SCORES[:-1]) + ' |',
        '|---|' + '---|' * (len(SCORES) - 1),
    ]
    for r in runs:
        lines.append(f'| {r.label} | ' + ' | '.join(_top_heads(r, s) for s in SCORES[:-1]) + ' |')
    for score in (*SCORES, 'first_position'):
        lines += ['', f'## {score}: {SCORE_DOCS[score]}', '', *_score_table(score, runs)]
    for r in runs:
        if r.kv is None:
            lines += ['', f'## KV-head similarity: {r.label}', '', f'n/a for {r.attention}.']
            continue
        lines += [
            '',
            f'## KV-head similarity: {r.label}',
            '',
            'Centred cosine (lm.analysis.scores.centred_cosine) of the pre-RoPE key and value '
            'projections over the validation windows; linear CKA in the PNG.',
            '',
            *_matrix_table('keys', r.kv['key_cosine']),
            '',
            *_matrix_table('values', r.kv['value_cosine']),
        ]
    return '\n'.join(lines) + '\n'


def _whole_windows(tokens: np.ndarray, T: int, batch: int, max_batches: int) -> list[np.ndarray]:
    """Batches [batch, T + 1] of the evaluation protocol's windows (`lm.data.windows.eval_windows`)
    that hold T whole targets (scores by position need every position), in whole batches: the
    first `max_batches` batches, or all (0)."""
    starts = eval_windows(len(tokens), T)
    starts = starts[window_targets(len(tokens), starts, T) == T]
    n = len(starts) // batch
    n = min(n, max_batches) if max_batches else n
    return [
        np.stack([tokens[s : s + T + 1] for s in starts[b * batch : (b + 1) * batch]]).astype(
            np.int32
        )
        for b in range(n)
    ]
