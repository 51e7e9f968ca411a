"""What a conversion may be asked (`ConversionOptions`, scripts/uptrain.py builds them from its
flags) and its checks: one-line errors naming the config keys that record each option (`KEYS`),
before any array is read; and `check_uptrain_config`, the same choices in a run's
`config.uptrain`, checked when train.py starts. Light on imports, so train.py checks them
without loading the conversions (lm/convert/methods.py applies them).
"""

from __future__ import annotations

import dataclasses
import math
import types

import ml_collections
from absl import logging

from lm.data.parts import PARTS
from lm.model import attention
from lm.model.config import ModelConfig

POOL_METHODS = ('mean', 'first', 'random', 'aligned')
SCHEDULES = ('continue', 'rewarm')
OPTIMIZER_STATES = ('convert', 'fresh')
LATENT_METHODS = ('joint_svd',)
GROUPINGS = ('contiguous', 'similarity')


# Each option's config key in the converted run, which errors name (scripts/uptrain.py shows its
# flags instead); `steps` and `seed` are recorded nowhere, so errors name the option itself.
KEYS = {
    'target': 'config.uptrain.target',
    'num_kv_heads': 'config.model.num_kv_heads',
    'kv_share_every': 'config.model.kv_share_every',
    'kv_lora_rank': 'config.model.mla.kv_lora_rank',
    'qk_rope_head_dim': 'config.model.mla.qk_rope_head_dim',
    'rope_heads': 'config.model.mla.rope_heads',
    'method': 'config.uptrain.method',
    'grouping': 'config.uptrain.grouping',
    'calibration_tokens': 'config.uptrain.calibration_tokens',
    'source_step': 'config.uptrain.source_step',
    'steps': 'ConversionOptions.steps',
    'fraction': 'config.uptrain.fraction',
    'schedule': 'config.uptrain.schedule',
    'warmup_steps': 'config.uptrain.warmup_steps',
    'optimizer_state': 'config.uptrain.optimizer_state',
    'seed': 'ConversionOptions.seed',
    'data_split': 'config.data.split',
    'lr': 'config.train.lr',
    'kv_budget': 'config.uptrain.kv_budget',
}
_k = types.SimpleNamespace(**KEYS)  # the keys by attribute, for the messages


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConversionOptions:
    """What a conversion does and how the converted run goes on, checked when built (one-line
    errors naming `KEYS`, whatever the source).

    target '' pools the source's K/V heads to `num_kv_heads` (GQA / MQA) by `method`
    (`POOL_METHODS`) after `grouping`; a target naming a variant with a KV latent (`latent_kv`)
    converts to it, with `kv_lora_rank` C and `qk_rope_head_dim` P, by `LATENT_METHODS`, its RoPE
    key (`rope_heads` 1) the mean over the source's G KV heads' kept columns, or with `rope_heads`
    R dividing G, R keys each averaging G / R adjacent KV heads (R = G: each its own). method
    '' becomes the target's default ('mean'; 'joint_svd' for a latent), grouping '' the
    budget's 'similarity' with `kv_budget`, else 'contiguous'. `kv_share_every` n > 1
    then merges each n adjacent layers' K/V into one (cross-layer attention, lm/convert/cla.py,
    by the same method and grouping); num_kv_heads 0 keeps the source's count. The converted
    run starts at the source's `source_step` (None: its latest checkpoint) and trains `steps`
    more (None: `fraction` of the source's steps; None: the source config's uptrain.fraction) under
    `schedule` with `optimizer_state`, the schedule's warmup or ramp `warmup_steps` (None: the
    source config's uptrain.warmup_steps; -1: 10% of the steps under 'rewarm', none under
    'continue'); `seed` draws method 'random's fresh K/V. None for
    `calibration_tokens`: the source config's. `data_split` (None: the source's) is the corpus
    part the converted run trains on (`lm.data.parts`); `lr` (None: the source's) its peak
    learning rate, the source's min_lr scaled by the same factor. `kv_budget` B > 0 (with
    num_kv_heads unset, grouping 'similarity', method 'mean') gives each layer its own KV head
    count, B in all, where its heads are least alike (lm/convert/per_layer.py)."""

    target: str = ''
    num_kv_heads: int = 0
    kv_share_every: int = 1
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    rope_heads: int = 1
    method: str = ''
    grouping: str = ''
    calibration_tokens: int | None = None
    source_step: int | None = None
    steps: int | None = None
    fraction: float | None = None
    schedule: str = 'continue'
    warmup_steps: int | None = None
    optimizer_state: str = 'convert'
    seed: int = 0
    data_split: str | None = None
    lr: float | None = None
    kv_budget: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, 'method', self.method or _default_method(self.target))
        grouping = self.grouping or ('similarity' if self.kv_budget > 0 else 'contiguous')
        object.__setattr__(self, 'grouping', grouping)
        _check_run(self)
        _check_target(self)
        if self.latent:
            _check_latent(self)
        else:
            _check_pool(self)

    @property
    def latent(self) -> bool:
        return bool(self.target) and attention.VARIANTS[self.target].latent_kv

    @property
    def needs_calibration(self) -> bool:
        return (
            self.latent
            or self.grouping != 'contiguous'
            or self.method == 'aligned'
            or self.kv_budget > 0
        )


