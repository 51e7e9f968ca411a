"""Training-step throughput and MFU per attention variant.

For each variant of a config (default: configs/shakespeare_char.py, nanoGPT's CPU recipe) it
reports the train step's compile time, the median step time over --steps steps after --warmup
(each call waited for; with config.train.steps_per_call = K, a call runs K steps and its time is
divided by K), the host time to dispatch a step, the median step time with the data
pipeline included (batch built on the host and transferred every step), tokens/s, model FLOPs
per token (6N + 12·L·H·Q·T, PaLM App. B), achieved FLOP/s and MFU against a stated peak
(--peak_flops per device, else the GPU/TPU table in lm/train/perf.py; a CPU has no table entry,
so its MFU column is '—' unless --peak_flops states one).
The header names the CPU model (and the accelerator kind).

With PyTorch importable it also times the nanoGPT baseline (scripts/baselines/torch_nanogpt.py:
nanoGPT's model at this config's width, depth, heads, context, batch and vocabulary) in the same
process, interleaved with ours: on a CPU eager ('torch'); on a GPU as nanoGPT trains there
(bfloat16 autocast, flash SDPA, fused AdamW) under `torch.compile` ('torch.compile') and eager
('torch'). The timed steps are split into --rounds rounds, each running our steps then as many
steps of each baseline, and each row gives a baseline's median over the rounds of that variant
and the ratio (its ms/step ÷ ours: above 1 means ours is faster). Without PyTorch it says so in
one line.

  python scripts/bench_train.py
  python scripts/bench_train.py --variants=mha --steps=100 --json=bench.json
  python scripts/bench_train.py --config=configs/gpt125m.py --variants=mha   # on a GPU
  python scripts/bench_train.py --torch_baseline=false   # ours only
"""

import json
import os
import time

import jax
import numpy as np
from absl import flags
from baselines import torch_nanogpt

from lm.cli import RecipeFlags, bootstrap, check_writable_dir, run_app
from lm.data import call_batch
from lm.experiments import check_output_path
from lm.model import flops_per_token, param_counts
from lm.train import (
    assemble,
    device_call_batch,
    device_description,
    make_train_step,
    mfu,
    peak_flops,
)

RECIPE = RecipeFlags(__name__)
_VARIANTS = flags.DEFINE_list('variants', ['mha', 'gqa2', 'mqa', 'mla'], 'Variants to time.')
_STEPS = flags.DEFINE_integer('steps', 60, 'Timed steps (median reported).')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Untimed steps after compiling.')
_JSON = flags.DEFINE_string('json', '', 'Also write the rows as JSON here.')
_PEAK = flags.DEFINE_float(
    'peak_flops', 0.0, 'Stated peak FLOP/s per device for MFU (0: the GPU/TPU table; none on CPU).'
)
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Rounds alternating ours and the PyTorch baseline.')
_TORCH = flags.DEFINE_bool(
    'torch_baseline',
    True,
    'Time the PyTorch nanoGPT baseline interleaved (eager on a CPU; compiled and eager on a GPU).',
)

_TORCH_THREADS = flags.DEFINE_integer(
    'torch_threads', 0, "The baseline's torch.set_num_threads; 0 = torch default."
)

# The custom-call target of cuDNN's fused (flash) attention in a compiled GPU program.
CUDNN_FMHA = '__cudnn$fmha'
_steppers: dict[tuple, torch_nanogpt.Stepper] = {}


def peers() -> tuple[str, ...]:
    """The baselines this device times: eager on a CPU, compiled and eager on a GPU."""
    return ('torch.compile', 'torch') if jax.devices()[0].platform == 'gpu' else ('torch',)


def baseline_stepper(c, vocab: int, peer: str) -> torch_nanogpt.Stepper:
    """The PyTorch baseline `peer` at config c's shape (built once per shape, warmed up)."""
    shape = torch_nanogpt.Shape(
        vocab=vocab,
        n_layer=c.model.num_layers,
        n_head=c.model.num_heads,
        n_embd=c.model.d_model,
        block=c.data.seq_len,
        batch=c.train.batch_size,
    )
    if (shape, peer) not in _steppers:
        gpu = jax.devices()[0].platform == 'gpu'
        _steppers[shape, peer] = torch_nanogpt.make_stepper(
            shape,
            threads=_TORCH_THREADS.value,
            device='cuda' if gpu else 'cpu',
            compiled=peer == 'torch.compile',
        )
        torch_nanogpt.time_steps(_steppers[shape, peer], max(_WARMUP.value, 3))
    return _steppers[shape, peer]


