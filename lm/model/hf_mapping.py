"""How attention variants map to Hugging Face architectures, as data a variant holds
(`AttentionVariant.hf_mappings`); lm/convert/hf.py applies it to config.json and safetensors.

An `HFMapping` gives one architecture's attention part: the config.json fields it reads and
writes and one layer's attention tensors. What every architecture shares (embedding, norms,
SwiGLU MLP, RoPE base and llama3 scaling) is lm/convert/hf.py's.

- `LLAMA` (`LlamaForCausalLM`) is lm's 'mha' / 'gqa' / 'mqa' (contiguous KV groups, rotate-half
  RoPE: no permutation).
- `QWEN2` (`Qwen2ForCausalLM`) is lm's 'mha' / 'gqa' / 'mqa' with q/k/v biases and no o bias,
  and carries local (sliding-window) / global layers (`layer_types`, `sliding_window`): export
  picks it for a model with `config.model.sliding_window` > 0.
- `DEEPSEEK_V3` (`DeepseekV3ForCausalLM`, dense layers only) is lm's 'mla'.

An HF `weight` is [out, in]; an lm kernel is [in..., out...] with heads split out:
`q_proj` -> [E, H, D], `k_proj` / `v_proj` -> [E, G, D], `o_proj` -> [H, D, E],
`kv_b_proj` -> [C, H, N + U] ([k_nope; v] per head). DeepSeek with `rope_interleave=True`
keeps each RoPE pair adjacent; lm keeps pair (i, i + P/2), so the RoPE columns of `q_proj` /
`q_b_proj` and `kv_a_proj_with_mqa` are permuted by [0, 2, ..., P-2, 1, 3, ..., P-1].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from lm.model.config import ModelConfig

DEEPSEEK_LATENT_EPS = 1e-6  # DeepseekV3's q_a_layernorm / kv_a_layernorm eps (not configurable)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One lm parameter and the HF tensor it comes from.

    lm = W.T.reshape(lm shape) for a `linear` weight W [out, in] (W.reshape(lm shape)
    otherwise), then `columns` (if set) picks the last axis: lm[..., j] = that[..., columns[j]].
    `n_in`: how many leading lm axes are HF input axes (linear weights only).
    """

    lm: tuple  # path in the lm parameter tree, e.g. ('blocks', 0, 'attn', 'q_proj', 'kernel')
    hf: str  # tensor name in the safetensors file(s)
    linear: bool
    n_in: int = 0
    columns: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class HFMapping:
    """The attention part of one Hugging Face architecture.

    `from_hf(config.json) -> (config.model settings, rope_interleave)` and `to_hf(cfg) ->
    config.json fields` refuse what they cannot express in one line naming the field or knob;
    `attention_tensors(cfg, rope_interleave)` lists one layer's attention parameters with lm
    paths under the block's 'attn' and HF names under the layer's 'self_attn.'.
    """

    architecture: str  # config.json `architectures[0]`, e.g. 'LlamaForCausalLM'
    model_type: str  # config.json `model_type`, e.g. 'llama'
    required: tuple[str, ...]  # integer config.json fields it reads besides the shared ones
    rope_scalings: tuple[str, ...]  # the `config.model.rope_scaling` values it can express
    from_hf: Callable[[dict], tuple[dict, bool]]
    to_hf: Callable[[ModelConfig], dict]
    attention_tensors: Callable[[ModelConfig, bool], list[Tensor]]
    interleaved_rope: bool = False  # exports write RoPE columns interleaved (`rope_interleave`)
    layer_types: bool = False  # carries local (sliding-window) / global layers (`layer_types`)


def refuse(field: str, value, why: str) -> ValueError:
    """The one-line error for a config.json field lm cannot express."""
    return ValueError(f'config.json {field}={value!r}: {why}')


def interleave_columns(width: int, rope_dim: int) -> np.ndarray:
    """Last-axis index from lm's layout to DeepSeek's interleaved one: the last `rope_dim` of
    `width` columns are [0, 2, ..., P-2, 1, 3, ..., P-1] (offset), the rest kept."""
    pe = np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
    return np.concatenate([np.arange(width - rope_dim), width - rope_dim + pe])


