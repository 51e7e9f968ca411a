"""The attention-variant contract (`AttentionVariant`), the registry the factory in
lm/model/attention.py reads (`VARIANTS`, `register`), and the pieces every variant shares: masks,
the KV cache (`KVCache`), the grouped attention kernel and the weights analysis reads
(`AttentionWeights`). Shape letters: see the legend in lm/model/transformer.py.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from lm.model.chunked import chunked_attention
from lm.model.config import ModelConfig
from lm.model.flash_decode import flash_decode, unserved
from lm.model.hf_mapping import HFMapping
from lm.model.kv_cache import KVCache


@functools.cache
def _fall_back(message: str) -> None:
    """Logs `message` once per process (a decode step traces each layer's attention)."""
    logging.warning(message)


def causal_mask(T: int, S: int | None = None) -> jax.Array:
    """[T, S] boolean, True where query t may attend key s (s <= t, aligned at the end)."""
    S = T if S is None else S
    return jnp.arange(S)[None, :] <= jnp.arange(T)[:, None] + (S - T)


def document_mask(segment_ids_BT: jax.Array) -> jax.Array:
    """[B, T, T] causal mask within documents: query t attends key s <= t of its own segment
    (segment_ids_BT: the document each position of a packed window belongs to)."""
    same_BTS = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    return same_BTS & causal_mask(segment_ids_BT.shape[1])[None]


def window_mask(T: int, window: int) -> jax.Array:
    """[T, T] causal sliding-window mask: query t attends key s with 0 <= t - s < window
    (transformers' Mistral / Gemma convention: the window counts the query itself)."""
    diff_TT = jnp.arange(T)[:, None] - jnp.arange(T)[None, :]
    return (diff_TT >= 0) & (diff_TT < window)


def grouped_attention(
    q_BTHD: jax.Array,
    k_BGSD: jax.Array,
    v_BGSU: jax.Array,
    *,
    scale: float,
    mask: jax.Array | None = None,
    impl: str = 'einsum',
) -> tuple[jax.Array, jax.Array | None]:
    """Softmax attention where H query heads share G = k.shape[1] KV heads: (output
    [B, T, H, U], weights [B, H, T, S] in float32, or None where `impl` does not form them).

    Keys and values are head-major, [B, G, S, D], the layout of the decoding cache: each KV
    head's S slots are contiguous, so one new token's attention streams the cache once (with
    [B, S, G, D], XLA on CPU transposed the whole cache every step). mask: broadcastable to
    [B, T, S], True = attend; None means causal. impl 'einsum' reshapes the queries to
    [B, T, G, R, D] so each KV head serves its R query heads without being repeated (query head
    h = g·R + r); 'dot_product' calls `jax.nn.dot_product_attention` with XLA's implementation
    (JAX picks it for implementation=None, on GPU too) and 'cudnn' asks it for cuDNN's fused
    flash attention (GPU, bfloat16/float16); both take [B, S, G, D] (a transpose here) and fewer
    KV heads natively.
    """
    B, T, H, D = q_BTHD.shape
    G, S, U = k_BGSD.shape[1], k_BGSD.shape[2], v_BGSU.shape[3]
    if impl in ('dot_product', 'cudnn'):
        v_pad = jnp.pad(v_BGSU, ((0, 0), (0, 0), (0, 0), (0, D - U))) if U < D else v_BGSU
        out = jax.nn.dot_product_attention(
            q_BTHD,
            k_BGSD.transpose(0, 2, 1, 3),
            v_pad.transpose(0, 2, 1, 3),
            scale=scale,
            is_causal=mask is None,
            mask=None if mask is None else jnp.broadcast_to(mask, (B, T, S))[:, None],
            implementation='cudnn' if impl == 'cudnn' else None,
        )
        return out[..., :U], None
    q_BGRTD = q_BTHD.reshape(B, T, G, H // G, D).transpose(0, 2, 3, 1, 4)
    # scores[b, g, s, r, t] = <k[b, g, s], q[b, t, g, r]>: one KV head per group of R queries,
    # the cache the matmul's row-major left operand (no transposed copy of it on CPU).
    s_BGSRT = jnp.einsum('BGSD,BGRTD->BGSRT', k_BGSD, q_BGRTD, preferred_element_type=jnp.float32)
    # softmax over the contiguous last axis (XLA on CPU reduces a strided axis ~7× slower)
    s_BGRTS = s_BGSRT.transpose(0, 1, 3, 4, 2) * scale
    if mask is None:
        mask = causal_mask(T, S)
    mask_B11TS = jnp.broadcast_to(mask, (B, T, S))[:, None, None]
    s_BGRTS = jnp.where(mask_B11TS, s_BGRTS, jnp.finfo(jnp.float32).min)
    # softmax with the normalisation after the value sum: one pass less over the scores
    e_BGRTS = jnp.exp(s_BGRTS - jax.lax.stop_gradient(s_BGRTS.max(axis=-1, keepdims=True)))
    sum_BGRT1 = e_BGRTS.sum(axis=-1, keepdims=True)
    # out[b, g, r, t] = sum_s e[b, g, r, t, s] · v[b, g, s] / sum_s e[b, g, r, t, s]
    out_BGRTU = jnp.einsum('BGRTS,BGSU->BGRTU', e_BGRTS.astype(v_BGSU.dtype), v_BGSU) / sum_BGRT1
    out_BTHU = out_BGRTU.astype(v_BGSU.dtype).transpose(0, 3, 1, 2, 4).reshape(B, T, H, U)
    return out_BTHU, (e_BGRTS / sum_BGRT1).reshape(B, H, T, S)


class AttentionWeights(nnx.Intermediate):
    """What a variant sows when `sow_weights` is set: its attention weights [B, H, T, S]."""


class AttentionVariant(nnx.Module):
    """The contract of an attention variant. Subclass it, set `names`, implement the methods
    that raise here, and decorate the class with `@register` (which refuses a class that lacks
    one: `missing_members`).

    Model: `__init__(cfg, rngs=...)` (keeping the ModelConfig as `self.cfg`) and one
    computation, `__call__(x_BTE, positions_BT, *, segment_ids_BT=None, cache=None) -> (y_BTE,
    cache)`, for training, prefill, cached decoding and analysis alike. Segment ids given (no
    cache): attend only within a document (`document_mask`); a local layer (`window` > 0, set by
    the model) also attends only the last `window` keys: `mask` builds either. A `KVCache`
    given (`init_cache` makes one): the T new tokens are written at its slot and attend what
    `KVCache.write` returns (arrays and mask: the cache may be a ring or int8, the variant
    never sees which); the updated cache is returned (None without one). The softmax goes
    through `attend`, which sows the weights as `AttentionWeights` when `sow_weights` is set
    (lm/analysis reads them with `nnx.capture`). Static facts, read without building the
    module: `resolve` (check the variant's knobs and fill in derived ones), `kv_cache_elements`,
    `kv_cache_vectors`, `kv_cache_per_channel` and `kv_heads` (what the cache holds:
    accounting, tables), `score_dims` (FLOP counts).
    Capabilities:
    `poolable_kv_heads` (per-head K/V projections, `kv_projections`, that uptraining may pool,
    lm/convert/uptrain.py), `latent_kv` (a conversion target with a KV latent,
    lm/convert/methods.py), `cross_layer_kv` (cross-layer attention, lm/model/layout.py: the
    constructor takes `kv_from_below`, a layer without K/V projections whose `cache` argument
    is the K/V of the layer below, and `kv_to_above`, a layer that returns its K/V as a
    `KVCache` even without a cache) and `parse_spec` (short variant names such as 'gqa2').
    Decode knob: `absorb`, which a variant without a cheaper cached path ignores.
    """

    names: ClassVar[tuple[str, ...]] = ()  # the `config.model.attention` values it implements
    poolable_kv_heads: ClassVar[bool] = False  # has K/V heads that can be merged (uptraining)
    latent_kv: ClassVar[bool] = False  # K/V from a shared latent + RoPE key (lm/convert/options.py)
    cross_layer_kv: ClassVar[bool] = False  # layers may reuse the K/V of the layer below
    sow_weights: bool = False  # set on a model copy (`set_attributes`) to sow AttentionWeights
    window: int = 0  # sliding window W of a local layer (set by the model); 0 = global
    # With a cache: decode by the variant's cheaper equivalent computation (MLA: weight
    # absorption); False: the computation training uses (a reference). Set with `set_absorb`.
    absorb: bool = True

    def mask(self, T: int, segment_ids_BT: jax.Array | None) -> jax.Array | None:
        """The training / analysis mask of T tokens (no cache): None (causal), within documents
        (`document_mask`, [B, T, T]), and within this layer's `window` (`window_mask`)."""
        mask = None if segment_ids_BT is None else document_mask(segment_ids_BT)
        if not self.window:
            return mask
        local_TT = window_mask(T, self.window)
        return local_TT if mask is None else mask & local_TT[None]

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        """Checks the variant's knobs (one-line ValueError) and fills in the derived ones."""
        raise NotImplementedError

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        """Cached elements per token per layer."""
        raise NotImplementedError

    @staticmethod
    def kv_cache_vectors(cfg: ModelConfig) -> int:
        """Cached vectors per token per layer (an int8 cache keeps one scale for each)."""
        raise NotImplementedError

    @staticmethod
    def kv_cache_per_channel(cfg: ModelConfig) -> tuple[int, int]:
        """(elements, vectors) per token per layer of the cached keys, the arrays `init_cache`
        names `per_channel` (a 'kivi4' cache quantizes them per channel, the others per
        token, lm/model/kv_kivi.py); (0, 0): none."""
        return 0, 0

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
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> KVCache:
        """Per-layer decoding cache (`KVCache.empty` of arrays [B, ..., S, X], head-major)."""
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
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        raise NotImplementedError

    def kv_projections(self, x_BTE: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per-KV-head keys and values before RoPE, [B, T, G, D] each, as `__call__` computes
        them (only when `poolable_kv_heads`)."""
        raise NotImplementedError

    def attend(
        self,
        q_BTHD: jax.Array,
        k_BGSD: jax.Array,
        v_BGSU: jax.Array | None,
        *,
        scale: float,
        mask: jax.Array | None,
        impl: str | None = None,
        filled: jax.Array | None = None,
        value_width: int | None = None,
    ) -> jax.Array:
        """`grouped_attention` (keys and values head-major, [B, G, S, D], or [B, S, D] for one
        KV head) with `impl` (default: config.model.attention_impl), sowing its weights when
        `sow_weights` is set (on the einsum path, the one that forms them). v_BGSU None: the
        values are the keys' first `value_width` columns (absorbed MLA's latent), [B, T, H,
        value_width] out. filled: with a full cache, the slots written so far (`KVCache.filled`;
        None for a ring, attended whole); then a decode step's one query attends in one fused
        kernel when config.model.decode_kernel is 'pallas' (`flash_decode`; a cache it cannot
        tile attends with XLA, said once in a log line), and otherwise einsum attention reads
        only the filled slots, config.model.decode_chunk at a time (`chunked_attention`), unless
        decode_chunk is 0."""
        impl = 'einsum' if self.sow_weights else impl or self.cfg.attention_impl
        chunk, kernel = self.cfg.decode_chunk, self.cfg.decode_kernel
        S = k_BGSD.shape[-2]
        decode = filled is not None and q_BTHD.shape[1] == 1 and not self.sow_weights
        if decode and kernel != 'xla':
            if reason := unserved(S):
                _fall_back(f'{type(self).__name__}: {reason}; this variant decodes with XLA')
            else:
                return flash_decode(
                    q_BTHD,
                    k_BGSD,
                    v_BGSU,
                    mask,
                    scale=scale,
                    filled=filled,
                    value_width=value_width,
                    interpret=kernel == 'pallas_interpret',
                )
        U = value_width
        if v_BGSU is None:  # the keys serve as values: attend, then keep the first U columns
            v_BGSU = k_BGSD
        if filled is not None and 0 < chunk < S and impl == 'einsum' and not self.sow_weights:
            out_BTHU = chunked_attention(
                q_BTHD, k_BGSD, v_BGSU, mask, scale=scale, filled=filled, chunk=chunk
            )
            return out_BTHU if U is None else out_BTHU[..., :U]
        if k_BGSD.ndim == 3:  # one shared KV head as [B, S, D] (absorbed MLA's latent)
            k_BGSD, v_BGSU = k_BGSD[:, None], v_BGSU[:, None]
        out_BTHU, p_BHTS = grouped_attention(
            q_BTHD, k_BGSD, v_BGSU, scale=scale, mask=mask, impl=impl
        )
        if self.sow_weights:
            self.sow(AttentionWeights, 'weights', p_BHTS)
        return out_BTHU if U is None else out_BTHU[..., :U]

    # What the variant owns besides its computation: its config section and its HF mapping.
    config_section: ClassVar[str] = ''  # its own `config.model.<config_section>` ('' = none)
    config_class: ClassVar[type | None] = None  # frozen dataclass of that section's keys
    hf_mappings: ClassVar[tuple[HFMapping, ...]] = ()  # HF architectures (export: the first)

    @classmethod
    def read_section(cls, model: Mapping) -> Any:
        """`config.model.<config_section>` as a `config_class` (None for a variant without a
        section); one-line ValueError for a missing section or unknown or missing keys. Its
        values are checked by `resolve`."""
        if cls.config_class is None:
            return None
        where = f'config.model.{cls.config_section}'
        if cls.config_section not in model:
            raise ValueError(f'{where} is missing (attention={model["attention"]!r} reads it)')
        section = model[cls.config_section]
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        if unknown := sorted(set(section.keys()) - fields):
            raise ValueError(f'{where} has unknown key(s) {unknown}; known keys: {sorted(fields)}')
        if missing := sorted(fields - set(section.keys())):
            raise ValueError(f'{where} is missing key(s) {missing}')
        return cls.config_class(**{k: section[k] for k in fields})


VARIANTS: dict[str, type[AttentionVariant]] = {}  # config.model.attention -> class


# What every variant implements (the members that raise NotImplementedError here), and what each
# capability adds.
CONTRACT = (
    '__init__',
    '__call__',
    'resolve',
    'kv_cache_elements',
    'kv_cache_vectors',
    'kv_heads',
    'score_dims',
    'init_cache',
)
CAPABILITIES = {
    'poolable_kv_heads': ('kv_projections', 'pooled'),
    'latent_kv': ('config_section',),  # a conversion writes the target's section
}


def missing_members(cls: type[AttentionVariant]) -> list[str]:
    """The contract members `cls` leaves to `AttentionVariant` (or above it), in contract order,
    those of its capabilities included; `names` and the config section pair are members too."""
    wanted = [*CONTRACT]
    for capability, members in CAPABILITIES.items():
        wanted += members if getattr(cls, capability) else ()
    missing = [m for m in wanted if not _overrides(cls, m)]
    if not cls.names:
        missing.append('names')
    if bool(cls.config_section) != (cls.config_class is not None):
        missing.append('config_class' if cls.config_section else 'config_section')
    return missing


def _overrides(cls: type, member: str) -> bool:
    """Whether `member`'s nearest definition on `cls`'s MRO is a variant's, not the contract's
    own (or nnx.Module's)."""
    owner = next(c for c in cls.__mro__ if member in vars(c))
    return owner is not AttentionVariant and issubclass(owner, AttentionVariant)


def register(cls: type[AttentionVariant]) -> type[AttentionVariant]:
    """Class decorator: makes `cls` the implementation of each of its `names`, once it
    implements the contract (a one-line TypeError names what it lacks)."""
    if missing := missing_members(cls):
        raise TypeError(
            f'attention variant {cls.__name__} lacks {", ".join(missing)} of the '
            'AttentionVariant contract (lm/model/variant.py)'
        )
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


def set_absorb(model: nnx.Module, absorb: bool) -> None:
    """Sets `absorb` of every attention variant in `model` (a decoder's choice of path)."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, AttentionVariant):
            module.absorb = absorb


def sections() -> set[str]:
    """The names of the registered variants' own `config.model` sections."""
    return {cls.config_section for cls in VARIANTS.values() if cls.config_section}


def inactive_sections(attention: str) -> list[str]:
    """The `config.model` sections that `attention` does not read (other variants' own)."""
    active = VARIANTS[attention].config_section if attention in VARIANTS else ''
    return sorted(sections() - {active})
