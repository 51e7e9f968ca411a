"""Attention variants, the contract they fulfil, and the registry the factory reads.

- 'mha', 'gqa', 'mqa': one grouped implementation, `GroupedQueryAttention`. MHA is G = H KV
  heads, MQA is G = 1. Query head i reads KV head i // R, R = H / G (contiguous groups, the
  Llama / Hugging Face order). K and V are never repeated per query head.
- 'mla': `MultiHeadLatentAttention`, DeepSeek-V2 §2.1 (low-rank joint KV compression with a
  decoupled, head-shared RoPE key).

Every variant subclasses `AttentionVariant` and is registered with `@register`; everything
outside this file (model, decoding, accounting, uptraining, sweeps, plots) asks the variant
class (`variant(cfg)`) what it can do, never compares `cfg.attention` with a name. A new
variant is one registered class. Shape letters: see the legend in lm/model.py.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from lm.config import ModelConfig
from lm.layers import Dense, RMSNorm, fused_dense, residual_scale, rope


def causal_mask(T: int, S: int | None = None) -> jax.Array:
    """[T, S] boolean, True where query t may attend key s (s <= t, aligned at the end)."""
    S = T if S is None else S
    return jnp.arange(S)[None, :] <= jnp.arange(T)[:, None] + (S - T)


def document_mask(segment_ids_BT: jax.Array) -> jax.Array:
    """[B, T, T] causal mask within documents: query t attends key s <= t of its own segment
    (segment_ids_BT: the document each position of a packed window belongs to)."""
    same_BTS = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    return same_BTS & causal_mask(segment_ids_BT.shape[1])[None]


def cache_mask(kv_valid_BS: jax.Array, slot: jax.Array, T: int) -> jax.Array:
    """[B, T, S] mask for T new queries written at cache slots slot..slot+T-1: a query attends
    valid slots at or before its own (kv_valid_BS marks filled, non-padding slots)."""
    S = kv_valid_BS.shape[1]
    causal_TS = jnp.arange(S)[None, :] <= slot + jnp.arange(T)[:, None]
    return kv_valid_BS[:, None, :] & causal_TS[None]


def write_cache(cache_BS_: jax.Array, new_BT_: jax.Array, slot: jax.Array) -> jax.Array:
    """Writes T new entries into a [B, S, ...] cache at slots slot..slot+T-1."""
    return jax.lax.dynamic_update_slice_in_dim(cache_BS_, new_BT_.astype(cache_BS_.dtype), slot, 1)


def grouped_attention(
    q_BTHD: jax.Array,
    k_BSGD: jax.Array,
    v_BSGU: jax.Array,
    *,
    scale: float,
    mask: jax.Array | None = None,
    impl: str = 'einsum',
) -> jax.Array:
    """Softmax attention where H query heads share G = k.shape[2] KV heads; returns [B, T, H, U].

    mask: broadcastable to [B, T, S], True = attend; None means causal. impl 'einsum' reshapes the
    queries to [B, T, G, R, D] so each KV head serves its R query heads without being repeated;
    'dot_product' calls `jax.nn.dot_product_attention` (cuDNN flash attention on GPU), which also
    takes fewer KV heads natively.
    """
    B, T, H, D = q_BTHD.shape
    G, U = k_BSGD.shape[2], v_BSGU.shape[3]
    if impl == 'dot_product':
        v_pad = jnp.pad(v_BSGU, ((0, 0), (0, 0), (0, 0), (0, D - U))) if U < D else v_BSGU
        out = jax.nn.dot_product_attention(
            q_BTHD,
            k_BSGD,
            v_pad,
            scale=scale,
            is_causal=mask is None,
            mask=None if mask is None else jnp.broadcast_to(mask, (B, T, k_BSGD.shape[1]))[:, None],
        )
        return out[..., :U]
    q_BTGRD = q_BTHD.reshape(B, T, G, H // G, D)
    # scores[b, g, r, t, s] = <q[b, t, g, r], k[b, s, g]>: one KV head per group of R queries.
    s_BGRTS = (
        jnp.einsum('BTGRD,BSGD->BGRTS', q_BTGRD, k_BSGD, preferred_element_type=jnp.float32) * scale
    )
    if mask is None:
        mask = causal_mask(T, k_BSGD.shape[1])
    mask_B11TS = jnp.broadcast_to(mask, (B, T, k_BSGD.shape[1]))[:, None, None]
    s_BGRTS = jnp.where(mask_B11TS, s_BGRTS, jnp.finfo(jnp.float32).min)
    p_BGRTS = jax.nn.softmax(s_BGRTS, axis=-1).astype(v_BSGU.dtype)
    # out[b, t, g, r] = sum_s p[b, g, r, t, s] · v[b, s, g]
    out_BTGRU = jnp.einsum('BGRTS,BSGU->BTGRU', p_BGRTS, v_BSGU)
    return out_BTGRU.reshape(B, T, H, U)


class AttentionVariant(nnx.Module):
    """The contract of an attention variant. Subclass it, set `names`, implement the methods
    that raise here, and decorate the class with `@register`.

    Model: `__init__(cfg, rngs=...)`, `__call__(x_BTE, positions_BT, segment_ids_BT=None) -> y_BTE`
    (segment ids given: attend only within a document, `document_mask`) and, for KV-cache
    decoding, `init_cache` plus `extend` (T new tokens written into the cache at `slot`).
    Static facts, read without building the module: `resolve` (check the variant's knobs and
    fill in derived ones), `kv_cache_elements` and `kv_heads` (what the cache holds: accounting,
    tables), `score_dims` (FLOP counts). Capabilities: `poolable_kv_heads` (uptraining may pool
    its K/V heads, lm/uptrain.py), `latent_kv` (a conversion target with a KV latent,
    lm/conversion.py) and `parse_spec` (short variant names such as 'gqa2').
    """

    names: ClassVar[tuple[str, ...]] = ()  # the `config.model.attention` values it implements
    poolable_kv_heads: ClassVar[bool] = False  # has K/V heads that can be merged (uptraining)
    latent_kv: ClassVar[bool] = False  # K/V from a shared latent + RoPE key (lm/conversion.py)

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        """Checks the variant's knobs (one-line ValueError) and fills in the derived ones."""
        raise NotImplementedError

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        """Cached elements per token per layer."""
        raise NotImplementedError

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        """What the cache holds per token and layer, for tables and HParams ('2' K/V heads,
        'latent 128+16')."""
        raise NotImplementedError

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        """(q·k width, value width) per query head, for FLOP counts."""
        raise NotImplementedError

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> dict[str, jax.Array]:
        """Per-layer decoding cache: arrays of shape [B, S, ...]."""
        raise NotImplementedError

    @classmethod
    def parse_spec(cls, spec: str) -> dict[str, Any] | None:
        """`config.model` settings for a short variant name ('mla'), None if not this variant's."""
        return {'attention': spec} if spec in cls.names else None

    @classmethod
    def pooled(cls, num_kv_heads: int) -> dict[str, Any]:
        """`config.model` settings of this variant pooled to `num_kv_heads` K/V heads (only when
        `poolable_kv_heads`)."""
        raise NotImplementedError

    def __call__(
        self, x_BTE: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array | None = None
    ) -> jax.Array:
        raise NotImplementedError

    def extend(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        cache: dict,
        slot: jax.Array,
        kv_valid_BS: jax.Array,
        absorb: bool = True,
    ) -> tuple[jax.Array, dict]:
        """Attention for T new tokens written into the cache at slots slot..slot+T-1; queries
        attend valid slots (`kv_valid_BS`) at or before their own. `absorb` is a hint a variant
        may ignore (MLA: weight absorption)."""
        raise NotImplementedError


