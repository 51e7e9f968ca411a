"""Head analysis: what each attention head does, read from its attention probabilities.

Every score is a pure function of causal attention probabilities p_BHTS (query t, key s, S = T,
rows summing to 1) and returns one number per head, [H], averaged over batch rows and over query
positions t >= 1 (query 0 can only attend to itself, so it says nothing about a head). The
probe (`attention_probs`) runs the model's own forward pass on a copy with `sow_weights` set and
reads the weights each layer's attention variant sows (the contract in lm/model/variant.py), so
MHA, GQA, MQA, MLA and any registered variant are read with the parameters and numerics of
their forward pass; the training step is not touched.

Sources: Olsson et al. 2022, "In-context learning and induction heads" (induction score on
repeated random tokens, in-context-learning score); Gu et al. 2024, "When attention sink emerges
in language models" (arXiv 2410.10781; sink metric with eps = 0.3); TransformerLens
`detect_head` (previous-token and duplicate-token patterns).

Shape letters: B batch, T query positions, S key positions, H query heads, G KV heads,
D head dim, N tokens, E d_model, L layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lm.model import attention, layout
from lm.model.config import DTYPES
from lm.model.transformer import Transformer

SINK_EPS = 0.3  # Gu et al. 2024: a head is a sink head when its attention to token 1 > 0.3


def _mean_over_queries(x_BHT: jax.Array) -> jax.Array:
    """[H]: mean over batch rows and query positions t >= 1."""
    return jnp.mean(x_BHT[:, :, 1:], axis=(0, 2))


def previous_token_score(p_BHTS: jax.Array) -> jax.Array:
    """Mean attention from position t to t - 1 (TransformerLens `detect_head`, previous-token
    pattern): 1 for a head that always looks one token back."""
    return jnp.mean(jnp.diagonal(p_BHTS, offset=-1, axis1=2, axis2=3), axis=(0, 2))


def earlier_copies(tokens_BT: jax.Array) -> jax.Array:
    """[B, T, S] boolean: key s < t holds the same token as query t."""
    T = tokens_BT.shape[1]
    same_BTS = tokens_BT[:, :, None] == tokens_BT[:, None, :]
    return same_BTS & (jnp.arange(T)[None, :] < jnp.arange(T)[:, None])[None]


def _mass_on(p_BHTS: jax.Array, target_BTS: jax.Array) -> jax.Array:
    """[H]: attention mass on the target keys, averaged over the queries that have a target
    (NaN when none has)."""
    mass_BHT = jnp.einsum('BHTS,BTS->BHT', p_BHTS, target_BTS.astype(p_BHTS.dtype))
    has_BT = jnp.any(target_BTS, axis=-1).astype(p_BHTS.dtype)
    return jnp.einsum('BHT,BT->H', mass_BHT, has_BT) / jnp.sum(has_BT)


def duplicate_token_score(p_BHTS: jax.Array, tokens_BT: jax.Array) -> jax.Array:
    """Attention to earlier copies of the query's own token (TransformerLens `detect_head`,
    duplicate-token pattern): mass on keys s < t with token[s] == token[t], averaged over the
    queries that have an earlier copy."""
    return _mass_on(p_BHTS, earlier_copies(tokens_BT))


def induction_score(p_BHTS: jax.Array, tokens_BT: jax.Array) -> jax.Array:
    """Prefix-matching score of Olsson et al. 2022: mass on the token right after each earlier
    copy of the query's token (key s + 1 for token[s] == token[t], s < t), averaged over the
    queries that have an earlier copy. On `repeated_random_tokens` (distinct tokens repeated
    twice) that is exactly the mean attention from a token in the second repeat to the token
    after its copy in the first."""
    copies_BTS = earlier_copies(tokens_BT)
    after_BTS = jnp.pad(copies_BTS[:, :, :-1], ((0, 0), (0, 0), (1, 0)))
    return _mass_on(p_BHTS, after_BTS)


def first_position_attention(p_BHTS: jax.Array) -> jax.Array:
    """Mean attention to the first position (Gu et al. 2024's alpha for token 1, over queries
    t >= 1)."""
    return _mean_over_queries(p_BHTS[..., 0])


def sink_fraction(p_BHTS: jax.Array, eps: float = SINK_EPS) -> jax.Array:
    """Fraction of query positions (t >= 1, all rows) whose attention to the first position
    exceeds eps = 0.3, Gu et al. 2024's threshold applied per head and position."""
    return _mean_over_queries((p_BHTS[..., 0] > eps).astype(jnp.float32))


