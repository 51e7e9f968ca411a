"""Peak FLOP/s per device and model FLOP utilisation (MFU), as in PaLM App. B."""

from __future__ import annotations

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

# Dense bf16 peak FLOP/s per device from vendor data sheets (no sparsity).
PEAK_FLOPS = {
    'NVIDIA H100 80GB HBM3': 989e12,
    'NVIDIA H100': 989e12,
    'NVIDIA H200': 989e12,
    'NVIDIA A100-SXM4-80GB': 312e12,
    'NVIDIA A100-SXM4-40GB': 312e12,
    'NVIDIA A100': 312e12,
    'NVIDIA L4': 121e12,
    'TPU v4': 275e12,
    'TPU v5 lite': 197e12,
    'TPU v5e': 197e12,
    'TPU v5p': 459e12,
    'TPU v6 lite': 918e12,
    'TPU v6e': 918e12,
}


def cpu_model() -> str:
    """The host CPU's model name and core count, e.g. 'AMD EPYC (2 cores)' (from
    /proc/cpuinfo where there is one, else the platform module)."""
    name = ''
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            for line in f:
                if line.lower().startswith('model name'):
                    name = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or 'unknown CPU'
    return f'{name} ({os.cpu_count()} cores)'


def device_description() -> str:
    """What the run computes on: the CPU model for CPU devices, else the accelerator kind, with
    the device count, e.g. '2 x cpu on AMD EPYC (2 cores)' or '1 x NVIDIA H100 80GB HBM3'."""
    device = jax.devices()[0]
    where = f'{jax.device_count()} x {device.device_kind}'
    return f'{where} on {cpu_model()}' if device.platform == 'cpu' else where


def first_device_mesh() -> jax.sharding.Mesh:
    """A mesh of the first device alone: computations under it run on that device only."""
    return jax.make_mesh((1,), ('one',), devices=jax.devices()[:1], axis_types=(AxisType.Explicit,))


def timed_matmul(a_NN: np.ndarray | jax.Array, repeats: int) -> tuple[jax.Array, float]:
    """(a @ a, the best time of `repeats` calls in seconds), computed on the first device alone
    whatever mesh the caller has set: under a multi-device CPU mesh the matmul would otherwise
    be replicated, every device computing it on its own share of the cores, and a peak timed
    from it would be one device's share."""
    mesh = first_device_mesh()
    with jax.set_mesh(mesh):
        a = jax.device_put(a_NN, NamedSharding(mesh, PartitionSpec()))
        f = jax.jit(jnp.dot)
        out = f(a, a).block_until_ready()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = f(a, a).block_until_ready()
            times.append(time.perf_counter() - t)
    return out, float(np.min(times))


def measure_matmul_flops(n: int = 2048, repeats: int = 10, dtype=jnp.float32) -> float:
    """Peak FLOP/s of an n×n×n matmul on the first device (`timed_matmul`): the best of
    `repeats` timed calls (2·n³ FLOPs each), so a busy moment on a shared machine does not
    lower the peak."""
    with jax.set_mesh(first_device_mesh()):
        a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    return 2 * n**3 / timed_matmul(a, repeats)[1]


def peak_flops(override: float = 0.0) -> tuple[float, str]:
    """(peak FLOP/s of all devices of the run, where the number came from).

    CPU: a matmul measured on this host, which uses all its cores however many JAX devices
    the host is split into, times the number of hosts. GPU / TPU: the per-device table (or a
    measured bf16 matmul for an unknown kind) times the device count. `override` is per device.
    """
    device = jax.devices()[0]
    if override > 0:
        return override * jax.device_count(), 'config.train.peak_flops per device'
    if device.platform == 'cpu':
        return (
            measure_matmul_flops() * jax.process_count(),
            'measured: float32 2048³ jnp.dot, all cores of each host',
        )
    kind = device.device_kind
    for name, flops in PEAK_FLOPS.items():
        if kind.startswith(name):
            return flops * jax.device_count(), f'table: {name} x {jax.device_count()}'
    measured = measure_matmul_flops(dtype=jnp.bfloat16)
    return measured * jax.device_count(), f'measured: bfloat16 2048³ jnp.dot on {kind}'


def mfu(tokens_per_sec: float, flops_per_token: float, peak_flops_total: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices."""
    return tokens_per_sec * flops_per_token / peak_flops_total
