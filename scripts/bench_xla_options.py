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

import time

import jax
import numpy as np
from absl import flags

from lm.cli import RecipeFlags, bootstrap, run_app
from lm.config import with_overrides
from lm.data.corpus import call_batch
from lm.model.accounting import flops_per_token
from lm.train.perf import mfu, peak_flops
from lm.train.run import assemble
from lm.train.step import device_call_batch, make_train_step, parse_xla_options

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
    'name:key=value[,key=value...]; compared against the default options ("base").',
)
_ARMS = flags.DEFINE_multi_string(
    'config_arm',
    [],
    'name:key=value[,key=value...]: config overrides (on top of --set), lowered on their own '
    'and compiled with the default options; compared against "base".',
)
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds; each option set runs once per round.')
_CALLS = flags.DEFINE_integer('calls', 5, 'Timed calls per option set per round.')


def parse_option(spec: str) -> tuple[str, dict]:
    """'name:key=value,key=value' -> (name, {key: value}); 'true' / 'false' become bools."""
    name, sep, pairs = spec.partition(':')
    if not sep or not name:
        raise ValueError(f'--option={spec!r}: expected name:key=value[,key=value...]')
    return name, parse_xla_options(pairs, f'--option={spec!r}')


def parse_arm(spec: str) -> tuple[str, list[str]]:
    """'name:key=value,key=value' -> (name, ['key=value', ...])."""
    name, sep, pairs = spec.partition(':')
    if not sep or not name or not pairs:
        raise ValueError(f'--config_arm={spec!r}: expected name:key=value[,key=value...]')
    return name, pairs.split(',')


def lowered_step(config) -> tuple:
    """(lowered train step, its fresh state, one call's batch, mesh, model FLOPs per step) of
    `config`."""
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
    return (
        lowered,
        exp.state,
        batch,
        ctx.mesh,
        tokens * flops_per_token(exp.model_cfg, c.data.seq_len),
    )


def run() -> int:
    option_sets = dict([('base', {})] + [parse_option(s) for s in _OPTIONS.value if s])
    arms = dict(parse_arm(s) for s in _ARMS.value)
    if clash := sorted(set(arms) & set(option_sets)):
        raise ValueError(f'--config_arm and --option share the name(s) {clash}')
    config = RECIPE.config(_VARIANT.value)
    arm_configs = {
        name: with_overrides(config, pairs, '--config_arm') for name, pairs in arms.items()
    }
    bootstrap(config, compilation_cache=False)
    lowered, state, batch, mesh, flops = lowered_step(config)
    k = config.train.steps_per_call
    # name -> (compiled program, the state it advances, its batch); option sets share the
    # base's state (donated: each program takes the state the previous one returned)
    programs = {
        name: (lowered.compile(compiler_options=o), 'base', batch)
        for name, o in option_sets.items()
    }
    states = {'base': state}
    arm_flops_per_step = {name: flops for name in option_sets}  # model FLOPs of one step
    for name, arm_config in arm_configs.items():
        arm_lowered, states[name], arm_batch, _, arm_flops = lowered_step(arm_config)
        arm_flops_per_step[name] = arm_flops
        programs[name] = (arm_lowered.compile(), name, arm_batch)
    times: dict[str, list[float]] = {name: [] for name in programs}
    with jax.set_mesh(mesh):
        for _ in range(_ROUNDS.value):
            for name, (fn, owner, arm_batch) in programs.items():
                states[owner], metrics = fn(states[owner], arm_batch)  # warm this program up
                jax.block_until_ready(metrics)
                for _ in range(_CALLS.value):
                    t = time.perf_counter()
                    states[owner], metrics = fn(states[owner], arm_batch)
                    jax.block_until_ready(metrics)
                    times[name].append((time.perf_counter() - t) / k)
    base = float(np.median(times['base']))
    peak, peak_source = peak_flops()
    print(
        f'XLA options A/B: {RECIPE.name}:{_VARIANT.value}, '
        f'{jax.device_count()} x {jax.devices()[0].device_kind}, {k} steps per call, '
        f'{_ROUNDS.value} rounds x {_CALLS.value} calls; MFU: {peak_source}'
    )
    print('| options | step ms (median) | min | vs base | MFU |')
    print('|---|---|---|---|---|')
    for name, ts in times.items():
        median = float(np.median(ts))
        util = mfu(1 / median, arm_flops_per_step[name], peak)
        cells = f'{median * 1e3:.1f} | {min(ts) * 1e3:.1f} | {base / median:.2f}x'
        print(f'| {name} | {cells} | {"-" if util is None else f"{util:.1%}"} |')
    return 0


if __name__ == '__main__':
    run_app(run)
