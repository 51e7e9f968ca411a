"""Conversion options beyond Ainslie et al.'s contiguous mean-pooling (scripts/uptrain.py):
which KV heads share (`grouping`), aligned merging (`method='aligned'`) and MHA / GQA → MLA
(`target` a variant with a KV latent), their checks, and the calibration text they fit on.

The maths lives in lm/convert/head_merging.py (grouping, alignment) and lm/convert/mla.py (MHA2MLA);
this module checks a `Plan` (one-line errors, before any array is read), reads the calibration
inputs, and applies the maths to every layer of a checkpointed parameter tree. Calibration
inputs are every layer's attention input (the normalised residual stream, as the head-analysis
probe `lm.analysis.scores.attention_inputs` reads it) on `uptrain.calibration_tokens` tokens of the
source run's training split, in windows of its seq_len spread evenly over the split: real text
the source was trained on, none of the validation split the converted run is evaluated on.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lm.analysis import scores as analysis
from lm.convert import head_merging, mla
from lm.model import attention
from lm.model.config import ModelConfig
from lm.model.transformer import Transformer

POOL_METHODS = ('mean', 'first', 'random', 'aligned')
SCHEDULES = ('continue', 'rewarm')
OPTIMIZER_STATES = ('convert', 'fresh')
LATENT_METHODS = ('joint_svd',)
GROUPINGS = ('contiguous', 'similarity')
CALIBRATION_BATCH = 16  # windows per forward pass when reading calibration inputs
_probe = nnx.jit(analysis.attention_inputs)  # one compilation per model shape and process


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a conversion does. target '' pools the source's K/V heads to `num_kv_heads` (GQA /
    MQA); a target naming a variant with a KV latent (`latent_kv`) converts to it, with
    `kv_lora_rank` C and `qk_rope_head_dim` P, by `LATENT_METHODS`."""

    num_kv_heads: int
    method: str
    grouping: str = 'contiguous'
    target: str = ''
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def latent(self) -> bool:
        return bool(self.target) and attention.VARIANTS[self.target].latent_kv

    @property
    def needs_calibration(self) -> bool:
        return self.latent or self.grouping != 'contiguous' or self.method == 'aligned'


def resolve_method(target: str, method: str) -> str:
    """--method as given, '' meaning the target's default ('mean'; joint SVD for a latent)."""
    if method:
        return method
    latent = bool(target) and getattr(attention.VARIANTS.get(target), 'latent_kv', False)
    return LATENT_METHODS[0] if latent else POOL_METHODS[0]


def check_plan_flags(plan: Plan, optimizer_state: str) -> None:
    """One-line errors for option combinations that are wrong whatever the source."""
    if plan.grouping not in GROUPINGS:
        raise ValueError(f'--grouping must be one of {GROUPINGS}, got {plan.grouping!r}')
    cls = attention.VARIANTS.get(plan.target) if plan.target else None
    if plan.target and not (cls and (cls.latent_kv or cls.poolable_kv_heads)):
        raise ValueError(
            f'--target must be empty (fewer K/V heads) or an attention variant with K/V heads or '
            f'a KV latent {sorted(attention.VARIANTS)}, got {plan.target!r}'
        )
    if not plan.latent:
        _check_pool_flags(plan)
        return
    t = f'--target={plan.target}'
    if plan.method not in LATENT_METHODS:
        raise ValueError(f'--method={plan.method} does not apply to {t}: use {LATENT_METHODS}')
    if plan.grouping != 'contiguous':
        raise ValueError(f'--grouping={plan.grouping} does not apply to {t} (no heads are merged)')
    if plan.num_kv_heads:
        raise ValueError(f'--num_kv_heads does not apply to {t}; leave it unset')
    if plan.kv_lora_rank < 1:
        raise ValueError(f'--kv_lora_rank must be >= 1 for {t}, got {plan.kv_lora_rank}')
    if plan.qk_rope_head_dim < 2 or plan.qk_rope_head_dim % 2:
        raise ValueError(
            f'--qk_rope_head_dim must be an even number >= 2 for {t}, got {plan.qk_rope_head_dim}'
        )
    if optimizer_state != 'fresh':
        raise ValueError(
            f'{t} builds new parameters with no AdamW history: pass --optimizer_state=fresh'
        )


def _check_pool_flags(plan: Plan) -> None:
    if plan.method not in POOL_METHODS:
        raise ValueError(f'--method must be one of {POOL_METHODS}, got {plan.method!r}')
    if plan.num_kv_heads < 1:
        raise ValueError(f'--num_kv_heads must be >= 1, got {plan.num_kv_heads}')
    if plan.kv_lora_rank or plan.qk_rope_head_dim:
        raise ValueError(
            '--kv_lora_rank and --qk_rope_head_dim apply only to a --target with a KV latent'
        )
    if plan.grouping == 'similarity' and plan.method == 'random':
        raise ValueError('--grouping=similarity has no effect with --method=random (fresh K/V)')


def check_latent_source(src: ModelConfig, plan: Plan) -> None:
    """One-line errors for a latent conversion the source's shapes cannot take."""
    D, P, C = src.head_dim, plan.qk_rope_head_dim, plan.kv_lora_rank
    if P >= D:
        raise ValueError(
            f"--qk_rope_head_dim={P} must be smaller than the source's head_dim={D} (the rest "
            'of each head becomes the latent part)'
        )
    rank = min(src.d_model, src.num_kv_heads * (2 * D - P))
    if C > rank:
        raise ValueError(
            f"--kv_lora_rank={C} is larger than the largest rank of the source's [W_K,nope | "
            f'W_V], min(d_model, num_kv_heads · (2 · head_dim − qk_rope_head_dim)) = {rank}'
        )
    if src.qkv_bias or src.o_bias:
        raise ValueError(
            'the source has qkv_bias / o_bias, which the latent attention has no place for'
        )
    if src.rope_scaling:
        raise ValueError(
            f"the source uses rope_scaling='{src.rope_scaling}', whose frequencies the latent "
            "attention's shared RoPE key cannot reproduce"
        )


