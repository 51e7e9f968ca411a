"""MHA / GQA → multi-head latent attention (MHA2MLA, arXiv 2502.14837), as pure functions over
one layer's attention parameters, mapped onto lm's MLA layout (`MultiHeadLatentAttention` in
lm/model/mla.py, DeepSeek's names, `config.model.mla.q_lora_rank` = 0):

  q_proj [E, H, N + P]           per head [q_nope; q_rope]     ← source W_Q columns
  kv_a_proj_with_mqa [E, C + RP] [W_DKV, W_KR]                 ← joint SVD factor; mean RoPE key
  kv_a_layernorm scale [C]       c_KV = scale ⊙ z / rms(z)     ← fitted to calibration inputs
  kv_b_proj [C, H, N + D]        per head [W_UK; W_UV]         ← joint SVD factor
  o_proj [H, D, E]               unchanged (v_head_dim = D)

with P = qk_rope_head_dim, N = qk_nope_head_dim = D − P and C = kv_lora_rank (the converted
run's `config.model.mla` section; R = rope_heads, 1 unless asked). Steps:

1. Partial RoPE. lm's MLA has one RoPE key per token shared by every head, rotated by its own
   frequency ladder θ'^(−2i/P), i < P/2. So the kept frequency pairs are the same for all heads
   and layers, and they must form a ladder the MLA can represent: source pairs {0, s, 2s, ...,
   (P/2 − 1)·s} (source pair j turns at θ^(−2j/D)) with θ' = θ^(s·P/D) in the converted config.
   The stride s is chosen by MHA2MLA's 2-norm criterion: the contribution of pair j of head h
   is mean‖q_hj‖ · mean‖k_hj‖ over calibration tokens; s maximises the contribution kept, summed
   over heads and layers. (MHA2MLA picks any pairs per layer and KV head, each KV head with
   its own RoPE key; one key shared by all heads cannot: docs/uptraining.md.) The highest
   frequency, pair 0, is always kept.
2. Shared RoPE key. W_KR is the mean over the source KV heads of their kept-pair key columns;
   queries keep their own columns. With R > 1 RoPE keys (`rope_heads`), key r is the mean over
   the r-th group of G / R adjacent KV heads (R = G: MHA2MLA's key per KV head, on the ladder).
3. Joint SVD (MHA2MLA's SVD_joint, on the weights): [W_K,nope | W_V] over all KV heads, an
   [E, G·(N + D)] matrix, is U·Σ·Vᵀ; W_DKV = U_C·Σ_C and [W_UK | W_UV] = V_Cᵀ; a KV head's
   up-projection serves each of its H / G query heads.
4. Latent norm. MLA normalises the latent, c = scale ⊙ z / rms(z) with z = W_DKV·x, which no
   weights can undo; `scale` is fitted per latent dimension by least squares on calibration
   inputs so that c ≈ z (the scale of z is not lost, only its per-token variation).

Lossy, in order: (1) the dropped pairs lose RoPE (their q·k no longer depends on distance);
(2) the kept pairs' keys are averaged over KV heads (exact for an MQA source, and for heads
whose kept key columns agree); (3) truncating the SVD to C < rank [W_K,nope | W_V] =
min(E, G·(N + D)); (4) the latent RMSNorm's per-token scale. Everything else is exact: at full
rank W_DKV·W_UK and W_DKV·W_UV are the source's non-RoPE key and value projections to float32
rounding. Shape letters as in lm/model/transformer.py; M calibration tokens, J = D / 2 frequency
pairs.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from lm.convert.head_merging import projections


@dataclasses.dataclass(frozen=True)
class LatentRecipe:
    """How a latent conversion (MHA2MLA) reordered each head's dimensions: `order_D`
    (`q_order`), which the optimizer state's kept moments follow."""

    order_D: np.ndarray


