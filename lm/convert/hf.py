"""Hugging Face checkpoints <-> lm: config translation and the parameter mapping, as pure data.

Llama (`LlamaForCausalLM`) is lm's 'mha' / 'gqa' / 'mqa' (contiguous KV groups, rotate-half
RoPE: no permutation); DeepSeek-V3 (`DeepseekV3ForCausalLM`, dense layers only) is lm's 'mla'.
An HF `weight` is [out, in]; an lm kernel is [in..., out...] with heads split out:
`q_proj` -> [E, H, D], `k_proj` / `v_proj` -> [E, G, D], `o_proj` -> [H, D, E],
`kv_b_proj` -> [C, H, Dn + Dv] ([k_nope; v] per head). DeepSeek with `rope_interleave=True`
keeps each RoPE pair adjacent; lm keeps pair (i, i + Dr/2), so the RoPE columns of `q_proj` /
`q_b_proj` and `kv_a_proj_with_mqa` are permuted by [0, 2, ..., Dr-2, 1, 3, ..., Dr-1].

What lm cannot express is refused in one line naming the config.json field.
Reading and writing files is `lm/convert/hf_io.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lm.model.config import ModelConfig

LLAMA, DEEPSEEK = 'llama', 'deepseek_v3'
ARCHITECTURES = {LLAMA: 'LlamaForCausalLM', DEEPSEEK: 'DeepseekV3ForCausalLM'}
DEEPSEEK_LATENT_EPS = 1e-6  # DeepseekV3's q_a_layernorm / kv_a_layernorm eps (not configurable)
TORCH_DTYPES = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'float16'}
_REQUIRED = (
    'vocab_size',
    'hidden_size',
    'num_hidden_layers',
    'num_attention_heads',
    'intermediate_size',
)
_MLA_REQUIRED = ('kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim')
_LLAMA3_KEYS = {
    'factor': 'rope_scaling_factor',
    'low_freq_factor': 'rope_low_freq_factor',
    'high_freq_factor': 'rope_high_freq_factor',
    'original_max_position_embeddings': 'rope_original_max_len',
}


def _refuse(field: str, value, why: str) -> ValueError:
    return ValueError(f'config.json {field}={value!r}: {why}')


def _rope(hf: dict) -> tuple[float, dict]:
    """(rope_theta, rope-scaling parameters) from either config.json layout: transformers 5's
    `rope_parameters` or the older top-level `rope_theta` + `rope_scaling`."""
    params = dict(hf.get('rope_scaling') or {})
    params.update(hf.get('rope_parameters') or {})
    theta = params.pop('rope_theta', hf.get('rope_theta', 10_000.0))
    rope_type = params.pop('rope_type', params.pop('type', 'default'))
    return float(theta), {'rope_type': rope_type, **params}


def model_from_hf(hf: dict) -> tuple[dict, bool]:
    """(lm `config.model` values, rope_interleave) for a config.json; ValueError naming the
    first field lm cannot express."""
    model_type = hf.get('model_type')
    if model_type not in ARCHITECTURES:
        raise _refuse(
            'model_type', model_type, f'lm imports {sorted(ARCHITECTURES)} (Llama and DeepSeek-V3)'
        )
    required = _REQUIRED + (_MLA_REQUIRED if model_type == DEEPSEEK else ())
    if missing := [k for k in required if not isinstance(hf.get(k), int)]:
        raise ValueError(f'config.json lacks integer field(s) {missing}')
    if hf.get('hidden_act', 'silu') != 'silu':
        raise _refuse('hidden_act', hf['hidden_act'], "lm's MLP is SwiGLU ('silu')")
    if hf.get('mlp_bias'):
        raise _refuse('mlp_bias', hf['mlp_bias'], 'lm has no MLP biases')
    theta, scaling = _rope(hf)
    if scaling.get('partial_rotary_factor', 1.0) != 1.0:
        raise _refuse(
            'rope_parameters.partial_rotary_factor',
            scaling['partial_rotary_factor'],
            'lm rotates the whole head',
        )
    H, L = hf['num_attention_heads'], hf['num_hidden_layers']
    model = {
        'vocab_size': hf['vocab_size'],
        'd_model': hf['hidden_size'],
        'num_layers': L,
        'num_heads': H,
        'mlp_dim': hf['intermediate_size'],
        'rope_theta': theta,
        'norm_eps': float(hf.get('rms_norm_eps', 1e-6)),
        'tie_embeddings': bool(hf.get('tie_word_embeddings', False)),
        'rope_scaling': '',
        'qkv_bias': False,
        'o_bias': False,
    }
    rope_type = scaling['rope_type']
    if model_type == LLAMA:
        if rope_type == 'llama3':
            model['rope_scaling'] = 'llama3'
            for key, name in _LLAMA3_KEYS.items():
                if key not in scaling:
                    raise _refuse(f'rope_scaling.{key}', None, "rope type 'llama3' needs it")
                model[name] = float(scaling[key])
            model['rope_original_max_len'] = int(scaling['original_max_position_embeddings'])
        elif rope_type != 'default':
            raise _refuse('rope_scaling.rope_type', rope_type, "lm supports 'default' and 'llama3'")
        G = hf.get('num_key_value_heads') or H
        model['attention'] = 'mha' if G == H else ('mqa' if G == 1 else 'gqa')
        model['num_kv_heads'] = G
        model['head_dim'] = hf.get('head_dim') or hf['hidden_size'] // H
        model['qkv_bias'] = model['o_bias'] = bool(hf.get('attention_bias', False))
        return model, False
    if rope_type != 'default':
        raise _refuse(
            'rope_scaling.rope_type', rope_type, 'lm imports DeepSeek-V3 with plain RoPE only'
        )
    if hf.get('attention_bias'):
        raise _refuse('attention_bias', True, 'lm has no biases on DeepSeek q_a/kv_a/o projections')
    dense = hf.get('first_k_dense_replace', 3)
    if dense is not None and dense < L:
        raise _refuse(
            'first_k_dense_replace',
            dense,
            f'layers {dense}..{L - 1} of {L} are MoE layers; lm imports dense layers only',
        )
    model.update(
        attention='mla',
        num_kv_heads=0,
        kv_lora_rank=hf['kv_lora_rank'],
        q_lora_rank=hf.get('q_lora_rank') or 0,
        qk_nope_head_dim=hf['qk_nope_head_dim'],
        qk_rope_head_dim=hf['qk_rope_head_dim'],
        v_head_dim=hf['v_head_dim'],
        latent_norm_eps=DEEPSEEK_LATENT_EPS,
    )
    return model, bool(hf.get('rope_interleave', True))


def hf_from_model(cfg: ModelConfig, max_position_embeddings: int, **extra) -> dict:
    """The config.json of an lm model (`extra`: token ids and the like); ValueError naming
    the first knob that transformers' Llama / DeepseekV3 cannot express."""
    if cfg.rope_scaling and cfg.attention == 'mla':
        raise ValueError(
            "config.model.rope_scaling='llama3' with attention='mla' has no DeepseekV3 equivalent"
        )
    if cfg.rope_scaling:
        rope = {'rope_type': 'llama3', 'rope_theta': cfg.rope_theta}
        rope.update({key: getattr(cfg, name) for key, name in _LLAMA3_KEYS.items()})
    else:
        rope = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
    common = {
        'vocab_size': cfg.vocab_size,
        'hidden_size': cfg.d_model,
        'intermediate_size': cfg.mlp_dim,
        'num_hidden_layers': cfg.num_layers,
        'num_attention_heads': cfg.num_heads,
        'hidden_act': 'silu',
        'rms_norm_eps': cfg.norm_eps,
        'max_position_embeddings': max_position_embeddings,
        'rope_parameters': rope,
        # The pre-5 layout too, for older transformers, vLLM and the like.
        'rope_theta': cfg.rope_theta,
        'rope_scaling': {k: v for k, v in rope.items() if k != 'rope_theta'}
        if cfg.rope_scaling
        else None,
        'tie_word_embeddings': cfg.tie_embeddings,
        'attention_dropout': 0.0,
        'dtype': TORCH_DTYPES[cfg.param_dtype],
        'use_cache': True,
        **extra,
    }
    if cfg.attention != 'mla':
        if cfg.qkv_bias != cfg.o_bias:
            raise ValueError(
                f'config.model.qkv_bias={cfg.qkv_bias} with o_bias={cfg.o_bias} has no Llama '
                'equivalent (attention_bias sets biases on q, k, v and o together)'
            )
        return {
            'architectures': [ARCHITECTURES[LLAMA]],
            'model_type': LLAMA,
            **common,
            'num_key_value_heads': cfg.num_kv_heads,
            'head_dim': cfg.head_dim,
            'attention_bias': cfg.qkv_bias,
            'mlp_bias': False,
        }
    latent_eps = cfg.latent_norm_eps or cfg.norm_eps
    if latent_eps != DEEPSEEK_LATENT_EPS:
        raise ValueError(
            f'config.model.latent_norm_eps resolves to {latent_eps}, but DeepseekV3 fixes its '
            f'latent norms at {DEEPSEEK_LATENT_EPS}; train MLA runs to export with '
            f'latent_norm_eps={DEEPSEEK_LATENT_EPS}'
        )
    return {
        'architectures': [ARCHITECTURES[DEEPSEEK]],
        'model_type': DEEPSEEK,
        **common,
        'num_key_value_heads': cfg.num_heads,
        'kv_lora_rank': cfg.kv_lora_rank,
        'q_lora_rank': cfg.q_lora_rank or None,
        'qk_nope_head_dim': cfg.qk_nope_head_dim,
        'qk_rope_head_dim': cfg.qk_rope_head_dim,
        'v_head_dim': cfg.v_head_dim,
        'head_dim': cfg.qk_rope_head_dim,
        'rope_interleave': True,
        'first_k_dense_replace': cfg.num_layers,
        'attention_bias': False,
    }


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