def check_conversion(
    src: ModelConfig, num_kv_heads: int, method: str, plan: Plan | None = None
) -> None:
    """One-line errors for a conversion that cannot work, before any array is read."""
    if not attention.variant(src).poolable_kv_heads:
        raise ValueError(
            f"the source checkpoint uses attention='{src.attention}', which has no K/V heads to "
            'pool; only MHA/GQA/MQA checkpoints convert to fewer KV heads or a latent'
        )
    if plan is not None and plan.latent:
        check_latent_source(src, plan)
        return
    if method not in POOL_METHODS:
        raise ValueError(f'--method must be one of {POOL_METHODS}, got {method!r}')
    g_src, H = src.num_kv_heads, src.num_heads
    if num_kv_heads < 1:
        raise ValueError(f'--num_kv_heads must be >= 1, got {num_kv_heads}')
    if num_kv_heads > g_src:
        raise ValueError(
            f"--num_kv_heads={num_kv_heads} is larger than the source's {g_src} KV "
            'heads; conversion only merges heads'
        )
    if H % num_kv_heads:
        raise ValueError(
            f"the source's num_heads={H} is not divisible by --num_kv_heads={num_kv_heads}"
        )
    if g_src % num_kv_heads:
        raise ValueError(
            f"the source's {g_src} KV heads are not divisible by --num_kv_heads={num_kv_heads}"
        )


def check_flags(
    num_kv_heads: int,
    method: str,
    step: int | None,
    fraction: float | None,
    seed: int,
    schedule: str = 'continue',
    optimizer_state: str = 'convert',
    plan: Plan | None = None,
) -> None:
    """One-line errors for flags that are wrong whatever the source, before anything is read
    (`plan`: the conversion options, default contiguous pooling by `method`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f'--schedule must be one of {SCHEDULES}, got {schedule!r}')
    if optimizer_state not in OPTIMIZER_STATES:
        raise ValueError(
            f'--optimizer_state must be one of {OPTIMIZER_STATES}, got {optimizer_state!r}'
        )
    check_plan_flags(plan or Plan(num_kv_heads, method), optimizer_state)
    if step is not None and step < 0:
        raise ValueError(f'--step must be >= 0, got {step}')
    if fraction is not None and not (math.isfinite(fraction) and fraction >= 0):
        raise ValueError(f'--fraction must be a finite number >= 0, got {fraction}')
    if not 0 <= seed < 2**32:
        raise ValueError(f'--seed must be in [0, 2**32), got {seed}')


def check_steps(source_step: int | None, steps: int | None) -> None:
    """One-line errors for uptraining steps that cannot be set (a step-0 source needs them)."""
    if steps is None and source_step == 0:
        raise ValueError(
            'the source checkpoint is at step 0 (imported, e.g. by scripts/convert_hf.py), so '
            'uptrain.fraction of its steps is 0: pass --steps'
        )
    if steps is not None and steps < 0:
        raise ValueError(f'--steps must be >= 0, got {steps}')


def calibration_inputs(model: Transformer, tokens: np.ndarray, seq_len: int, num_tokens: int):
    """[L] attention inputs [M, E] (float32 numpy) on ceil(num_tokens / seq_len) windows of
    seq_len tokens spread evenly over `tokens` (a split's token array)."""
    if len(tokens) < seq_len or num_tokens < 1:
        raise ValueError(
            f'uptrain.calibration_tokens={num_tokens} must be >= 1 and the training split '
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
    params: dict, src: ModelConfig, plan: Plan, inputs: list, latent_norm_eps: float
) -> tuple[dict, dict, str]:
    """(parameters, `config.model` settings, kept RoPE pairs as 'j,j,...') of the MLA model
    converted from `params` (lm/convert/mla.py): the RoPE stride chosen on all layers.
    `latent_norm_eps`: the converted config's `config.model.mla.latent_norm_eps` (0 = norm_eps)."""
    C, P, D = plan.kv_lora_rank, plan.qk_rope_head_dim, src.head_dim
    blocks = list(params['blocks'].values())
    contribution = sum(
        mla.pair_contribution(block['attn'], x_ME)
        for block, x_ME in zip(blocks, inputs, strict=True)
    )
    stride = mla.choose_stride(contribution, P)
    eps = latent_norm_eps or src.norm_eps
    out = dict(params)
    out['blocks'] = {
        layer: {**block, 'attn': mla.mla_layer(block['attn'], x, C, P, stride, eps)}
        for (layer, block), x in zip(params['blocks'].items(), inputs, strict=True)
    }
    section = {
        'kv_lora_rank': C,
        'q_lora_rank': 0,
        'qk_nope_head_dim': D - P,
        'qk_rope_head_dim': P,
        'v_head_dim': D,
    }
    settings = {
        'attention': plan.target,
        'num_kv_heads': 0,
        attention.VARIANTS[plan.target].config_section: section,
        'rope_theta': float(src.rope_theta ** (stride * P / D)),
    }
    pairs = mla.kept_dims(D, P, stride)[0][: P // 2]
    return out, settings, ','.join(map(str, pairs))
