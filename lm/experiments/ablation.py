"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, as a plan for the experiment
runner (lm.experiments.runner); its tables are in lm.experiments.ablation_tables.

Per seed (one lane each): the MHA source trained for N steps on the corpus's `pretrain` part
(lm.data.parts); every conversion arm (GQA / MQA by a pooling method, cross-layer attention by the
same methods, MLA at a latent rank) under every schedule of `schedules` needs that source, converts
its checkpoint and uptrains for round(alpha·N) steps on the `uptrain` part; every target trained
from scratch for N + round(alpha·N) steps (the same batch and seq_len: the same tokens) on both
parts, at the alphas of `scratch_fractions` (with `mha_scratch`, the source's MHA too: what
the same tokens buy without converting). Every trained arm runs at each learning rate of `lrs`
(lm.experiments.lr_grid picks one per arm on the validation part); every run is scored on the
validation part (selection) and, at its last step, on the held-out part (the report). A
from-scratch run's fingerprint is the settings it depends on (`SCRATCH_SETTINGS`) with its part
and learning rate, a conversion arm's every setting with its schedule, part and learning rate.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from collections.abc import Callable

import ml_collections
from absl import logging

from lm.config import load_config_file, with_overrides
from lm.convert.methods import SCHEDULES
from lm.convert.uptrain import ConversionOptions, check_conversion, convert_checkpoint
from lm.experiments.runner import RunStopped, Spec
from lm.model import attention
from lm.model.accounting import kv_cache_bytes_per_token
from lm.model.transformer import check_model_config
from lm.train import loop
from lm.train.run import check_config, check_devices

# What a from-scratch run depends on; uptraining runs depend on every setting.
SCRATCH_SETTINGS = ('data_path', 'steps', 'eval_tokens', 'set')
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
    """The source config (MHA) trained from scratch on both training parts."""
    config = base_config(ab, seed, steps, lr)
    config.data.split = SCRATCH_PART
    return config


def pooled_config(ab: Ablation, num_kv_heads: int, seed: int, steps: int, lr=None):
    """The source config with its K/V heads pooled to `num_kv_heads`, trained from scratch on
    both training parts."""
    config = base_config(ab, seed, steps, lr)
    config.data.split = SCRATCH_PART
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
        config = base_config(ab, seed, steps, lr)
        config.data.split = SCRATCH_PART
    config.model.kv_share_every = n
    return config


def latent_variant() -> str:
    """The attention variant with a KV latent (MLA), the target of latent conversions."""
    return next(name for name, cls in attention.VARIANTS.items() if cls.latent_kv)


def latent_config(ab: Ablation, rank: int, seed: int, steps: int, lr=None, rope_heads: int = 1):
    """The source config as the MLA that conversion to latent rank `rank` with `rope_heads` RoPE
    keys builds (its RoPE base left as the source's), trained from scratch on both training
    parts."""
    config = base_config(ab, seed, steps, lr)
    config.data.split = SCRATCH_PART
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


def _trainer(name: str, make: Callable[[str], ml_collections.ConfigDict], tb_dir: str):
    """A Spec's run: trains `make(workdir)` (a config, or a conversion that writes the run's
    first checkpoint and returns its config) with lm.train.loop; result: {'eval': validation
    metrics, 'heldout': held-out metrics}, both at the last step."""

    def run(workdir: str) -> dict:
        out = loop.train(make(workdir), workdir, tb_dir)
        if not os.path.exists(os.path.join(workdir, 'results.json')):  # written at the last step
            why = f'by {signal.Signals(out["signal"]).name} ' if out['signal'] else ''
            raise RunStopped(
                f'{name} stopped {why}at step {out["step"]} (its checkpoint kept; the ablation '
                'starts an unfinished run again from its beginning)'
            )
        logging.info('%s: eval loss %.4f', name, out['eval']['loss'])
        return {'eval': out['eval'], 'heldout': out['heldout']}

    return run


def _suffix(ab: Ablation, lr: float) -> str:
    return f'_lr{lr:g}' if ab.lrs else ''  # without a grid, the names runs always had


