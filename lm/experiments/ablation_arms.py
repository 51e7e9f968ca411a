"""The uptraining ablation's settings (`Ablation`, scripts/uptrain_ablation.py's flags) and its
arms: every run's config (the MHA source, each target from scratch) and every conversion's
options, by the label the tables give it. The plan that trains them is lm.experiments.ablation.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable

from lm.config import default_values, load_config_file, with_overrides
from lm.convert.options import SCHEDULES
from lm.convert.uptrain import ConversionOptions
from lm.data.checks import reset_idle_data
from lm.model import attention
from lm.model.transformer import check_model_config

SOURCE = 'MHA'  # the source's label in the tables
# The corpus part (config.data.split) each kind of run trains on.
SOURCE_PART, UPTRAIN_PART, SCRATCH_PART = 'pretrain', 'uptrain', 'pretrain+uptrain'


@dataclasses.dataclass(frozen=True)
class Ablation:
    """The ablation's settings (scripts/uptrain_ablation.py's flags)."""

    config_file: str  # the recipe (configs/shakespeare_char.py)
    data_path: str
    steps: int  # N, the source's training steps
    seeds: int
    fractions: tuple[float, ...]  # uptraining fractions alpha
    scratch_fractions: tuple[float, ...]  # the alphas whose budgets get from-scratch baselines
    targets: tuple[int, ...] = (2, 1)  # KV heads after pooling (1 = MQA)
    methods: tuple[str, ...] = ('mean', 'first', 'random')  # pooling, maybe 'similarity-'
    mla_ranks: tuple[int, ...] = ()  # MHA -> MLA arms at these latent ranks
    cla: tuple[str, ...] = ()  # MHA -> cross-layer attention arms: 'cla2', 'mqa_cla2', 'gqa2_cla3'
    mla_rope_dim: int = 8
    mla_rope_heads: tuple[int, ...] = (1,)  # RoPE keys of each MLA arm: 1 shared; G: per KV head
    calibration_tokens: int | None = None
    optimizer_state: str = 'convert'  # every conversion arm: the source's Adam state carried
    eval_tokens: int = 0
    schedules: tuple[str, ...] = ('continue',)  # every method runs under each
    lrs: tuple[float, ...] = ()  # learning-rate grid of every trained arm; () = the recipe's
    overrides: tuple[str, ...] = ()  # --set key=value for every run
    mha_scratch: bool = False  # also MHA from scratch on both parts at every from-scratch budget

    def __post_init__(self) -> None:
        for flag, value in (('--steps', self.steps), ('--seeds', self.seeds)):
            if value < 1:
                raise ValueError(f'{flag}: expected >= 1, got {value}')
        if zero := [a for a in self.fractions if a > 0 and not self.up_steps(a)]:
            raise ValueError(
                f'--fractions: alpha={zero[0]} of --steps={self.steps} rounds to 0 uptraining '
                'steps (the alpha = 0 arm again): raise --steps or alpha'
            )
        if not set(self.scratch_fractions) <= set(self.fractions):
            raise ValueError('--scratch_fractions: every alpha must also be in --fractions')
        if not self.schedules or not set(self.schedules) <= set(SCHEDULES):
            raise ValueError(f'--schedule: expected one or more of {SCHEDULES}')
        if any(not lr > 0 for lr in self.lrs):
            raise ValueError('--lrs: every learning rate must be > 0')
        if self.mla_ranks and not self.mla_rope_heads:
            raise ValueError('--mla_rope_heads: expected one or more counts of RoPE keys (1 = one)')
        if len(set(self.mla_rope_heads)) < len(self.mla_rope_heads):
            raise ValueError(f'--mla_rope_heads: a count is repeated in {self.mla_rope_heads}')
        for item in self.overrides:  # the ablation sets these itself: the --set would do nothing
            if (key := item.partition('=')[0].strip()) in ABLATION_SETS:
                raise ValueError(
                    f'--set {item!r}: the ablation sets {key} itself, from {ABLATION_SETS[key]}; '
                    'leave it out'
                )

    def settings(self) -> dict:
        """Every setting that changes a run's result beyond its name (arm, alpha, seed) and its
        own schedule, part and learning rate (`plan` adds those)."""
        return {
            'data_path': os.path.abspath(self.data_path),
            'steps': self.steps,
            'eval_tokens': self.eval_tokens,
            'optimizer_state': self.optimizer_state,
            'calibration_tokens': self.calibration_tokens,
            'mla_rope_dim': self.mla_rope_dim,
            'set': list(self.overrides),
        }

    def up_steps(self, alpha: float) -> int:
        return round(alpha * self.steps)  # as uptrain_config

    def totals(self) -> list[int]:
        """The from-scratch budgets: N + round(alpha·N) at each of `scratch_fractions`."""
        return sorted({self.steps + self.up_steps(a) for a in self.scratch_fractions})

    def recipe_lr(self) -> float:
        """The recipe's peak learning rate, the source's."""
        return float(base_config(self, 0, 1).train.lr)

    def grid(self) -> tuple[float, ...]:
        """The learning rates every trained arm runs at: `lrs`, or the recipe's."""
        return self.lrs or (self.recipe_lr(),)


