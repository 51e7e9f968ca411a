"""lm/train/profile.py: a trace's ops by category, on a CPU trace and a GPU-shaped one."""

import jax
import jax.numpy as jnp

from lm.train.profile import load_profile, profile


def test_a_cpu_trace_attributes_the_matmul_to_its_category_and_source(tmp_path):
    def f(a, b):
        return jnp.tanh(a @ b).sum()

    a = jax.device_put(jnp.ones((256, 256)), jax.devices('cpu')[0])  # a CPU trace on any machine
    compiled = jax.jit(f).lower(a, a).compile()
    jax.block_until_ready(compiled(a, a))
    jax.profiler.start_trace(str(tmp_path))
    for _ in range(3):
        jax.block_until_ready(compiled(a, a))
    jax.profiler.stop_trace()
    p = load_profile(str(tmp_path), compiled.as_text(), steps=3)
    assert not p.device and p.busy > 0
    assert p.by_category()['matmul'] > 0
    assert {source for _, source in p.by_source()} <= {'dot_general', 'tanh', 'reduce_sum'}


HLO = """
%fused_pad.22 (param_0: bf16[8,32]) -> bf16[8,64] {
  %param_0 = bf16[8,32]{1,0} parameter(0)
  %constant_1 = bf16[] constant(0)
  ROOT %pad.3 = bf16[8,64]{1,0} pad(%param_0, %constant_1), padding=0_0x0_32
}

%fused_dot.1 (param_0: bf16[8,32]) -> f32[8,8] {
  %param_0 = bf16[8,32]{1,0} parameter(0)
  ROOT %dot.2 = f32[8,8]{1,0} dot(%param_0, %param_0), lhs_contracting_dims={1}, \
rhs_contracting_dims={1}, metadata={op_name="jit(_loop)/while/body/BGSD,BGRTD->BGSRT/dot_general"}
}

ENTRY %main (p: bf16[8,32]) -> bf16[8,64] {
  %p = bf16[8,32]{1,0} parameter(0)
  %gemm_fusion.1 = f32[8,8]{1,0} fusion(%p), kind=kCustom, calls=%fused_dot.1
  ROOT %loop_pad_fusion.22 = bf16[8,64]{1,0} fusion(%p), kind=kLoop, calls=%fused_pad.22, \
metadata={op_name="jit(_loop)/while/body/dot_general"}
}
"""


def test_gpu_kernels_map_to_their_ops_and_library_kernels_are_counted_apart():
    """A GPU trace names XLA's kernel for op `loop_pad_fusion.22` `loop_pad_fusion_22`; a
    cuBLAS kernel has no op of that name. Host events are not kernel time."""
    events = [
        {'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/device:GPU:0'}},
        {'ph': 'M', 'name': 'process_name', 'pid': 2, 'args': {'name': '/host:CPU'}},
        {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': 7, 'args': {'name': 'Stream #14'}},
        {'ph': 'M', 'name': 'thread_name', 'pid': 2, 'tid': 3, 'args': {'name': 'python'}},
        {'ph': 'X', 'pid': 1, 'tid': 7, 'name': 'loop_pad_fusion_22', 'dur': 300.0},
        {'ph': 'X', 'pid': 1, 'tid': 7, 'name': 'loop_pad_fusion_22', 'dur': 100.0},
        {'ph': 'X', 'pid': 1, 'tid': 7, 'name': 'sm90_xmma_gemm_bf16', 'dur': 1000.0},
        {'ph': 'X', 'pid': 1, 'tid': 7, 'name': 'gemm_fusion_1', 'dur': 60.0},
        {'ph': 'X', 'pid': 2, 'tid': 3, 'name': 'loop_pad_fusion.22', 'dur': 5000.0},
    ]
    p = profile(events, HLO, steps=2)
    assert p.device
    assert p.ms == {'loop_pad_fusion.22': 0.2, 'sm90_xmma_gemm_bf16': 0.5, 'gemm_fusion.1': 0.03}
    assert p.category == {
        'loop_pad_fusion.22': 'elementwise',
        'sm90_xmma_gemm_bf16': 'library',
        'gemm_fusion.1': 'matmul',
    }
    assert p.by_source()[('elementwise', 'while/body/dot_general')] == 0.2
    # a fusion without metadata: its matmul's source
    assert p.by_source()[('matmul', 'while/body/BGSD,BGRTD->BGSRT/dot_general')] == 0.03
