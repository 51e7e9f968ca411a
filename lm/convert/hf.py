"""Hugging Face checkpoints <-> lm: config translation and the parameter mapping, as pure data.

Each attention variant says which HF architecture it maps to (`AttentionVariant.hf_mappings`,
lm/model/hf_mapping.py: Llama for MHA / GQA / MQA, DeepSeek-V3 for MLA); this module
adds what every architecture shares (embedding, norms, SwiGLU MLP, RoPE) and asks the registry:
import picks the variant by config.json's `model_type` (or `architectures`), export asks
`attention.variant(cfg)`. A variant without a mapping is refused, never exported as another.
An HF `weight` is [out, in]; an lm kernel is [in..., out...] (layouts: lm/model/hf_mapping.py).

What lm cannot express is refused in one line naming the config.json field or config key.
Reading and writing files is `lm/convert/hf_io.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lm.model import attention
from lm.model.accounting import param_shapes
from lm.model.config import ModelConfig
from lm.model.hf_mapping import HFMapping, Tensor, refuse

TORCH_DTYPES = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'float16'}
_REQUIRED = (
    'vocab_size',
    'hidden_size',
    'num_hidden_layers',
    'num_attention_heads',
    'intermediate_size',
)
_LLAMA3_KEYS = {
    'factor': 'rope_scaling_factor',
    'low_freq_factor': 'rope_low_freq_factor',
    'high_freq_factor': 'rope_high_freq_factor',
    'original_max_position_embeddings': 'rope_original_max_len',
}
_ROPE_TYPES = {'': 'default', 'llama3': 'llama3'}  # config.model.rope_scaling -> HF rope_type
LM_FIELD = 'lm_model'  # config.json of an lm export: the config.model keys HF has no field for
# ... but these: the weights' dtype is read from them; kernels are the importing machine's choice
_NOT_CARRIED = ('param_dtype', 'attention_impl', 'decode_kernel')


def mappings() -> dict[HFMapping, list[str]]:
    """Every registered variant's HF architectures, each with the attention kinds it serves."""
    out: dict[HFMapping, list[str]] = {}
    for kind, cls in attention.VARIANTS.items():
        for mapping in cls.hf_mappings:
            out.setdefault(mapping, []).append(kind)
    return out


def _supported() -> str:
    return ', '.join(
        f'{m.architecture} ({m.model_type}: {"/".join(kinds)})' for m, kinds in mappings().items()
    )


def export_mapping(cfg: ModelConfig) -> HFMapping:
    """The HF architecture `cfg`'s attention variant exports to; a one-line ValueError for a
    variant that has none."""
    cls = attention.variant(cfg)
    if not cls.hf_mappings:
        raise ValueError(
            f'config.model.attention={cfg.attention!r} ({cls.__name__}) has no Hugging Face '
            f'mapping; export supports {_supported()}'
        )
    if cfg.kv_share_every > 1 or cfg.kv_heads_per_layer:
        raise ValueError(
            f'config.model.kv_share_every={cfg.kv_share_every} / kv_heads_per_layer='
            f'{cfg.kv_heads_per_layer}: Hugging Face Llama has one K/V per layer and one KV head '
            'count for all; export supports uniform layouts only'
        )
    if not cfg.sliding_window:
        return cls.hf_mappings[0]
    for mapping in cls.hf_mappings:
        if mapping.layer_types:
            return mapping
    raise ValueError(
        f'config.model.sliding_window={cfg.sliding_window} with attention={cfg.attention!r} '
        'has no Hugging Face architecture with local/global layers; export supports '
        + ', '.join(m.architecture for m in mappings() if m.layer_types)
    )


def import_mapping(hf: dict) -> HFMapping:
    """The mapping of config.json's `model_type` (else of its `architectures`), through the
    registered variants; a one-line ValueError naming the supported ones."""
    model_type, archs = hf.get('model_type'), hf.get('architectures') or []
    for mapping in mappings():
        if mapping.model_type == model_type or (not model_type and mapping.architecture in archs):
            return mapping
    raise refuse('model_type', model_type, f'lm imports {_supported()}')


