"""Attention variants, the contract they fulfil, and the registry the factory reads.

- 'mha', 'gqa', 'mqa': one grouped implementation, `GroupedQueryAttention` (lm/model/gqa.py).
  MHA is G = H KV heads, MQA is G = 1. Query head i reads KV head i // R, R = H / G (contiguous
  groups, the Llama / Hugging Face order). K and V are never repeated per query head.
- 'mla': `MultiHeadLatentAttention` (lm/model/mla.py), DeepSeek-V2 §2.1 (low-rank joint KV
  compression with a decoupled, head-shared RoPE key).

Every variant subclasses `AttentionVariant` (lm/model/variant.py, with the registry and shared
pieces) and is registered with `@register`; it computes attention once, in its `__call__`, for
training, cached decoding and analysis. Everything outside these files (model, decoding,
accounting, uptraining, analysis, sweeps, plots) asks the variant class (`variant(cfg)`) what it
can do, never compares `cfg.attention` with a name. A new variant is one registered class.
Shape letters: see the legend in lm/model/transformer.py.
"""

from __future__ import annotations

import re
from typing import Any

import ml_collections
from flax import nnx

from lm.model.config import ModelConfig
from lm.model.gqa import GroupedQueryAttention
from lm.model.kv_cache import KVCache, cache_mask, write_cache
from lm.model.mla import MultiHeadLatentAttention
from lm.model.variant import (
    VARIANTS,
    AttentionVariant,
    AttentionWeights,
    causal_mask,
    document_mask,
    grouped_attention,
    inactive_sections,
    missing_members,
    register,
    sections,
    set_absorb,
    unregister,
    window_mask,
)

__all__ = [
    'VARIANTS',
    'AttentionVariant',
    'AttentionWeights',
    'GroupedQueryAttention',
    'KVCache',
    'MultiHeadLatentAttention',
    'baseline',
    'cache_mask',
    'causal_mask',
    'document_mask',
    'grouped_attention',
    'inactive_sections',
    'make_attention',
    'missing_members',
    'parse_variant',
    'register',
    'sections',
    'set_absorb',
    'unregister',
    'variant',
    'window_mask',
    'write_cache',
]


def variant(cfg: ModelConfig | ml_collections.ConfigDict) -> type[AttentionVariant]:
    """The attention class named by `cfg.attention` (a ModelConfig or `config.model`)."""
    if cfg.attention not in VARIANTS:
        raise ValueError(
            f'config.model.attention must be one of {sorted(VARIANTS)}, got {cfg.attention!r}'
        )
    return VARIANTS[cfg.attention]


def parse_variant(spec: str) -> dict[str, Any]:
    """`config.model` settings for a short variant name: 'mha', 'gqa2', 'mqa', 'mla', or any
    registered variant's own (`AttentionVariant.parse_spec`); '<name>_cla<n>' adds cross-layer
    attention with sharing factor n ('mqa_cla2'; 'cla2' alone is MHA's)."""
    if match := re.fullmatch(r'(?:(.+)_)?cla(\d+)', spec):
        return {**parse_variant(match.group(1) or 'mha'), 'kv_share_every': int(match.group(2))}
    for cls in dict.fromkeys(VARIANTS.values()):
        if (settings := cls.parse_spec(spec)) is not None:
            return settings
    what = (  # 'gqa' is a kind (config.model.attention), not a variant: its g is missing
        f'variant {spec!r} names an attention kind without its settings'
        if spec in VARIANTS
        else f'unknown variant {spec!r}'
    )
    raise ValueError(
        f"{what}; expected 'mha', 'gqa<g>' (e.g. 'gqa2'), 'mqa' or 'mla', optionally with "
        f"'_cla<n>' (attention kinds registered: {sorted(VARIANTS)})"
    )


def baseline() -> dict[str, Any]:
    """`config.model` settings of multi-head attention, the baseline that KV sharing is
    compared against (equal-parameter sweeps match every point to it)."""
    return parse_variant('mha')


def make_attention(cfg: ModelConfig, *, rngs: nnx.Rngs, **sharing: bool) -> AttentionVariant:
    """The factory: builds the attention module named by `cfg.attention` (`sharing`: a CLA
    layer's role, `lm.model.layout.sharing`; only for variants with `cross_layer_kv`)."""
    return variant(cfg)(cfg, rngs=rngs, **sharing)
