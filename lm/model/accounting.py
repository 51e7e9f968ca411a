"""Parameter counts, KV-cache sizes and FLOPs per token for a model config (no arrays built).

KV cache per token: the sum over layers of each layer's elements, which are 2·h·d_h (MHA),
2·g·d_h (GQA), 2·d_h (MQA) and d_c + d_h^R (MLA); each variant states its own
(`kv_cache_elements`, `score_dims`), reading its own config section (MLA's ranks:
`cfg.section`). Layers differ where the KV layout says so (lm/model/layout.py): a layer's own KV
head count (`kv_heads_per_layer`), and none for a cross-layer-attention consumer, which reads
its producer's cache. A sequence's cache (`kv_cache_bytes`, `kv_cache_bytes_by_layer`) counts
local (sliding-window) layers at most W tokens each, and int8 storage as a byte per element plus
one scale per cached vector.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from lm.model import attention, layout
from lm.model.config import DTYPES, ModelConfig
from lm.model.kv_cache import KV_CACHE_DTYPES
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

    Counted from the abstract model (`nnx.eval_shape`), so it is exact for any variant.
    """
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    counts = dict.fromkeys(COMPONENTS, 0)
    for path, leaf in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        counts[_component(path)] += math.prod(leaf.shape)
    counts['total'] = sum(counts.values())
    return counts


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


def kv_cache_bytes_per_layer(
    cfg: ModelConfig, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> list[int]:
    """[L] cache bytes per token of each layer: its elements in `dtype` ('float'), or one int8
    byte each plus a `dtype` scale per cached vector ('int8', lm/model/kv_quant.py)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f'kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}')
    size = jnp.dtype(DTYPES[dtype]).itemsize
    if kv_cache_dtype == 'float':
        return [n * size for n in kv_cache_elements_per_layer(cfg)]
    cls = attention.variant(cfg)
    vectors = [
        cls.kv_cache_vectors(layout.layer_config(cfg, i)) if layout.is_producer(cfg, i) else 0
        for i in range(cfg.num_layers)
    ]
    return [n + v * size for n, v in zip(kv_cache_elements_per_layer(cfg), vectors, strict=True)]


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str = 'bfloat16') -> int:
    """Cache bytes per token across all layers for elements stored as `dtype`, every layer
    counted as holding every token (`kv_cache_bytes` bounds local layers by their window)."""
    return sum(kv_cache_bytes_per_layer(cfg, dtype))


def kv_cache_bytes_by_layer(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> list[int]:
    """[L] bytes each layer's cache holds for one sequence of `length` tokens: a global layer
    keeps every token, a local one (sliding window W) at most W, each at its
    `kv_cache_bytes_per_layer` (0 for a CLA consumer)."""
    per_token = kv_cache_bytes_per_layer(cfg, dtype, kv_cache_dtype)
    return [min(length, cfg.layer_window(i) or length) * b for i, b in enumerate(per_token)]


def kv_cache_bytes(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> int:
    """Bytes one sequence's cache holds for `length` tokens, all layers
    (`kv_cache_bytes_by_layer`)."""
    return sum(kv_cache_bytes_by_layer(cfg, length, dtype, kv_cache_dtype))


def kv_cache_bytes_per_context_token(cfg: ModelConfig, length: int, dtype: str = 'bfloat16') -> int:
    """Cache bytes per token of one sequence of `length` tokens, rounded to a byte: equals
    `kv_cache_bytes_per_token` unless local layers hold fewer than `length` slots."""
    return round(kv_cache_bytes(cfg, length, dtype) / length)


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