def interleave_columns(width: int, rope_dim: int) -> np.ndarray:
    """Last-axis index from lm's layout to DeepSeek's interleaved one: the last `rope_dim` of
    `width` columns are [0, 2, ..., Dr-2, 1, 3, ..., Dr-1] (offset), the rest kept."""
    pe = np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
    return np.concatenate([np.arange(width - rope_dim), width - rope_dim + pe])


def tensor_map(cfg: ModelConfig, rope_interleave: bool = False) -> list[Tensor]:
    """Every lm parameter of `cfg` with its HF source, in HF file order."""
    out = [Tensor(('embed',), 'model.embed_tokens.weight', False)]
    mla = cfg.attention == 'mla'
    q_cols = mla_cols = None
    if mla and rope_interleave:
        Dn, Dr = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        q_cols = interleave_columns(Dn + Dr, Dr)
        mla_cols = interleave_columns(cfg.kv_lora_rank + Dr, Dr)
    for i in range(cfg.num_layers):
        hf, lm = f'model.layers.{i}.', ('blocks', i)

        def add(lm_tail, hf_name, linear=True, n_in=1, columns=None, _lm=lm, _hf=hf):
            out.append(Tensor(_lm + lm_tail, _hf + hf_name, linear, n_in, columns))

        add(('attn_norm', 'scale'), 'input_layernorm.weight', linear=False)
        if not mla:
            for name in ('q_proj', 'k_proj', 'v_proj'):
                add(('attn', name, 'kernel'), f'self_attn.{name}.weight')
                if cfg.qkv_bias:
                    add(('attn', name, 'bias'), f'self_attn.{name}.bias', linear=False)
            add(('attn', 'o_proj', 'kernel'), 'self_attn.o_proj.weight', n_in=2)
            if cfg.o_bias:
                add(('attn', 'o_proj', 'bias'), 'self_attn.o_proj.bias', linear=False)
        else:
            if cfg.q_lora_rank:
                add(('attn', 'q_a_proj', 'kernel'), 'self_attn.q_a_proj.weight')
                add(('attn', 'q_a_layernorm', 'scale'), 'self_attn.q_a_layernorm.weight', False)
                add(('attn', 'q_b_proj', 'kernel'), 'self_attn.q_b_proj.weight', columns=q_cols)
            else:
                add(('attn', 'q_proj', 'kernel'), 'self_attn.q_proj.weight', columns=q_cols)
            add(
                ('attn', 'kv_a_proj_with_mqa', 'kernel'),
                'self_attn.kv_a_proj_with_mqa.weight',
                columns=mla_cols,
            )
            add(('attn', 'kv_a_layernorm', 'scale'), 'self_attn.kv_a_layernorm.weight', False)
            add(('attn', 'kv_b_proj', 'kernel'), 'self_attn.kv_b_proj.weight')
            add(('attn', 'o_proj', 'kernel'), 'self_attn.o_proj.weight', n_in=2)
        add(('mlp_norm', 'scale'), 'post_attention_layernorm.weight', linear=False)
        for name in ('gate_proj', 'up_proj', 'down_proj'):
            add(('mlp', name, 'kernel'), f'mlp.{name}.weight')
    out.append(Tensor(('final_norm', 'scale'), 'model.norm.weight', False))
    if not cfg.tie_embeddings:
        out.append(Tensor(('lm_head', 'kernel'), 'lm_head.weight', True, 1))
    return out


