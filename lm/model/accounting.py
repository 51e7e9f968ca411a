"""Parameter counts, KV-cache sizes and FLOPs per token for a model config (no arrays built).

KV cache per token: the sum over layers of each layer's elements, which are 2·h·d_h (MHA),
2·g·d_h (GQA), 2·d_h (MQA) and d_c + R·d_h^R (MLA, R RoPE keys); each variant states its own
(`kv_cache_elements`, `score_dims`), reading its own config section (MLA's ranks:
`cfg.section`). Layers differ where the KV layout says so (lm/model/layout.py): a layer's own KV
head count (`kv_heads_per_layer`), and none for a cross-layer-attention consumer, which reads
its producer's cache. A sequence's cache (`kv_cache_bytes`, `kv_cache_bytes_by_layer`) counts
local (sliding-window) layers at most W tokens each, int8 storage as a byte per element plus
one scale per cached vector, and KIVI's 4-bit storage (lm/model/kv_kivi.py) as it lays out a
full cache of `length` tokens in groups of G = config.model.kv_quant_group: half a byte per
element of S' = (ceil(length/G) + 1)·G slots, a min and a scale per key channel per group and
per value vector per slot, and a float residual of G slots (`kivi4_bytes`).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from flax import nnx

from lm.model import attention, layout
from lm.model.config import DTYPES, ModelConfig
from lm.model.kv_cache import check_storage
from lm.model.transformer import Transformer

COMPONENTS = ('embedding', 'attention', 'mlp', 'norm', 'lm_head')


def _component(path: tuple) -> str:
    names = [str(p) for p in path]
    if names[0] == 'blocks':
        sub = names[2]
        return 'norm' if sub.endswith('norm') else {'attn': 'attention', 'mlp': 'mlp'}[sub]
    return {'embed': 'embedding', 'final_norm': 'norm', 'lm_head': 'lm_head'}[names[0]]


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component (embedding, attention, mlp, norm, lm_head) and 'total'.

    Counted from the abstract model (`nnx.eval_shape`), so it is exact for any variant; each
    config is traced once per process (sweep planning and parameter matching ask many times).
    """
    return dict(_param_counts(cfg))


def param_shapes(cfg: ModelConfig) -> dict[tuple, tuple[int, ...]]:
    """Every parameter of the model `cfg` builds, by its path (('blocks', 0, 'attn', 'k_proj',
    'kernel'), ...), with its shape; from the abstract model, traced once per config."""
    return dict(_param_shapes(cfg))


@functools.lru_cache(maxsize=256)
def _param_shapes(cfg: ModelConfig) -> tuple[tuple[tuple, tuple[int, ...]], ...]:
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    return tuple((tuple(path), tuple(leaf.shape)) for path, leaf in flat)