def _default_method(target: str) -> str:
    latent = bool(target) and getattr(attention.VARIANTS.get(target), 'latent_kv', False)
    return LATENT_METHODS[0] if latent else POOL_METHODS[0]


def _one_of(opts: ConversionOptions, name: str, allowed: tuple) -> None:
    if getattr(opts, name) not in allowed:
        raise ValueError(f'{KEYS[name]} must be one of {allowed}, got {getattr(opts, name)!r}')


def _check_run(opts: ConversionOptions) -> None:
    """The options of the converted run and its inputs: schedule, optimizer state, steps, seed,
    calibration tokens."""
    _one_of(opts, 'schedule', SCHEDULES)
    _one_of(opts, 'optimizer_state', OPTIMIZER_STATES)
    for name in ('source_step', 'steps'):
        if getattr(opts, name) is not None and getattr(opts, name) < 0:
            raise ValueError(f'{KEYS[name]} must be >= 0, got {getattr(opts, name)}')
    if opts.fraction is not None and not (math.isfinite(opts.fraction) and opts.fraction >= 0):
        raise ValueError(f'{_k.fraction} must be a finite number >= 0, got {opts.fraction}')
    if opts.warmup_steps is not None and opts.warmup_steps < -1:
        raise ValueError(
            f'{_k.warmup_steps} must be >= -1 (-1: the default), got {opts.warmup_steps}'
        )
    if not 0 <= opts.seed < 2**32:
        raise ValueError(f'{_k.seed} must be in [0, 2**32), got {opts.seed}')
    if opts.calibration_tokens is not None and opts.calibration_tokens < 1:
        raise ValueError(f'{_k.calibration_tokens} must be >= 1, got {opts.calibration_tokens}')
    if opts.steps is not None and opts.fraction is not None:
        raise ValueError(f'{_k.steps} and {_k.fraction} both set the uptraining steps: give one')
    if opts.data_split is not None:
        _one_of(opts, 'data_split', ('', *PARTS))
    if opts.lr is not None and not (math.isfinite(opts.lr) and opts.lr > 0):
        raise ValueError(f'{_k.lr} must be a finite number > 0, got {opts.lr}')


def _check_target(opts: ConversionOptions) -> None:
    _one_of(opts, 'grouping', GROUPINGS)
    cls = attention.VARIANTS.get(opts.target) if opts.target else None
    if opts.target and not (cls and (cls.latent_kv or cls.poolable_kv_heads)):
        raise ValueError(
            f'{_k.target} must be empty (fewer K/V heads) or an attention variant with K/V '
            f'heads or a KV latent {sorted(attention.VARIANTS)}, got {opts.target!r}'
        )


def _check_latent(opts: ConversionOptions) -> None:
    t = f'{_k.target}={opts.target}'
    if opts.method not in LATENT_METHODS:
        raise ValueError(f'{_k.method}={opts.method} does not apply to {t}: use {LATENT_METHODS}')
    if opts.kv_budget:  # before grouping, which a budget sets to 'similarity' by default
        raise ValueError(f'{_k.kv_budget} does not apply to {t} (per-layer KV heads); leave it 0')
    if opts.grouping != 'contiguous':
        raise ValueError(
            f'{_k.grouping}={opts.grouping} does not apply to {t} (no heads are merged)'
        )
    if opts.num_kv_heads:
        raise ValueError(f'{_k.num_kv_heads} does not apply to {t}; leave it unset')
    if opts.kv_lora_rank < 1:
        raise ValueError(f'{_k.kv_lora_rank} must be >= 1 for {t}, got {opts.kv_lora_rank}')
    if opts.qk_rope_head_dim < 2 or opts.qk_rope_head_dim % 2:
        raise ValueError(
            f'{_k.qk_rope_head_dim} must be an even number >= 2 for {t}, '
            f'got {opts.qk_rope_head_dim}'
        )
    if opts.rope_heads < 1:
        raise ValueError(f'{_k.rope_heads} must be >= 1 for {t}, got {opts.rope_heads}')
    if opts.kv_share_every != 1:
        raise ValueError(f'{_k.kv_share_every} does not apply to {t}; leave it 1')


