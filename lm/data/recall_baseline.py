"""The best no-lookup score of an MQAR generator: what a model that never binds a value to its
key can score on its rows.

A lookup policy finds the pair whose key the query repeats and copies that pair's value. A
no-lookup policy may read everything else: the positions, the keys, the set of values a row
holds, the query's rank among the row's queries, and every token of the input. Two families of
such policies cover what a row's layout can leak:

- `label`: answer a fixed token chosen by the query's position (the most frequent answer there,
  a majority-label policy);
- `copy`: copy the value of the pair chosen by the query's position, by its rank, or by both
  (whichever pair most often holds the answer there). On the leaky 'mqar' generator this finds
  its pair order (early pairs are asked first).

Each policy is fitted on one set of rows and scored on another, so a lucky fit does not count.
On 'mqar_zoology' no such policy can beat 1/pairs in expectation: a row's keys, values, slots
and query order are drawn independently, so given all of them but the key-value binding, the
binding is a uniform random permutation and the queried key's value is any of the P values
with probability 1/P; the answer is never in the input, so no answered value can be ruled out.
"""

from __future__ import annotations

import numpy as np

from lm.data.recall import TARGET_FLAG, unpack


def answers(rows: np.ndarray, pairs: int) -> dict[str, np.ndarray]:
    """Per scored target of packed MQAR rows [n, T + 1] (pairs first): its query position,
    its rank among its row's queries, its answer token, and the index of the pair whose value
    it is (-1 if none), each [number of targets]."""
    _, targets = unpack(rows)
    row, pos = np.nonzero(rows[:, 1:] >= TARGET_FLAG)
    starts = np.r_[0, np.flatnonzero(np.diff(row)) + 1]
    rank = np.arange(len(row)) - np.repeat(starts, np.diff(np.r_[starts, len(row)]))
    answer = targets[row, pos]
    values = (rows[:, 1 : 2 * pairs : 2] & (TARGET_FLAG - 1))[row]
    hit = values == answer[:, None]
    pair = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
    return {'position': pos, 'rank': rank, 'answer': answer, 'pair': pair}


def _best_table(features: np.ndarray, outcomes: np.ndarray) -> dict[int, int]:
    """For each feature value, the most frequent outcome (ties: the smallest)."""
    table: dict[int, int] = {}
    for f in np.unique(features):
        values, counts = np.unique(outcomes[features == f], return_counts=True)
        table[int(f)] = int(values[counts.argmax()])
    return table


def _score(fit: np.ndarray, fit_out: np.ndarray, test: np.ndarray, test_out: np.ndarray) -> float:
    """Accuracy on `test` of the policy fitted on `fit`: per feature value, its best outcome."""
    table = _best_table(fit, fit_out)
    guess = np.array([table.get(int(f), -2) for f in test])
    return float(np.mean(guess == test_out))


def no_lookup_scores(fit_rows: np.ndarray, test_rows: np.ndarray, pairs: int) -> dict[str, float]:
    """The held-out accuracy of each no-lookup policy (module docstring), fitted on `fit_rows`
    and scored on `test_rows` (packed rows of one generator with `pairs` pairs)."""
    a, b = answers(fit_rows, pairs), answers(test_rows, pairs)
    joint = lambda x: x['position'] * (pairs + 1) + x['rank']  # noqa: E731
    return {
        'label_by_position': _score(a['position'], a['answer'], b['position'], b['answer']),
        'copy_by_position': _score(a['position'], a['pair'], b['position'], b['pair']),
        'copy_by_rank': _score(a['rank'], a['pair'], b['rank'], b['pair']),
        'copy_by_position_and_rank': _score(joint(a), a['pair'], joint(b), b['pair']),
    }


def no_lookup_baseline(fit_rows: np.ndarray, test_rows: np.ndarray, pairs: int) -> float:
    """The best of `no_lookup_scores`: the no-lookup baseline of the generator."""
    return max(no_lookup_scores(fit_rows, test_rows, pairs).values())