def _rope(hf: dict) -> tuple[float, dict]:
    """(rope_theta, rope-scaling parameters) from either config.json layout: transformers 5's
    `rope_parameters` or the older top-level `rope_theta` + `rope_scaling`."""
    params = dict(hf.get('rope_scaling') or {})
    params.update(hf.get('rope_parameters') or {})
    theta = params.pop('rope_theta', hf.get('rope_theta', 10_000.0))
    rope_type = params.pop('rope_type', params.pop('type', 'default'))
    return float(theta), {'rope_type': rope_type, **params}


def _check_shared_fields(hf: dict, mapping: HFMapping) -> None:
    """One-line errors for the shared config.json fields lm cannot express."""
    if missing := [k for k in _REQUIRED + mapping.required if not isinstance(hf.get(k), int)]:
        raise ValueError(f'config.json lacks integer field(s) {missing}')
    if hf.get('hidden_act', 'silu') != 'silu':
        raise refuse('hidden_act', hf['hidden_act'], "lm's MLP is SwiGLU ('silu')")
    if hf.get('mlp_bias'):
        raise refuse('mlp_bias', hf['mlp_bias'], 'lm has no MLP biases')


def _rope_from_hf(hf: dict, mapping: HFMapping) -> dict:
    """The `config.model` RoPE settings of config.json, as far as `mapping` carries them."""
    theta, scaling = _rope(hf)
    if scaling.get('partial_rotary_factor', 1.0) != 1.0:
        raise refuse(
            'rope_parameters.partial_rotary_factor',
            scaling['partial_rotary_factor'],
            'lm rotates the whole head',
        )
    types = {_ROPE_TYPES[s]: s for s in mapping.rope_scalings}
    if scaling['rope_type'] not in types:
        why = f'lm imports {mapping.architecture} with rope types {sorted(types)}'
        raise refuse('rope_scaling.rope_type', scaling['rope_type'], why)
    model = {'rope_theta': theta, 'rope_scaling': types[scaling['rope_type']]}
    if model['rope_scaling'] == 'llama3':
        for key, name in _LLAMA3_KEYS.items():
            if key not in scaling:
                raise refuse(f'rope_scaling.{key}', None, "rope type 'llama3' needs it")
            model[name] = float(scaling[key])
        model['rope_original_max_len'] = int(scaling['original_max_position_embeddings'])
    return model


def model_from_hf(hf: dict) -> tuple[dict, bool]:
    """(lm `config.model` values, rope_interleave) for a config.json; ValueError naming the
    first field lm cannot express."""
    mapping = import_mapping(hf)
    _check_shared_fields(hf, mapping)
    model = {
        'vocab_size': hf['vocab_size'],
        'd_model': hf['hidden_size'],
        'num_layers': hf['num_hidden_layers'],
        'num_heads': hf['num_attention_heads'],
        'mlp_dim': hf['intermediate_size'],
        'norm_eps': float(hf.get('rms_norm_eps', 1e-6)),
        'tie_embeddings': bool(hf.get('tie_word_embeddings', False)),
        'qkv_bias': False,
        'o_bias': False,
        **_rope_from_hf(hf, mapping),
    }
    settings, rope_interleave = mapping.from_hf(hf)
    model.update(settings)
    _add_missing(model, hf.get(LM_FIELD) or {})
    return model, rope_interleave


def lm_only(model: dict, hf_config: dict) -> dict:
    """The `config.model` values (`model`, a dict) that `hf_config`'s own fields do not carry
    (kv_quant_group, the compute dtype, ...): an export writes them as config.json's LM_FIELD so
    that its import evaluates as the run did."""
    carried, _ = model_from_hf({k: v for k, v in hf_config.items() if k != LM_FIELD})

    def missing(full: dict, have: dict) -> dict:
        out = {}
        for key, value in full.items():
            if isinstance(value, dict) and isinstance(have.get(key), dict):
                if sub := missing(value, have[key]):
                    out[key] = sub
            elif key not in have and key not in _NOT_CARRIED:
                out[key] = value
        return out

    return missing(model, carried)