def _check_pool(opts: ConversionOptions) -> None:
    _one_of(opts, 'method', POOL_METHODS)
    if opts.kv_share_every < 1:
        raise ValueError(f'{_k.kv_share_every} must be >= 1, got {opts.kv_share_every}')
    if opts.kv_budget:
        _check_budget(opts)
    elif opts.num_kv_heads < 0:
        raise ValueError(f'{_k.num_kv_heads} must be >= 1, got {opts.num_kv_heads}')
    elif opts.num_kv_heads == 0 and opts.kv_share_every == 1:  # 0 with CLA: the source's
        raise ValueError(
            f'{_k.num_kv_heads} is required (or {_k.target}=mla, {_k.kv_share_every} > 1 or '
            f'{_k.kv_budget})'
        )
    if opts.kv_lora_rank or opts.qk_rope_head_dim or opts.rope_heads != 1:
        raise ValueError(
            f'{_k.kv_lora_rank}, {_k.qk_rope_head_dim} and {_k.rope_heads} apply only to a '
            f'{_k.target} with a KV latent'
        )
    if opts.grouping == 'similarity' and opts.method == 'random':
        raise ValueError(
            f'{_k.grouping}=similarity has no effect with {_k.method}=random (fresh K/V)'
        )


def _check_budget(opts: ConversionOptions) -> None:
    """Per-layer counts under a budget: chosen by similarity, pooled by mean, one count each."""
    b = f'{_k.kv_budget}={opts.kv_budget}'
    if opts.kv_budget < 0:
        raise ValueError(f'{_k.kv_budget} must be >= 0 (0 = off), got {opts.kv_budget}')
    if opts.num_kv_heads:
        raise ValueError(f"{b} chooses each layer's KV heads; leave {_k.num_kv_heads} unset")
    if opts.kv_share_every != 1:
        raise ValueError(f'{b} does not combine with {_k.kv_share_every}; leave it 1')
    if opts.grouping != 'similarity' or opts.method != 'mean':
        raise ValueError(
            f'{b} merges the most similar heads by their mean: set {_k.grouping}=similarity '
            f'and {_k.method}=mean, got {opts.grouping} and {opts.method}'
        )


def check_latent_source(src: ModelConfig, opts: ConversionOptions) -> None:
    """One-line errors for a latent conversion the source's shapes cannot take."""
    D, P, C = src.head_dim, opts.qk_rope_head_dim, opts.kv_lora_rank
    if P >= D:
        raise ValueError(
            f"{_k.qk_rope_head_dim}={P} must be smaller than the source's head_dim={D} "
            '(the rest of each head becomes the latent part)'
        )
    rank = min(src.d_model, src.num_kv_heads * (2 * D - P))
    if C > rank:
        raise ValueError(
            f"{_k.kv_lora_rank}={C} is larger than the largest rank of the source's "
            '[W_K,nope | W_V], min(d_model, num_kv_heads · (2 · head_dim − qk_rope_head_dim)) '
            f'= {rank}'
        )
    if src.num_kv_heads % opts.rope_heads:
        raise ValueError(
            f"{_k.rope_heads}={opts.rope_heads} must divide the source's num_kv_heads="
            f'{src.num_kv_heads} (each RoPE key stands for num_kv_heads / rope_heads KV heads)'
        )
    if src.qkv_bias or src.o_bias:
        raise ValueError(
            'the source has qkv_bias / o_bias, which the latent attention has no place for'
        )
    if src.rope_scaling:
        raise ValueError(
            f"the source uses rope_scaling='{src.rope_scaling}', whose frequencies the latent "
            "attention's RoPE ladder cannot reproduce"
        )


