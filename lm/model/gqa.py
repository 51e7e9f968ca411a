"""Multi-head, grouped-query and multi-query attention ('mha', 'gqa', 'mqa'): one grouped
implementation, registered for the factory in lm/model/attention.py. MHA is G = H KV heads, MQA
is G = 1. Query head i reads KV head i // R, R = H / G (contiguous groups, the Llama / Hugging
Face order). K and V are never repeated per query head. Shape letters: see the legend in
lm/model/transformer.py."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lm.model import layout
from lm.model.config import ModelConfig
from lm.model.hf_mapping import LLAMA, QWEN2
from lm.model.kv_cache import cache_mask
from lm.model.layers import Dense, fused_dense, residual_scale, rope
from lm.model.variant import AttentionVariant, KVCache, document_mask, register


@register
class GroupedQueryAttention(AttentionVariant):
    """MHA / GQA / MQA: H query heads, G = num_kv_heads K/V heads, RoPE on q and k."""

    names = ('mha', 'gqa', 'mqa')
    poolable_kv_heads = True
    cross_layer_kv = True
    fused_groups = (('q_proj', 'k_proj', 'v_proj'),)  # read the same input: `fused_dense`

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        H, g = cfg.num_heads, cfg.num_kv_heads
        implied = {'mha': H, 'mqa': 1}.get(cfg.attention)
        per_layer = cfg.kv_heads_per_layer
        if per_layer and implied is not None and set(per_layer) != {implied}:
            raise ValueError(
                f'config.model.kv_heads_per_layer={per_layer} contradicts attention='
                f"'{cfg.attention}' (which means {implied} in every layer); use attention='gqa'"
            )
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
    def kv_cache_vectors(cfg: ModelConfig) -> int:
        """K and V of each KV head."""
        return 2 * cfg.num_kv_heads

    @staticmethod
    def kv_cache_per_channel(cfg: ModelConfig) -> tuple[int, int]:
        """The keys, K of each KV head (KIVI quantizes keys per channel, values per token)."""
        return cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        return layout.describe(cfg, str(cfg.num_kv_heads))

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        return cfg.head_dim, cfg.head_dim

    @classmethod
    def parse_spec(cls, spec: str) -> dict[str, Any] | None:
        """'mha', 'mqa', or 'gqa<G>' ('gqa2': two K/V heads)."""
        if match := re.fullmatch(r'gqa([1-9]\d*)', spec):  # 'gqa0' is no variant
            return {'attention': 'gqa', 'num_kv_heads': int(match.group(1))}
        return {'attention': spec, 'num_kv_heads': 0} if spec in ('mha', 'mqa') else None

    @classmethod
    def pooled(cls, num_kv_heads: int) -> dict[str, Any]:
        return {'attention': 'mqa' if num_kv_heads == 1 else 'gqa', 'num_kv_heads': num_kv_heads}

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        kv_from_below: bool = False,
        kv_to_above: bool = False,
    ):
        E, H, G, D = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.qkv_bias
        self.q_proj = Dense(
            (E,), (H, D), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs, use_bias=bias
        )
        # A CLA consumer (kv_from_below) has no K/V projections: it reads the layer below's.
        self.k_proj, self.v_proj = (
            (None, None)
            if kv_from_below
            else [
                Dense(
                    (E,), (G, D), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs, use_bias=bias
                )
                for _ in range(2)
            ]
        )
        self.kv_to_above = kv_to_above
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
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> KVCache:
        """Per-layer decoding cache: K and V for each KV head, head-major [B, G, S, D] each.
        K holds the keys (`per_channel`)."""
        shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
        k, v = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
        return KVCache.empty(per_channel=('k',), k=k, v=v)

    def _projections(self, x_BTE: jax.Array) -> list[jax.Array]:
        """q [B, T, H, D], k and v [B, T, G, D] before RoPE, in one fused matmul."""
        return fused_dense(x_BTE, self, ('q_proj', 'k_proj', 'v_proj'))

    def kv_projections(self, x_BTE: jax.Array) -> tuple[jax.Array, jax.Array]:
        _, k_BTGD, v_BTGD = self._projections(x_BTE)
        return k_BTGD, v_BTGD

    def __call__(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        cfg = self.cfg
        if self.k_proj is None:
            return self._attend_below(x_BTE, positions_BT, segment_ids_BT, cache), None
        q_BTHD, k_BTGD, v_BTGD = self._projections(x_BTE)
        q_BTHD = rope(q_BTHD, positions_BT, cfg.rope_theta, cfg)
        k_BTGD = rope(k_BTGD, positions_BT, cfg.rope_theta, cfg)
        k_BGSD, v_BGSD = k_BTGD.transpose(0, 2, 1, 3), v_BTGD.transpose(0, 2, 1, 3)  # head-major
        mask = self.mask(x_BTE.shape[1], segment_ids_BT)
        filled = None  # with a decoding cache: `KVCache.filled`
        if cache is not None:  # S = the cache's slots instead of the T new tokens
            cache, seen, mask = cache.write(k=k_BGSD, v=v_BGSD)
            k_BGSD, v_BGSD = (seen[n].astype(q_BTHD.dtype) for n in ('k', 'v'))
            filled = cache.filled
        elif self.kv_to_above:  # the K/V the layers above read, as a cache of these T tokens
            T, pad_B = k_BGSD.shape[2], jnp.zeros(k_BGSD.shape[:1], jnp.int32)
            cache = KVCache({'k': k_BGSD, 'v': v_BGSD}, jnp.int32(T), pad_B, length=T)
        out_BTHD = self.attend(
            q_BTHD, k_BGSD, v_BGSD, scale=cfg.head_dim**-0.5, mask=mask, filled=filled
        )
        return self.o_proj(out_BTHD), cache

    def _attend_below(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        segment_ids_BT: jax.Array | None,
        below: KVCache,
    ) -> jax.Array:
        """A CLA consumer: its queries attend `below`, the K/V its producer returned (its
        updated full-length float cache, the T new tokens last written: layout.resolve and
        init_caches refuse windows and int8 with CLA), through the producer's mask."""
        cfg = self.cfg
        q_BTHD = rope(self.q_proj(x_BTE), positions_BT, cfg.rope_theta, cfg)
        k_BGSD, v_BGSD = (below.read(n, q_BTHD.dtype) for n in ('k', 'v'))
        T, S = x_BTE.shape[1], k_BGSD.shape[-2]
        if segment_ids_BT is not None:
            mask = document_mask(segment_ids_BT)
        else:
            mask = cache_mask(jnp.arange(S), below.pad_B, below.slot - T, T)
        # a decoding cache has more slots than new tokens; training's K/V are these T tokens
        filled = below.filled if S != T else None
        out_BTHD = self.attend(
            q_BTHD, k_BGSD, v_BGSD, scale=cfg.head_dim**-0.5, mask=mask, filled=filled
        )
        return self.o_proj(out_BTHD)

    hf_mappings = (LLAMA, QWEN2)