def method_label(method: str, schedule: str) -> str:
    """A conversion's name in the tables: its method, prefixed by its schedule if not
    'continue' (e.g. 'rewarm-aligned')."""
    return method if schedule == 'continue' else f'{schedule}-{method}'


# The config keys `base_config` and the arms set in every run, and from what: a --set of one
# would be replaced silently.
ABLATION_SETS = {
    'seed': '--seeds',
    'data.path': '--data_path',
    'data.split': 'the part of the corpus each arm trains on',
    'train.steps': '--steps and --fractions',
    'eval_tokens': '--eval_tokens',
    'eval_every': 'the run length (each run is evaluated at its end)',
    'checkpoint_every': 'the run length (each run is checkpointed at its end)',
    'model.attention': 'the arms (--targets, --mla_ranks, --cla)',
}


def base_config(ab: Ablation, seed: int, steps: int, lr: float | None = None):
    """The source (MHA) recipe with the ablation's data (its pretrain part), steps, learning
    rate (None: the recipe's; min_lr scaled with it), evaluation and overrides."""
    config = load_config_file(ab.config_file, attention.baseline()['attention'])
    config = with_overrides(config, list(ab.overrides))
    config.seed = seed
    config.data.update(path=ab.data_path, split=SOURCE_PART)
    config.train.steps = steps
    if lr is not None:
        config.train.update(lr=lr, min_lr=config.train.min_lr * lr / config.train.lr)
    config.eval_tokens = ab.eval_tokens
    config.eval_every = config.checkpoint_every = max(steps, 1)
    return config


def mha_config(ab: Ablation, seed: int, steps: int, lr=None):
    """The source config (MHA) trained from scratch on both training parts, without the part
    settings that run does not read (`reset_idle_data`: the contiguous layout's
    uptrain_fraction)."""
    config = base_config(ab, seed, steps, lr)
    config.data.split = SCRATCH_PART
    reset_idle_data(config.data, default_values('data'))
    return config


def pooled_config(ab: Ablation, num_kv_heads: int, seed: int, steps: int, lr=None):
    """The source config with its K/V heads pooled to `num_kv_heads`, trained from scratch on
    both training parts."""
    config = mha_config(ab, seed, steps, lr)
    config.model.update(attention.VARIANTS[config.model.attention].pooled(num_kv_heads))
    return config


def parse_cla(ab: Ablation, spec: str) -> tuple[int, int]:
    """A CLA arm ('cla<n>', 'mqa_cla<n>', 'gqa<g>_cla<n>': a variant name with '_cla<n>', n >= 2)
    -> (num_kv_heads, n); 0 heads = the source's."""
    try:
        settings = attention.parse_variant(spec)
    except ValueError:
        settings = {}
    n = settings.pop('kv_share_every', 1)
    if n < 2:
        raise ValueError(
            f"--cla: expected 'cla<n>', 'mqa_cla<n>' or 'gqa<g>_cla<n>', n >= 2, got {spec!r}"
        )
    source_model = base_config(ab, 0, 1).model
    kind = attention.VARIANTS.get(settings.get('attention', source_model.attention))
    if kind is not attention.VARIANTS[source_model.attention]:
        raise ValueError(  # the conversion pools heads of the source's kind only
            f"--cla: arm {spec}: CLA arms keep the source's attention "
            f"({source_model.attention!r}: 'cla<n>', 'mqa_cla<n>', 'gqa<g>_cla<n>'); "
            f'{settings["attention"]!r} with CLA is not converted (MLA arms: --mla_ranks)'
        )
    source = check_model_config(source_model).num_kv_heads
    target = base_config(ab, 0, 1)
    target.model.update(settings)
    try:
        g = check_model_config(target.model).num_kv_heads
    except ValueError as e:
        raise ValueError(f'--cla: arm {spec}: {e}') from None
    return (0 if g == source else g), n


