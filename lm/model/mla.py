"""Multi-head latent attention (DeepSeek-V2 §2.1), registered as 'mla' for the factory in
lm/model/attention.py. Shape letters: see the legend in lm/model/transformer.py."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from lm.model.config import ModelConfig
from lm.model.hf_mapping import DEEPSEEK_V3
from lm.model.layers import Dense, RMSNorm, residual_scale, rope
from lm.model.variant import AttentionVariant, KVCache, register


@dataclasses.dataclass(frozen=True)
class MLAConfig:
    """MLA's own section, `config.model.mla` (each key's meaning: configs/base.py)."""

    kv_lora_rank: int  # C, the rank of the KV latent c_KV
    q_lora_rank: int  # rank of the query latent c_Q; 0 = queries straight from h
    qk_nope_head_dim: int  # N, per-head query/key width without RoPE
    qk_rope_head_dim: int  # P, the decoupled RoPE width of each RoPE key
    rope_heads: int  # R_K, RoPE keys per token: 1 = DeepSeek's one key shared by every head
    v_head_dim: int  # U, per-head value width
    latent_norm_eps: float  # eps of the latent RMSNorms; 0 = config.model.norm_eps


def rope_slots(q_pe_BTHP: jax.Array, rope_heads: int) -> jax.Array:
    """[B, T, H, R_K·P]: query head h's RoPE part in slot h // (H / R_K) and zeros in the
    others, so that its dot with the R_K keys [k_1; ...; k_R_K] is its own key's score (the
    zeros cost R_K - 1 extra P-wide products per head and key in the absorbed scores)."""
    B, T, H, P = q_pe_BTHP.shape
    slot_HR = jax.nn.one_hot(jnp.arange(H) // (H // rope_heads), rope_heads, dtype=q_pe_BTHP.dtype)
    return jnp.einsum('BTHP,HR->BTHRP', q_pe_BTHP, slot_HR).reshape(B, T, H, rope_heads * P)


@register
class MultiHeadLatentAttention(AttentionVariant):
    """DeepSeek-V2 MLA (§2.1), with DeepSeek's parameter names.

    c_KV = RMSNorm(W_DKV h) of rank C = kv_lora_rank is all a cache would keep, together with the
    RoPE key k_R = RoPE(W_KR h), one per token shared by every head. (With rope_heads R_K > 1:
    R_K RoPE keys per token, query head h reading key h // (H / R_K), as MHA2MLA gives each KV
    head of a converted model its own, arXiv 2502.14837; the cache holds C + R_K·P per token.)
    Per-head keys and values are up-projections of c_KV: k_C = W_UK c_KV, v = W_UV c_KV.
    Queries come from h directly (q_lora_rank = 0) or through a normalised latent c_Q of rank
    q_lora_rank; each head's query is [q_C; RoPE(q_R)]. Softmax scale
    1 / sqrt(qk_nope_head_dim + qk_rope_head_dim). The cache holds no per-head K/V:
    `num_kv_heads` resolves to 0 and tables show the latent.
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
        if mla.rope_heads < 1 or cfg.num_heads % mla.rope_heads:
            raise ValueError(
                f'config.model.mla.rope_heads={mla.rope_heads} must be >= 1 and divide '
                f'config.model.num_heads={cfg.num_heads}'
            )
        if not (math.isfinite(mla.latent_norm_eps) and mla.latent_norm_eps >= 0):
            raise ValueError(
                'config.model.mla.latent_norm_eps must be >= 0 (0 = norm_eps), '
                f'got {mla.latent_norm_eps}'
            )
        if cfg.qkv_bias or cfg.o_bias:  # else silently without them
            raise ValueError(
                "config.model.qkv_bias / o_bias apply to mha / gqa / mqa; attention='mla' "
                'has no biases on its projections: leave them False'
            )
        if cfg.num_kv_heads not in (0, cfg.num_heads):
            raise ValueError(
                f'config.model.num_kv_heads={cfg.num_kv_heads} does not apply to '
                "attention='mla' (every head has its own K/V); leave it 0"
            )
        return dataclasses.replace(cfg, num_kv_heads=0)

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        """Cached elements per token per layer: the latent and the RoPE keys, d_c + R_K·d_h^R."""
        return cfg.section.kv_lora_rank + cfg.section.rope_heads * cfg.section.qk_rope_head_dim

    @staticmethod
    def kv_cache_vectors(cfg: ModelConfig) -> int:
        """One [c_KV; k_R] latent per token."""
        return 1

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        mla = cfg.section
        keys = f'{mla.rope_heads}x' if mla.rope_heads > 1 else ''
        return f'latent {mla.kv_lora_rank}+{keys}{mla.qk_rope_head_dim}'

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
        # W_DKV and W_KR in one matrix, as DeepSeek stores them: [E, C + R_K·Dr] (key r's
        # columns C + r·Dr onwards).
        self.kv_a_proj_with_mqa = Dense(
            (E,), (C + mla.rope_heads * Dr,), ('embed', 'kv_lora'), cfg, rngs=rngs
        )
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
        """(q_C [B, T, H, N], RoPE'd q_R [B, T, H, P])."""
        cfg = self.cfg
        if cfg.section.q_lora_rank:
            q_BTHD = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_BTE)))
        else:
            q_BTHD = self.q_proj(x_BTE)
        q_nope_BTHN, q_pe_BTHP = jnp.split(q_BTHD, [cfg.section.qk_nope_head_dim], axis=-1)
        return q_nope_BTHN, rope(q_pe_BTHP, positions_BT, cfg.rope_theta, cfg)

    def latents(self, x_BTE: jax.Array, positions_BT: jax.Array) -> jax.Array:
        """What a KV cache holds per token: [c_KV; RoPE'd keys k_R], [B, T, C + R_K·P]."""
        cfg = self.cfg
        c_BTC, k_pe_BTX = jnp.split(
            self.kv_a_proj_with_mqa(x_BTE), [cfg.section.kv_lora_rank], axis=-1
        )
        k_pe_BTRP = k_pe_BTX.reshape(*k_pe_BTX.shape[:2], cfg.section.rope_heads, -1)
        k_pe_BTX = rope(k_pe_BTRP, positions_BT, cfg.rope_theta, cfg).reshape(k_pe_BTX.shape)
        return jnp.concatenate([self.kv_a_layernorm(c_BTC), k_pe_BTX.astype(c_BTC.dtype)], axis=-1)

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> KVCache:
        """Per-layer decoding cache: each token's `latents`, [c_KV; k_R] [B, S, C + R_K·P]. No
        array is named `per_channel`: the latent serves as keys and values alike (absorbed),
        and a 'kivi4' cache quantizes it per token, like KIVI's values (KIVI covers per-head
        K/V only)."""
        width = MultiHeadLatentAttention.kv_cache_elements(cfg)
        return KVCache.empty(latent=jnp.zeros((batch, length, width), dtype))

    def latent_attention(
        self,
        q_nope_BTHN: jax.Array,
        q_pe_BTHP: jax.Array,
        latent_BSD: jax.Array,
        mask: jax.Array | None,
        absorb: bool,
        filled: jax.Array | None = None,
    ) -> jax.Array:
        """Attention of the queries over the `latents` [c_KV; k_R] of S keys (D = C + R_K·P
        here): [B, T, H, U] before o_proj.

        absorb=False materialises per-head keys [W_UK c_KV; k_R] and values W_UV c_KV (training,
        the naive decode). absorb=True is DeepSeek-V2 §2.1.2's weight absorption: W_UK moves
        into the query and W_UV after the attention, so every head attends the latent itself as
        one shared K/V head (G = 1): <[W_UKᵀ q_C; q_R], [c_KV; k_R]> is the same score (with
        R_K > 1, q_R in its key's slot of R_K·P, zeros elsewhere: `rope_slots`)."""
        cfg = self.cfg
        C, N, R = cfg.section.kv_lora_rank, cfg.section.qk_nope_head_dim, cfg.section.rope_heads
        if absorb:
            w_uk_CHN, w_uv_CHU = jnp.split(
                self.kv_b_proj.kernel[...].astype(q_nope_BTHN.dtype), [N], axis=-1
            )
            q_lat_BTHC = jnp.einsum('BTHN,CHN->BTHC', q_nope_BTHN, w_uk_CHN)  # W_UKᵀ q_C per head
            q_pe_BTHX = rope_slots(q_pe_BTHP, R) if R > 1 else q_pe_BTHP  # X = R_K·P
            q_BTHD = jnp.concatenate([q_lat_BTHC, q_pe_BTHX], axis=-1)
            # The latent is the one K/V head; its values: its first C columns, c_KV (the fused
            # decode kernel reads each latent tile once for both). einsum: a head width of
            # C + P is past what cuDNN's fused kernel takes.
            out_BTHC = self.attend(
                q_BTHD,
                latent_BSD,
                None,
                scale=self.scale,
                mask=mask,
                impl='einsum',
                filled=filled,
                value_width=C,
            )
            return jnp.einsum('BTHC,CHU->BTHU', out_BTHC, w_uv_CHU)  # W_UV after
        c_BSC, k_pe_BSX = jnp.split(latent_BSD, [C], axis=-1)
        kv_BHSD = self.kv_b_proj(c_BSC).transpose(0, 2, 1, 3)  # head-major for the kernel
        k_nope_BHSN, v_BHSU = jnp.split(kv_BHSD, [N], axis=-1)
        # [k_C; k_R] with RoPE key r broadcast to its H / R_K heads.
        B, H, S = k_nope_BHSN.shape[:3]
        k_pe_BRSP = k_pe_BSX.reshape(B, S, R, -1).transpose(0, 2, 1, 3)
        k_pe_BHSP = jnp.repeat(k_pe_BRSP, H // R, axis=1, total_repeat_length=H)
        q_BTHD = jnp.concatenate([q_nope_BTHN, q_pe_BTHP], axis=-1)
        k_BHSD = jnp.concatenate([k_nope_BHSN, k_pe_BHSP.astype(k_nope_BHSN.dtype)], axis=-1)
        return self.attend(q_BTHD, k_BHSD, v_BHSU, scale=self.scale, mask=mask, filled=filled)

    @property
    def scale(self) -> float:
        return (self.cfg.section.qk_nope_head_dim + self.cfg.section.qk_rope_head_dim) ** -0.5

    def __call__(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Expanded without a cache; with one (which holds only the `latents`), absorbed unless
        `absorb` is False."""
        q_nope_BTHN, q_pe_BTHP = self.queries(x_BTE, positions_BT)
        latent_BSD = self.latents(x_BTE, positions_BT)
        mask = self.mask(x_BTE.shape[1], segment_ids_BT)
        if cache is not None:  # S = the cache's slots instead of the T new tokens
            cache, seen, mask = cache.write(latent=latent_BSD)
            latent_BSD = seen['latent'].astype(q_nope_BTHN.dtype)
        absorb = self.absorb and cache is not None
        filled = None if cache is None else cache.filled
        out_BTHU = self.latent_attention(
            q_nope_BTHN, q_pe_BTHP, latent_BSD, mask, absorb, filled=filled
        )
        return self.o_proj(out_BTHU), cache

    config_section = 'mla'
    config_class = MLAConfig
    hf_mappings = (DEEPSEEK_V3,)
