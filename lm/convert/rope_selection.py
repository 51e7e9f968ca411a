"""Partial-RoPE selection measured at conversion: MHA2MLA's choice against lm's.

MHA2MLA (arXiv 2502.14837) keeps, per layer and KV head, the r frequency pairs with the largest
2-norm contribution (`mla.pair_contribution`, summed over the head's query heads), each KV head
with its own RoPE key. lm's MHA -> MLA conversion (lm/convert/mla.py) keeps one ladder of pairs
{0, s, 2s, ...} for every head and layer and averages the kept key columns over the KV heads
into one shared key (with `rope_heads` = G, its MLA keeps each KV head's key instead: the
'ladder, own keys' selection here). Both then factor the rest by
the same joint SVD; this module measures the step before it, on a source layer's attention over
calibration windows: what each selection keeps of the source's causal q·k logits (relative
Frobenius error) and of its attention (mean total-variation distance between softmax rows).
Pure numpy, float64. Shape letters as in lm/model/transformer.py; J = D / 2 frequency pairs.
"""

from __future__ import annotations

import numpy as np

from lm.convert import mla
from lm.convert.head_merging import projections


def per_head_pairs(contribution_HJ: np.ndarray, G: int, r: int) -> np.ndarray:
    """[G, r] MHA2MLA's kept pairs, ascending: per KV head the r largest of the contribution
    summed over its H / G query heads (ties: the lower pair)."""
    H, J = contribution_HJ.shape
    by_kv_GJ = contribution_HJ.reshape(G, H // G, J).sum(axis=1)
    return np.sort(np.argsort(-by_kv_GJ, axis=1, kind='stable')[:, :r], axis=1)


def kept_mask(pairs_XR: np.ndarray, J: int) -> np.ndarray:
    """[X, J] True where head x keeps pair j."""
    mask_XJ = np.zeros((pairs_XR.shape[0], J), bool)
    np.put_along_axis(mask_XJ, pairs_XR, True, axis=1)
    return mask_XJ


def partial_rope(y_BTXD: np.ndarray, inv_freq_J: np.ndarray, kept_XJ: np.ndarray) -> np.ndarray:
    """y with each head's kept pairs (i, i + J) rotated by position t · inv_freq_i (rotate-half
    layout, as lm.model.layers.rope; positions 0..T-1) and its other pairs left unrotated."""
    T, J = y_BTXD.shape[1], y_BTXD.shape[-1] // 2
    angle_1T1J = (np.arange(T, dtype=np.float64)[:, None] * inv_freq_J[None])[None, :, None]
    cos = np.where(kept_XJ[None, None], np.cos(angle_1T1J), 1.0)
    sin = np.where(kept_XJ[None, None], np.sin(angle_1T1J), 0.0)
    y1, y2 = y_BTXD[..., :J], y_BTXD[..., J:]
    return np.concatenate([y1 * cos - y2 * sin, y2 * cos + y1 * sin], axis=-1)


def attention_error(
    q_BTHD: np.ndarray, k_BTGD: np.ndarray, q2_BTHD: np.ndarray, k2_BTGD: np.ndarray
) -> tuple[float, float]:
    """(relative error of the causal logits, mean total-variation distance of the causal
    softmax rows, scale 1/sqrt(D)) of (q2, k2) against (q, k); query head h reads KV head
    h // (H / G)."""
    H, G, D = q_BTHD.shape[2], k_BTGD.shape[2], q_BTHD.shape[-1]
    T = q_BTHD.shape[1]

    def logits(q, k):  # [B, H, T, T]: s_htu = q_th · k_u,g(h) / sqrt(D)
        return np.einsum('bthd,buhd->bhtu', q, np.repeat(k, H // G, axis=2)) / np.sqrt(D)

    causal_TT = np.tril(np.ones((T, T), bool))
    s, s2 = logits(q_BTHD, k_BTGD), logits(q2_BTHD, k2_BTGD)
    rel = np.linalg.norm((s2 - s)[..., causal_TT]) / np.linalg.norm(s[..., causal_TT])

    def probs(x):
        x = np.where(causal_TT, x, -np.inf)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    tv = 0.5 * np.abs(probs(s2) - probs(s)).sum(axis=-1).mean()
    return float(rel), float(tv)


def selections(attn: dict, x_BTE: np.ndarray, theta: float, P: int, stride: int) -> dict:
    """Per selection: pairs kept per KV head, RoPE values cached per token and layer, logit
    error and attention TV against the source layer `attn` on its attention inputs x_BTE
    (calibration windows, positions 0..T-1). Selections: lm's ladder (`stride`, as
    `mla.choose_stride` picks it) with its shared, averaged key; the ladder with each KV head's
    own key (lm's choice of pairs alone); MHA2MLA's per-KV-head pairs at the same r = P / 2; and
    at the same RoPE cache (r = P / 2G, where G divides P / 2)."""
    B, T, E = x_BTE.shape
    x_ME = x_BTE.reshape(-1, E).astype(np.float64)
    q_BTHD = projections(attn['q_proj'], x_ME).reshape(B, T, *attn['q_proj']['kernel'].shape[1:])
    k_BTGD = projections(attn['k_proj'], x_ME).reshape(B, T, *attn['k_proj']['kernel'].shape[1:])
    H, G, D = q_BTHD.shape[2], k_BTGD.shape[2], q_BTHD.shape[-1]
    J, r = D // 2, P // 2
    inv_freq_J = theta ** (-np.arange(J, dtype=np.float64) / J)
    contribution_HJ = mla.pair_contribution(attn, x_ME)
    q_src = partial_rope(q_BTHD, inv_freq_J, np.ones((H, J), bool))
    k_src = partial_rope(k_BTGD, inv_freq_J, np.ones((G, J), bool))

    def measure(pairs_GR: np.ndarray, keys_BTGD: np.ndarray) -> dict:
        kept_GJ = kept_mask(pairs_GR, J)
        q2 = partial_rope(q_BTHD, inv_freq_J, np.repeat(kept_GJ, H // G, axis=0))
        error, tv = attention_error(q_src, k_src, q2, partial_rope(keys_BTGD, inv_freq_J, kept_GJ))
        return {'logit_error': error, 'attention_tv': tv}

    rope_dims = mla.kept_dims(D, P, stride)[0]  # the ladder's pairs, then their partners
    ladder_GR = np.tile(rope_dims[:r], (G, 1))
    shared_BTGD = k_BTGD.copy()
    shared_BTGD[..., rope_dims] = k_BTGD[..., rope_dims].mean(axis=2, keepdims=True)
    rows = {
        'lm: ladder, shared key': (r, P, measure(ladder_GR, shared_BTGD)),
        'ladder, own keys': (r, G * P, measure(ladder_GR, k_BTGD)),
        'MHA2MLA: per KV head, same r': (
            r,
            G * P,
            measure(per_head_pairs(contribution_HJ, G, r), k_BTGD),
        ),
    }
    if r % G == 0:
        pairs_GR = per_head_pairs(contribution_HJ, G, r // G)
        rows['MHA2MLA: per KV head, same cache'] = (r // G, P, measure(pairs_GR, k_BTGD))
    return {name: {'pairs': n, 'rope_cache': c, **m} for name, (n, c, m) in rows.items()}