def _llama_from_hf(hf: dict) -> tuple[dict, bool]:
    H = hf['num_attention_heads']
    if not isinstance(H, int) or H < 1:
        raise refuse('num_attention_heads', H, 'expected a positive integer')
    G = hf.get('num_key_value_heads') or H
    if not isinstance(G, int) or G < 1 or H % G:
        raise refuse('num_key_value_heads', G, f'expected a divisor of num_attention_heads={H}')
    bias = bool(hf.get('attention_bias', False))
    settings = {
        'attention': 'mha' if G == H else ('mqa' if G == 1 else 'gqa'),
        'num_kv_heads': G,
        'head_dim': hf.get('head_dim') or hf['hidden_size'] // H,
        'qkv_bias': bias,
        'o_bias': bias,
    }
    return settings, False


def _llama_to_hf(cfg: ModelConfig) -> dict:
    if cfg.qkv_bias != cfg.o_bias:
        raise ValueError(
            f'config.model.qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias} has no Llama '
            'equivalent (attention_bias sets biases on q, k, v and o together)'
        )
    return {
        'num_key_value_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
        'attention_bias': cfg.qkv_bias,
        'mlp_bias': False,
    }


def _llama_tensors(cfg: ModelConfig, rope_interleave: bool) -> list[Tensor]:
    out = []
    for name in ('q_proj', 'k_proj', 'v_proj'):
        out.append(Tensor((name, 'kernel'), f'{name}.weight', True, 1))
        if cfg.qkv_bias:
            out.append(Tensor((name, 'bias'), f'{name}.bias', False))
    out.append(Tensor(('o_proj', 'kernel'), 'o_proj.weight', True, 2))
    if cfg.o_bias:
        out.append(Tensor(('o_proj', 'bias'), 'o_proj.bias', False))
    return out


LLAMA = HFMapping(
    architecture='LlamaForCausalLM',
    model_type='llama',
    required=(),
    rope_scalings=('', 'llama3'),
    from_hf=_llama_from_hf,
    to_hf=_llama_to_hf,
    attention_tensors=_llama_tensors,
)


def layer_pattern(layer_types: list[str]) -> str:
    """The shortest `config.model.layer_pattern` that repeats to HF's `layer_types`."""
    letters = ''.join({'sliding_attention': 'L', 'full_attention': 'G'}[t] for t in layer_types)
    for n in range(1, len(letters) + 1):
        if all(letters[i] == letters[i % n] for i in range(len(letters))):
            return letters[:n]
    return letters


def _qwen2_layer_types(hf: dict) -> list[str]:
    """config.json's `layer_types`, or what Qwen2Config derives without it (sliding layers from
    `max_window_layers` on, when `use_sliding_window`)."""
    L, sliding = hf['num_hidden_layers'], hf.get('use_sliding_window') and hf.get('sliding_window')
    if hf.get('layer_types'):
        if len(hf['layer_types']) != L:
            raise refuse(
                'layer_types',
                hf['layer_types'],
                f'expected one entry per layer, {L} (num_hidden_layers), got '
                f'{len(hf["layer_types"])}',
            )
        return list(hf['layer_types'])
    first = hf.get('max_window_layers', 28)
    return ['sliding_attention' if sliding and i >= first else 'full_attention' for i in range(L)]


def _qwen2_from_hf(hf: dict) -> tuple[dict, bool]:
    settings, _ = _llama_from_hf(hf)
    types = _qwen2_layer_types(hf)
    if unknown := sorted(set(types) - {'sliding_attention', 'full_attention'}):
        raise refuse('layer_types', unknown, 'lm has sliding-window and full attention layers')
    local = 'sliding_attention' in types
    if local and not (hf.get('use_sliding_window', True) and hf.get('sliding_window')):
        raise refuse('sliding_window', hf.get('sliding_window'), 'sliding layers need a window')
    pattern = layer_pattern(types) if local else ''
    settings.update(
        qkv_bias=True,
        o_bias=False,
        sliding_window=int(hf['sliding_window']) if local else 0,
        layer_pattern='' if pattern == 'L' else pattern,
    )
    return settings, False


def _qwen2_to_hf(cfg: ModelConfig) -> dict:
    if not cfg.qkv_bias or cfg.o_bias:
        raise ValueError(
            f'config.model.qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias}: Qwen2ForCausalLM, '
            'the Hugging Face architecture with local/global layers, has q/k/v biases and no o '
            'bias; train with qkv_bias=True, o_bias=False to export sliding-window layers'
        )
    types = [
        'sliding_attention' if cfg.layer_window(i) else 'full_attention'
        for i in range(cfg.num_layers)
    ]
    return {
        'num_key_value_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
        'use_sliding_window': bool(cfg.sliding_window),
        'sliding_window': cfg.sliding_window or None,
        'max_window_layers': cfg.num_layers,
        'layer_types': types,
    }


