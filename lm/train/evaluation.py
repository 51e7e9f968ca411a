"""Held-out evaluation: loss (nats/token) with its standard error, perplexity and bits per byte.

One protocol everywhere (in-training `eval/*`, eval.py, sweeps, ablations): the split's target
tokens in non-overlapping windows of the training context, each scored exactly once
(`lm.data.windows.eval_windows`; `config.eval_tokens` > 0 = that many tokens' windows spread evenly
over
the split), batched `eval_batch_size` windows at a time. The set is a pure function of the split,
the context and `eval_tokens`: identical for every run on the same data and any process count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from lm.data.corpus import Corpus
from lm.data.recall import TASKS
from lm.data.windows import eval_batches, eval_windows, window_targets
from lm.sharding import global_batch


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
    """Windows per eval call: `config.eval_batch_size`, or the training micro-batch if 0."""
    return config.eval_batch_size or config.train.batch_size // config.train.grad_accum_steps


def check_eval_config(config: ml_collections.ConfigDict, data_parallel: int) -> None:
    """One-line errors for the evaluation settings (needs the mesh's data-parallel size)."""
    for name in ('eval_tokens', 'eval_batch_size'):
        if config[name] < 0:
            raise ValueError(f'config.{name} must be >= 0, got {config[name]}')
    tokens, seq_len = config.eval_tokens, config.data.seq_len
    if tokens and config.data.source in TASKS:  # a warning: settings shared with text runs
        logging.warning(
            'config.eval_tokens=%d is ignored: source=%r scores config.data.recall_eval_examples'
            '=%d examples',
            tokens,
            config.data.source,
            config.data.recall_eval_examples,
        )
    elif 0 < tokens <= seq_len:  # as eval.py's --eval_tokens
        raise ValueError(
            f'config.eval_tokens={tokens}: expected 0 (the whole split) or more than one window '
            f'of config.data.seq_len={seq_len} tokens (the standard error is over windows)'
        )
    size = eval_batch_size(config)
    if size % data_parallel or size % jax.process_count():
        raise ValueError(
            f'config.eval_batch_size={config.eval_batch_size} (-> {size} windows per call) must '
            f'be divisible by the data-parallel size {data_parallel} and by the '
            f'{jax.process_count()} processes'
        )


def batch_for_windows(
    batch_size: int, windows: int, batch_sharding: jax.sharding.NamedSharding, seq_len: int
) -> int:
    """`batch_size`, or fewer when the split has fewer `windows`: the fewest rows that hold them
    all and still divide over the batch's shards and the processes (more would only be padding,
    and an eval_batch_size far past the windows ran out of memory)."""
    rows_per_shard = batch_sharding.shard_shape((batch_size, seq_len))[0]
    multiple = math.lcm(batch_size // rows_per_shard, jax.process_count())
    return min(batch_size, -(-windows // multiple) * multiple)


def ratio_stderr(sums: np.ndarray, counts: np.ndarray) -> float:
    """Standard error of sum(sums) / sum(counts) over windows (the ratio estimator's, which is
    std(window means, ddof 1) / sqrt(W) when every window has the same count); nan if W < 2."""
    w = len(sums)
    if w < 2:
        return math.nan
    loss = sums.sum() / counts.sum()
    resid = sums - loss * counts
    return float(math.sqrt(w / (w - 1) * np.sum(resid**2)) / counts.sum())


class _Progress:
    """Progress of a long evaluation, on the log: after the first batch past `every_s` seconds
    (compiling included) the expected duration, then a line every `every_s` seconds."""

    def __init__(self, split: str, batches: int, eval_tokens: int, every_s: float):
        self.split, self.batches, self.every_s = split, batches, every_s
        self.hint = (
            'set config.eval_tokens > 0 to score fewer tokens than the whole split'
            if not eval_tokens
            else f'a smaller config.eval_tokens (now {eval_tokens}) scores fewer tokens'
        )
        self.start = self.last = time.monotonic()
        self.first = None  # when the first batch (and its compile) was done
        self.announced = False

    def done(self, n: int) -> None:
        """`n` batches are done."""
        now = time.monotonic()
        if self.first is None:
            self.first = now
        if n == self.batches or now - self.last < self.every_s:
            return
        rate = (now - self.first) / (n - 1) if n > 1 else now - self.start
        left = rate * (self.batches - n)
        if not self.announced:
            logging.info(
                'evaluating the %s split takes about %.0f s more (%d batches); %s',
                self.split, left, self.batches, self.hint,
            )  # fmt: skip
            self.announced = True
        else:
            logging.info('eval: %d/%d batches, about %.0f s left', n, self.batches, left)
        self.last = now


def _window_sums(
    eval_step: Callable,
    params: dict,
    tokens: np.ndarray,
    starts: np.ndarray,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None,
    progress: _Progress,
    *,
    batch_size: int,
    seq_len: int,
) -> list[np.ndarray]:
    """Each evaluation batch's per-window loss sums (this process's first shard), in order."""
    sums = []
    for batch, weights in eval_batches(
        tokens,
        starts,
        batch_size=batch_size,
        seq_len=seq_len,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    ):
        if stop is not None:
            stop()
        out = eval_step(
            params, global_batch(batch, batch_sharding), global_batch(weights, batch_sharding)
        )
        # Fetched before the next call: XLA:CPU's in-process collectives (several CPU devices)
        # can deadlock when many multi-device executions are queued at once. [B], or an
        # ensemble's [K, B].
        sums.append(np.asarray(out.addressable_data(0), np.float64))
        progress.done(len(sums))
    return sums


def evaluate(
    eval_step: Callable,
    params: dict,
    corpus: Corpus,
    split: str,
    *,
    batch_size: int,
    seq_len: int,
    eval_tokens: int,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None = None,
    progress_every_s: float = 10.0,
) -> dict[str, float]:
    """Mean next-token loss over the evaluation windows of `split` (`lm.data.windows.eval_windows`),
    with its standard error over windows and the number of target tokens scored.

    bits/byte = loss / ln 2 · tokens/byte of the split, so runs with different tokenizers
    compare on the same text. `stop` is called before each batch (it raises to stop: e.g.
    `lm.train.interrupt.StopRequest.check`). An evaluation that lasts longer than
    `progress_every_s` logs how long it will take, then its progress at that interval. A recall
    source is scored by `evaluate_recall`.
    """
    if corpus.task is not None:
        rows, cells = corpus.task.split(split)
        return evaluate_recall(
            eval_step, params, rows, cells, corpus.task.groups, batch_size, batch_sharding, stop
        )
    where = (corpus, split, batch_size, seq_len, eval_tokens, batch_sharding, stop)
    window_sums, counts = _split_sums(eval_step, params, *where, progress_every_s)
    return _loss_metrics(window_sums, counts, corpus, split)


def evaluate_members(
    eval_step: Callable,
    params: dict,
    corpus: Corpus,
    split: str,
    *,
    batch_size: int,
    seq_len: int,
    eval_tokens: int,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None = None,
    progress_every_s: float = 10.0,
) -> list[dict[str, float]]:
    """`evaluate`'s metrics of each member of an ensemble (`lm.train.ensemble`), in one pass
    over the windows (a recall task's rows): `eval_step` and `params` are the ensemble's,
    stacked."""
    if corpus.task is not None:
        rows, cells = corpus.task.split(split)
        scores_KN3 = _recall_scores(eval_step, params, rows, batch_size, batch_sharding, stop)
        return [_recall_metrics(s_N3, cells, corpus.task.groups) for s_N3 in scores_KN3]
    where = (corpus, split, batch_size, seq_len, eval_tokens, batch_sharding, stop)
    window_sums_KW, counts = _split_sums(eval_step, params, *where, progress_every_s)
    return [_loss_metrics(sums_W, counts, corpus, split) for sums_W in window_sums_KW]


def _split_sums(
    eval_step: Callable,
    params: dict,
    corpus: Corpus,
    split: str,
    batch_size: int,
    seq_len: int,
    eval_tokens: int,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None,
    progress_every_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(loss sums of each evaluation window [W] (an ensemble's [K, W]), targets per window [W])."""
    tokens = corpus.tokens[split]
    starts = eval_windows(len(tokens), seq_len, eval_tokens)
    counts = window_targets(len(tokens), starts, seq_len).astype(np.float64)
    batch_size = batch_for_windows(batch_size, len(starts), batch_sharding, seq_len)
    logging.info(
        'evaluating the %s split: %d windows of %d tokens in batches of %d',
        split,
        len(starts),
        seq_len,
        batch_size,
    )
    progress = _Progress(split, -(-len(starts) // batch_size), eval_tokens, progress_every_s)
    sums = _window_sums(
        eval_step,
        params,
        tokens,
        starts,
        batch_sharding,
        stop,
        progress,
        batch_size=batch_size,
        seq_len=seq_len,
    )
    # padding rows (weight 0) dropped
    return np.concatenate(sums, axis=-1)[..., : len(starts)], counts


def _loss_metrics(
    window_sums: np.ndarray, counts: np.ndarray, corpus: Corpus, split: str
) -> dict[str, float]:
    """loss, its stderr, perplexity, bits/byte and tokens of one model's window sums."""
    loss = float(window_sums.sum() / counts.sum())
    return {
        'loss': loss,
        'loss_stderr': ratio_stderr(window_sums, counts),
        'perplexity': math.exp(min(loss, 700.0)),
        'bits_per_byte': loss / math.log(2) / corpus.bytes_per_token(split),
        'tokens': int(counts.sum()),
    }


def evaluate_recall(
    eval_step: Callable,
    params: dict,
    rows: np.ndarray,
    cells: np.ndarray,
    groups: list[str],
    batch_size: int,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None = None,
) -> dict[str, float]:
    """A recall task's held-out rows (packed, `lm.data.recall`) scored on their answers only:
    'loss' (nats per answer token, with its stderr over rows), 'recall_accuracy' (answer
    tokens whose argmax is right), and per cell of `groups` 'recall_accuracy/<group>' plus its
    marginals over lengths and depths (passkey)."""
    scores_N3 = _recall_scores(eval_step, params, rows, batch_size, batch_sharding, stop)
    return _recall_metrics(scores_N3, cells, groups)


def _recall_scores(
    eval_step: Callable,
    params: dict,
    rows: np.ndarray,
    batch_size: int,
    batch_sharding: jax.sharding.NamedSharding,
    stop: Callable[[], None] | None,
) -> np.ndarray:
    """(nats, right, count) of each row's answers, [N, 3] (an ensemble's [K, N, 3])."""
    logging.info('evaluating %d recall examples in batches of %d', len(rows), batch_size)
    out, per = [], batch_size // jax.process_count()
    for first in range(0, len(rows), batch_size):
        if stop is not None:
            stop()
        batch = np.zeros((batch_size, rows.shape[1]), np.int32)  # padding rows score nothing
        chunk = rows[first : first + batch_size]
        batch[: len(chunk)] = chunk
        mine = batch[jax.process_index() * per : (jax.process_index() + 1) * per]
        result = eval_step(params, global_batch(mine, batch_sharding))
        out.append(np.asarray(result.addressable_data(0), np.float64))
    return np.concatenate(out, axis=-2)[..., : len(rows), :]


def _recall_metrics(scores_N3: np.ndarray, cells: np.ndarray, groups: list[str]) -> dict:
    """`evaluate_recall`'s metrics of one model's per-row scores."""
    nats, right, count = scores_N3.T
    loss = float(nats.sum() / count.sum())
    metrics = {
        'loss': loss,
        'loss_stderr': ratio_stderr(nats, count),
        'perplexity': math.exp(min(loss, 700.0)),
        'recall_accuracy': float(right.sum() / count.sum()),
        'tokens': int(count.sum()),
    }
    marginals: dict[str, list[int]] = {}
    for c, group in enumerate(groups):
        marginals[group] = [c]
        for part in group.split('_'):
            marginals.setdefault(part, []).append(c)
    for name, cs in marginals.items():
        mask = np.isin(cells, cs)
        metrics[f'recall_accuracy/{name}'] = float(right[mask].sum() / count[mask].sum())
    return metrics
