"""Held-out evaluation: loss (nats/token), perplexity and bits per byte of raw text."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax

from lm.data import Corpus, eval_batches
from lm.sharding import global_batch


def evaluate(
    eval_step: Callable,
    params: dict,
    corpus: Corpus,
    split: str,
    *,
    batch_size: int,
    seq_len: int,
    num_batches: int,
    batch_sharding: jax.sharding.NamedSharding,
) -> dict[str, float]:
    """Mean next-token loss over the first `num_batches` windows of `split` (0 = all of it).

    bits/byte = loss / ln 2 · tokens/byte of the split, so runs with different tokenizers
    compare on the same text.
    """
    batches = eval_batches(
        corpus.tokens[split],
        batch_size=batch_size,
        seq_len=seq_len,
        num_batches=num_batches,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    # One batch in flight at a time: XLA:CPU's in-process collectives (several CPU devices) can
    # deadlock when many multi-device executions are queued at once.
    total = sum(float(eval_step(params, global_batch(b, batch_sharding))) for b in batches)
    loss = total / (len(batches) * batch_size * seq_len)
    return {
        'loss': loss,
        'perplexity': math.exp(min(loss, 700.0)),
        'bits_per_byte': loss / math.log(2) / corpus.bytes_per_token(split),
    }