def check_conversion(src: ModelConfig, opts: ConversionOptions) -> None:
    """One-line errors for a conversion the source cannot take, before any array is read."""
    cls = attention.variant(src)
    if not cls.poolable_kv_heads:
        raise ValueError(
            f"the source checkpoint uses attention='{src.attention}', which has no K/V heads lm "
            f'can pool ({cls.__name__}.poolable_kv_heads is False); only MHA/GQA/MQA checkpoints '
            'convert to fewer KV heads or a latent'
        )
    if src.kv_share_every > 1 or src.kv_heads_per_layer:
        raise ValueError(
            'the source checkpoint shares K/V across layers or has per-layer KV heads '
            '(config.model.kv_share_every / kv_heads_per_layer); convert from a uniform one'
        )
    if opts.latent:
        check_latent_source(src, opts)
        return
    if opts.kv_budget:
        L = src.num_layers  # one KV head per layer at the fewest (1 divides every count)
        if not L <= opts.kv_budget <= src.num_kv_heads * L:
            raise ValueError(
                f'{_k.kv_budget}={opts.kv_budget} must be between {L} and '
                f"{src.num_kv_heads * L} (the source's KV heads over its {L} layers)"
            )
        return
    g_src, H, key = src.num_kv_heads, src.num_heads, _k.num_kv_heads
    g = opts.num_kv_heads or g_src
    if g > g_src:
        raise ValueError(
            f"{key}={g} is larger than the source's {g_src} KV heads; conversion only merges heads"
        )
    if H % g:
        raise ValueError(f'{key}={g} does not divide config.model.num_heads={H}')
    if g_src % g:
        raise ValueError(f"{key}={g} does not divide the source's {g_src} KV heads")
    if opts.num_kv_heads == g_src and opts.kv_share_every == 1 and opts.method != 'random':
        logging.warning(
            "%s=%d is the source's own count: no K/V heads are merged, so the converted run "
            "continues the source's weights under the uptraining schedule",
            key,
            g,
        )
    if opts.kv_share_every > src.num_layers:
        raise ValueError(
            f"{_k.kv_share_every}={opts.kv_share_every} is more than the source's "
            f'{src.num_layers} layers'
        )


def check_steps(source_step: int | None, steps: int | None) -> None:
    """One-line errors for uptraining steps that cannot be set (a step-0 source needs them)."""
    if steps is None and source_step == 0:
        raise ValueError(
            'the source checkpoint is at step 0 (imported, e.g. by scripts/convert_hf.py), so '
            f'config.uptrain.fraction of its steps is 0: set {_k.steps}'
        )
    if steps is not None and steps < 0:
        raise ValueError(f'{_k.steps} must be >= 0, got {steps}')


def uptrain_steps(source_step: int, steps: int | None, fraction: float) -> int:
    """The converted run's uptraining steps: `steps`, else `fraction` of the source's."""
    return round(fraction * source_step) if steps is None else steps


def check_some_steps(source_step: int, steps: int | None, fraction: float) -> None:
    """One-line error for a conversion to uptrain that would have no uptraining step (train.py
    would then train nothing): `steps` 0, or `fraction` of the source's steps rounding to 0."""
    if uptrain_steps(source_step, steps, fraction):
        return
    if steps is not None:
        raise ValueError(f'{_k.steps}=0 leaves nothing to uptrain: set it >= 1')
    raise ValueError(
        f"{_k.fraction}={fraction} of the source's {source_step} steps rounds to 0 uptraining "
        f'steps, so train.py would train nothing: set a larger {_k.fraction} or {_k.steps} >= 1'
    )


def check_uptrain_config(up: ml_collections.ConfigDict) -> None:
    """One-line errors for `config.uptrain` of a run to train: the defaults scripts/uptrain.py
    reads from it later (fraction, warmup_steps, calibration_tokens) and the choices it records
    there, each one of its values (a run converted by it always passes)."""
    if not (math.isfinite(up.fraction) and up.fraction >= 0):
        raise ValueError(f'config.uptrain.fraction must be a finite number >= 0, got {up.fraction}')
    for key, least in (('warmup_steps', -1), ('kv_budget', 0), ('calibration_tokens', 1)):
        if up[key] < least:
            raise ValueError(f'config.uptrain.{key} must be >= {least}, got {up[key]}')
    if up.source_step < -1:
        raise ValueError(f'config.uptrain.source_step must be >= -1, got {up.source_step}')
    for key, allowed in (
        ('schedule', SCHEDULES),
        ('optimizer_state', OPTIMIZER_STATES),
        ('grouping', GROUPINGS),
        ('method', ('', *POOL_METHODS, *LATENT_METHODS)),
        ('target', ('', *sorted(attention.VARIANTS))),
    ):
        if up[key] not in allowed:
            raise ValueError(f'config.uptrain.{key} must be one of {allowed}, got {up[key]!r}')