VARIANTS: dict[str, type[AttentionVariant]] = {}  # config.model.attention -> class


def register(cls: type[AttentionVariant]) -> type[AttentionVariant]:
    """Class decorator: makes `cls` the implementation of each of its `names`."""
    for name in cls.names:
        if name in VARIANTS and VARIANTS[name] is not cls:
            raise ValueError(f'attention variant {name!r} is already registered')
        VARIANTS[name] = cls
    return cls


def unregister(cls: type[AttentionVariant]) -> None:
    """Removes `cls`'s names from the registry (tests register toy variants)."""
    for name in cls.names:
        if VARIANTS.get(name) is cls:
            del VARIANTS[name]


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
        the einsum path's scores and softmax, for head analysis (lm/analysis.py)."""
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
        for name in ('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'):
            if getattr(cfg, name) <= 0:
                raise ValueError(
                    f"config.model.{name} must be > 0 for attention='mla', got {getattr(cfg, name)}"
                )
        if cfg.q_lora_rank < 0:
            raise ValueError(
                f'config.model.q_lora_rank must be >= 0 (0 = direct queries), got {cfg.q_lora_rank}'
            )
        if cfg.qk_rope_head_dim % 2:
            raise ValueError(
                f'config.model.qk_rope_head_dim={cfg.qk_rope_head_dim} must be even for RoPE'
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
        return cfg.kv_lora_rank + cfg.qk_rope_head_dim

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        return f'latent {cfg.kv_lora_rank}+{cfg.qk_rope_head_dim}'

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, H, C = cfg.d_model, cfg.num_heads, cfg.kv_lora_rank
        Dn, Dr, Dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if cfg.q_lora_rank:
            Cq = cfg.q_lora_rank
            self.q_a_proj = Dense((E,), (Cq,), ('embed', 'q_lora'), cfg, rngs=rngs)
            self.q_a_layernorm = RMSNorm(Cq, cfg, cfg.latent_norm_eps)
            self.q_b_proj = Dense(
                (Cq,), (H, Dn + Dr), ('q_lora', 'heads', 'head_dim'), cfg, rngs=rngs
            )
        else:
            self.q_proj = Dense((E,), (H, Dn + Dr), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs)
        # W_DKV and W_KR in one matrix, as DeepSeek stores them: [E, C + Dr].
        self.kv_a_proj_with_mqa = Dense((E,), (C + Dr,), ('embed', 'kv_lora'), cfg, rngs=rngs)
        self.kv_a_layernorm = RMSNorm(C, cfg, cfg.latent_norm_eps)
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
        if cfg.q_lora_rank:
            q_BTHD = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_BTE)))
        else:
            q_BTHD = self.q_proj(x_BTE)
        q_nope, q_pe = jnp.split(q_BTHD, [cfg.qk_nope_head_dim], axis=-1)
        return q_nope, rope(q_pe, positions_BT, cfg.rope_theta, cfg)

    def latents(self, x_BTE: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
        """What a KV cache holds: (c_KV [B, T, C], RoPE'd shared key k_R [B, T, Dr])."""
        cfg = self.cfg
        c_BTC, k_pe_BTP = jnp.split(self.kv_a_proj_with_mqa(x_BTE), [cfg.kv_lora_rank], axis=-1)
        return self.kv_a_layernorm(c_BTC), rope(k_pe_BTP, positions_BT, cfg.rope_theta, cfg)

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> dict[str, jax.Array]:
        """Per-layer decoding cache: the latent c_KV [B, S, C] and shared RoPE key [B, S, Dr]."""
        return {
            'c': jnp.zeros((batch, length, cfg.kv_lora_rank), dtype),
            'k_pe': jnp.zeros((batch, length, cfg.qk_rope_head_dim), dtype),
        }

    def _expanded(self, q_nope, q_pe, c_BSC, k_pe_BSP, mask) -> jax.Array:
        """Attention with per-head K and V materialised from the latent (training, prefill)."""
        cfg = self.cfg
        H = cfg.num_heads
        k_nope, v_BSHU = jnp.split(self.kv_b_proj(c_BSC), [cfg.qk_nope_head_dim], axis=-1)
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
            self.kv_b_proj.kernel[...].astype(dtype), [cfg.qk_nope_head_dim], axis=-1
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
        analysis (lm/analysis.py)."""
        cfg = self.cfg
        q_nope, q_pe = self.queries(x_BTE, positions_BT)
        c_BSC, k_pe_BSR = self.latents(x_BTE, positions_BT)
        k_nope = jnp.split(self.kv_b_proj(c_BSC), [cfg.qk_nope_head_dim], axis=-1)[0]
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
        return (self.cfg.qk_nope_head_dim + self.cfg.qk_rope_head_dim) ** -0.5

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


def variant(cfg: ModelConfig) -> type[AttentionVariant]:
    """The attention class named by `cfg.attention`."""
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


def resolve(cfg: ModelConfig) -> ModelConfig:
    """Checks the variant's knobs and fills in the derived ones (num_kv_heads, head_dim)."""
    return variant(cfg).resolve(cfg)


def make_attention(cfg: ModelConfig, *, rngs: nnx.Rngs) -> AttentionVariant:
    """The factory: builds the attention module named by `cfg.attention`."""
    return variant(cfg)(cfg, rngs=rngs)
