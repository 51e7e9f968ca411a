"""lm/convert/rope_selection.py: partial RoPE against lm's own rope and an independent
complex-number form of the logits (float64), the selections' exact equalities, and the script."""

import csv

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_entry, stdlib_text, tiny_train_config

from lm.convert import mla
from lm.convert import rope_selection as rs
from lm.model.layers import rope
from lm.train.loop import train


def complex_logits(q_BTHD, k_BTGD, kept_HJ, kept_GJ, inv_freq_J):
    """s_htu = sum_j Re(zq_thj conj(zk_ugj) e^{i (t - u) w_j}) over pairs kept by both, the
    unrotated Re(zq conj zk) over pairs neither keeps (z = y_j + i y_{j+J})."""
    H, G, J = q_BTHD.shape[2], k_BTGD.shape[2], q_BTHD.shape[-1] // 2
    zq = q_BTHD[..., :J] + 1j * q_BTHD[..., J:]
    zk = np.repeat(k_BTGD[..., :J] + 1j * k_BTGD[..., J:], H // G, axis=2)
    assert (kept_HJ == np.repeat(kept_GJ, H // G, axis=0)).all()
    T = q_BTHD.shape[1]
    dt_TT = np.arange(T)[:, None] - np.arange(T)[None]
    phase_TTJ = np.where(kept_HJ[:, None, None], np.exp(1j * dt_TT[..., None] * inv_freq_J), 1)
    prod = np.einsum('bthj,buhj->bhtuj', zq, np.conj(zk))
    return np.real((prod * phase_TTJ[None]).sum(-1))


def test_partial_rope_is_lms_rope_where_kept_and_the_identity_elsewhere():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(2, 7, 3, 8))
    inv_freq_J = 10_000.0 ** (-np.arange(4) / 4)
    full = rs.partial_rope(y, inv_freq_J, np.ones((3, 4), bool))
    positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
    np.testing.assert_allclose(
        full, rope(jnp.asarray(y, jnp.float32), positions, 10_000.0), atol=1e-5
    )  # fmt: skip  (float32 jax against float64)
    np.testing.assert_array_equal(rs.partial_rope(y, inv_freq_J, np.zeros((3, 4), bool)), y)


def test_partial_rope_logits_match_the_complex_form():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 6, 4, 8)), rng.normal(size=(2, 6, 2, 8))
    inv_freq_J = 100.0 ** (-np.arange(4) / 4)
    kept_GJ = np.array([[1, 0, 1, 0], [0, 1, 1, 0]], bool)
    kept_HJ = np.repeat(kept_GJ, 2, axis=0)
    q2, k2 = rs.partial_rope(q, inv_freq_J, kept_HJ), rs.partial_rope(k, inv_freq_J, kept_GJ)
    ours = np.einsum('bthd,buhd->bhtu', q2, np.repeat(k2, 2, axis=2))
    np.testing.assert_allclose(ours, complex_logits(q, k, kept_HJ, kept_GJ, inv_freq_J),
                               rtol=1e-10, atol=1e-10)  # fmt: skip


def test_attention_error_is_zero_for_the_same_attention_and_a_distance_otherwise():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(1, 5, 2, 4)), rng.normal(size=(1, 5, 1, 4))
    assert rs.attention_error(q, k, q, k) == (0.0, 0.0)
    error, tv = rs.attention_error(q, k, q, 3 * rng.normal(size=k.shape))
    assert error > 0.1 and 0 < tv <= 1


def test_per_head_pairs_rank_each_kv_heads_summed_contribution():
    contribution_HJ = np.array([[1, 5, 2, 0], [1, 0, 2, 9], [3, 1, 0, 2], [3, 1, 0, 1]], float)
    # KV head 0 (query heads 0, 1): [2, 5, 4, 9] -> pairs 3, 1; KV head 1: [6, 2, 0, 3] -> 0, 3
    np.testing.assert_array_equal(rs.per_head_pairs(contribution_HJ, 2, 2), [[1, 3], [0, 3]])


def layer(rng, G, H=4, D=8, E=16):
    return {
        'q_proj': {'kernel': rng.normal(size=(E, H, D)) / 4},
        'k_proj': {'kernel': rng.normal(size=(E, G, D)) / 4},
        'v_proj': {'kernel': rng.normal(size=(E, G, D)) / 4},
    }


def test_selections_exact_cases():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 12, 16))
    mqa = rs.selections(layer(rng, G=1), x, theta=100.0, P=4, stride=1)
    # one KV head: lm's shared key is that head's own key
    assert mqa['lm: ladder, shared key'] == {**mqa['ladder, own keys'], 'rope_cache': 4}
    full = rs.selections(layer(rng, G=2), x, theta=100.0, P=8, stride=1)  # every pair kept
    assert full['ladder, own keys']['logit_error'] < 1e-12
    assert full['MHA2MLA: per KV head, same r']['logit_error'] < 1e-12
    assert full['lm: ladder, shared key']['logit_error'] > 0.01  # two keys averaged into one
    same = layer(rng, G=2)
    same['k_proj']['kernel'][:, 1] = same['k_proj']['kernel'][:, 0]  # identical KV heads
    rows = rs.selections(same, x, theta=100.0, P=4, stride=2)
    assert rows['lm: ladder, shared key']['logit_error'] == pytest.approx(
        rows['ladder, own keys']['logit_error'], rel=1e-12
    )
    assert [(r['pairs'], r['rope_cache']) for r in rows.values()] == [
        (2, 4),
        (2, 8),
        (2, 8),
        (1, 4),
    ]


