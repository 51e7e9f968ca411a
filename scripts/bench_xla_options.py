r"""A/B of XLA compiler options (and config settings) on the train step, interleaved in one
process.

The train step of a config (default: configs/shakespeare_char.py, MHA, its steps_per_call) is
lowered once and compiled once per option set; each --config_arm (config overrides, e.g. the
head's logits dtype) is lowered from its own copy of the config and compiled with the default
options (every arm also gets the config's own train.xla_options). The compiled programs then
take turns for --rounds rounds of --calls calls each, so every arm sees the same minutes of a
noisy machine. Prints the median ms/step per arm, its speed relative to the first, and its MFU
where the device has a stated peak (lm.train.perf).

  python scripts/bench_xla_options.py
  python scripts/bench_xla_options.py \
      --option=noynn:xla_cpu_experimental_ynn_fusion_type= \
      --option=xnn:xla_cpu_use_xnnpack=true
  python scripts/bench_xla_options.py --set=model.dtype=bfloat16 --option= \
      --config_arm=logits16:model.logits_dtype=compute
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import flags

from lm.cli import RecipeFlags, bootstrap, run_app
from lm.config import hides_a_pair, split_items, with_overrides
from lm.data import call_batch
from lm.model import flops_per_token
from lm.train import (
    assemble,
    check_config,
    check_devices,
    device_call_batch,
    make_train_step,
    mfu,
    parse_xla_options,
    peak_flops,
)

RECIPE = RecipeFlags(__name__)
_VARIANT = flags.DEFINE_string('variant', 'mha', 'Attention variant.')
_OPTIONS = flags.DEFINE_multi_string(
    'option',
    [
        'noynn:xla_cpu_experimental_ynn_fusion_type=',
        'ynn_dots:xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
        'eigen_1thread:xla_cpu_multi_thread_eigen=false',
        'xnnpack:xla_cpu_use_xnnpack=true',
        'tiling_propagation:xla_cpu_experimental_enable_tiling_propagation=true',
    ],
    'name:key=value[,key=value...]; compared against the default options ("base"). Pairs are '
    'separated by ";" instead (quoted) when a value holds commas.',
)
_ARMS = flags.DEFINE_multi_string(
    'config_arm',
    [],
    'name:key=value[,key=value...]: config overrides (on top of --set), lowered on their own '
    'and compiled with the default options; compared against "base". Pairs are separated by '
    '";" instead (quoted) when a value holds commas.',
)
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds; each option set runs once per round.')
_CALLS = flags.DEFINE_integer('calls', 5, 'Timed calls per option set per round.')


def parse_option(spec: str) -> tuple[str, dict]:
    """'name:key=value,key=value' -> (name, {key: value}); 'true' / 'false' become bools; pairs
    are separated by ';' instead when a value holds commas (`split_items`)."""
    name, sep, pairs = spec.partition(':')
    if not sep or not name:
        raise ValueError(f'--option={spec!r}: expected name:key=value[,key=value...]')
    return name, parse_xla_options(' '.join(split_items(pairs)), f'--option={spec!r}')


def parse_arm(spec: str) -> tuple[str, list[str]]:
    """'name:key=value,key=value' -> (name, ['key=value', ...]); pairs are separated by ';'
    instead when a value holds commas (`split_items`)."""
    name, sep, pairs = spec.partition(':')
    if not sep or not name or not pairs:
        raise ValueError(f'--config_arm={spec!r}: expected name:key=value[,key=value...]')
    items = split_items(pairs)
    if ';' in pairs and any(hides_a_pair(item.partition('=')[2]) for item in items):
        raise ValueError(
            f'--config_arm={spec!r}: a pair holds a second key=value; with ";", '
            'separate every pair by ";"'
        )
    return name, items


@dataclasses.dataclass
class Arm:
    """One compiled train step under test and what timing it needs."""

    program: Callable
    owner: str  # the arm whose state it advances (option sets share the base's)
    batch: jax.Array
    steps_per_call: int
    flops: float  # model FLOPs of one optimizer step


def lowered_step(config: ml_collections.ConfigDict) -> tuple[Any, dict, Arm]:
    """(lowered train step, its fresh state, its Arm without a program) of `config`."""
    exp = assemble(config, state='init', data=True)
    c, ctx = exp.config, exp.ctx
    k = c.train.steps_per_call
    local = call_batch(
        exp.corpus.tokens['train'],
        seed=c.seed,
        step=0,
        steps=k,
        batch_size=c.train.batch_size,
        seq_len=c.data.seq_len,
    )
    with jax.set_mesh(ctx.mesh):
        batch = device_call_batch(ctx, local)
        lowered = make_train_step(ctx, c.train.grad_accum_steps, k).lower(exp.state, batch)
    tokens = c.train.batch_size * c.data.seq_len
    flops = tokens * flops_per_token(exp.model_cfg, c.data.seq_len)
    return lowered, exp.state, Arm(None, '', batch, k, flops)


def arm_configs(config: ml_collections.ConfigDict, names: set[str]) -> dict:
    """--config_arm's configs by name, each checked (one-line errors before any compile)."""
    arms = {}
    for spec in _ARMS.value:
        name, pairs = parse_arm(spec)
        if name in arms or name in names:
            raise ValueError(f'--config_arm={spec!r}: the name {name!r} is taken')
        if any(pair.strip().startswith('mesh.') for pair in pairs):
            raise ValueError(f'--config_arm={spec!r}: arms share the base mesh; use --set')
        arms[name] = with_overrides(config, pairs, f'--config_arm={name}')
    return arms


