"""Recall tasks: synthetic sources whose answers need the KV cache, scored only where an answer is
due (`config.data.source`):

- 'mqar': leaky multi-query associative recall, after Arora et al. 2023 ("Zoology",
  `multiquery_ar`; 'mqar_zoology', `zoology_rows`, is MQAR as Zoology builds it). A row
  opens with `recall_pairs` key-value pairs (keys from [1, V/2), values from [V/2, V), V =
  `recall_vocab`, each key and each value once), then each key once more as a query at a slot
  drawn by Zoology's power law (`recall_power_a`); the token after a query is its value, the
  answer. Every other token is uniform over the vocabulary (Zoology's random_non_queries).
  With `recall_train_pairs` (e.g. '2,4,8') each training row draws its number of pairs from
  that list, as Zoology trains on a mixture; held-out rows keep `recall_pairs`.
- 'passkey': a 5-digit pass key hidden in filler text (Mohtashami & Jaggi 2023's "The grass is
  green..." haystack), bytes; the row ends with the question and the key. Each example is
  `passkey_lengths` bytes long (right-aligned in its row after EOS padding) with the key at a
  depth in [0, 1] of the filler. Held-out examples cover the grid of lengths x `passkey_depths`
  evenly; training examples draw a length from the list and a uniform depth.

Examples are pure functions of a seed: the training batch of step s from (recall_seed, seed, s),
the held-out split from recall_seed alone, so every run of a sweep scores the same examples.
A row is T + 1 tokens like a text window; the targets to score carry `TARGET_FLAG` (bit 30) in
the row itself, so batches keep the text path's shape and the loss masks them on the device
(`lm.train.step`).
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections
import numpy as np

from lm.data.tokenizer import ByteTokenizer

TASKS = ('mqar', 'mqar_zoology', 'passkey')
MQAR_SOURCES = ('mqar', 'mqar_zoology')
TARGET_FLAG = 1 << 30  # set on a row's token where it is a scored target (an answer)
LABEL_FLAG = 1 << 29  # with TARGET_FLAG: the target is a label only, its input position is BLANK
BLANK = 0  # the input token of a label-only position and of mqar_zoology's filler (never a key)
FILLER = (
    'The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. '
)
NEEDLE = 'The pass key is {key}. Remember it. {key} is the pass key. '
QUESTION = 'What is the pass key? The pass key is '
DIGITS = 5


def parse_floats(text: str) -> list[float]:
    return [float(v) for v in text.split(',') if v.strip()]


def parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(',') if v.strip()]


class SymbolTokenizer:
    """MQAR's vocabulary: `vocab_size` opaque symbols, the last one doubling as EOS (never drawn
    as a key or value; only as filler)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eos_id = vocab_size - 1
        self.name = f'symbols{vocab_size}'
        self.parallel = False
        self.continuation_mark = ' =>'  # ids run together otherwise ('1 40' + '23')

    def encode(self, text: str) -> list[int]:
        """The whitespace-separated ids of `text`; one-line ValueError for anything that is
        not an id in [0, vocab_size)."""
        ids = []
        for word in text.split():
            if not (word.isascii() and word.isdigit() and int(word) < self.vocab_size):
                raise ValueError(
                    f'{word!r} is not a symbol id: expected whole numbers 0..{self.vocab_size - 1} '
                    'separated by spaces'
                )
            ids.append(int(word))
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), np.int32)

    def decode(self, ids) -> str:
        return ' '.join(str(int(i)) for i in ids)