@pytest.mark.slow
def test_script_measures_every_layer_and_writes_one_row_per_selection_and_seed(tmp_path):
    text = tmp_path / 'small.txt'
    text.write_text(stdlib_text(30_000), encoding='utf-8')
    config = tiny_train_config(tmp_path, text, **{'train.steps': 2, 'model.num_kv_heads': 2})
    train(config, str(tmp_path / 'run'))
    out = tmp_path / 'rope.csv'
    args = [f'--workdir={tmp_path / "run"}', '--calibration_tokens=64', f'--out={out}']
    script = 'docs/studies/uptraining/mla_rope_selection.py'
    done = run_entry(script, *args, '--qk_rope_head_dim=4', check=True)
    assert done.stdout.count(f'| {tmp_path / "run"} |') == 4 * config.model.num_layers
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [(r['arm'], r['seed']) for r in rows] == [
        ('lm: ladder, shared key', '0'),
        ('ladder, own keys', '0'),
        ('MHA2MLA: per KV head, same r', '0'),
        ('MHA2MLA: per KV head, same cache', '0'),
    ]
    assert all(0 < float(r['attention_tv']) < 1 for r in rows)
    bad = run_entry(script, *args, '--qk_rope_head_dim=3')
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].endswith(
        '--qk_rope_head_dim must be an even number >= 2 for config.uptrain.target=mla, got 3'
    )


def reference_errors(s_src, s_new):
    """(relative causal logit error, mean TV of the causal softmax rows), by loops."""
    B, H, T, _ = s_src.shape
    num = den = tv = 0.0
    for b in range(B):
        for h in range(H):
            for t in range(T):
                a, c = s_src[b, h, t, : t + 1], s_new[b, h, t, : t + 1]
                num, den = num + ((c - a) ** 2).sum(), den + (a**2).sum()
                p, p2 = np.exp(a - a.max()), np.exp(c - c.max())
                tv += 0.5 * np.abs(p / p.sum() - p2 / p2.sum()).sum()
    return np.sqrt(num / den), tv / (B * H * T)


def test_every_selection_matches_an_independent_construction():
    """lm's arm from lm's own rope at the converted theta' on the ladder's columns with the
    key averaged there; MHA2MLA's arms from the complex form with their per-head pairs; the
    errors by loops (scale 1/sqrt(D), causal rows)."""
    rng = np.random.default_rng(4)
    H, G, D, E, P, stride, theta = 4, 2, 8, 16, 4, 2, 100.0
    attn = layer(rng, G=G, H=H, D=D, E=E)
    x = rng.normal(size=(2, 6, E))
    q = np.einsum('bte,ehd->bthd', x, attn['q_proj']['kernel'])
    k = np.einsum('bte,egd->btgd', x, attn['k_proj']['kernel'])
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))

    def logits(q_, k_):
        return np.einsum('bthd,buhd->bhtu', q_, np.repeat(k_, H // G, axis=2)) / np.sqrt(D)

    def lms_rope(y, th):
        return np.asarray(rope(jnp.asarray(y, jnp.float32), positions, th), np.float64)

    s_src = logits(lms_rope(q, theta), lms_rope(k, theta))
    rope_dims, nope_dims = mla.kept_dims(D, P, stride)
    theta_conv = theta ** (stride * P / D)  # the converted config's rope_theta
    k_shared = k[..., rope_dims].mean(axis=2, keepdims=True).repeat(G, axis=2)
    s_lm = logits(
        np.concatenate([q[..., nope_dims], lms_rope(q[..., rope_dims], theta_conv)], -1),
        np.concatenate([k[..., nope_dims], lms_rope(k_shared, theta_conv)], -1),
    )
    rows = rs.selections(attn, x, theta, P, stride)
    got = rows['lm: ladder, shared key']
    want = reference_errors(s_src, s_lm)
    assert (got['logit_error'], got['attention_tv']) == pytest.approx(want, rel=1e-4)
    J = D // 2
    inv_freq_J = theta ** (-np.arange(J) / J)
    contribution = mla.pair_contribution(attn, x.reshape(-1, E))
    for name, r in (
        ('MHA2MLA: per KV head, same r', P // 2),
        ('MHA2MLA: per KV head, same cache', 1),
    ):
        kept_GJ = rs.kept_mask(rs.per_head_pairs(contribution, G, r), J)
        kept_HJ = np.repeat(kept_GJ, H // G, axis=0)
        s_new = complex_logits(q, k, kept_HJ, kept_GJ, inv_freq_J) / np.sqrt(D)
        want = reference_errors(s_src, s_new)
        got = rows[name]
        assert (got['logit_error'], got['attention_tv']) == pytest.approx(want, rel=1e-4), name