def rope_strides(D: int, P: int) -> list[int]:
    """Strides s whose ladder of P / 2 source pairs {0, s, ..., (P/2 − 1)·s} fits in D / 2."""
    if P == 2:
        return [1]
    return list(range(1, (D // 2 - 1) // (P // 2 - 1) + 1))


def kept_dims(D: int, P: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(rope dims [P] in the MLA's rotate-half layout, non-RoPE dims [D − P] in order)."""
    pairs = np.arange(P // 2) * stride
    rope_dims = np.concatenate([pairs, pairs + D // 2])
    return rope_dims, np.setdiff1d(np.arange(D), rope_dims)


def q_order(D: int, pairs: np.ndarray) -> np.ndarray:
    """[D] the source query columns in the converted q_proj's order, [q_nope; q_rope], for the
    kept source frequency `pairs` (as `kept_dims` gives them)."""
    rope_dims = np.concatenate([pairs, pairs + D // 2])
    return np.concatenate([np.setdiff1d(np.arange(D), rope_dims), rope_dims])


def latent_moments(src: dict, fresh: dict, order_D: np.ndarray) -> dict:
    """An Adam moment tree of the converted model: `fresh`'s (zeros, the converted parameters'
    structure) with the source's moments `src` carried over where a parameter is kept:
    everything outside attention, o_proj, and q_proj with its columns reordered by `order_D`
    (`q_order`) exactly as the weights are; the new latent factors keep their zeros."""
    out = {k: (fresh[k] if k == 'blocks' else v) for k, v in src.items()}
    out['blocks'] = {}
    for layer, block in src['blocks'].items():
        attn = dict(fresh['blocks'][layer]['attn'])
        attn['o_proj'] = block['attn']['o_proj']
        attn['q_proj'] = {'kernel': block['attn']['q_proj']['kernel'][..., order_D]}
        out['blocks'][layer] = {**block, 'attn': attn}
    return out


def pair_contribution(attn: dict, x_ME: np.ndarray) -> np.ndarray:
    """[H, J] MHA2MLA's 2-norm contribution of each query head's frequency pair j:
    mean over tokens of ‖q_hj‖ times that of ‖k_hj‖ (k of the head's KV head), pre-RoPE."""
    q_MHD, k_MGD = projections(attn['q_proj'], x_ME), projections(attn['k_proj'], x_ME)
    H, G, J = q_MHD.shape[1], k_MGD.shape[1], q_MHD.shape[2] // 2

    def pair_norms(y_MXD):  # [X, J]: mean ‖(y_j, y_{j + J})‖
        return np.sqrt(y_MXD[..., :J] ** 2 + y_MXD[..., J:] ** 2).mean(axis=0)

    return pair_norms(q_MHD) * np.repeat(pair_norms(k_MGD), H // G, axis=0)


def choose_stride(contribution_HJ: np.ndarray, P: int) -> int:
    """The ladder stride keeping the most contribution (`pair_contribution`, summed over heads
    and layers by the caller); ties: the smallest stride."""
    D = 2 * contribution_HJ.shape[-1]
    by_pair_J = contribution_HJ.reshape(-1, D // 2).sum(axis=0)
    strides = rope_strides(D, P)
    return max(strides, key=lambda s: (by_pair_J[kept_dims(D, P, s)[0][: P // 2]].sum(), -s))


def joint_svd(
    wk_nope_EGN: np.ndarray, wv_EGD: np.ndarray, C: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W_DKV [E, C], W_UK [C, G, N], W_UV [C, G, D]): the rank-C truncated SVD of
    [W_K,nope | W_V] (float64), singular values on the down projection."""
    E, G, N = wk_nope_EGN.shape
    joint = np.concatenate([wk_nope_EGN.reshape(E, -1), wv_EGD.reshape(E, -1)], axis=1)
    u, s, vt = np.linalg.svd(joint.astype(np.float64), full_matrices=False)
    up = vt[:C]
    return u[:, :C] * s[None, :C], up[:, : G * N].reshape(C, G, N), up[:, G * N :].reshape(C, G, -1)


def latent_scale(z_MC: np.ndarray, eps: float) -> np.ndarray:
    """[C] the RMSNorm scale with scale ⊙ z / rms(z) closest to z in least squares per latent
    dimension: Σ z²/r ÷ Σ z²/r², r = sqrt(mean(z²) + eps) per token (1 where z is all 0)."""
    z2_MC = z_MC.astype(np.float64) ** 2
    r_M1 = np.sqrt(z2_MC.mean(axis=1, keepdims=True) + eps)
    num_C, den_C = (z2_MC / r_M1).sum(axis=0), (z2_MC / r_M1**2).sum(axis=0)
    return np.where(den_C > 0, num_C / np.where(den_C > 0, den_C, 1.0), 1.0)


def mla_layer(
    attn: dict, x_ME: np.ndarray, C: int, P: int, stride: int, eps: float, rope_heads: int = 1
) -> dict:
    """The MLA parameters of one MHA / GQA layer (see the module docstring), latent scale fitted
    on its attention inputs x_ME. Needs no biases (MLA has none). `rope_heads` R (dividing the
    source's G KV heads): R RoPE keys, key r the mean of KV heads r·G/R .. (r + 1)·G/R − 1's kept
    columns (R = 1: step 2's one shared key; R = G: each KV head its own, as MHA2MLA)."""
    wq_EHD = np.asarray(attn['q_proj']['kernel'], np.float64)
    wk_EGD = np.asarray(attn['k_proj']['kernel'], np.float64)
    wv_EGD = np.asarray(attn['v_proj']['kernel'], np.float64)
    E, H, D = wq_EHD.shape
    reps = H // wk_EGD.shape[1]  # query heads per source KV head
    rope_dims, nope_dims = kept_dims(D, P, stride)
    w_dkv_EC, w_uk_CGN, w_uv_CGD = joint_svd(wk_EGD[..., nope_dims], wv_EGD, C)
    G = wk_EGD.shape[1]
    w_kr_EX = wk_EGD[..., rope_dims].reshape(E, rope_heads, G // rope_heads, P).mean(axis=2)
    scale_C = latent_scale(x_ME.astype(np.float64) @ w_dkv_EC, eps)
    q_kernel = np.concatenate([wq_EHD[..., nope_dims], wq_EHD[..., rope_dims]], axis=-1)
    b_kernel = np.concatenate(
        [np.repeat(w_uk_CGN, reps, axis=1), np.repeat(w_uv_CGD, reps, axis=1)], -1
    )
    a_kernel = np.concatenate([w_dkv_EC, w_kr_EX.reshape(E, -1)], axis=1)
    dtype = attn['q_proj']['kernel'].dtype
    return {
        'q_proj': {'kernel': jnp.asarray(q_kernel, dtype)},
        'kv_a_proj_with_mqa': {'kernel': jnp.asarray(a_kernel, dtype)},
        'kv_a_layernorm': {'scale': jnp.asarray(scale_C, dtype)},
        'kv_b_proj': {'kernel': jnp.asarray(b_kernel, dtype)},
        'o_proj': {'kernel': attn['o_proj']['kernel']},
    }
