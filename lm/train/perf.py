"""Stated peak FLOP/s per device and model FLOP utilisation (MFU), as in PaLM App. B; the memory
bandwidth a decode benchmark is held against (measured in the run, the vendor's figure beside it)
and each decode row's place on that roofline (scripts/bench_decode.py)."""

from __future__ import annotations

import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

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

# Peak memory bandwidth per device, bytes/s, from vendor data sheets (HBM; stated beside the
# copy bandwidth a decode benchmark measures, never used as its reference).
PEAK_BANDWIDTH = {
    'NVIDIA H100 80GB HBM3': 3.35e12,
    'NVIDIA H100 PCIe': 2.0e12,
    'NVIDIA H100': 3.35e12,
    'NVIDIA H200': 4.8e12,
    'NVIDIA A100-SXM4-80GB': 2.039e12,
    'NVIDIA A100-SXM4-40GB': 1.555e12,
    'NVIDIA L4': 0.3e12,
    'TPU v4': 1.2e12,
    'TPU v5 lite': 0.819e12,
    'TPU v5e': 0.819e12,
    'TPU v5p': 2.765e12,
    'TPU v6 lite': 1.64e12,
    'TPU v6e': 1.64e12,
}


def spec_bandwidth() -> float | None:
    """The vendor's peak memory bandwidth of this run's accelerator kind (None: a CPU or an
    unlisted kind)."""
    device = jax.devices()[0]
    if device.platform == 'cpu':
        return None
    for name, bandwidth in PEAK_BANDWIDTH.items():
        if device.device_kind.startswith(name):
            return bandwidth
    return None


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


def peak_flops(override: float = 0.0) -> tuple[float, str]:
    """(stated peak FLOP/s of all devices of the run, where the number came from).

    A peak is stated, never timed at start-up (a timing on a shared machine swings several
    fold): `override` (config.train.peak_flops, per device), else the vendor table for the
    accelerator kind. A CPU or an unlisted kind without `override` has no stated peak: 0.0,
    and no MFU is computed."""
    n = jax.device_count()
    if override > 0:
        return override * n, f'stated {override:.3g} FLOP/s per device x {n}'
    device = jax.devices()[0]
    if device.platform != 'cpu':
        for name, flops in PEAK_FLOPS.items():
            if device.device_kind.startswith(name):
                return flops * n, f'table: {name} x {n}'
    return 0.0, (
        f'no stated peak for {device_description()}: set config.train.peak_flops '
        '(FLOP/s per device) for MFU'
    )


def mfu(tokens_per_sec: float, flops_per_token: float, peak_flops_total: float) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the stated peak of all devices; None
    without a stated peak, or when the ratio exceeds 1 (the stated peak is below what the run
    achieves, so it is wrong: an MFU over 100% is never reported)."""
    if peak_flops_total <= 0:
        return None
    utilisation = tokens_per_sec * flops_per_token / peak_flops_total
    return utilisation if utilisation <= 1 else None


def timed(fn, x: jax.Array, repeats: int) -> float:
    """Median seconds of a jitted `fn(x)` after one warm-up call."""
    jax.block_until_ready(fn(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def memory_reference(gib: float, repeats: int = 7) -> dict:
    """The device's memory bandwidth as the best decoders reach it, bytes/s: a device-to-device
    copy (bytes read + written) and a streaming read (a jitted sum), each the median of
    `repeats` at sizes gib / 4, gib / 2 and gib, the best of all; with the vendor's figure."""
    copy, read = jax.jit(lambda x: x.copy()), jax.jit(jnp.sum)
    best = {'copy': 0.0, 'read': 0.0}
    for size in (gib / 4, gib / 2, gib):
        x = jnp.ones((max(1, int(size * 2**30) // 4),), jnp.float32)
        best['copy'] = max(best['copy'], 2 * x.nbytes / timed(copy, x, repeats))
        best['read'] = max(best['read'], x.nbytes / timed(read, x, repeats))
        del x
    return {**best, 'reference': max(best.values()), 'spec': spec_bandwidth()}


def add_roofline(rows: list[dict], reference: dict, baseline: str) -> dict:
    """Adds achieved GB/s, its fraction of the reference bandwidth, and the measured and
    predicted (bytes ratio) speedups over the `baseline` variant's row at the same batch and
    context (None without one; the key keeps bench_decode's JSON name, `speedup_vs_mha`). A row
    that read faster than the measured reference raises it to that row's rate (`raised_by`), so no
    fraction exceeds 1. Returns the reference used."""
    for r in rows:
        r['achieved_GBps'] = r['bytes_per_step'] / (r['ms_per_step'] / 1e3) / 1e9
    fastest = max(rows, key=lambda r: r['achieved_GBps'])
    reference = dict(reference, raised_by=None)
    if fastest['achieved_GBps'] * 1e9 > reference['reference']:
        reference['reference'] = fastest['achieved_GBps'] * 1e9
        reference['raised_by'] = (fastest['variant'], fastest['context'], fastest['batch'])
    base = {(r['batch'], r['context']): r for r in rows if r['variant'] == baseline}
    for r in rows:
        r['bandwidth_GBps'] = reference['reference'] / 1e9
        r['copy_GBps'], r['read_GBps'] = reference['copy'] / 1e9, reference['read'] / 1e9
        r['fraction_of_bandwidth'] = r['achieved_GBps'] * 1e9 / reference['reference']
        ref = base.get((r['batch'], r['context']))
        r['speedup_vs_mha'] = ref and ref['ms_per_step'] / r['ms_per_step']
        r['predicted_speedup'] = ref and ref['bytes_per_step'] / r['bytes_per_step']
        r['fraction_of_predicted'] = ref and r['speedup_vs_mha'] / r['predicted_speedup']
    return reference


def reference_text(reference: dict) -> str:
    """One line: the reference bandwidth, how it was measured, and the vendor's figure."""
    gbps = {k: reference[k] / 1e9 for k in ('copy', 'read', 'reference')}
    spec = reference['spec']
    text = (
        f'reference bandwidth {gbps["reference"]:,.0f} GB/s (best of a device-to-device copy, '
        f'{gbps["copy"]:,.0f} GB/s read + written, and a streaming read, {gbps["read"]:,.0f} '
        f'GB/s; vendor figure {f"{spec / 1e9:,.0f} GB/s" if spec else "not listed"})'
    )
    if reference['raised_by']:
        variant, context, batch = reference['raised_by']
        text += (
            f'; raised to the {variant} row at context {context}, batch {batch}, which read '
            'faster than both'
        )
    return text