def _lane(ab: Ablation, out_dir: str, seed: int, by_label: dict) -> list[Spec]:
    """One seed's runs: its source, then per target its conversion arms and baselines."""
    tb, lane, src = os.path.join(out_dir, 'tb'), f'seed{seed}', f'mha_s{seed}'
    scratch = {k: v for k, v in ab.settings().items() if k in SCRATCH_SETTINGS}
    lr0 = ab.recipe_lr()
    source = _trainer(src, lambda w: base_config(ab, seed, ab.steps), tb)
    fp = {**scratch, 'split': SOURCE_PART, 'lr': lr0}
    specs = [Spec(src, fp, source, (SOURCE, 'scratch', 0.0, lr0), seed, lane=lane)]
    if ab.mha_scratch:
        specs += _scratch_specs(
            ab,
            attention.baseline()['attention'],  # run names mha_scratch_<steps>_s<seed>
            SOURCE,
            lambda s, t, lr=None: mha_config(ab, s, t, lr),
            seed,
            lane,
            tb,
        )
    for label, (make, methods) in by_label.items():
        for method, options in methods.items():
            for alpha in ab.fractions:
                if alpha == 0 and options.schedule != ab.schedules[0]:
                    continue  # nothing trained: the same model under every schedule
                for lr in ab.grid() if alpha else ab.grid()[:1]:
                    name = f'{label}_{method}_a{alpha:g}{_suffix(ab, lr)}_s{seed}'
                    opts = dataclasses.replace(options, fraction=alpha, seed=seed, lr=lr)
                    convert = _converter(os.path.join(out_dir, src), opts)
                    fp = {**ab.settings(), 'schedule': options.schedule}
                    fp.update(split=UPTRAIN_PART, lr=lr)
                    arm = (label, method, alpha, lr)
                    specs.append(
                        Spec(name, fp, _trainer(name, convert, tb), arm, seed, (src,), lane)
                    )
        specs += _scratch_specs(ab, label, label, make, seed, lane, tb)
    return specs


def _scratch_specs(
    ab: Ablation, prefix: str, label: str, make: Callable, seed: int, lane: str, tb: str
) -> list[Spec]:
    """One seed's from-scratch runs of target `label` (config `make(seed, steps, lr)`) at every
    budget and learning rate; run names start with `prefix`."""
    scratch = {k: v for k, v in ab.settings().items() if k in SCRATCH_SETTINGS}
    specs = []
    for total in ab.totals():
        for lr in ab.grid():
            name = f'{prefix}_scratch_{total}{_suffix(ab, lr)}_s{seed}'
            run = _trainer(name, lambda w, t=total, m=make, lr=lr: m(seed, t, lr), tb)
            fp = {**scratch, 'split': SCRATCH_PART, 'lr': lr}
            specs.append(Spec(name, fp, run, (label, 'scratch', total, lr), seed, lane=lane))
    return specs


def _arm_flags(label: str) -> str:
    """The flags that make the target `label` (latent_label, cla_label or a pooled target)."""
    if label.startswith('MLA-'):
        return '--mla_ranks/--mla_rope_heads/--mla_rope_dim'
    return '--cla' if 'CLA' in label else '--targets'


def plan(ab: Ablation, out_dir: str) -> list[Spec]:
    """The ablation's runs, a lane per seed ('seed<k>'): the source first, then per target its
    conversion arms (each needing the source) and its from-scratch baselines. Arms (keys of
    the validation values, lm.experiments.lr_grid): (SOURCE, 'scratch', 0.0, lr),
    (label, method label, alpha, lr) and (label, 'scratch', total steps, lr). Every target's
    model and conversion is checked first: a bad one fails before any training."""
    by_label = arms(ab)
    source = check_model_config(base_config(ab, 0, 1).model)
    for label, (make, methods) in by_label.items():
        try:
            check_model_config(make(0, ab.steps).model)
            for options in methods.values():
                check_conversion(source, options)
        except ValueError as e:
            raise ValueError(f'{_arm_flags(label)}: arm {label}: {e}') from None
    specs = [s for seed in range(ab.seeds) for s in _lane(ab, out_dir, seed, by_label)]
    # An unfinished run starts clean: a conversion writes into an empty workdir.
    return [dataclasses.replace(s, resume=False) for s in specs]


def check_configs(ab: Ablation) -> None:
    """The checks train.py makes before any work (`check_config`, `check_devices`: settings,
    data files, evaluation) on the source's config and every from-scratch config, at every
    learning rate of the grid: a bad --set, --eval_tokens or --data_path fails before any run
    starts (the conversion arms train the source's config on another part, fewer steps)."""
    makes = [lambda s, t, lr: base_config(ab, s, t, lr)]
    makes += [make for make, _ in arms(ab).values()]
    for make in makes:
        for total, lr in itertools.product(ab.totals() or [ab.steps], ab.grid()):
            check_devices(check_config(make(ab.seeds - 1, total, lr)))


def _converter(source_dir: str, options: ConversionOptions) -> Callable[[str], object]:
    """The setup of a conversion arm: converts the source's checkpoint into the workdir."""
    return lambda workdir: convert_checkpoint(source_dir, options, workdir)


def kv_bytes(ab: Ablation) -> dict[str, int]:
    """{label: KV-cache bytes per token (bfloat16, all layers)} of the source and every target."""
    makes = {SOURCE: lambda s, t: base_config(ab, s, t)}
    makes.update({label: make for label, (make, _) in arms(ab).items()})
    return {
        label: kv_cache_bytes_per_token(check_model_config(make(0, ab.steps).model))
        for label, make in makes.items()
    }
