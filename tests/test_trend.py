"""The 'trend' doc table (lm.experiments.trend) against an independent float64 reference:
numpy.polyfit per seed and scipy's one-sample t-test, on random inputs."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lm.experiments import stats, trend
from lm.experiments.tables import KINDS


def _rows(rng, seeds=9, xs=(0, 1, 2, 3), slope=0.004):
    rows = []
    for s in range(seeds):
        base = rng.normal(1.77, 0.01)
        for i, x in enumerate(xs):
            loss = base + slope * x + rng.normal(0, 0.008)
            rows.append({'arm': f'arm{i}', 'x': str(x), 'seed': str(s), 'eval_loss': repr(loss)})
    return rows


def test_slope_and_end_difference_match_polyfit_and_scipy():
    rng = np.random.default_rng(7)
    rows = _rows(rng)
    rng.shuffle(rows)  # row order does not matter
    by_seed = {}
    for r in rows:
        by_seed.setdefault(int(r['seed']), {})[float(r['x'])] = float(r['eval_loss'])
    want_slopes = [np.polyfit(list(v), list(v.values()), 1)[0] for _, v in sorted(by_seed.items())]
    want_ends = [v[3.0] - v[0.0] for _, v in sorted(by_seed.items())]
    (name_s, slope, p_s, flip_s), (name_e, ends, p_e, flip_e) = trend.contrasts(rows)
    assert (name_s, name_e) == ('slope per unit of x', 'arm3 − arm0')
    assert slope.n == ends.n == 9
    np.testing.assert_allclose(slope.mean, np.mean(want_slopes), rtol=1e-10)
    np.testing.assert_allclose(ends.mean, np.mean(want_ends), rtol=1e-10)
    raw = [scipy_stats.ttest_1samp(v, 0).pvalue for v in (want_slopes, want_ends)]
    holm = sorted(raw)
    holm = {holm[0]: min(1, 2 * holm[0]), holm[1]: min(1, max(2 * holm[0], holm[1]))}
    np.testing.assert_allclose([p_s, p_e], [holm[raw[0]], holm[raw[1]]], rtol=1e-6)
    assert flip_s >= stats.sign_flip_floor(9) and flip_e >= stats.sign_flip_floor(9)
    table = KINDS['trend'](rows)
    assert '| arm0 | 0 |' in table and '| slope per unit of x | 9 |' in table


def test_a_seed_missing_an_arm_is_left_out_and_an_arm_with_two_xs_is_refused():
    rows = _rows(np.random.default_rng(1), seeds=4)
    kept = [r for r in rows if not (r['seed'] == '3' and r['arm'] == 'arm2')]
    assert trend.contrasts(kept)[0][1].n == 3
    rows[0] = {**rows[0], 'x': '9'}
    with pytest.raises(ValueError, match='arm0 has two x values'):
        trend.contrasts(rows)


def test_seeds_needed_is_the_noncentral_t_power_threshold():
    # The kv_contrast statement: effect 0.0175 nats, sd 0.0143 -> 8 seeds at alpha 0.05; a
    # normal approximation ((z_a + z_b) / d)^2 is a lower bound that the t-test exceeds by 1-3.
    n = trend.seeds_needed(0.0175, 0.0143, 0.05)
    z = (scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)) / (0.0175 / 0.0143)
    assert n == 8 and z**2 < n <= z**2 + 3
    assert trend.seeds_needed(0.0175 * 2 / 3, 0.0143, 0.025) == 17


def test_sd_upper_bound_covers_the_true_sd_as_often_as_its_confidence():
    # Independent reference: 40,000 simulated samples of 9 normal values (sd 1); the bound of
    # each sample's sd lies at or above 1 in 90% of them (binomial sd 0.0015; 0.006 is 4).
    rng = np.random.default_rng(0)
    sds = rng.normal(0.0, 1.0, size=(40_000, 9)).std(1, ddof=1)
    bounds = np.array([trend.sd_upper_bound(s, 9) for s in sds[:2000]])
    assert abs(np.mean(bounds >= 1) - 0.9) < 0.02  # the function itself, on 2,000
    factor = trend.sd_upper_bound(1.0, 9)  # it scales the sd by one factor
    assert abs(np.mean(sds * factor >= 1) - 0.9) < 0.006
    assert trend.sd_upper_bound(0.0206, 9) == pytest.approx(0.0312, abs=5e-5)  # the MLA retest's
    assert trend.sd_upper_bound(1.0, 9, 0.95) > factor > 1
    with pytest.raises(ValueError, match='at least 2 values, got 1'):
        trend.sd_upper_bound(1.0, 1)


def test_gap_change_describes_two_settings_paired_by_seed():
    # Independent reference: numpy and scipy's t on random losses; seeds missing from either
    # setting or arm are left out.
    rng = np.random.default_rng(1)
    before = {(arm, s): float(v) for arm in 'ab' for s, v in enumerate(rng.normal(1.8, 0.01, 12))}
    after = {(arm, s): float(v) for arm in 'ab' for s, v in enumerate(rng.normal(1.7, 0.01, 12))}
    del before['b', 0], after['a', 11]
    seeds = range(1, 11)
    g0 = np.array([before['a', s] - before['b', s] for s in seeds])
    g1 = np.array([after['a', s] - after['b', s] for s in seeds])
    c = g1 - g0
    half = scipy_stats.t.ppf(0.975, 9) * c.std(ddof=1) / np.sqrt(10)
    lines = trend.gap_change(before, after, 'a', 'b', ('1e-3', '2e-3'))
    assert lines[0] == (
        f'seeds 1-10: a - b {g0.mean():+.4f} at 1e-3, {g1.mean():+.4f} at 2e-3; change '
        f'{c.mean():+.4f} [{c.mean() - half:+.4f}, {c.mean() + half:+.4f}]'
    )
    mean_b = np.mean([before['b', s] for s in seeds]), np.mean([after['b', s] for s in seeds])
    assert lines[2] == f'seeds 1-10: b {mean_b[0]:.4f} at 1e-3, {mean_b[1]:.4f} at 2e-3'


def test_gap_change_refuses_settings_with_no_shared_seed():
    before = {('a', 0): 1.0, ('b', 0): 1.1}
    after = {('a', 1): 1.0, ('b', 1): 1.1}
    with pytest.raises(ValueError, match='a and b share no seed at both 1e-3 and 2e-3'):
        trend.gap_change(before, after, 'a', 'b', ('1e-3', '2e-3'))


def test_t_test_power_matches_simulated_t_tests():
    # Independent reference: 40,000 simulated paired t-tests at n = 10, effect 0.8 sd, alpha
    # 0.05/3; the simulated rejection rate's sd is under 0.0025, so 0.01 is 4 of them.
    rng = np.random.default_rng(0)
    x = rng.normal(0.8, 1.0, size=(40_000, 10))
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(10))
    rate = np.mean(np.abs(t) > scipy_stats.t.ppf(1 - 0.05 / 6, 9))
    assert abs(trend.t_test_power(0.8, 1.0, 0.05 / 3, 10) - rate) < 0.01
    n = trend.seeds_needed(0.8, 1.0, 0.05 / 3)
    assert (
        trend.t_test_power(0.8, 1.0, 0.05 / 3, n)
        >= 0.8
        > trend.t_test_power(0.8, 1.0, 0.05 / 3, n - 1)
    )
    # Far past 80%: a finite power near 1 (scipy's lower-tail cdf gave nan at this nc)
    assert 0.9999 < trend.t_test_power(0.0296, 0.0177, 0.05 / 3, 32) <= 1
