"""Parameter counts, KV-cache sizes and FLOPs per token for a model config (no arrays built).

KV cache per token: the sum over layers of each layer's elements, which are 2·h·d_h (MHA),
2·g·d_h (GQA), 2·d_h (MQA) and d_c + d_h^R (MLA); each variant states its own
(`kv_cache_elements`, `score_dims`), reading its own config section (MLA's ranks:
`cfg.section`). Layers differ where the KV layout says so (lm/model/layout.py): a layer's own KV
head count (`kv_heads_per_layer`), and none for a cross-layer-attention consumer, which reads
its producer's cache.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from flax import nnx

from lm.model import attention, layout
from lm.model.config import DTYPES, ModelConfig
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


def kv_cache_bytes_per_layer(cfg: ModelConfig, dtype: str = 'bfloat16') -> list[int]:
    """[L] cache bytes per token of each layer for elements stored as `dtype`."""
    size = jnp.dtype(DTYPES[dtype]).itemsize
    return [n * size for n in kv_cache_elements_per_layer(cfg)]


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str = 'bfloat16') -> int:
    """Cache bytes per token across all layers for elements stored as `dtype`."""
    return sum(kv_cache_bytes_per_layer(cfg, dtype))


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