def run() -> int:
    for flag in (_ROUNDS, _CALLS):
        if flag.value < 1:
            raise ValueError(f'--{flag.name} must be >= 1, got {flag.value}')
    option_sets = {'base': {}}
    for spec in filter(None, _OPTIONS.value):
        name, options = parse_option(spec)
        if name in option_sets:
            raise ValueError(f'--option={spec!r}: the name {name!r} is taken')
        option_sets[name] = options
    config = RECIPE.config(_VARIANT.value)
    configs = arm_configs(config, set(option_sets))
    bootstrap(config, compilation_cache=False)
    for name, arm_config in configs.items():  # what each arm's assemble checks without data
        try:
            check_devices(check_config(arm_config))
        except ValueError as e:
            raise ValueError(f'--config_arm={name}: {e}') from None
    lowered, state, base = lowered_step(config)
    arms = {
        name: dataclasses.replace(base, program=lowered.compile(compiler_options=o), owner='base')
        for name, o in option_sets.items()
    }
    states = {'base': state}
    for name, arm_config in configs.items():
        arm_lowered, states[name], arm = lowered_step(arm_config)
        arms[name] = dataclasses.replace(arm, program=arm_lowered.compile(), owner=name)
    times = time_arms(arms, states, base.batch.sharding.mesh)
    peak, peak_source = peak_flops(config.train.peak_flops)
    print(
        f'XLA options A/B: {RECIPE.name}:{_VARIANT.value}, '
        f'{jax.device_count()} x {jax.devices()[0].device_kind}, '
        f'{base.steps_per_call} steps per call (base), '
        f'{_ROUNDS.value} rounds x {_CALLS.value} calls; MFU: {peak_source}'
    )
    print('| options | step ms (median) | min | vs base | MFU |')
    print('|---|---|---|---|---|')
    median_base = float(np.median(times['base']))
    for name, ts in times.items():
        median = float(np.median(ts))
        util = mfu(1 / median, arms[name].flops, peak)
        cells = f'{median * 1e3:.1f} | {min(ts) * 1e3:.1f} | {median_base / median:.2f}x'
        print(f'| {name} | {cells} | {"-" if util is None else f"{util:.1%}"} |')
    return 0


def time_arms(arms: dict[str, Arm], states: dict, mesh: Any) -> dict[str, list[float]]:
    """Seconds per optimizer step of each call, the arms taking turns (each call donates the
    state its owner holds and returns the next)."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    with jax.set_mesh(mesh):
        for _ in range(_ROUNDS.value):
            for name, arm in arms.items():
                states[arm.owner], metrics = arm.program(states[arm.owner], arm.batch)  # warm up
                jax.block_until_ready(metrics)
                for _ in range(_CALLS.value):
                    t = time.perf_counter()
                    states[arm.owner], metrics = arm.program(states[arm.owner], arm.batch)
                    jax.block_until_ready(metrics)
                    times[name].append((time.perf_counter() - t) / arm.steps_per_call)
    return times


if __name__ == '__main__':
    run_app(run)
