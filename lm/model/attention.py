"""Attention variants, the contract they fulfil, and the registry the factory reads.

- 'mha', 'gqa', 'mqa': one grouped implementation, `GroupedQueryAttention`. MHA is G = H KV
  heads, MQA is G = 1. Query head i reads KV head i // R, R = H / G (contiguous groups, the
  Llama / Hugging Face order). K and V are never repeated per query head.
- 'mla': `MultiHeadLatentAttention`, DeepSeek-V2 §2.1 (low-rank joint KV compression with a
  decoupled, head-shared RoPE key).

Every variant subclasses `AttentionVariant` (lm/model/variant.py, with the registry and shared
pieces) and is registered with `@register`; MLA lives in lm/model/mla.py. Everything
outside these files (model, decoding, accounting, uptraining, sweeps, plots) asks the variant
class (`variant(cfg)`) what it can do, never compares `cfg.attention` with a name. A new
variant is one registered class. Shape letters: see the legend in lm/model/transformer.py.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lm.model.config import ModelConfig
from lm.model.hf_mapping import LLAMA
from lm.model.layers import Dense, fused_dense, residual_scale, rope
from lm.model.mla import MultiHeadLatentAttention
from lm.model.variant import (
    VARIANTS,
    AttentionVariant,
    cache_mask,
    causal_mask,
    document_mask,
    grouped_attention,
    inactive_sections,
    register,
    sections,
    unregister,
    write_cache,
)

__all__ = [
    'VARIANTS',
    'AttentionVariant',
    'GroupedQueryAttention',
    'MultiHeadLatentAttention',
    'baseline',
    'cache_mask',
    'causal_mask',
    'document_mask',
    'grouped_attention',
    'inactive_sections',
    'make_attention',
    'parse_variant',
    'register',
    'sections',
    'unregister',
    'variant',
    'write_cache',
]


@register
class GroupedQueryAttention(AttentionVariant):
    """MHA / GQA / MQA: H query heads, G = num_kv_heads K/V heads, RoPE on q and k."""

    names = ('mha', 'gqa', 'mqa')
    poolable_kv_heads = True

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        H, g = cfg.num_heads, cfg.num_kv_heads
        implied = {'mha': H, 'mqa': 1}.get(cfg.attention)
        if implied is not None and g not in (0, implied):
            raise ValueError(
                f'config.model.num_kv_heads={g} contradicts attention='
                f"'{cfg.attention}' (which means {implied}); use attention='gqa'"
            )
        g = implied or g
        if g == 0:
            raise ValueError("config.model.num_kv_heads must be set (> 0) for attention='gqa'")
        if g > H:
            raise ValueError(f'config.model.num_kv_heads={g} must be <= num_heads={H}')
        if H % g:
            raise ValueError(f'config.model.num_heads={H} must be divisible by num_kv_heads={g}')
        head_dim = cfg.head_dim
        if head_dim == 0:
            if cfg.d_model % H:
                raise ValueError(
                    f'config.model.d_model={cfg.d_model} must be divisible by '
                    f'num_heads={H} when head_dim is 0 (derived)'
                )
            head_dim = cfg.d_model // H
        if head_dim % 2:
            raise ValueError(f'config.model.head_dim={head_dim} must be even for RoPE')
        return dataclasses.replace(cfg, num_kv_heads=g, head_dim=head_dim)

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        """Cached elements per token per layer: K and V for each KV head, 2·g·d_h."""
        return 2 * cfg.num_kv_heads * cfg.head_dim

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        return str(cfg.num_kv_heads)

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        return cfg.head_dim, cfg.head_dim

    @classmethod
    def parse_spec(cls, spec: str) -> dict[str, Any] | None:
        """'mha', 'mqa', or 'gqa<G>' ('gqa2': two K/V heads)."""
        if match := re.fullmatch(r'gqa(\d+)', spec):
            return {'attention': 'gqa', 'num_kv_heads': int(match.group(1))}
        return {'attention': spec, 'num_kv_heads': 0} if spec in ('mha', 'mqa') else None

    @classmethod
    def pooled(cls, num_kv_heads: int) -> dict[str, Any]:
        return {'attention': 'mqa' if num_kv_heads == 1 else 'gqa', 'num_kv_heads': num_kv_heads}

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, H, G, D = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.qkv_bias
        self.q_proj = Dense(
            (E,), (H, D), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs, use_bias=bias
        )
        self.k_proj = Dense(
            (E,), (G, D), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs, use_bias=bias
        )
        self.v_proj = Dense(
            (E,), (G, D), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs, use_bias=bias
        )
        self.o_proj = Dense(
            (H, D),
            (E,),
            ('heads', 'head_dim', 'embed'),
            cfg,
            rngs=rngs,
            use_bias=cfg.o_bias,
            scale=residual_scale(cfg),
        )
        self.cfg = cfg

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> dict[str, jax.Array]:
        """Per-layer decoding cache: K and V for each KV head, [B, S, G, D] each."""
        shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
        return {'k': jnp.zeros(shape, dtype), 'v': jnp.zeros(shape, dtype)}

    def _qkv(self, x_BTE: jax.Array, positions_BT: jax.Array):
        theta = self.cfg.rope_theta
        q_BTHD, k_BTGD, v_BTGD = fused_dense(x_BTE, [self.q_proj, self.k_proj, self.v_proj])
        q_BTHD = rope(q_BTHD, positions_BT, theta, self.cfg)
        return q_BTHD, rope(k_BTGD, positions_BT, theta, self.cfg), v_BTGD

    def probs(self, x_BTE: jax.Array, positions_BT: jax.Array) -> jax.Array:
        """Causal attention probabilities [B, H, T, S] (S = T) of `__call__` on the same input:
        the einsum path's scores and softmax, for head analysis (lm/analysis/scores.py)."""
        q_BTHD, k_BTGD, _ = self._qkv(x_BTE, positions_BT)
        B, T, H, D = q_BTHD.shape
        G = k_BTGD.shape[2]
        q_BTGRD = q_BTHD.reshape(B, T, G, H // G, D)
        # scores[b, g, r, t, s] = <q[b, t, g, r], k[b, s, g]>, as in `grouped_attention`.
        s_BGRTS = (
            jnp.einsum('BTGRD,BSGD->BGRTS', q_BTGRD, k_BTGD, preferred_element_type=jnp.float32)
            * self.cfg.head_dim**-0.5
        )
        s_BGRTS = jnp.where(causal_mask(T)[None, None, None], s_BGRTS, jnp.finfo(jnp.float32).min)
        return jax.nn.softmax(s_BGRTS, axis=-1).reshape(B, H, T, T)

    def __call__(
        self, x_BTE: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array | None = None
    ) -> jax.Array:
        cfg = self.cfg
        q_BTHD, k_BTGD, v_BTGD = self._qkv(x_BTE, positions_BT)
        mask = None if segment_ids_BT is None else document_mask(segment_ids_BT)
        out_BTHD = grouped_attention(
            q_BTHD, k_BTGD, v_BTGD, scale=cfg.head_dim**-0.5, mask=mask, impl=cfg.attention_impl
        )
        return self.o_proj(out_BTHD)

    def extend(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        cache: dict,
        slot: jax.Array,
        kv_valid_BS: jax.Array,
        absorb: bool = True,
    ) -> tuple[jax.Array, dict]:
        """Attention for T new tokens written into the cache at `slot` (prefill or decode)."""
        q_BTHD, k_BTGD, v_BTGD = self._qkv(x_BTE, positions_BT)
        cache = {
            'k': write_cache(cache['k'], k_BTGD, slot),
            'v': write_cache(cache['v'], v_BTGD, slot),
        }
        mask = cache_mask(kv_valid_BS, slot, x_BTE.shape[1])
        out_BTHD = grouped_attention(
            q_BTHD,
            cache['k'].astype(q_BTHD.dtype),
            cache['v'].astype(q_BTHD.dtype),
            mask=mask,
            scale=self.cfg.head_dim**-0.5,
            impl=self.cfg.attention_impl,
        )
        return self.o_proj(out_BTHD), cache

    hf_mappings = (LLAMA,)


def variant(cfg: ModelConfig | ml_collections.ConfigDict) -> type[AttentionVariant]:
    """The attention class named by `cfg.attention` (a ModelConfig or `config.model`)."""
    if cfg.attention not in VARIANTS:
        raise ValueError(
            f'config.model.attention must be one of {sorted(VARIANTS)}, got {cfg.attention!r}'
        )
    return VARIANTS[cfg.attention]


def parse_variant(spec: str) -> dict[str, Any]:
    """`config.model` settings for a short variant name: 'mha', 'gqa2', 'mqa', 'mla', or any
    registered variant's own (`AttentionVariant.parse_spec`)."""
    for cls in dict.fromkeys(VARIANTS.values()):
        if (settings := cls.parse_spec(spec)) is not None:
            return settings
    raise ValueError(
        f"unknown variant {spec!r}; expected 'mha', 'gqa<g>' (e.g. 'gqa2'), 'mqa' or 'mla' "
        f'(registered: {sorted(VARIANTS)})'
    )


def baseline() -> dict[str, Any]:
    """`config.model` settings of multi-head attention, the baseline that KV sharing is
    compared against (equal-parameter sweeps match every point to it)."""
    return parse_variant('mha')


def make_attention(cfg: ModelConfig, *, rngs: nnx.Rngs) -> AttentionVariant:
    """The factory: builds the attention module named by `cfg.attention`."""
    return variant(cfg)(cfg, rngs=rngs)
