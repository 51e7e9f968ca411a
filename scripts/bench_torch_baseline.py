"""The eager PyTorch baseline of issue 7: nanoGPT's model and CPU recipe for Tiny Shakespeare
(4 layers, 4 heads, d_model 128, context 64, batch 12, GELU MLP, LayerNorm without bias,
learned positions, AdamW), timed the way scripts/bench_train.py times ours, so the two compare
on one machine. Needs `pip install torch` (not a dependency of lm). scripts/bench_train.py runs
the same baseline interleaved with ours and prints the ratio; this script times it alone.

  python scripts/bench_torch_baseline.py --steps=60
"""

import numpy as np
from absl import flags

from lm import perf, torch_baseline
from lm.cli import run_app

_STEPS = flags.DEFINE_integer('steps', 60, 'Timed steps (median reported).')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Untimed steps.')
_THREADS = flags.DEFINE_integer('threads', 0, 'torch.set_num_threads; 0 = torch default.')


def run() -> int:
    shape = torch_baseline.Shape()
    stepper = torch_baseline.make_stepper(shape, threads=_THREADS.value)
    torch_baseline.time_steps(stepper, _WARMUP.value)
    dt = float(np.median(torch_baseline.time_steps(stepper, _STEPS.value)))
    peak, source = perf.peak_flops()
    tps = shape.batch * shape.block / dt
    fpt = stepper.flops_per_token
    print(
        f'eager PyTorch {stepper.version} nanoGPT baseline on {perf.cpu_model()}: '
        f'{stepper.params:,} params, {stepper.threads} threads, '
        f'peak {peak / 1e9:,.0f} GFLOP/s ({source})'
    )
    print(
        f'| torch eager | {dt * 1e3:.1f} ms/step | {tps:,.0f} tokens/s | '
        f'{fpt * tps / 1e9:.1f} GFLOP/s | MFU {perf.mfu(tps, fpt, peak):.1%} |'
    )
    return 0


if __name__ == '__main__':
    run_app(run)
