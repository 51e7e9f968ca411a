"""Multi-head latent attention (DeepSeek-V2 §2.1), registered as 'mla' for the factory in
lm/model/attention.py. Shape letters: see the legend in lm/model/transformer.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from lm.model.config import ModelConfig
from lm.model.hf_mapping import DEEPSEEK_V3
from lm.model.layers import Dense, RMSNorm, residual_scale, rope
from lm.model.variant import (
    AttentionVariant,
    cache_mask,
    causal_mask,
    document_mask,
    grouped_attention,
    register,
    write_cache,
)


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """MLA's own section, `config.model.mla` (each key's meaning: configs/base.py)."""

    kv_lora_rank: int  # C, the rank of the KV latent c_KV
    q_lora_rank: int  # rank of the query latent c_Q; 0 = queries straight from h
    qk_nope_head_dim: int  # N, per-head query/key width without RoPE
    qk_rope_head_dim: int  # P, the decoupled RoPE width (one RoPE key shared by the heads)
    v_head_dim: int  # U, per-head value width
    latent_norm_eps: float  # eps of the latent RMSNorms; 0 = config.model.norm_eps


@register
class MultiHeadLatentAttention(AttentionVariant):
    """DeepSeek-V2 MLA (§2.1), with DeepSeek's parameter names.

    c_KV = RMSNorm(W_DKV h) of rank C = kv_lora_rank is all a cache would keep, together with the
    RoPE key k_R = RoPE(W_KR h), one per token shared by every head. Per-head keys and values
    are up-projections of c_KV: k_C = W_UK c_KV, v = W_UV c_KV. Queries come from h directly
    (q_lora_rank = 0) or through a normalised latent c_Q of rank q_lora_rank; each head's query
    is [q_C; RoPE(q_R)]. Softmax scale 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim).
    The cache holds no per-head K/V: `num_kv_heads` resolves to 0 and tables show the latent.
    """

    names = ('mla',)
    latent_kv = True

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        mla = cfg.section
        for name in ('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'):
            if getattr(mla, name) <= 0:
                raise ValueError(
                    f"config.model.mla.{name} must be > 0 for attention='mla', "
                    f'got {getattr(mla, name)}'
                )
        if mla.q_lora_rank < 0:
            raise ValueError(
                'config.model.mla.q_lora_rank must be >= 0 (0 = direct queries), '
                f'got {mla.q_lora_rank}'
            )
        if mla.qk_rope_head_dim % 2:
            raise ValueError(
                f'config.model.mla.qk_rope_head_dim={mla.qk_rope_head_dim} must be even for RoPE'
            )
        if mla.latent_norm_eps < 0:
            raise ValueError(
                'config.model.mla.latent_norm_eps must be >= 0 (0 = norm_eps), '
                f'got {mla.latent_norm_eps}'
            )
        if cfg.num_kv_heads not in (0, cfg.num_heads):
            raise ValueError(
                f'config.model.num_kv_heads={cfg.num_kv_heads} does not apply to '
                "attention='mla' (every head has its own K/V); leave it 0"
            )
        return dataclasses.replace(cfg, num_kv_heads=0)

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        """Cached elements per token per layer: the latent and the shared RoPE key, d_c + d_h^R."""
        return cfg.section.kv_lora_rank + cfg.section.qk_rope_head_dim

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        return f'latent {cfg.section.kv_lora_rank}+{cfg.section.qk_rope_head_dim}'

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        return cfg.section.qk_nope_head_dim + cfg.section.qk_rope_head_dim, cfg.section.v_head_dim

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        mla = cfg.section
        E, H, C = cfg.d_model, cfg.num_heads, mla.kv_lora_rank
        Dn, Dr, Dv = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        if mla.q_lora_rank:
            Cq = mla.q_lora_rank
            self.q_a_proj = Dense((E,), (Cq,), ('embed', 'q_lora'), cfg, rngs=rngs)
            self.q_a_layernorm = RMSNorm(Cq, cfg, mla.latent_norm_eps)
            self.q_b_proj = Dense(
                (Cq,), (H, Dn + Dr), ('q_lora', 'heads', 'head_dim'), cfg, rngs=rngs
            )
        else:
            self.q_proj = Dense((E,), (H, Dn + Dr), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs)
        # W_DKV and W_KR in one matrix, as DeepSeek stores them: [E, C + Dr].
        self.kv_a_proj_with_mqa = Dense((E,), (C + Dr,), ('embed', 'kv_lora'), cfg, rngs=rngs)
        self.kv_a_layernorm = RMSNorm(C, cfg, mla.latent_norm_eps)
        # W_UK and W_UV in one matrix: [C, H, Dn + Dv].
        self.kv_b_proj = Dense((C,), (H, Dn + Dv), ('kv_lora', 'heads', 'head_dim'), cfg, rngs=rngs)
        self.o_proj = Dense(
            (H, Dv),
            (E,),
            ('heads', 'head_dim', 'embed'),
            cfg,
            rngs=rngs,
            scale=residual_scale(cfg),
        )
        self.cfg = cfg

    def queries(self, x_BTE: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(q_C [B, T, H, Dn], RoPE'd q_R [B, T, H, Dr])."""
        cfg = self.cfg
        if cfg.section.q_lora_rank:
            q_BTHD = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_BTE)))
        else:
            q_BTHD = self.q_proj(x_BTE)
        q_nope, q_pe = jnp.split(q_BTHD, [cfg.section.qk_nope_head_dim], axis=-1)
        return q_nope, rope(q_pe, positions_BT, cfg.rope_theta, cfg)

    def latents(self, x_BTE: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
        """What a KV cache holds: (c_KV [B, T, C], RoPE'd shared key k_R [B, T, Dr])."""
        cfg = self.cfg
        c_BTC, k_pe_BTP = jnp.split(
            self.kv_a_proj_with_mqa(x_BTE), [cfg.section.kv_lora_rank], axis=-1
        )
        return self.kv_a_layernorm(c_BTC), rope(k_pe_BTP, positions_BT, cfg.rope_theta, cfg)

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> dict[str, jax.Array]:
        """Per-layer decoding cache: the latent c_KV [B, S, C] and shared RoPE key [B, S, Dr]."""
        return {
            'c': jnp.zeros((batch, length, cfg.section.kv_lora_rank), dtype),
            'k_pe': jnp.zeros((batch, length, cfg.section.qk_rope_head_dim), dtype),
        }

    def _expanded(self, q_nope, q_pe, c_BSC, k_pe_BSP, mask) -> jax.Array:
        """Attention with per-head K and V materialised from the latent (training, prefill)."""
        cfg = self.cfg
        H = cfg.num_heads
        k_nope, v_BSHU = jnp.split(self.kv_b_proj(c_BSC), [cfg.section.qk_nope_head_dim], axis=-1)
        # [k_C; k_R] with the one RoPE key broadcast to every head.
        k_pe_BSHP = jnp.broadcast_to(
            k_pe_BSP[:, :, None], k_pe_BSP.shape[:2] + (H,) + k_pe_BSP.shape[2:]
        )
        q_BTHD = jnp.concatenate([q_nope, q_pe], axis=-1)
        k_BSHD = jnp.concatenate([k_nope, k_pe_BSHP.astype(k_nope.dtype)], axis=-1)
        out_BTHU = grouped_attention(
            q_BTHD, k_BSHD, v_BSHU, scale=self.scale, mask=mask, impl=cfg.attention_impl
        )
        return self.o_proj(out_BTHU)

    def _absorbed(self, q_nope, q_pe, c_BSC, k_pe_BSP, mask) -> jax.Array:
        """DeepSeek-V2 §2.1.2 weight absorption: W_UK is applied to the query and W_UV to the
        attention output, so scores and values are read straight from the cached latent."""
        cfg = self.cfg
        dtype = q_nope.dtype
        w_uk_CHN, w_uv_CHU = jnp.split(
            self.kv_b_proj.kernel[...].astype(dtype), [cfg.section.qk_nope_head_dim], axis=-1
        )
        q_lat_BTHC = jnp.einsum('BTHN,CHN->BTHC', q_nope, w_uk_CHN)  # W_UKᵀ q_C per head
        # score = <W_UKᵀ q_C, c_KV> + <q_R, k_R>
        s_BHTS = (
            jnp.einsum(
                'BTHC,BSC->BHTS',
                q_lat_BTHC,
                c_BSC.astype(dtype),
                preferred_element_type=jnp.float32,
            )
            + jnp.einsum(
                'BTHP,BSP->BHTS', q_pe, k_pe_BSP.astype(dtype), preferred_element_type=jnp.float32
            )
        ) * self.scale
        s_BHTS = jnp.where(mask[:, None], s_BHTS, jnp.finfo(jnp.float32).min)
        p_BHTS = jax.nn.softmax(s_BHTS, axis=-1).astype(dtype)
        o_lat_BTHC = jnp.einsum('BHTS,BSC->BTHC', p_BHTS, c_BSC.astype(dtype))
        return self.o_proj(jnp.einsum('BTHC,CHU->BTHU', o_lat_BTHC, w_uv_CHU))  # W_UV after

    def probs(self, x_BTE: jax.Array, positions_BT: jax.Array) -> jax.Array:
        """Causal attention probabilities [B, H, T, S] (S = T) of `__call__` on the same input:
        scores of `_expanded` ([q_C; RoPE(q_R)] against [k_C; shared RoPE(k_R)]), for head
        analysis (lm/analysis/scores.py)."""
        cfg = self.cfg
        q_nope, q_pe = self.queries(x_BTE, positions_BT)
        c_BSC, k_pe_BSR = self.latents(x_BTE, positions_BT)
        k_nope = jnp.split(self.kv_b_proj(c_BSC), [cfg.section.qk_nope_head_dim], axis=-1)[0]
        k_pe_BSHR = jnp.broadcast_to(k_pe_BSR[:, :, None], k_nope.shape[:3] + k_pe_BSR.shape[2:])
        q_BTHK = jnp.concatenate([q_nope, q_pe], axis=-1)
        k_BSHK = jnp.concatenate([k_nope, k_pe_BSHR.astype(k_nope.dtype)], axis=-1)
        # scores[b, h, t, s] = <q[b, t, h], k[b, s, h]>
        s_BHTS = (
            jnp.einsum('BTHK,BSHK->BHTS', q_BTHK, k_BSHK, preferred_element_type=jnp.float32)
            * self.scale
        )
        T = x_BTE.shape[1]
        s_BHTS = jnp.where(causal_mask(T)[None, None], s_BHTS, jnp.finfo(jnp.float32).min)
        return jax.nn.softmax(s_BHTS, axis=-1)

    @property
    def scale(self) -> float:
        return (self.cfg.section.qk_nope_head_dim + self.cfg.section.qk_rope_head_dim) ** -0.5

    def __call__(
        self, x_BTE: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array | None = None
    ) -> jax.Array:
        q_nope, q_pe = self.queries(x_BTE, positions_BT)
        c_BSC, k_pe_BSP = self.latents(x_BTE, positions_BT)
        mask = None if segment_ids_BT is None else document_mask(segment_ids_BT)
        return self._expanded(q_nope, q_pe, c_BSC, k_pe_BSP, mask=mask)

    def extend(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        cache: dict,
        slot: jax.Array,
        kv_valid_BS: jax.Array,
        absorb: bool = True,
    ) -> tuple[jax.Array, dict]:
        """Attention for T new tokens; the cache holds only c_KV and k_R. `absorb=False`
        expands per-head K/V from the whole cache instead (the naive reference path)."""
        q_nope, q_pe = self.queries(x_BTE, positions_BT)
        c_BTC, k_pe_BTP = self.latents(x_BTE, positions_BT)
        cache = {
            'c': write_cache(cache['c'], c_BTC, slot),
            'k_pe': write_cache(cache['k_pe'], k_pe_BTP, slot),
        }
        mask = cache_mask(kv_valid_BS, slot, x_BTE.shape[1])
        attend = self._absorbed if absorb else self._expanded
        return attend(q_nope, q_pe, cache['c'], cache['k_pe'], mask), cache

    config_section = 'mla'
    config_class = MLAConfig
    hf_mappings = (DEEPSEEK_V3,)
