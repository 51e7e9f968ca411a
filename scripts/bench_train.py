"""Training-step throughput and MFU per attention variant.

For each variant of a config (default: configs/shakespeare_char.py, nanoGPT's CPU recipe) it
reports the train step's compile time, the median step time over --steps steps after --warmup
(each call waited for; with config.train.steps_per_call = K, a call runs K steps and its time is
divided by K), the host time to dispatch a step, the median step time with the data
pipeline included (batch built on the host and transferred every step), tokens/s, model FLOPs
per token (6N + 12·L·H·Q·T, PaLM App. B), achieved FLOP/s and MFU against the peak measured in
the same process (CPU: float32 2048³ jnp.dot; GPU/TPU: the per-device table in lm/perf.py).

  python scripts/bench_train.py
  python scripts/bench_train.py --variants=mha --steps=100 --json=bench.json
  python scripts/bench_train.py --config=configs/gpt125m.py --variants=mha   # on a GPU
"""

import json
import time

import jax
import numpy as np
from absl import flags

from lm import accounting, perf
from lm.cli import RecipeFlags, bootstrap, run_app
from lm.data import call_batch
from lm.experiment import prepare
from lm.train_step import device_call_batch, init_state, make_train_step

RECIPE = RecipeFlags(__name__)
_VARIANTS = flags.DEFINE_list('variants', ['mha', 'gqa2', 'mqa', 'mla'], 'Variants to time.')
_STEPS = flags.DEFINE_integer('steps', 60, 'Timed steps (median reported).')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Untimed steps after compiling.')
_JSON = flags.DEFINE_string('json', '', 'Also write the rows as JSON here.')


def bench(variant: str, peak_total: float) -> dict:
    exp = prepare(RECIPE.config(variant))
    c, ctx = exp.config, exp.ctx
    k = c.train.steps_per_call
    with jax.set_mesh(ctx.mesh):
        state = init_state(ctx, exp.model_cfg, c.seed)
        step_fn = make_train_step(ctx, c.train.grad_accum_steps, k)

        def device_batch(call: int) -> jax.Array:
            """The batch of one call: [B, T+1], or [k, B, T+1] for k steps per call."""
            local = call_batch(
                exp.corpus.tokens['train'],
                seed=c.seed,
                step=call * k,
                steps=k,
                batch_size=c.train.batch_size,
                seq_len=c.data.seq_len,
            )
            return device_call_batch(ctx, local)

        batch = device_batch(0)
        t = time.perf_counter()
        compiled = step_fn.lower(state, batch).compile()
        compile_s = time.perf_counter() - t
        calls = -(-_STEPS.value // k)
        for _ in range(-(-_WARMUP.value // k)):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        step_times, dispatch = [], []
        for _ in range(calls):
            t = time.perf_counter()
            state, metrics = compiled(state, batch)
            dispatch.append((time.perf_counter() - t) / k)
            jax.block_until_ready(metrics)
            step_times.append((time.perf_counter() - t) / k)
        with_data = []
        for call in range(calls):
            t = time.perf_counter()
            state, metrics = compiled(state, device_batch(call))
            jax.block_until_ready(metrics)
            with_data.append((time.perf_counter() - t) / k)
    dt = float(np.median(step_times))
    tokens = c.train.batch_size * c.data.seq_len
    fpt = accounting.flops_per_token(exp.model_cfg, c.data.seq_len)
    return {
        'variant': variant,
        'steps_per_call': k,
        'compile_s': compile_s,
        'step_time_ms': dt * 1e3,
        'dispatch_ms': float(np.median(dispatch)) * 1e3,
        'step_time_with_data_ms': float(np.median(with_data)) * 1e3,
        'tokens_per_sec': tokens / dt,
        'model_flops_per_token': fpt,
        'achieved_flops': fpt * tokens / dt,
        'peak_flops': peak_total,
        'mfu': perf.mfu(tokens / dt, fpt, peak_total),
        'params': accounting.param_counts(exp.model_cfg)['total'],
    }


def run() -> int:
    bootstrap(RECIPE.config(_VARIANTS.value[0]), compilation_cache=False)
    peak_total, source = perf.peak_flops()
    rows = [bench(v, peak_total) for v in _VARIANTS.value]
    print(
        f'train-step benchmark: {jax.device_count()} x {jax.devices()[0].device_kind}, '
        f'config {RECIPE.name}, peak {peak_total / 1e9:,.0f} GFLOP/s '
        f'({source}); medians over {_STEPS.value} steps (calls of steps/call steps, each '
        'timed and divided by it)'
    )
    print(
        '| variant | params | steps/call | compile s | step ms | dispatch ms/step | '
        'step ms with data | tokens/s | MFLOPs/token | GFLOP/s | MFU |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        print(
            f'| {r["variant"]} | {r["params"]:,} | {r["steps_per_call"]} | {r["compile_s"]:.1f} | '
            f'{r["step_time_ms"]:.1f} | {r["dispatch_ms"]:.2f} | '
            f'{r["step_time_with_data_ms"]:.1f} | {r["tokens_per_sec"]:,.0f} | '
            f'{r["model_flops_per_token"] / 1e6:.2f} | {r["achieved_flops"] / 1e9:.1f} | '
            f'{r["mfu"]:.1%} |'
        )
    if _JSON.value:
        with open(_JSON.value, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    run_app(run)
