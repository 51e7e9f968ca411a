"""What trained a run, for its record: the source commit of this `lm` checkout and the toolchain
its numbers are exact under (`lm.train.golden`: the same commit can train other last bits on
another CPU or JAX). Written into each finished run's results.json ('trained_by') and its log.
"""

from __future__ import annotations

import os
import platform
import subprocess

import jax

from lm.train.perf import cpu_model, device_description

# XLA_FLAGS words that leave a CPU's numerics as they are: the GPU's, and the simulated CPU
# device count (which `config.mesh.cpu_devices` sets anyway).
_NUMERICS_FREE_FLAGS = ('--xla_gpu_', '--xla_force_host_platform_device_count')


def toolchain() -> dict[str, str | bool]:
    """What a run's numbers are exact under: the JAX and jaxlib versions, the backend, the CPU
    (XLA's CPU code is built for the host's instruction set and threads: one commit trained the
    MQAR study's runs differently on a 2-core AMD EPYC and a 2-core Intel Xeon), whether XLA
    optimises (`jax_disable_most_optimizations`, which the test suite sets, gives other bits) and
    the XLA_FLAGS that can change the CPU's numerics (read for this record only)."""
    import jaxlib

    words = os.environ.get('XLA_FLAGS', '').split()
    return {
        'jax': jax.__version__,
        'jaxlib': jaxlib.__version__,
        'backend': jax.default_backend(),
        'cpu': f'{cpu_model()}, {platform.machine()}',
        'optimized': not jax.config.read('jax_disable_most_optimizations'),
        'xla_flags': ' '.join(sorted(w for w in words if not w.startswith(_NUMERICS_FREE_FLAGS))),
    }


def source_commit() -> str:
    """The git commit of the checkout `lm` is imported from, with '+' when its tracked files
    differ from it; '' when `lm` is not in a git checkout (an installed copy)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = ['git', '-C', root]
    try:
        head = subprocess.run([*git, 'rev-parse', 'HEAD'], capture_output=True, text=True)
        if head.returncode:
            return ''
        changed = subprocess.run(
            [*git, 'status', '--porcelain', '--untracked-files=no'],
            capture_output=True,
            text=True,
        )
    except OSError:  # no git
        return ''
    return head.stdout.strip() + ('+' if changed.stdout.strip() else '')


def trained_by() -> dict[str, str | bool]:
    """A run's provenance: `source_commit`, `toolchain` and the devices it ran on."""
    return {'commit': source_commit(), **toolchain(), 'devices': device_description()}
