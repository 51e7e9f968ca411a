r"""A/B of XLA compiler options on the train step, interleaved in one process.

The train step of a config (default: configs/shakespeare_char.py, MHA, its steps_per_call) is
lowered once and compiled once per option set; the compiled programs then take turns for
--rounds rounds of --calls calls each, so every option set sees the same minutes of a noisy
machine. Prints the median ms/step per option set and its speed relative to the first.

  python scripts/bench_xla_options.py
  python scripts/bench_xla_options.py \
      --option=noynn:xla_cpu_experimental_ynn_fusion_type= \
      --option=xnn:xla_cpu_use_xnnpack=true
"""

import time

import jax
import numpy as np
from absl import flags

from lm.cli import RecipeFlags, bootstrap, run_app
from lm.data.corpus import call_batch
from lm.train.run import assemble
from lm.train.step import device_call_batch, make_train_step

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
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds; each option set runs once per round.')
_CALLS = flags.DEFINE_integer('calls', 5, 'Timed calls per option set per round.')


def parse_option(spec: str) -> tuple[str, dict]:
    """'name:key=value,key=value' -> (name, {key: value}); 'true' / 'false' become bools."""
    name, sep, pairs = spec.partition(':')
    if not sep or not name:
        raise ValueError(f'--option={spec!r}: expected name:key=value[,key=value...]')
    options = {}
    for pair in pairs.split(','):
        key, eq, value = pair.partition('=')
        if not eq:
            raise ValueError(f'--option={spec!r}: {pair!r} is not key=value')
        options[key] = {'true': True, 'false': False}.get(value.lower(), value)
    return name, options


def run() -> int:
    option_sets = dict([('base', {})] + [parse_option(s) for s in _OPTIONS.value])
    config = RECIPE.config(_VARIANT.value)
    bootstrap(config, compilation_cache=False)
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
        state = exp.state
        batch = device_call_batch(ctx, local)
        lowered = make_train_step(ctx, c.train.grad_accum_steps, k).lower(state, batch)
        compiled = {name: lowered.compile(compiler_options=o) for name, o in option_sets.items()}
        times: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(_ROUNDS.value):
            for name, fn in compiled.items():
                state, metrics = fn(state, batch)  # warm this program up again
                jax.block_until_ready(metrics)
                for _ in range(_CALLS.value):
                    t = time.perf_counter()
                    state, metrics = fn(state, batch)
                    jax.block_until_ready(metrics)
                    times[name].append((time.perf_counter() - t) / k)
    base = float(np.median(times['base']))
    print(
        f'XLA options A/B: {RECIPE.name}:{_VARIANT.value}, '
        f'{jax.device_count()} x {jax.devices()[0].device_kind}, {k} steps per call, '
        f'{_ROUNDS.value} rounds x {_CALLS.value} calls'
    )
    print('| options | step ms (median) | min | vs base |')
    print('|---|---|---|---|')
    for name, ts in times.items():
        median = float(np.median(ts))
        print(f'| {name} | {median * 1e3:.1f} | {min(ts) * 1e3:.1f} | {base / median:.2f}x |')
    return 0


if __name__ == '__main__':
    run_app(run)