def _flat_index(shape: tuple[int, ...], index: tuple, columns: np.ndarray | None) -> np.ndarray:
    """Flat (row-major) positions in an array of `shape` of the block `index` selects, after
    the last axis is re-indexed by `columns`."""
    ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if columns is not None:
        ids = ids[..., columns]
    return ids[index]


def to_lm_block(read, t: Tensor, lm_shape: tuple[int, ...], index: tuple) -> np.ndarray:
    """The block `index` (a tuple of slices) of lm parameter `t`, reading only the rows and
    columns of the HF tensor it needs: `read(rows, cols)` returns W[rows, cols] of a 2-D
    tensor (`cols` is None for a 1-D one)."""
    index = tuple(index) + (slice(None),) * (len(lm_shape) - len(index))
    if not t.linear:
        if t.lm == ('embed',):  # same layout: rows and columns read directly
            return read(index[0], index[1])
        flat = _flat_index(lm_shape, index, t.columns)  # a norm scale or bias: small
        lo, hi = int(flat.min()), int(flat.max()) + 1
        return read(slice(lo, hi), None)[flat - lo]
    n_in = t.n_in
    in_ids = _flat_index(lm_shape[:n_in], index[:n_in], None)
    out_ids = _flat_index(lm_shape[n_in:], index[n_in:], t.columns)
    r0, r1 = int(out_ids.min()), int(out_ids.max()) + 1
    c0, c1 = int(in_ids.min()), int(in_ids.max()) + 1
    block = read(slice(r0, r1), slice(c0, c1))  # [out rows, in cols]
    picked = block[(out_ids - r0).reshape(-1)][:, (in_ids - c0).reshape(-1)]
    return picked.T.reshape(in_ids.shape + out_ids.shape)


def to_hf(t: Tensor, x: np.ndarray) -> np.ndarray:
    """The HF tensor of lm parameter `t` with value `x` (inverse of `to_lm_block`)."""
    if t.columns is not None:
        x = x[..., np.argsort(t.columns)]
    if not t.linear:
        return x if t.lm == ('embed',) else x.reshape(-1)
    n_in = int(np.prod(x.shape[: t.n_in]))
    return np.ascontiguousarray(x.reshape(n_in, -1).T)


def exports_interleaved_rope(cfg: ModelConfig) -> bool:
    """Whether export writes RoPE columns interleaved: DeepseekV3 (MLA) checkpoints carry
    `rope_interleave=True`; Llama's rotate-half layout is lm's own."""
    return cfg.attention == 'mla'
