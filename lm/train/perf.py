"""Stated peak FLOP/s per device and model FLOP utilisation (MFU), as in PaLM App. B."""

from __future__ import annotations

import os
import platform

import jax

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