def _add_missing(model: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(model.get(key), dict):
            _add_missing(model[key], value)
        elif key not in model:
            model[key] = value


def check_known(model: dict, known: dict, prefix: str = '') -> None:
    """Refuses a key of an imported `model` that `known` (the base config.model) lacks: an
    export's LM_FIELD written by another version of lm."""
    for key, value in model.items():
        if key not in known:
            raise refuse(
                f'{LM_FIELD}.{prefix}{key}', value, 'not a config.model key of this version of lm'
            )
        if isinstance(value, dict) and isinstance(known[key], dict):
            check_known(value, known[key], f'{prefix}{key}.')


def _rope_to_hf(cfg: ModelConfig, mapping: HFMapping) -> dict:
    if cfg.rope_scaling not in mapping.rope_scalings:
        raise ValueError(
            f'config.model.rope_scaling={cfg.rope_scaling!r} with attention={cfg.attention!r} '
            f'has no {mapping.architecture} equivalent'
        )
    rope = {'rope_type': _ROPE_TYPES[cfg.rope_scaling], 'rope_theta': cfg.rope_theta}
    if cfg.rope_scaling:
        rope.update({key: getattr(cfg, name) for key, name in _LLAMA3_KEYS.items()})
    return rope


def hf_from_model(cfg: ModelConfig, max_position_embeddings: int, **extra) -> dict:
    """The config.json of an lm model (`extra`: token ids and the like); ValueError naming
    the first knob that its HF architecture cannot express, or the variant that has none."""
    mapping = export_mapping(cfg)
    rope = _rope_to_hf(cfg, mapping)
    return {
        'architectures': [mapping.architecture],
        'model_type': mapping.model_type,
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
        **mapping.to_hf(cfg),
    }


def check_exportable(cfg: ModelConfig) -> None:
    """The one-line errors of an export, from the config alone (before any array is read): a
    variant with no mapping, a knob its architecture cannot express, a parameter it leaves out."""
    hf_from_model(cfg, 1)
    tensor_map(cfg)


def tensor_map(cfg: ModelConfig, rope_interleave: bool = False) -> list[Tensor]:
    """Every lm parameter of `cfg` with its HF source, in HF file order (the attention's from
    its variant's mapping)."""
    attn = export_mapping(cfg).attention_tensors(cfg, rope_interleave)
    out = [Tensor(('embed',), 'model.embed_tokens.weight', False)]
    for i in range(cfg.num_layers):
        lm, hf = ('blocks', i), f'model.layers.{i}.'
        out.append(Tensor((*lm, 'attn_norm', 'scale'), hf + 'input_layernorm.weight', False))
        for t in attn:
            out.append(dataclasses.replace(t, lm=(*lm, 'attn', *t.lm), hf=f'{hf}self_attn.{t.hf}'))
        out.append(
            Tensor((*lm, 'mlp_norm', 'scale'), hf + 'post_attention_layernorm.weight', False)
        )
        for name in ('gate_proj', 'up_proj', 'down_proj'):
            out.append(Tensor((*lm, 'mlp', name, 'kernel'), f'{hf}mlp.{name}.weight', True, 1))
    out.append(Tensor(('final_norm', 'scale'), 'model.norm.weight', False))
    if not cfg.tie_embeddings:
        out.append(Tensor(('lm_head', 'kernel'), 'lm_head.weight', True, 1))
    _check_covers(cfg, {t.lm for t in out})
    return out


def _check_covers(cfg: ModelConfig, mapped: set[tuple]) -> None:
    """A one-line ValueError unless the mapping names exactly the model's parameters: one it
    leaves out would be dropped by an export (and left at its initial value by an import)."""
    model = set(param_shapes(cfg))
    for missing, side, would in (
        (model - mapped, 'leaves out', 'an export would drop them'),
        (mapped - model, 'names', 'which the model does not have'),
    ):
        if missing:
            names = sorted('/'.join(map(str, path)) for path in missing)
            raise ValueError(
                f'config.model.attention={cfg.attention!r} ({attention.variant(cfg).__name__}): '
                'its Hugging Face mapping '
                f'({export_mapping(cfg).architecture}) {side} {len(names)} parameters ('
                f'{", ".join(names[:3])}{", ..." if len(names) > 3 else ""}): {would}; map '
                "them in the variant's hf_mappings, or give it none"
            )


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
    """Whether export writes RoPE columns interleaved (DeepseekV3 checkpoints carry
    `rope_interleave=True`; Llama's rotate-half layout is lm's own)."""
    return export_mapping(cfg).interleaved_rope
