"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, as a plan for the experiment
runner (lm.experiments.runner); its settings and arms are lm.experiments.ablation_arms, its tables
lm.experiments.ablation_tables.

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

from lm.convert.uptrain import ConversionOptions, check_conversion, convert_checkpoint
from lm.experiments.ablation_arms import (
    SCRATCH_PART,
    SOURCE,
    SOURCE_PART,
    UPTRAIN_PART,
    Ablation,
    arms,
    base_config,
    mha_config,
)
from lm.experiments.runner import RunStopped, Spec
from lm.model import attention
from lm.model.accounting import kv_cache_bytes_per_token
from lm.model.transformer import check_model_config
from lm.train import loop
from lm.train.run import check_config, check_devices

# What a from-scratch run depends on; uptraining runs depend on every setting.
SCRATCH_SETTINGS = ('data_path', 'steps', 'eval_tokens', 'set')


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
