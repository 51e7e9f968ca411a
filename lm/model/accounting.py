"""Parameter counts, KV-cache sizes and FLOPs per token for a model config (no arrays built).

KV cache per token: L · elements per layer, which is 2·h·d_h (MHA), 2·g·d_h (GQA), 2·d_h (MQA)
and d_c + d_h^R (MLA); each variant states its own (`kv_cache_elements`, `score_dims`), reading
its own config section (MLA's ranks: `cfg.section`). A sequence's cache (`kv_cache_bytes`)
counts local (sliding-window) layers at most W tokens each, and int8 storage as a byte per
element plus one scale per cached vector.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from lm.model import attention
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


def kv_cache_elements_per_token(cfg: ModelConfig) -> int:
    """Cached elements per token across all layers."""
    return cfg.num_layers * attention.variant(cfg).kv_cache_elements(cfg)


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str = 'bfloat16') -> int:
    """Cache bytes per token across all layers for elements stored as `dtype`, every layer
    counted as holding every token (`kv_cache_bytes` bounds local layers by their window)."""
    return kv_cache_elements_per_token(cfg) * jnp.dtype(DTYPES[dtype]).itemsize


def kv_cache_bytes(
    cfg: ModelConfig, length: int, dtype: str = 'bfloat16', kv_cache_dtype: str = 'float'
) -> int:
    """Bytes one sequence's cache holds for `length` tokens, layer by layer: a global layer
    keeps every token, a local one (sliding window W) at most W; per token and layer, the
    variant's elements in `dtype` ('float'), or one int8 byte each plus a `dtype` scale per
    cached vector ('int8', lm/model/kv_quant.py)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f'kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}')
    cls = attention.variant(cfg)
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    per_token = cls.kv_cache_elements(cfg) * itemsize
    if kv_cache_dtype == 'int8':
        per_token = cls.kv_cache_elements(cfg) + cls.kv_cache_vectors(cfg) * itemsize
    slots = [min(length, cfg.layer_window(i) or length) for i in range(cfg.num_layers)]
    return sum(slots) * per_token


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
