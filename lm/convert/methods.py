"""The methods beyond Ainslie et al.'s contiguous mean-pooling, applied: which KV heads share
(`grouping`), aligned merging (`method='aligned'`) and MHA / GQA → MLA (`target` a variant with
a KV latent), and the calibration text they fit on. The options and their checks are
lm/convert/options.py's.

The maths lives in lm/convert/head_merging.py (grouping, alignment) and lm/convert/mla.py
(MHA2MLA); this module reads the calibration inputs and applies the maths to every layer of a
checkpointed parameter tree. Calibration inputs are every layer's attention input
(the normalised residual stream, as the head-analysis probe
`lm.analysis.scores.attention_inputs` reads it) on `uptrain.calibration_tokens` tokens of the
source run's training split, in windows of its seq_len spread evenly over the split: real text
the source was trained on, none of the validation split the converted run is evaluated on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lm.analysis import scores as analysis
from lm.convert import head_merging, mla
from lm.convert.options import KEYS, ConversionOptions
from lm.model import attention
from lm.model.config import ModelConfig
from lm.model.hf_mapping import DEEPSEEK_LATENT_EPS
from lm.model.transformer import Transformer

CALIBRATION_BATCH = 16  # windows per forward pass when reading calibration inputs
_probe = nnx.jit(analysis.attention_inputs)  # one compilation per model shape and process


def calibration_inputs(model: Transformer, tokens: np.ndarray, seq_len: int, num_tokens: int):
    """[L] attention inputs [M, E] (float32 numpy) on ceil(num_tokens / seq_len) windows of
    seq_len tokens spread evenly over `tokens` (a split's token array)."""
    if len(tokens) < seq_len or num_tokens < 1:
        raise ValueError(
            f'{KEYS["calibration_tokens"]}={num_tokens} must be >= 1 and the training split '
            f'({len(tokens)} tokens) must hold a window of {seq_len}'
        )
    windows = -(-num_tokens // seq_len)
    starts = np.linspace(0, len(tokens) - seq_len, windows).astype(np.int64)
    chunks = []
    for i in range(0, windows, CALIBRATION_BATCH):
        rows = np.stack([tokens[s : s + seq_len] for s in starts[i : i + CALIBRATION_BATCH]])
        inputs, _ = _probe(model, jnp.asarray(rows.astype(np.int32)))
        chunks.append([np.asarray(x, np.float32).reshape(-1, x.shape[-1]) for x in inputs])
    return [np.concatenate(layer) for layer in zip(*chunks, strict=True)]


def similarity_groups(params: dict, num_kv_heads: int, method: str, inputs: list) -> list:
    """[L] the KV-head groups per layer with the largest within-group similarity
    (`head_merging.choose_groups`; value CKA when the heads are aligned before pooling)."""
    metric = 'cka' if method == 'aligned' else 'cosine'
    groups = []
    for block, x_ME in zip(params['blocks'].values(), inputs, strict=True):
        sim_GG = head_merging.kv_similarity(block['attn'], x_ME, metric)
        groups.append(head_merging.choose_groups(sim_GG, sim_GG.shape[0] // num_kv_heads))
    return groups


def format_groups(groups: list) -> str:
    """'0,2|1,3;0,1|2,3': per layer (';'), the source KV heads merged into each new head."""
    return ';'.join('|'.join(','.join(map(str, g)) for g in layer) for layer in groups)


def latent_conversion(
    params: dict, src: ModelConfig, options: ConversionOptions, inputs: list, latent_norm_eps: float
) -> tuple[dict, dict, str]:
    """(parameters, `config.model` settings, kept RoPE pairs as 'j,j,...') of the MLA model
    converted from `params` (lm/convert/mla.py): the RoPE stride chosen on all layers.
    `latent_norm_eps`: the source config's `config.model.mla.latent_norm_eps`; 0 (the default)
    becomes DeepseekV3's fixed latent-norm eps, so that the converted run exports."""
    C, P, D = options.kv_lora_rank, options.qk_rope_head_dim, src.head_dim
    blocks = list(params['blocks'].values())
    contribution = sum(
        mla.pair_contribution(block['attn'], x_ME)
        for block, x_ME in zip(blocks, inputs, strict=True)
    )
    stride = mla.choose_stride(contribution, P)
    eps = latent_norm_eps or DEEPSEEK_LATENT_EPS
    out = dict(params)
    out['blocks'] = {
        layer: {
            **block,
            'attn': mla.mla_layer(block['attn'], x, C, P, stride, eps, options.rope_heads),
        }
        for (layer, block), x in zip(params['blocks'].items(), inputs, strict=True)
    }
    section = {
        'kv_lora_rank': C,
        'q_lora_rank': 0,
        'qk_nope_head_dim': D - P,
        'qk_rope_head_dim': P,
        'rope_heads': options.rope_heads,
        'v_head_dim': D,
        'latent_norm_eps': eps,
    }
    settings = {
        'attention': options.target,
        'num_kv_heads': 0,
        attention.VARIANTS[options.target].config_section: section,
        'rope_theta': float(src.rope_theta ** (stride * P / D)),
    }
    pairs = mla.kept_dims(D, P, stride)[0][: P // 2]
    return out, settings, ','.join(map(str, pairs))


def latent_opt_state(opt_state, fresh_state, order_D: np.ndarray):
    """The converted MLA run's optax state for optimizer_state='convert': `fresh_state` (the
    converted parameters' `tx.init`) with every Adam state's count and moments carried over
    from the source's `opt_state` where the parameter is kept (`mla.latent_moments`)."""

    def is_adam(node) -> bool:
        return isinstance(node, optax.ScaleByAdamState)

    sources = iter(n for n in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(n))

    def carry(node):
        if not is_adam(node):
            return node
        src = next(sources)
        mu = mla.latent_moments(src.mu, node.mu, order_D)
        return node._replace(
            count=src.count, mu=mu, nu=mla.latent_moments(src.nu, node.nu, order_D)
        )

    return jax.tree.map(carry, fresh_state, is_leaf=is_adam)
