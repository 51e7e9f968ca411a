"""What trained a run, for its record: the source commit of this `lm` checkout and the toolchain
its numbers are exact under (`lm.train.golden`: the same commit can train other last bits on
another CPU or JAX). Written into each finished run's results.json ('trained_by') and its log.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess

import jax

from lm.train.perf import cpu_model, device_description

# XLA_FLAGS words that leave a CPU's numerics as they are: the GPU's (on a CPU backend), and the
# simulated CPU device count (which `config.mesh.cpu_devices` sets anyway).
_CPU_NUMERICS_FREE = ('--xla_gpu_', '--xla_force_host_platform_device_count')


def toolchain() -> dict[str, str | bool]:
    """What a run's numbers are exact under: the JAX and jaxlib versions, the backend, the CPU
    (XLA's CPU code is built for the host's instruction set and threads: one commit trained the
    MQAR study's runs differently on a 2-core AMD EPYC and a 2-core Intel Xeon) or, on an
    accelerator, its kind, whether XLA optimises (`jax_disable_most_optimizations`, which the
    test suite sets, gives other bits) and the XLA_FLAGS that can change the numerics (all on an
    accelerator; read for this record only)."""
    import jaxlib

    backend = jax.default_backend()
    words = os.environ.get('XLA_FLAGS', '').split()
    if backend == 'cpu':
        words = [w for w in words if not w.startswith(_CPU_NUMERICS_FREE)]
    out = {
        'jax': jax.__version__,
        'jaxlib': jaxlib.__version__,
        'backend': backend,
        'cpu': f'{cpu_model()}, {platform.machine()}',
        'optimized': not jax.config.read('jax_disable_most_optimizations'),
        'xla_flags': ' '.join(sorted(words)),
    }
    if backend != 'cpu':
        out['accelerator'] = jax.devices()[0].device_kind
    return out


def _git(root: str, *args: str) -> str | None:
    """`git -C root ARGS`'s output, None when it fails (no git, not a checkout, 10 s)."""
    try:
        out = subprocess.run(['git', '-C', root, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _checkout() -> str | None:
    """The git checkout whose top holds the `lm` imported here, None otherwise (an installed
    copy, a copy inside another repository, no git)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    top = _git(root, 'rev-parse', '--show-toplevel')
    return root if top and os.path.realpath(top) == os.path.realpath(root) else None


def _edited(root: str) -> str:
    """'+' when `lm/` or `configs/` differ from HEAD (edited, or files git does not track)."""
    return '+' if _git(root, 'status', '--porcelain', '--', 'lm', 'configs') else ''


def source_commit() -> str:
    """The git commit of the checkout `lm` is imported from, with '+' when `lm/` or `configs/`
    there differ from it; '' outside such a checkout (`_checkout`)."""
    root = _checkout()
    head = _git(root, 'rev-parse', 'HEAD') if root else None
    return head + _edited(root) if head else ''


def source_code() -> str:
    """What of the commit trains: a digest of HEAD's `lm/` and `configs/` trees (12 hex digits,
    '+' when they differ from HEAD), equal across commits that change neither (docs, tests,
    studies); '' outside a checkout."""
    root = _checkout()
    trees = _git(root, 'rev-parse', 'HEAD:lm', 'HEAD:configs') if root else None
    if not trees:
        return ''
    return hashlib.sha256(trees.encode()).hexdigest()[:12] + _edited(root)


def trained_by() -> dict[str, str | bool]:
    """A run's provenance: `source_commit`, `source_code`, `toolchain` and its devices."""
    return {
        'commit': source_commit(),
        'code': source_code(),
        **toolchain(),
        'devices': device_description(),
    }
