"""lm.experiments.stats against hand-computed values (t quantiles from printed tables)."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from lm.experiments import stats


def test_t_quantiles_match_the_table():
    # Two-sided 95%: t_{0.975, df} for df = 1, 2, 4, 30.
    for df, table in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)]:
        assert stats.t_quantile(df) == pytest.approx(table, abs=1e-4)


def test_mean_sample_std_and_interval_by_hand():
    est = stats.estimate([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3; sum of squares 10 / (n - 1 = 4) = 2.5, std sqrt(2.5) = 1.58114 (ddof 1, not 1.41421)
    assert est.n == 5 and est.mean == 3.0
    assert est.std == pytest.approx(1.5811388, abs=1e-7)
    # half-width 2.776445 * 1.5811388 / sqrt(5) = 1.9632432
    assert est.lo == pytest.approx(1.0367568, abs=1e-6)
    assert est.hi == pytest.approx(4.9632432, abs=1e-6)
    assert est.resolved and est.interval(2) == '[1.04, 4.96]'
    assert stats.sample_std([2.0, 4.0]) == pytest.approx(math.sqrt(2))


def test_one_value_has_no_interval():
    est = stats.estimate([1.5])
    assert est.mean == 1.5 and math.isnan(est.std) and math.isnan(est.lo)
    assert not est.resolved and est.interval() == 'n/a (1 seed)'
    with pytest.raises(ValueError, match='mean of no values'):
        stats.mean([])


def test_paired_difference_by_hand():
    a = {0: 1.10, 1: 1.25, 2: 1.00, 7: 9.0}  # seed 7 has no partner: left out
    b = {0: 1.00, 1: 1.20, 2: 0.90}
    d = stats.paired_difference(a, b)
    # differences 0.10, 0.05, 0.10: mean 0.083333, std 0.0288675, half 4.302653 * 0.0166667
    assert d.n == 3 and d.mean == pytest.approx(0.0833333, abs=1e-6)
    assert d.std == pytest.approx(0.0288675, abs=1e-6)
    assert d.lo == pytest.approx(0.0116224, abs=1e-6)
    assert d.hi == pytest.approx(0.1550442, abs=1e-6)
    assert d.resolved and stats.ordering('a', 'b', d) == 'a > b'
    # Unpaired, the same numbers do not resolve: the pairing removes the per-seed variance.
    assert not stats.estimate([1.10, 1.25, 1.00]).lo > stats.estimate([1.00, 1.20, 0.90]).hi
    noisy = stats.paired_difference({0: 1.0, 1: 2.0}, {0: 1.5, 1: 1.0})
    assert not noisy.resolved and stats.ordering('a', 'b', noisy) == 'a ~ b (unresolved)'
    unpaired = stats.paired_difference({0: 1.0}, {1: 1.0})  # no seed in common
    assert unpaired.n == 0 and not unpaired.resolved and unpaired.interval() == 'n/a (0 seeds)'


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    got = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert got == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-12)
    # a comparison without a p-value is not counted: m = 2
    got = stats.holm([0.01, math.nan, 0.04])
    assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.04)
    assert stats.family_size([0.01, math.nan, 0.04]) == 2
    assert stats.holm([0.6, 0.7]) == [1.0, 1.0]  # 1.2 capped, then kept monotone
    assert stats.holm([0.02]) == [0.02]


def test_paired_p_value_by_hand():
    d = stats.paired_difference({0: 1.10, 1: 1.25, 2: 1.00}, {0: 1.00, 1: 1.20, 2: 0.90})
    # t = 0.083333 / (0.0288675 / sqrt 3) = 5.0; with 2 df, p = 1 - t / sqrt(t^2 + 2)
    assert stats.p_value(d) == pytest.approx(1 - 5 / math.sqrt(27), abs=1e-9)
    assert stats.p_from_interval(d.mean, d.lo, d.hi, d.n) == pytest.approx(stats.p_value(d))
    assert stats.p_value(stats.paired_difference({0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0})) == 1.0
    # no spread: the sign-flip test, all n signs alike in 2 of 2^n patterns (not a t of inf)
    same = stats.paired_difference({0: 2.0, 1: 2.0}, {0: 1.0, 1: 1.0})
    assert stats.p_value(same) == 0.5 and not same.resolved
    six = stats.estimate([100.0] * 6)
    assert stats.p_value(six) == 1 / 32 and six.resolved
    assert not stats.estimate([100.0] * 5).resolved  # 1/16 > 0.05
    assert math.isnan(stats.p_value(stats.paired_difference({0: 2.0}, {0: 1.0})))


def test_rate_interval_and_count_p_by_hand():
    """Clopper-Pearson at the edges has a closed form: 0 of n -> [0, 1 - (α/2)^(1/n)], n of n ->
    [(α/2)^(1/n), 1]; Fisher's exact test on 4 of 5 against 1 of 5 sums the hypergeometric
    tables at most as likely as the observed one (margins 5, 5 and 5, 5)."""
    assert stats.rate_interval(0, 5) == (0.0, pytest.approx(1 - 0.025 ** (1 / 5), abs=1e-12))
    assert stats.rate_interval(5, 5) == (pytest.approx(0.025 ** (1 / 5), abs=1e-12), 1.0)
    lo, hi = stats.rate_interval(2, 5)
    assert 0 < lo < 0.4 < hi < 1
    # P(k successes in arm a) = C(5, k) C(5, 5 - k) / C(10, 5); observed k = 4 (p = 25 / 252);
    # as or less likely: k = 0, 1, 4, 5 -> (1 + 25 + 25 + 1) / 252
    assert stats.count_p_value(4, 5, 1, 5) == pytest.approx(52 / 252, abs=1e-12)
    assert stats.count_p_value(5, 5, 5, 5) == pytest.approx(1.0)
    assert stats.count_p_value(5, 5, 0, 5) == pytest.approx(2 / 252, abs=1e-12)


def test_against_scipy_stats_on_random_inputs():
    """The t, beta and Fisher computations (scipy.special and exact binomial weights) give
    scipy.stats' values: t.sf / t.ppf / beta.ppf / fisher_exact on random inputs, to 1e-12
    relative (one reference written another way)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_a, n_b = (int(x) for x in rng.integers(1, 15, 2))
        k_a, k_b = int(rng.integers(0, n_a + 1)), int(rng.integers(0, n_b + 1))
        want = scipy.stats.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue
        assert stats.count_p_value(k_a, n_a, k_b, n_b) == pytest.approx(want, rel=1e-12)
        lo, hi = stats.rate_interval(k_a, n_a)
        assert lo == (
            0.0
            if k_a == 0
            else pytest.approx(scipy.stats.beta.ppf(0.025, k_a, n_a - k_a + 1), rel=1e-12)
        )
        assert hi == (
            1.0
            if k_a == n_a
            else pytest.approx(scipy.stats.beta.ppf(0.975, k_a + 1, n_a - k_a), rel=1e-12)
        )
        n, mean, std = int(rng.integers(2, 30)), rng.normal(), rng.uniform(0.01, 2)
        diff = stats.Estimate(n, mean, std, math.nan, math.nan)
        t = mean / (std / math.sqrt(n))
        assert stats.p_value(diff) == pytest.approx(2 * scipy.stats.t.sf(abs(t), n - 1), rel=1e-12)
        assert stats.t_quantile(n) == pytest.approx(scipy.stats.t.ppf(0.975, n), rel=1e-12)


