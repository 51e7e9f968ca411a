"""Statistics over seeds that say what a comparison resolves: mean, sample std (ddof 1), 95% t
confidence intervals, and paired differences between two arms run with the same seeds (same
seed => same initialisation and data order, so the pairing removes their shared variance).

Comparisons come in families (every pairwise comparison one summary reports): each gets the
two-sided paired t-test's p-value, and the family is corrected by Holm's step-down method, so
an ordering is resolved when its Holm-adjusted p is below 1 - CONFIDENCE (family-wise error at
most 5% over the m comparisons made). Beside it, the exact sign-flip (permutation) test of the
same differences (`sign_flip_p`), which assumes no normality: at n paired seeds its smallest
two-sided p is 2 / 2^n (`sign_flip_floor`), 0.0625 at n = 5, so below 6 seeds it can never
resolve a comparison at 95%.

Pure functions of plain floats; an interval needs at least two values and is nan otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import special  # t and beta quantiles (scipy.stats itself takes ~1 s to import)

CONFIDENCE = 0.95


UNPAIRED = 'n/a (0 seeds)'  # the interval of a difference between arms that share no seed


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Mean of n values with their sample std (ddof 1) and a t confidence interval."""

    n: int
    mean: float
    std: float  # sample std, ddof 1; nan for n < 2
    lo: float  # lower end of the confidence interval; nan for n < 2
    hi: float  # upper end; nan for n < 2

    @property
    def resolved(self) -> bool:
        """The interval excludes 0 (for a difference: the sign of the effect is resolved); with
        no spread, where the interval is a point, `p_value`'s sign-flip test decides."""
        if self.n >= 2 and self.std == 0:
            return p_value(self) < 1 - CONFIDENCE
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)

    def interval(self, digits: int = 4) -> str:
        """'[lo, hi]', 'n/a (1 seed)' or UNPAIRED."""
        if self.n == 0:
            return UNPAIRED
        if self.n < 2:
            return f'n/a ({self.n} seed{"s" if self.n != 1 else ""})'
        return f'[{self.lo:.{digits}f}, {self.hi:.{digits}f}]'


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError('mean of no values')
    return math.fsum(values) / len(values)


def sample_std(values: Sequence[float]) -> float:
    """Standard deviation with Bessel's correction (ddof 1); nan for fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided t critical value: t_{(1 + confidence) / 2, df}."""
    return float(special.stdtrit(df, (1 + confidence) / 2))