def sink_rate(first_attention_LH: np.ndarray, eps: float = SINK_EPS) -> float:
    """Gu et al. 2024's model-level metric Sink^eps_1: the fraction of (layer, head) pairs whose
    mean attention to the first token (`first_position_attention`) exceeds eps."""
    return float(np.mean(np.asarray(first_attention_LH) > eps))


def attention_entropy(p_BHTS: jax.Array) -> jax.Array:
    """Entropy of each attention row in nats, -sum_s p log p (0 log 0 = 0), averaged over
    query positions t >= 1. A head that attends to one key scores 0; a uniform one log(t + 1)."""
    plogp_BHTS = jnp.where(p_BHTS > 0, p_BHTS * jnp.log(jnp.where(p_BHTS > 0, p_BHTS, 1)), 0)
    return _mean_over_queries(-jnp.sum(plogp_BHTS, axis=-1))


def repeated_random_tokens(
    rng: np.random.Generator, batch: int, period: int, token_ids: np.ndarray
) -> np.ndarray:
    """[batch, 2 · period] int32: `period` random tokens, then the same tokens again (Olsson et
    al.'s induction probe). Tokens are drawn from `token_ids` (e.g. those the text uses), distinct
    within a row when there are enough of them, so only the second repeat has earlier copies."""
    token_ids = np.asarray(token_ids)
    distinct = len(token_ids) >= period
    rows = np.stack([rng.choice(token_ids, period, replace=not distinct) for _ in range(batch)])
    return np.concatenate([rows, rows], axis=1).astype(np.int32)


def attention_inputs(model: Transformer, tokens_BT: jax.Array) -> tuple[list, jax.Array]:
    """The normalised input of every layer's attention, [B, T, E] each, from the model's own
    embedding and blocks, and the positions [B, T] the forward pass uses."""
    positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    x_BTE = jnp.take(model.embed[...], tokens_BT, axis=0).astype(DTYPES[model.cfg.dtype])
    inputs, below = [], None
    for i, block in enumerate(model.blocks):
        inputs.append(block.attn_norm(x_BTE))
        producer = layout.is_producer(model.cfg, i)  # a CLA consumer reads its producer's K/V
        x_BTE, kv = block(x_BTE, positions_BT, cache=None if producer else below)
        below = kv if producer else below
    return inputs, positions_BT


def attention_probs(model: Transformer, tokens_BT: jax.Array) -> list[jax.Array]:
    """Each layer's attention probabilities [B, H, T, T] (float32) on `tokens_BT`: the weights
    its attention variant sows (`AttentionWeights`) in the model's own forward pass, run on a
    copy of the model with `sow_weights` set."""
    probe = nnx.clone(model)
    probe.set_attributes(sow_weights=True)
    _, sown = nnx.capture(probe, attention.AttentionWeights)(tokens_BT)
    # one (weights,) tuple per layer, at its module path ('blocks', layer, ...): sorted by layer
    layers = sorted(nnx.to_flat_state(sown), key=lambda item: item[0])
    return [sown_weights.get_value()[0] for _, sown_weights in layers]