QWEN2 = HFMapping(
    architecture='Qwen2ForCausalLM',
    model_type='qwen2',
    required=(),
    rope_scalings=('',),
    from_hf=_qwen2_from_hf,
    to_hf=_qwen2_to_hf,
    attention_tensors=_llama_tensors,
    layer_types=True,
)


def _deepseek_from_hf(hf: dict) -> tuple[dict, bool]:
    if hf.get('attention_bias'):
        raise refuse('attention_bias', True, 'lm has no biases on DeepSeek q_a/kv_a/o projections')
    L, dense = hf['num_hidden_layers'], hf.get('first_k_dense_replace', 3)
    if dense is not None and dense < L:
        raise refuse(
            'first_k_dense_replace',
            dense,
            f'layers {dense}..{L - 1} of {L} are MoE layers; lm imports dense layers only',
        )
    section = {
        'kv_lora_rank': hf['kv_lora_rank'],
        'q_lora_rank': hf.get('q_lora_rank') or 0,
        'qk_nope_head_dim': hf['qk_nope_head_dim'],
        'qk_rope_head_dim': hf['qk_rope_head_dim'],
        'rope_heads': 1,  # DeepseekV3: one RoPE key shared by all heads
        'v_head_dim': hf['v_head_dim'],
        'latent_norm_eps': DEEPSEEK_LATENT_EPS,
    }
    settings = {'attention': 'mla', 'num_kv_heads': 0, 'mla': section}
    return settings, bool(hf.get('rope_interleave', True))


def _deepseek_to_hf(cfg: ModelConfig) -> dict:
    mla = cfg.section
    if mla.rope_heads != 1:
        raise ValueError(
            f'config.model.mla.rope_heads={mla.rope_heads}, but DeepseekV3 has one RoPE key '
            'shared by all heads (rope_heads=1)'
        )
    latent_eps = mla.latent_norm_eps or cfg.norm_eps
    if latent_eps != DEEPSEEK_LATENT_EPS:
        raise ValueError(
            f'config.model.mla.latent_norm_eps resolves to {latent_eps}, but DeepseekV3 fixes its '
            f'latent norms at {DEEPSEEK_LATENT_EPS}; train MLA runs to export with '
            f'config.model.mla.latent_norm_eps={DEEPSEEK_LATENT_EPS}'
        )
    return {
        'num_key_value_heads': cfg.num_heads,
        'kv_lora_rank': mla.kv_lora_rank,
        'q_lora_rank': mla.q_lora_rank or None,
        'qk_nope_head_dim': mla.qk_nope_head_dim,
        'qk_rope_head_dim': mla.qk_rope_head_dim,
        'v_head_dim': mla.v_head_dim,
        'head_dim': mla.qk_rope_head_dim,
        'rope_interleave': True,
        'first_k_dense_replace': cfg.num_layers,
        'attention_bias': False,
    }


def _deepseek_tensors(cfg: ModelConfig, rope_interleave: bool) -> list[Tensor]:
    mla = cfg.section
    q_cols = kv_cols = None
    if rope_interleave:
        N, P = mla.qk_nope_head_dim, mla.qk_rope_head_dim
        q_cols = interleave_columns(N + P, P)
        kv_cols = interleave_columns(mla.kv_lora_rank + P, P)
    if mla.q_lora_rank:
        out = [
            Tensor(('q_a_proj', 'kernel'), 'q_a_proj.weight', True, 1),
            Tensor(('q_a_layernorm', 'scale'), 'q_a_layernorm.weight', False),
            Tensor(('q_b_proj', 'kernel'), 'q_b_proj.weight', True, 1, q_cols),
        ]
    else:
        out = [Tensor(('q_proj', 'kernel'), 'q_proj.weight', True, 1, q_cols)]
    return out + [
        Tensor(('kv_a_proj_with_mqa', 'kernel'), 'kv_a_proj_with_mqa.weight', True, 1, kv_cols),
        Tensor(('kv_a_layernorm', 'scale'), 'kv_a_layernorm.weight', False),
        Tensor(('kv_b_proj', 'kernel'), 'kv_b_proj.weight', True, 1),
        Tensor(('o_proj', 'kernel'), 'o_proj.weight', True, 2),
    ]


DEEPSEEK_V3 = HFMapping(
    architecture='DeepseekV3ForCausalLM',
    model_type='deepseek_v3',
    required=('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'),
    rope_scalings=('',),
    from_hf=_deepseek_from_hf,
    to_hf=_deepseek_to_hf,
    attention_tensors=_deepseek_tensors,
    interleaved_rope=True,
)