def estimate(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean, sample std and the t interval mean ± t_{df=n-1} · std / sqrt(n)."""
    values = [float(v) for v in values]
    n, m, s = len(values), mean(values), sample_std(values)
    if n < 2:
        return Estimate(n, m, s, math.nan, math.nan)
    half = t_quantile(n - 1, confidence) * s / math.sqrt(n)
    return Estimate(n, m, s, m - half, m + half)


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = CONFIDENCE
) -> Estimate:
    """The difference a - b over the seeds both arms ran (`{seed: value}`), as an Estimate of
    the per-seed differences: its interval excludes 0 iff the ordering is resolved. With no
    seed in common it is an Estimate of n = 0 (unresolved)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:  # nothing to pair (e.g. a seed grid gave each point its own seeds)
        return Estimate(0, math.nan, math.nan, math.nan, math.nan)
    return estimate([a[s] - b[s] for s in seeds], confidence)


def ordering(name_a: str, name_b: str, diff: Estimate, resolved: bool | None = None) -> str:
    """'a < b', 'a > b' (resolved) or 'a ~ b' (unresolved) for a paired difference a - b of
    losses; `resolved` defaults to the interval's (uncorrected) verdict."""
    if not (diff.resolved if resolved is None else resolved):
        return f'{name_a} ~ {name_b} (unresolved)'
    return f'{name_a} {"<" if diff.mean < 0 else ">"} {name_b}'


def p_value(diff: Estimate) -> float:
    """Two-sided p of the paired t-test that the mean difference is 0 (df = n - 1); nan for
    n < 2. With no spread (every difference the same, e.g. steps on an evaluation grid) the
    t-test is undefined: the exact sign-flip test's p then, 2^(1 - n) for a non-zero mean (all
    n signs alike: 2 of the 2^n sign patterns) and 1 for a zero one."""
    if diff.n < 2:
        return math.nan
    if diff.std == 0:
        return 2.0 ** (1 - diff.n) if diff.mean != 0 else 1.0
    t = diff.mean / (diff.std / math.sqrt(diff.n))
    return float(2 * special.stdtr(diff.n - 1, -abs(t)))


# Above this many paired values the sign-flip distribution (2^n sums) is sampled, not enumerated
EXACT_SIGN_FLIP_N = 40  # enumerated exactly up to this many values (two halves of 2^20 sums)
SIGN_FLIP_DRAWS = 1 << 20  # sign patterns drawn above EXACT_SIGN_FLIP_N (seeded: reproducible)


def _pattern_sums(d: np.ndarray) -> np.ndarray:
    """The sum of every sign pattern of `d` (2^len(d) of them), doubling once per value."""
    sums = np.zeros(1)
    for v in d:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Two-sided p of the sign-flip (permutation) test that paired differences are symmetric about
    0: the fraction of the 2^n sign patterns whose |sum| is at least the observed |sum| (ties
    within a relative 1e-9 count as at least). Exact up to EXACT_SIGN_FLIP_N values: the sums of
    each half's patterns are enumerated and every pair of them counted by a sorted search (meet
    in the middle); above it, SIGN_FLIP_DRAWS seeded random patterns, (hits + 1) / (draws + 1).
    nan for no values."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return math.nan
    seen = abs(math.fsum(d.tolist())) * (1 - 1e-9)
    if seen == 0:
        return 1.0  # every pattern's |sum| is at least 0
    if d.size <= EXACT_SIGN_FLIP_N:
        first, second = _pattern_sums(d[: d.size // 2]), np.sort(_pattern_sums(d[d.size // 2 :]))
        at_least = second.size - np.searchsorted(second, seen - first, 'left')
        at_most = np.searchsorted(second, -seen - first, 'right')
        return float((at_least.sum() + at_most.sum()) / (first.size * second.size))
    rng, hits, chunk = np.random.default_rng(0), 0, 1 << 14
    for _ in range(SIGN_FLIP_DRAWS // chunk):
        signs = rng.choice([-1.0, 1.0], size=(chunk, d.size))
        hits += np.count_nonzero(np.abs(signs @ d) >= seen)
    return float((hits + 1) / (SIGN_FLIP_DRAWS + 1))


def paired_sign_flip_p(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """`sign_flip_p` of a - b over the seeds both arms ran; nan with no seed in common."""
    seeds = sorted(set(a) & set(b))
    return sign_flip_p([a[s] - b[s] for s in seeds])


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided sign-flip p that n paired values can give: 2 / 2^n (every
    difference of one sign; the observed pattern and its mirror) where `sign_flip_p` is exact,
    1 / (SIGN_FLIP_DRAWS + 1) above EXACT_SIGN_FLIP_N, where it samples."""
    return 2.0 ** (1 - n) if n <= EXACT_SIGN_FLIP_N else 1 / (SIGN_FLIP_DRAWS + 1)


def p_from_interval(mean: float, lo: float, hi: float, n: int, confidence: float = CONFIDENCE):
    """The paired t-test's two-sided p recovered from a reported mean and t-interval over n
    seeds (std / sqrt(n) = half-width / t quantile), for tables that kept only those."""
    half = (hi - lo) / 2
    std = half / t_quantile(n - 1, confidence) * math.sqrt(n)
    return p_value(Estimate(n, mean, std, lo, hi))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family's p-values, in the given order: the i-th
    smallest p (1-based) is multiplied by m - i + 1, made non-decreasing, capped at 1. nan
    values (comparisons without an interval) are left nan and not counted in m."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m, out, running = len(order), [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def family_size(p_values: Sequence[float]) -> int:
    """m: the comparisons a Holm correction of `p_values` counts (those with a p-value)."""
    return sum(not math.isnan(p) for p in p_values)


def rate_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Clopper-Pearson (exact) interval of a rate from k successes in n trials: for a bounded,
    two-valued outcome (a run learned the task or not), where a t-interval can leave [0, 1]."""
    alpha = 1 - confidence
    lo = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, alpha / 2))
    hi = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1 - alpha / 2))
    return lo, hi


def count_p_value(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided p of Fisher's exact test that two arms' rates are equal (k of n each): the
    hypergeometric probability, given the margins, of every table no likelier than the one seen
    (exact integer weights; ties within a relative 1e-7, as scipy's fisher_exact counts them)."""
    k = k_a + k_b
    weights = {
        x: math.comb(n_a, x) * math.comb(n_b, k - x)
        for x in range(max(0, k - n_b), min(k, n_a) + 1)
    }
    seen = weights[k_a]
    return min(
        1.0,
        math.fsum(w for w in weights.values() if w <= seen * (1 + 1e-7)) / math.comb(n_a + n_b, k),
    )
