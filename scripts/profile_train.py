"""Where a train step's time goes: a jax.profiler trace of --steps steps, with every XLA op
(fusion) attributed to a category by what its fused computation contains.

  python scripts/profile_train.py                    # shakespeare_char, MHA
  python scripts/profile_train.py --variant=mla --top=25 --set=model.dtype=bfloat16

Categories (lm/train/profile.py): matmul (contains a dot or convolution), transcendental (exp,
log, logistic, tanh, rsqrt, ...), layout (copy / transpose only), reduction, elementwise, and
on a GPU library (cuBLAS / cuDNN kernels); then the ops grouped by the JAX operation they came
from (HLO op_name). The trace itself stays in
--trace_dir for TensorBoard's profile plugin or Perfetto.
"""

import time

import jax
from absl import flags

from lm.cli import RecipeFlags, bootstrap, check_writable_dir, run_app
from lm.data import train_batch
from lm.sharding import global_batch
from lm.train import (
    assemble,
    check_not_in_checkpoints,
    load_profile,
    make_train_step,
    print_profile,
)

RECIPE = RecipeFlags(__name__)
_VARIANT = flags.DEFINE_string('variant', 'mha', 'Attention variant.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Profiled steps.')
_TOP = flags.DEFINE_integer('top', 15, 'Individual ops to list.')
_TRACE = flags.DEFINE_string('trace_dir', '/tmp/lm_profile', 'Where the trace is written.')


def run() -> int:
    if _STEPS.value < 1:
        raise ValueError(f'--steps must be >= 1 (profiled steps), got {_STEPS.value}')
    check_writable_dir(_TRACE.value, '--trace_dir')
    check_not_in_checkpoints(_TRACE.value, '--trace_dir')
    config = RECIPE.config(_VARIANT.value)
    bootstrap(config, compilation_cache=False)
    exp = assemble(config, state='init', data=True)
    c = exp.config
    with jax.set_mesh(exp.ctx.mesh):
        state = exp.state
        batch = global_batch(
            train_batch(
                exp.corpus.tokens['train'],
                seed=c.seed,
                step=0,
                batch_size=c.train.batch_size,
                seq_len=c.data.seq_len,
            ),
            exp.ctx.batch_sharding,
        )
        compiled = make_train_step(exp.ctx, c.train.grad_accum_steps).lower(state, batch).compile()
        for _ in range(5):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        t = time.perf_counter()
        for _ in range(_STEPS.value):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        wall = (time.perf_counter() - t) / _STEPS.value
        jax.profiler.start_trace(_TRACE.value)
        for _ in range(_STEPS.value):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
    p = load_profile(_TRACE.value, compiled.as_text(), _STEPS.value)
    where = 'device kernels' if p.device else 'ops traced (ops on 2 threads can overlap)'
    print(
        f'{_VARIANT.value}: {wall * 1e3:.1f} ms/step wall (mean of {_STEPS.value}); '
        f'{where}: {p.busy:.1f} ms/step'
    )
    print_profile(p, _TOP.value)
    return 0


if __name__ == '__main__':
    run_app(run)