def cla_label(g: int, n: int) -> str:
    return {0: '', 1: 'MQA-'}.get(g, f'GQA-{g}-') + f'CLA{n}'


def cla_config(ab: Ablation, g: int, n: int, seed: int, steps: int, lr=None):
    """The source config with K/V shared by every n layers (and pooled to g heads, 0 = kept),
    trained from scratch on both training parts."""
    if g:
        config = pooled_config(ab, g, seed, steps, lr)
    else:
        config = mha_config(ab, seed, steps, lr)
    config.model.kv_share_every = n
    return config


def latent_variant() -> str:
    """The attention variant with a KV latent (MLA), the target of latent conversions."""
    return next(name for name, cls in attention.VARIANTS.items() if cls.latent_kv)


def latent_config(ab: Ablation, rank: int, seed: int, steps: int, lr=None, rope_heads: int = 1):
    """The source config as the MLA that conversion to latent rank `rank` with `rope_heads` RoPE
    keys builds (its RoPE base left as the source's), trained from scratch on both training
    parts."""
    config = mha_config(ab, seed, steps, lr)
    D, P = check_model_config(config.model).head_dim, ab.mla_rope_dim
    target = latent_variant()
    config.model.update(attention=target, num_kv_heads=0)
    config.model[attention.VARIANTS[target].config_section].update(
        kv_lora_rank=rank,
        q_lora_rank=0,
        qk_nope_head_dim=D - P,
        qk_rope_head_dim=P,
        rope_heads=rope_heads,
        v_head_dim=D,
    )
    return config


def latent_label(rank: int, rope_heads: int) -> str:
    """'MLA-64' (one shared RoPE key), 'MLA-64-k4' (4 RoPE keys)."""
    return f'MLA-{rank}' + (f'-k{rope_heads}' if rope_heads > 1 else '')


def _pooled_options(ab: Ablation, g: int, kv_share_every: int = 1) -> dict[str, ConversionOptions]:
    """{method label: options} of the pooled arms to `g` KV heads (0 = the source's), K/V shared
    by every `kv_share_every` layers, every method × schedule."""
    out = {}
    for schedule in ab.schedules:
        for name in ab.methods:
            grouping, _, method = name.rpartition('-')
            out[method_label(name, schedule)] = ConversionOptions(
                num_kv_heads=g,
                kv_share_every=kv_share_every,
                method=method,
                grouping=grouping or 'contiguous',
                optimizer_state=ab.optimizer_state,
                calibration_tokens=ab.calibration_tokens,
                schedule=schedule,
                data_split=UPTRAIN_PART,
            )
    return out


def arms(ab: Ablation) -> dict[str, tuple[Callable, dict[str, ConversionOptions]]]:
    """{target label: (scratch config fn(seed, steps, lr), {method label: ConversionOptions})};
    a bad method or combination fails here, before any training."""
    out = {}
    for g in ab.targets:
        label = 'MQA' if g == 1 else f'GQA-{g}'
        out[label] = (
            lambda s, t, lr=None, g=g: pooled_config(ab, g, s, t, lr),
            _pooled_options(ab, g),
        )
    for g, n in (parse_cla(ab, spec) for spec in ab.cla):
        out[cla_label(g, n)] = (
            lambda s, t, lr=None, g=g, n=n: cla_config(ab, g, n, s, t, lr),
            _pooled_options(ab, g, kv_share_every=n),
        )
    for rank, r in itertools.product(ab.mla_ranks, ab.mla_rope_heads):
        methods = {
            method_label('joint_svd', schedule): ConversionOptions(
                target=latent_variant(),
                kv_lora_rank=rank,
                qk_rope_head_dim=ab.mla_rope_dim,
                rope_heads=r,
                method='joint_svd',
                optimizer_state=ab.optimizer_state,
                calibration_tokens=ab.calibration_tokens,
                schedule=schedule,
                data_split=UPTRAIN_PART,
            )
            for schedule in ab.schedules
        }
        out[latent_label(rank, r)] = (
            lambda s, t, lr=None, c=rank, r=r: latent_config(ab, c, s, t, lr, r),
            methods,
        )
    return out