@functools.lru_cache(maxsize=256)
def _param_counts(cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    counts = dict.fromkeys(COMPONENTS, 0)
    for path, shape in _param_shapes(cfg):
        counts[_component(path)] += math.prod(shape)
    counts['total'] = sum(counts.values())
    return tuple(counts.items())


def kv_cache_elements_per_layer(cfg: ModelConfig) -> list[int]:
    """[L] cached elements per token of each layer (0 for a layer that reads another's cache)."""
    cls = attention.variant(cfg)
    return [
        cls.kv_cache_elements(layout.layer_config(cfg, i)) if layout.is_producer(cfg, i) else 0
        for i in range(cfg.num_layers)
    ]


def kv_cache_elements_per_token(cfg: ModelConfig) -> int:
    """Cached elements per token across all layers."""
    return sum(kv_cache_elements_per_layer(cfg))


def _vectors_per_layer(cfg: ModelConfig) -> list[tuple[int, int, int]]:
    """[L] (vectors, key elements, key vectors) per token of each layer (`kv_cache_vectors`,
    `kv_cache_per_channel`; zeros for a layer that reads another's cache)."""
    cls = attention.variant(cfg)
    out = []
    for i in range(cfg.num_layers):
        if layout.is_producer(cfg, i):
            layer = layout.layer_config(cfg, i)
            out.append((cls.kv_cache_vectors(layer), *cls.kv_cache_per_channel(layer)))
        else:
            out.append((0, 0, 0))
    return out


def kv_cache_bytes_per_layer(
    cfg: ModelConfig, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> list[float]:
    """[L] cache bytes per token of each layer: its elements in `dtype` ('float'), or one int8
    byte each plus a `dtype` scale per cached vector ('int8', lm/model/kv_quant.py); 'kivi4':
    the bytes per token as the length grows (half a byte per element, a min and a scale per key
    channel per G tokens and per value vector; a float, not whole bytes), without the residual
    and the spare group that `kivi4_bytes` adds for a given length."""
    check_storage(cfg, kv_cache_dtype)
    size = jnp.dtype(DTYPES[dtype]).itemsize
    elements = kv_cache_elements_per_layer(cfg)
    if kv_cache_dtype == 'float':
        return [n * size for n in elements]
    vectors = _vectors_per_layer(cfg)
    if kv_cache_dtype == 'int8':
        return [n + v * size for n, (v, _, _) in zip(elements, vectors, strict=True)]
    G = cfg.kv_quant_group
    return [
        n / 2 + 2 * size * (ke / G + v - kv)
        for n, (v, ke, kv) in zip(elements, vectors, strict=True)
    ]


def kivi4_bytes(cfg: ModelConfig, length: int, dtype: str = 'bfloat16') -> list[int]:
    """[L] bytes of each layer's 'kivi4' cache for one sequence of `length` tokens, exactly as
    lm/model/kv_kivi.py stores it, G = config.model.kv_quant_group: S' = (ceil(length/G) + 1)·G
    slots of packed codes (half a byte per element), a `dtype` min and scale per key channel
    per group (S'/G groups) and per value vector per slot, and the float residual of G slots
    (all elements)."""
    check_storage(cfg, 'kivi4')
    size = jnp.dtype(DTYPES[dtype]).itemsize
    G = cfg.kv_quant_group
    slots = (math.ceil(length / G) + 1) * G
    return [
        slots * n // 2 + 2 * size * (slots // G * ke + slots * (v - kv)) + G * n * size
        for n, (v, ke, kv) in zip(
            kv_cache_elements_per_layer(cfg), _vectors_per_layer(cfg), strict=True
        )
    ]


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str = 'bfloat16') -> int:
    """Cache bytes per token across all layers for elements stored as `dtype`, every layer
    counted as holding every token (`kv_cache_bytes` bounds local layers by their window)."""
    return sum(kv_cache_bytes_per_layer(cfg, dtype))


def kv_cache_bytes_by_layer(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> list[int]:
    """[L] bytes each layer's cache holds for one sequence of `length` tokens: a global layer
    keeps every token, a local one (sliding window W) at most W, each at its
    `kv_cache_bytes_per_layer` (0 for a CLA consumer); 'kivi4': `kivi4_bytes`."""
    if kv_cache_dtype == 'kivi4':
        return kivi4_bytes(cfg, length, dtype)
    per_token = kv_cache_bytes_per_layer(cfg, dtype, kv_cache_dtype)
    return [min(length, cfg.layer_window(i) or length) * b for i, b in enumerate(per_token)]


def kv_cache_bytes(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> int:
    """Bytes one sequence's cache holds for `length` tokens, all layers
    (`kv_cache_bytes_by_layer`)."""
    return sum(kv_cache_bytes_by_layer(cfg, length, dtype, kv_cache_dtype))


def kv_cache_bytes_read(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> int:
    """Cache bytes one decode step reads for one sequence of `length` tokens: every layer reads
    the cache it attends, its own or (a CLA consumer) its producer's, so cross-layer attention
    shrinks what is stored (`kv_cache_bytes`) but not what is read."""
    by_layer = kv_cache_bytes_by_layer(cfg, length, dtype, kv_cache_dtype)
    return sum(by_layer[layout.kv_source(cfg, i)] for i in range(cfg.num_layers))


def kv_cache_bytes_per_context_token(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> int:
    """Cache bytes per token of one sequence of `length` tokens (`kv_cache_bytes` / length,
    rounded to a byte): `kv_cache_bytes_per_token` for a float cache without local layers; a
    local layer counts its W slots, a kivi4 cache its float residual and spare group."""
    return round(kv_cache_bytes(cfg, length, dtype, kv_cache_dtype) / length)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token, PaLM App. B: 6N + 12·L·H·Q·T.

    N counts every parameter but the input embedding (a lookup, unless tied to the output
    head): the matmul weights, and the RMSNorm scales at 2 forward FLOPs each, though they
    multiply elementwise. The attention term is written 6·L·H·(Q_qk + Q_v)·T so MLA's unequal
    q·k and value widths count correctly; it equals 12·L·H·Q·T when they are equal.
    """
    counts = param_counts(cfg)
    n = counts['total'] - (0 if cfg.tie_embeddings else counts['embedding'])
    qk, v = attention.variant(cfg).score_dims(cfg)
    return 6 * n + 6 * cfg.num_layers * cfg.num_heads * (qk + v) * seq_len