def kv_projections(model: Transformer, tokens_BT: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
    """Each layer's per-KV-head keys and values before RoPE, ([B, T, G, D], [B, T, G, D]): the
    projections MHA -> GQA conversion averages (lm/convert/uptrain.py), from the variant's own
    `kv_projections`. Needs a variant with poolable K/V heads (mha / gqa / mqa)."""
    if model.cfg.kv_share_every > 1:
        raise ValueError(
            f'KV-head similarity needs every layer to have its own K/V; config.model.'
            f'kv_share_every={model.cfg.kv_share_every} shares them across layers'
        )
    if not attention.variant(model.cfg).poolable_kv_heads:
        raise ValueError(
            f'KV-head similarity needs per-head K/V projections (mha/gqa/mqa); attention='
            f"'{model.cfg.attention}' has none"
        )
    inputs, _ = attention_inputs(model, tokens_BT)
    return [blk.attn.kv_projections(h) for blk, h in zip(model.blocks, inputs, strict=True)]


def head_moments(x_NGD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(count, sum [G, D], sum of outer products [G, D, G, D]) over N tokens: what
    `head_covariance` needs, summable over chunks of text."""
    x32 = x_NGD.astype(jnp.float32)
    # s2[g, d, h, e] = sum_n x[n, g, d] · x[n, h, e]
    s2_GDGD = jnp.einsum('NGD,NHE->GDHE', x32, x32)
    return jnp.asarray(x_NGD.shape[0], jnp.float32), x32.sum(axis=0), s2_GDGD


def head_covariance(moments: tuple) -> np.ndarray:
    """Cross-covariance [G, D, G, D] (float64) of the heads' mean-centred projections."""
    n, s1_GD, s2_GDGD = (np.asarray(m, np.float64) for m in moments)
    mu_GD = s1_GD / n
    return s2_GDGD / n - np.einsum('GD,HE->GDHE', mu_GD, mu_GD)


def centred_cosine(cov_GDGD: np.ndarray) -> np.ndarray:
    """[G, G]: cosine between heads' mean-centred projections, dimension by dimension:
    sum_d cov(x_gd, x_hd) / sqrt(sum_d var(x_gd) · sum_d var(x_hd)). 1 when two heads produce
    the same (centred) vectors, so averaging them loses nothing; it is not rotation-invariant,
    which is right for mean-pooling, since averaging does not align heads first."""
    tr_GG = np.einsum('GDHD->GH', cov_GDGD)
    d_G = np.sqrt(np.diag(tr_GG))
    return tr_GG / np.outer(d_G, d_G)


def linear_cka(cov_GDGD: np.ndarray) -> np.ndarray:
    """[G, G]: linear CKA (Kornblith et al. 2019) between heads' centred projections,
    ||C_gh||_F² / (||C_gg||_F · ||C_hh||_F) with C_gh the [D, D] cross-covariance: invariant to
    rotations of either head, so it also counts heads that match only after an alignment."""
    hsic_GG = np.einsum('GDHE,GDHE->GH', cov_GDGD, cov_GDGD)
    d_G = np.sqrt(np.diag(hsic_GG))
    return hsic_GG / np.outer(d_G, d_G)


def token_losses(model: Transformer, tokens_BT1: jax.Array) -> jax.Array:
    """[B, T] next-token loss (nats) of windows of T + 1 tokens, by position."""
    logits_BTV = model(tokens_BT1[:, :-1])
    logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    return -jnp.take_along_axis(logp_BTV, tokens_BT1[:, 1:, None], axis=-1)[..., 0]


def icl_positions(T: int) -> tuple[int, int]:
    """(early, late) 0-based positions of Olsson et al.'s in-context-learning score, whose 50th
    and 500th tokens are scaled so that the 500th is the model's last position: late = T - 1,
    early = round(T / 10) - 1 (at least 0)."""
    return max(round(T / 10) - 1, 0), T - 1


def icl_score(loss_T: np.ndarray) -> float:
    """Olsson et al. 2022's in-context-learning score, scaled to the context (`icl_positions`):
    loss at the late position minus loss at the early one (negative = later tokens are easier)."""
    early, late = icl_positions(len(loss_T))
    return float(loss_T[late] - loss_T[early])