def device_batch(exp, call: int) -> jax.Array:
    """The training batch of call `call` on the run's devices: [B, T+1], or [k, B, T+1] for k
    steps per call."""
    c, k = exp.config, exp.config.train.steps_per_call
    local = call_batch(
        exp.corpus.tokens['train'],
        seed=c.seed,
        step=call * k,
        steps=k,
        batch_size=c.train.batch_size,
        seq_len=c.data.seq_len,
    )
    return device_call_batch(exp.ctx, local)


def timed_rounds(compiled, state, batch, k: int, calls: int, steppers: dict) -> tuple:
    """`calls` timed calls of `compiled` (k steps each) in up to --rounds rounds, each round
    followed by the PyTorch peers' share of their steps (interleaved: both see the same machine
    load): (state, seconds per step, dispatch seconds per step, {peer: seconds per step})."""
    step_times, dispatch = [], []
    peer_times = {p: [] for p in steppers}
    rounds = max(1, min(_ROUNDS.value, calls))
    for r in range(rounds):
        for _ in range(calls * (r + 1) // rounds - calls * r // rounds):
            t = time.perf_counter()
            state, metrics = compiled(state, batch)
            dispatch.append((time.perf_counter() - t) / k)
            jax.block_until_ready(metrics)
            step_times.append((time.perf_counter() - t) / k)
        for p, stepper in steppers.items():
            peer_times[p] += torch_nanogpt.time_steps(stepper, -(-_STEPS.value // rounds))
    return state, step_times, dispatch, peer_times


def bench(variant: str, peak_total: float, with_torch: bool) -> dict:
    exp = assemble(RECIPE.config(variant, '--variants'), state='init', data=True)
    c, ctx = exp.config, exp.ctx
    k = c.train.steps_per_call
    vocab = exp.model_cfg.vocab_size
    steppers = {p: baseline_stepper(c, vocab, p) for p in peers()} if with_torch else {}
    with jax.set_mesh(ctx.mesh):
        state = exp.state
        step_fn = make_train_step(ctx, c.train.grad_accum_steps, k)

        batch = device_batch(exp, 0)
        t = time.perf_counter()
        compiled = step_fn.lower(state, batch).compile()
        compile_s = time.perf_counter() - t
        fused_attention = CUDNN_FMHA in compiled.as_text()
        calls = -(-_STEPS.value // k)
        for _ in range(-(-_WARMUP.value // k)):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        state, step_times, dispatch, peer_times = timed_rounds(
            compiled, state, batch, k, calls, steppers
        )
        with_data = []
        for call in range(calls):
            t = time.perf_counter()
            state, metrics = compiled(state, device_batch(exp, call))
            jax.block_until_ready(metrics)
            with_data.append((time.perf_counter() - t) / k)
    dt = float(np.median(step_times))
    tokens = c.train.batch_size * c.data.seq_len
    fpt = flops_per_token(exp.model_cfg, c.data.seq_len)
    peer_ms = {p: float(np.median(t)) * 1e3 for p, t in peer_times.items()}
    return {
        'variant': variant,
        'steps_per_call': k,
        'compile_s': compile_s,
        'cudnn_fused_attention': fused_attention,
        'step_time_ms': dt * 1e3,
        'dispatch_ms': float(np.median(dispatch)) * 1e3,
        'step_time_with_data_ms': float(np.median(with_data)) * 1e3,
        'tokens_per_sec': tokens / dt,
        'model_flops_per_token': fpt,
        'achieved_flops': fpt * tokens / dt,
        'peak_flops': peak_total,
        'mfu': mfu(tokens / dt, fpt, peak_total),
        'params': param_counts(exp.model_cfg)['total'],
        # per baseline ('torch': eager, 'torch.compile'): its ms/step, and that over ours
        'peers': {
            p: {'step_time_ms': ms, 'over_ours': ms / (dt * 1e3)} for p, ms in peer_ms.items()
        },
    }


def peak_text(peak_total: float, source: str) -> str:
    """'peak 4,000 GFLOP/s (table: ...)', or the reason there is no stated peak."""
    return f'peak {peak_total / 1e9:,.0f} GFLOP/s ({source})' if peak_total else source


def percent(mfu: float | None) -> str:
    """An MFU cell: '41.2%', or '—' without a stated peak."""
    return '—' if mfu is None else f'{mfu:.1%}'


def torch_status() -> tuple[bool, str]:
    """(whether to time the PyTorch baselines, a one-line reason when not)."""
    if not _TORCH.value:
        return False, 'PyTorch baseline: off (--torch_baseline=false)'
    platform = jax.devices()[0].platform
    if platform not in ('cpu', 'gpu'):
        return (
            False,
            f'PyTorch baseline: not timed (it runs on a CPU or a GPU; this run: {platform})',
        )
    if not torch_nanogpt.available():
        return False, 'PyTorch baseline: not timed (torch is not importable)'
    if platform == 'gpu' and not torch_nanogpt.cuda_available():
        return False, 'PyTorch baseline: not timed (this PyTorch sees no GPU)'
    return True, ''


def run() -> int:
    if _STEPS.value < 1:
        raise ValueError(f'--steps must be >= 1 (timed steps), got {_STEPS.value}')
    if _ROUNDS.value < 1 or _WARMUP.value < 0:
        raise ValueError(
            f'--rounds must be >= 1 and --warmup >= 0, got {_ROUNDS.value} and {_WARMUP.value}'
        )
    if not _VARIANTS.value:
        raise ValueError('--variants is empty: name the attention variants to time (mha,mqa)')
    for variant in _VARIANTS.value:  # every variant's config, before any is timed
        RECIPE.config(variant, '--variants')
    if _JSON.value:
        check_output_path(_JSON.value, '--json', '.json')
        check_writable_dir(os.path.dirname(os.path.abspath(_JSON.value)), '--json')
    bootstrap(RECIPE.config(_VARIANTS.value[0], '--variants'), compilation_cache=False)
    peak_total, source = peak_flops(_PEAK.value)
    with_torch, why_not = torch_status()
    print(
        f'train-step benchmark: {device_description()}, '
        f'config {RECIPE.name}, {peak_text(peak_total, source)}; medians over {_STEPS.value} '
        'steps (calls of steps/call steps, each timed and divided by it)'
    )
    names = peers() if with_torch else ()
    if with_torch:
        version, threads = torch_nanogpt.version_and_threads(_TORCH_THREADS.value)
        kinds = ' and '.join('compiled' if p == 'torch.compile' else 'eager' for p in names)
        print(
            f'{kinds} PyTorch {version} nanoGPT baseline ({threads} threads), interleaved '
            f'with ours in {_ROUNDS.value} rounds per variant; torch ÷ ours > 1: ours is faster'
        )
    else:
        print(why_not)
    extra = ''.join(f' {p} ms | {p} ÷ ours |' for p in names)
    print(
        '| variant | params | steps/call | compile s | step ms | dispatch ms/step | '
        'step ms with data | tokens/s | MFLOPs/token | GFLOP/s | MFU | cuDNN attention |' + extra
    )
    print('|---|---|---|---|---|---|---|---|---|---|---|---|' + '---|---|' * len(names))
    rows = []
    for variant in _VARIANTS.value:  # each row as soon as it is measured
        r = bench(variant, peak_total, with_torch)
        rows.append(r)
        cells = ''.join(
            f' {q["step_time_ms"]:.1f} | {q["over_ours"]:.2f}x |' for q in r['peers'].values()
        )
        print(
            f'| {r["variant"]} | {r["params"]:,} | {r["steps_per_call"]} | {r["compile_s"]:.1f} | '
            f'{r["step_time_ms"]:.1f} | {r["dispatch_ms"]:.2f} | '
            f'{r["step_time_with_data_ms"]:.1f} | {r["tokens_per_sec"]:,.0f} | '
            f'{r["model_flops_per_token"] / 1e6:.2f} | {r["achieved_flops"] / 1e9:.1f} | '
            f'{percent(r["mfu"])} | {"yes" if r["cudnn_fused_attention"] else "no"} |' + cells,
            flush=True,
        )
    if _JSON.value:
        with open(_JSON.value, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    run_app(run)