def _brute_force_sign_flip(diffs: list[float]) -> float:
    """The sign-flip p written out: every one of the 2^n sign patterns, |sum| in float64."""
    seen = abs(sum(diffs))
    patterns = list(itertools.product((1.0, -1.0), repeat=len(diffs)))
    hits = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= seen * (1 - 1e-9)
        for signs in patterns
    )
    return hits / len(patterns)


def test_sign_flip_p_against_brute_force_enumeration():
    """The meet-in-the-middle enumeration gives the brute-force p on random float64 differences
    (n = 1-10, exact fractions of 2^n, so compared exactly; 22 and 24 against every pattern's
    sum), and the floor 2 / 2^n when every difference has one sign: 0.0625 at 5 seeds."""
    rng = np.random.default_rng(1)
    for n in range(1, 11):
        for _ in range(5):
            diffs = [float(x) for x in rng.normal(0.3, 1.0, n)]
            assert stats.sign_flip_p(diffs) == _brute_force_sign_flip(diffs), diffs
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5]) == stats.sign_flip_floor(5) == 0.0625
    assert stats.sign_flip_p([1.0, -1.0]) == 1.0 and math.isnan(stats.sign_flip_p([]))
    assert stats.paired_sign_flip_p({0: 2.0, 1: 3.0, 2: 9.0}, {0: 1.0, 1: 1.0, 5: 0.0}) == 0.5
    # meet in the middle agrees with every pattern's sum written out, at 22 and 24 values
    for n in (22, 24):
        diffs = rng.normal(0.4, 1.0, n)
        whole = np.zeros(1)
        for v in diffs:
            whole = np.concatenate([whole + v, whole - v])
        want = np.count_nonzero(np.abs(whole) >= abs(diffs.sum()) * (1 - 1e-9)) / whole.size
        assert stats.sign_flip_p(diffs.tolist()) == want, n
    assert stats.sign_flip_p([0.01] * 24) == stats.sign_flip_floor(24)
    # above EXACT_SIGN_FLIP_N the patterns are sampled: one sign throughout is never drawn
    # (exact p 2^-40), so p = 1 / (draws + 1); a balanced pair keeps p = 1
    many = [0.01 * (i + 1) for i in range(stats.EXACT_SIGN_FLIP_N + 1)]
    assert stats.sign_flip_p(many) == 1 / (stats.SIGN_FLIP_DRAWS + 1)
    assert stats.sign_flip_p(many + [-x for x in many]) == 1.0
