"""Which tokens each batch holds: training windows as pure functions of (seed, step, process),
and the evaluation windows of a held-out split.

Training (`config.data.sampling`):
- 'random': the `step`-th draw of B window starts, uniform with replacement, from a generator
  seeded with (seed, step).
- 'epochs': the split's W = (N - 1) // T non-overlapping windows (window w = tokens
  [w·T, w·T + T], T + 1 tokens, so each of the first W·T targets is predicted once), read in a
  seeded permutation per epoch: the b-th row of step s is global sample i = s·B + b, in epoch
  i // W at position i % W of that epoch's permutation (`permute`: a Feistel network, so no
  array of W indices is ever built). Every window once per epoch; resume is exact mid-epoch.
Process p of P takes rows [p·B/P, (p+1)·B/P) of each step, so hosts read disjoint rows.

Evaluation scores non-overlapping windows of the held-out split (`eval_windows`), each target
token once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_ROUNDS = 4  # Feistel rounds of `permute`


def _rows(global_rows: int, process_index: int, process_count: int) -> slice:
    per = global_rows // process_count
    return slice(process_index * per, (process_index + 1) * per)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic): a cheap, well-mixing hash."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(index: np.ndarray, n: int, seed: tuple[int, ...]) -> np.ndarray:
    """The images of `index` (integers in [0, n)) under a seeded pseudo-random permutation of
    [0, n): a balanced Feistel network on [0, 4^h) ⊇ [0, n) (a bijection for any round
    function), cycle-walked until the value is below n (fewer than 4 walks expected)."""
    h = max(1, -(-max(n - 1, 1).bit_length() // 2))
    mask = np.uint64((1 << h) - 1)
    keys = np.random.SeedSequence(list(seed)).generate_state(_ROUNDS, np.uint64)
    x = np.asarray(index, np.uint64).copy()
    todo = np.ones(x.shape, bool)
    while todo.any():
        y = x[todo]
        left, right = y >> np.uint64(h), y & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        x[todo] = (left << np.uint64(h)) | right
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


def num_windows(num_tokens: int, seq_len: int) -> int:
    """Non-overlapping training windows of T + 1 tokens in a split ('epochs' sampling)."""
    return (num_tokens - 1) // seq_len


def epoch_windows(seed: int, step: int, batch_size: int, windows: int) -> np.ndarray:
    """Window index of each of the B rows of step `step` under 'epochs' sampling."""
    sample = step * batch_size + np.arange(batch_size, dtype=np.int64)
    epoch, position = np.divmod(sample, windows)
    out = np.empty(batch_size, np.int64)
    for e in np.unique(epoch):
        rows = epoch == e
        out[rows] = permute(position[rows], windows, (seed, int(e)))
    return out


def train_batch(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
    sampling: str = 'random',
) -> np.ndarray:
    """This process's rows of step `step`'s batch: int32 [batch_size / process_count, T + 1]."""
    if sampling == 'epochs':
        windows = epoch_windows(seed, step, batch_size, num_windows(len(tokens), seq_len))
        starts = windows * seq_len
    else:
        starts = np.random.default_rng([seed, step]).integers(0, len(tokens) - seq_len, batch_size)
    starts = starts[_rows(batch_size, process_index, process_count)]
    return np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def call_batch(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    steps: int,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
    sampling: str = 'random',
) -> np.ndarray:
    """This process's rows for one train-step call running steps step..step+steps-1:
    `train_batch` [B/P, T + 1] for a single step, stacked [steps, B/P, T + 1] for several."""
    rows = [
        train_batch(
            tokens,
            seed=seed,
            step=step + i,
            batch_size=batch_size,
            seq_len=seq_len,
            process_index=process_index,
            process_count=process_count,
            sampling=sampling,
        )
        for i in range(steps)
    ]
    return rows[0] if steps == 1 else np.stack(rows)


def eval_windows(num_tokens: int, seq_len: int, eval_tokens: int = 0) -> np.ndarray:
    """Start offsets of the evaluation windows of a split of `num_tokens` tokens.

    The split's num_tokens - 1 next-token targets are cut into W = ceil((num_tokens - 1) / T)
    non-overlapping windows of T = seq_len (the last one partial), so every target is scored
    exactly once. `eval_tokens` > 0 keeps ceil(eval_tokens / T) of them (at most W), spread
    evenly over the whole split (window floor(i · W / k) for i < k) rather than its start.
    """
    num_windows = -(-(num_tokens - 1) // seq_len)
    starts = np.arange(num_windows, dtype=np.int64) * seq_len
    if eval_tokens:
        k = min(num_windows, -(-eval_tokens // seq_len))
        starts = starts[np.arange(k, dtype=np.int64) * num_windows // k]
    return starts


def window_targets(num_tokens: int, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Targets each window scores: T, or fewer for the split's last window."""
    return np.minimum(seq_len, num_tokens - 1 - starts)


def eval_batches(
    tokens: np.ndarray,
    starts: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This process's rows of each evaluation batch: (tokens int32 [B/P, T + 1], target weights
    float32 [B/P, T]), windows `starts` in order, B per batch.

    Every batch has the same shape (one compiled eval step): the split's last window is padded
    with token 0 and the last batch with whole padding rows, all of weight 0.
    """
    n = len(tokens)
    counts = window_targets(n, starts, seq_len)
    rows = _rows(batch_size, process_index, process_count)
    for first in range(0, len(starts), batch_size):
        batch = np.zeros((batch_size, seq_len + 1), np.int32)
        weights = np.zeros((batch_size, seq_len), np.float32)
        chunk = slice(first, first + batch_size)
        for r, (s, c) in enumerate(zip(starts[chunk], counts[chunk], strict=True)):
            batch[r, : c + 1] = tokens[s : s + c + 1]
            weights[r, :c] = 1.0
        yield batch[rows], weights[rows]