def check_recall_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for a recall source's settings."""
    T = data.seq_len
    if data.recall_seed < 0:
        raise ValueError(f'config.data.recall_seed must be >= 0, got {data.recall_seed}')
    if data.document_mask:
        raise ValueError(
            f'config.data.document_mask=True does not apply to source={data.source!r}: a recall '
            'row is one example, with no EOS-separated documents'
        )
    if data.source == 'mqar_zoology':
        return _check_zoology(data)
    if data.source == 'mqar':
        if data.recall_vocab < 4 or data.recall_vocab // 2 - 1 < data.recall_pairs:
            raise ValueError(
                f'config.data.recall_vocab={data.recall_vocab} must hold recall_pairs='
                f'{data.recall_pairs} distinct keys in [1, recall_vocab / 2)'
            )
        if data.recall_pairs < 1 or 4 * data.recall_pairs > T:
            raise ValueError(
                f'config.data.recall_pairs={data.recall_pairs} must be >= 1 with 4 x pairs <= '
                f'config.data.seq_len={T} (pairs, then a query slot of two tokens per pair)'
            )
        most = min(T // 4, data.recall_vocab // 2 - 1)
        if data.recall_train_pairs and not _counts_within(data.recall_train_pairs, most):
            raise ValueError(
                f'config.data.recall_train_pairs={data.recall_train_pairs!r} must list pair '
                f'counts in [1, {most}] (min(seq_len / 4, recall_vocab / 2 - 1)), or be empty'
            )
        if not (math.isfinite(data.recall_power_a) and data.recall_power_a > 0):
            raise ValueError(
                f'config.data.recall_power_a must be a finite number > 0, got {data.recall_power_a}'
            )
    else:
        if data.recall_train_pairs:
            raise ValueError(
                f'config.data.recall_train_pairs={data.recall_train_pairs!r} applies to '
                "source='mqar' only; leave it empty for passkey"
            )
        lengths, depths = _numbers(data, 'passkey_lengths', int), _numbers(data, 'passkey_depths')
        shortest = len(QUESTION) + len(NEEDLE.format(key='0' * DIGITS)) + DIGITS
        if T + 1 < shortest:  # no length fits: say what seq_len needs, not an empty range
            raise ValueError(
                f'config.data.seq_len={T} is too short for passkey: its shortest example '
                f'(the needle, the question and the key) is {shortest} tokens, so seq_len must '
                f'be >= {shortest - 1}'
            )
        if not lengths or min(lengths) < shortest or max(lengths) > T + 1:
            raise ValueError(
                f'config.data.passkey_lengths={data.passkey_lengths!r}: each length must be in '
                f'[{shortest}, config.data.seq_len + 1 = {T + 1}]'
            )
        if not depths or not all(0 <= d <= 1 for d in depths):
            raise ValueError(
                f'config.data.passkey_depths={data.passkey_depths!r} must list depths in [0, 1]'
            )
    if data.recall_eval_examples < 1:
        raise ValueError(
            f'config.data.recall_eval_examples must be >= 1, got {data.recall_eval_examples}'
        )


def _check_zoology(data: ml_collections.ConfigDict) -> None:
    """One-line errors for source='mqar_zoology'."""
    T, P, V = data.seq_len, data.recall_pairs, data.recall_vocab
    if V < 4 or V // 2 - 1 < P:
        raise ValueError(
            f'config.data.recall_vocab={V} must hold recall_pairs={P} distinct keys in '
            '[1, recall_vocab / 2) and as many values in [recall_vocab / 2, recall_vocab - 1)'
        )
    if P < 1 or 4 * P > T + 1:
        raise ValueError(
            f'config.data.recall_pairs={P} must be >= 1 with 4 x pairs <= config.data.seq_len + 1'
            f' = {T + 1} (the pairs, then a query slot of two tokens per pair)'
        )
    if data.recall_train_pairs:
        raise ValueError(
            f'config.data.recall_train_pairs={data.recall_train_pairs!r} applies to '
            "source='mqar' only; leave it empty for mqar_zoology"
        )
    if data.recall_eval_examples < 1:
        raise ValueError(
            f'config.data.recall_eval_examples must be >= 1, got {data.recall_eval_examples}'
        )


def _counts_within(text: str, most: int) -> bool:
    """Whether `text` lists one or more integers, each in [1, most] (no empty item: '2,,4')."""
    try:
        counts = [int(v) for v in text.split(',')]
    except ValueError:
        return False
    return all(1 <= c <= most for c in counts)


def _numbers(data: ml_collections.ConfigDict, key: str, kind: type = float) -> list:
    """`config.data.<key>`'s comma-separated numbers (`kind`: int or float); a one-line error
    naming it for an empty item ('128,,256') or one that is not a number."""
    text = data[key]
    try:
        return [kind(v) for v in text.split(',')]  # int('') and float('') raise too
    except ValueError:
        what = 'whole numbers' if kind is int else 'numbers'
        raise ValueError(f'config.data.{key}={text!r} must be comma-separated {what}') from None


def _distinct(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """k distinct integers from [low, high) per row, [n, k], in random order."""
    return np.argsort(rng.random((n, high - low)), axis=1)[:, :k] + low


def mqar_rows(
    rng: np.random.Generator, n: int, seq_len: int, pairs: int, vocab: int, power_a: float
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [n, T + 1], scored bool [n, T + 1]): scored marks the answers (a row's
    token t + 1 is the target of position t)."""
    context = 2 * pairs
    slots = (seq_len - context) // 2  # query g sits at context + 2g, its answer right after
    keys = _distinct(rng, n, 1, vocab // 2, pairs)
    values = _distinct(rng, n, vocab // 2, vocab - 1, pairs)
    # Zoology's power law over gaps 1..slots, drawn without replacement (Gumbel top-k).
    log_p = (power_a - 1) * np.log(np.arange(1, slots + 1))
    gaps = np.argsort(-(log_p + rng.gumbel(size=(n, slots))), axis=1)[:, :pairs]
    tokens = rng.integers(0, vocab, (n, seq_len + 1))
    tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
    query = context + 2 * gaps
    np.put_along_axis(tokens, query, keys, axis=1)
    np.put_along_axis(tokens, query + 1, values, axis=1)
    scored = np.zeros(tokens.shape, bool)
    np.put_along_axis(scored, query + 1, True, axis=1)
    return tokens.astype(np.int32), scored


def zoology_rows(
    rng: np.random.Generator, n: int, seq_len: int, pairs: int, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [n, T + 1], scored bool [n, T + 1]) of 'mqar_zoology': the pairs, then
    the P queries at P of the (T + 1 - 2P) // 2 two-token slots drawn uniformly, each slot's
    key drawn by a permutation of the pairs independent of the slots; a query's answer sits
    right after it (scored, a label only: `pack(..., label_only=True)` hides it from the input),
    every other token is BLANK."""
    context = 2 * pairs
    slots = (seq_len + 1 - context) // 2
    keys = _distinct(rng, n, 1, vocab // 2, pairs)
    values = _distinct(rng, n, vocab // 2, vocab - 1, pairs)
    chosen = np.sort(_distinct(rng, n, 0, slots, pairs), axis=1)  # the slots, in row order
    order = _distinct(rng, n, 0, pairs, pairs)  # the pair asked at each chosen slot
    tokens = np.full((n, seq_len + 1), BLANK, np.int64)
    tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
    query = context + 2 * chosen
    np.put_along_axis(tokens, query, np.take_along_axis(keys, order, axis=1), axis=1)
    np.put_along_axis(tokens, query + 1, np.take_along_axis(values, order, axis=1), axis=1)
    scored = np.zeros(tokens.shape, bool)
    np.put_along_axis(scored, query + 1, True, axis=1)
    return tokens.astype(np.int32), scored


def mqar_mixture_rows(
    rng: np.random.Generator, n: int, seq_len: int, mixture: list[int], vocab: int, power_a: float
) -> tuple[np.ndarray, np.ndarray]:
    """As `mqar_rows`, each row with a number of pairs drawn uniformly from `mixture`."""
    choice = rng.integers(0, len(mixture), n)
    tokens = np.empty((n, seq_len + 1), np.int32)
    scored = np.empty((n, seq_len + 1), bool)
    for i, pairs in enumerate(mixture):
        rows = np.flatnonzero(choice == i)
        tokens[rows], scored[rows] = mqar_rows(rng, len(rows), seq_len, pairs, vocab, power_a)
    return tokens, scored


def passkey_text(key: str, length: int, depth: float) -> tuple[str, int]:
    """(an example of `length` characters, where its answer starts): filler with the needle at
    `depth` of it (0 = first, 1 = right before the question), the question, the key."""
    needle, tail = NEEDLE.format(key=key), QUESTION + key
    room = length - len(needle) - len(tail)
    filler = (FILLER * (room // len(FILLER) + 1))[:room]
    cut = round(depth * room)
    text = filler[:cut] + needle + filler[cut:] + tail
    return text, len(text) - len(key)


def passkey_rows(
    rng: np.random.Generator, lengths: list[int], depths: list[float], seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [n, T + 1], scored bool [n, T + 1]) of n = len(lengths) examples, each
    right-aligned after EOS padding; scored marks the key's digits."""
    tok = ByteTokenizer()
    n = len(lengths)
    tokens = np.full((n, seq_len + 1), tok.eos_id, np.int32)
    scored = np.zeros(tokens.shape, bool)
    keys = rng.integers(0, 10, (n, DIGITS))
    for i, (length, depth) in enumerate(zip(lengths, depths, strict=True)):
        text, answer = passkey_text(''.join(map(str, keys[i])), length, depth)
        start = seq_len + 1 - length
        tokens[i, start:] = tok.encode_array(text)
        scored[i, start + answer :] = True
    return tokens, scored


def pack(tokens: np.ndarray, scored: np.ndarray, label_only: bool = False) -> np.ndarray:
    """Rows with TARGET_FLAG on the scored tokens (what batches carry), and with `label_only`
    LABEL_FLAG too (the step feeds BLANK as their input)."""
    flags = TARGET_FLAG | (LABEL_FLAG if label_only else 0)
    return np.where(scored, tokens | flags, tokens).astype(np.int32)


def unpack(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [..., T], targets [..., T]) of packed rows as the model sees them: the flags
    cleared, a label-only token's input position BLANK."""
    tokens = rows & (LABEL_FLAG - 1)
    inputs = np.where((rows & LABEL_FLAG) != 0, BLANK, tokens)
    return inputs[..., :-1], tokens[..., 1:]


def nth_answer_only(rows: np.ndarray, n: int) -> np.ndarray:
    """Packed rows [B, T + 1] with only each row's n-th flagged answer (0 = the first) still
    flagged: scoring them gives the accuracy on the n-th answer of every row."""
    flagged_BT = (rows & TARGET_FLAG) != 0
    drop_BT = flagged_BT & (np.cumsum(flagged_BT, axis=1) - 1 != n)
    return np.where(drop_BT, rows & (TARGET_FLAG - 1), rows).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class RecallTask:
    """A recall source: its examples as functions of a seed, and the held-out grid's labels."""

    data: ml_collections.ConfigDict

    @property
    def groups(self) -> list[str]:
        """Labels of the held-out cells whose accuracy is reported apart ('' = one cell)."""
        if self.data.source in MQAR_SOURCES:
            return []
        d = self.data
        return [
            f'depth{depth:g}_len{length}'
            for length in parse_ints(d.passkey_lengths)
            for depth in parse_floats(d.passkey_depths)
        ]

    def rows(
        self, entropy: list[int], n: int, grid: bool = False, train: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(packed rows int32 [n, T + 1], cell index [n]) from the seed `entropy`; with `grid`,
        passkey example i sits in cell i mod cells (held-out), else lengths and depths are drawn;
        `train` rows of MQAR follow `recall_train_pairs` when it is set."""
        d, rng = self.data, np.random.default_rng(entropy)
        if d.source == 'mqar_zoology':
            tokens, scored = zoology_rows(rng, n, d.seq_len, d.recall_pairs, d.recall_vocab)
            return pack(tokens, scored, label_only=True), np.zeros(n, np.int64)
        if d.source == 'mqar':
            if train and d.recall_train_pairs:
                mixture = parse_ints(d.recall_train_pairs)
                tokens, scored = mqar_mixture_rows(
                    rng, n, d.seq_len, mixture, d.recall_vocab, d.recall_power_a
                )
            else:
                tokens, scored = mqar_rows(
                    rng, n, d.seq_len, d.recall_pairs, d.recall_vocab, d.recall_power_a
                )
            return pack(tokens, scored), np.zeros(n, np.int64)
        lengths, depths = parse_ints(d.passkey_lengths), parse_floats(d.passkey_depths)
        if grid:
            cell = np.arange(n) % (len(lengths) * len(depths))
            length = [lengths[c // len(depths)] for c in cell]
            depth = [depths[c % len(depths)] for c in cell]
        else:
            cell = np.zeros(n, np.int64)
            length = [lengths[i] for i in rng.integers(0, len(lengths), n)]
            depth = list(rng.random(n))
        tokens, scored = passkey_rows(rng, length, depth, d.seq_len)
        return pack(tokens, scored), cell

    def split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The held-out ('validation') or a fixed training-distribution ('train') set of
        `recall_eval_examples` rows, with their cells."""
        d, held_out = self.data, split == 'validation'
        stream = 1 if held_out else 2
        return self.rows(
            [d.recall_seed, stream], d.recall_eval_examples, grid=True, train=not held_out
        )

    def call_batch(
        self,
        *,
        seed: int,
        step: int,
        steps: int,
        batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> np.ndarray:
        """This process's packed rows of one train-step call, as `lm.data.windows.call_batch`:
        [B/P, T + 1] for one step, [steps, B/P, T + 1] for several."""
        per = batch_size // process_count
        rows = [
            self.rows([self.data.recall_seed, 0, seed, step + i], batch_size, train=True)[0][
                process_index * per : (process_index + 1) * per
            ]
            for i in range(steps)
        ]
        return rows[0] if steps == 1 else np.stack(rows)

    def tokenizer(self):
        if self.data.source in MQAR_SOURCES:
            return SymbolTokenizer(self.data.recall_vocab)
        return ByteTokenizer()
