"""Where the eager PyTorch baseline's step spends its time: `torch.profiler`'s self time of
every op over a few steps, each aten op put in one of the categories lm/train/profile.py gives
XLA's ops (matmul, transcendental, layout, reduction, elementwise), so the two splits compare
(scripts/bench_torch_baseline.py --profile_top). Time outside aten ops (autograd's engine, the
optimizer's Python, the profiler's own frames) is 'framework'. PyTorch runs each op on all its
threads, so op time here is wall time of one thread; XLA's two one-core devices each report
their own.
"""

from __future__ import annotations

import collections
import time

from baselines.torch_nanogpt import Stepper
from lm.train import Profile

MATMUL = ('mm', 'addmm', 'bmm', 'baddbmm', 'addbmm', 'matmul', 'linear', 'mv', 'addmv', 'dot')
TRANSCENDENTAL = (
    'exp', 'log', 'tanh', 'gelu', 'gelu_backward', 'softmax', '_softmax', '_log_softmax',
    '_softmax_backward_data', '_log_softmax_backward_data', 'sqrt', 'rsqrt', 'div', 'div_',
    'pow', 'erf', 'sigmoid', 'reciprocal',
)  # fmt: skip
REDUCTION = (
    'sum', 'mean', 'norm', 'linalg_vector_norm', 'native_layer_norm',
    'native_layer_norm_backward', 'nll_loss_forward', 'nll_loss_backward', 'max', 'amax',
    'embedding_dense_backward', 'embedding_backward',
)  # fmt: skip
LAYOUT = (
    'copy_', 'clone', 'contiguous', 'transpose', 'permute', 't', 'view', 'reshape',
    '_reshape_alias', 'cat', 'split', 'split_with_sizes', 'chunk', 'to', '_to_copy', 'expand',
    'as_strided', 'select', 'slice', 'unsqueeze', 'squeeze', 'index_select', 'embedding',
    'detach', 'alias', 'empty_like', 'empty', 'empty_strided', 'unsafe_split',
)  # fmt: skip


def op_category(name: str) -> str:
    """The category of a profiler event: an aten op by its name (its `_foreach_` form counts as
    the op: `aten::_foreach_sqrt` is transcendental), anything else 'framework'."""
    if not name.startswith('aten::'):
        return 'framework'
    op = name.removeprefix('aten::').removeprefix('_foreach_')
    if op.startswith('_scaled_dot_product') or op.startswith('_efficient_attention'):
        return 'matmul'  # a fused attention kernel holds its two products, as an XLA fusion
    for category, ops in (
        ('matmul', MATMUL),
        ('transcendental', TRANSCENDENTAL),
        ('reduction', REDUCTION),
        ('layout', LAYOUT),
    ):
        if op in ops or op.rstrip('_') in ops:
            return category
    return 'elementwise'


def profile_steps(stepper: Stepper, steps: int) -> tuple[Profile, float]:
    """(per-op self time in ms per step, as a `Profile`; wall ms per step under the profiler)
    of `steps` baseline steps."""
    import torch  # optional: only the baseline needs it

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            stepper.step()
        wall = (time.perf_counter() - start) / steps * 1e3
    ms, category = collections.Counter(), {}
    for event in prof.key_averages():
        if event.self_cpu_time_total > 0:
            ms[event.key] += event.self_cpu_time_total / 1e3 / steps
            category[event.key] = op_category(event.key)
    return Profile(ms, category, {}, device=False), wall
