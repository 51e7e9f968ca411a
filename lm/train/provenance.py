"""What trained a run, for its record: the source commit of this `lm` checkout and the toolchain
its numbers are exact under (`lm.train.golden`: the same commit can train other last bits on
another CPU or JAX). Written into each finished run's results.json ('trained_by') and its log;
a run's checkpoints carry it by steps (`sessions_through`), so a run resumed under another
version says which steps each trained.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess

import jax

from lm.train.perf import cpu_model, device_description

# XLA_FLAGS words that leave a CPU's numerics as they are: the GPU's (on a CPU backend), and the
# simulated CPU device count (which `config.mesh.cpu_devices` sets anyway).
_CPU_NUMERICS_FREE = ('--xla_gpu_', '--xla_force_host_platform_device_count')
# A checkpoint side-car's and a results.json's key: which steps each session trained, by what
# (`sessions_through`).
SESSIONS = 'trained_by_sessions'


def toolchain() -> dict[str, str | bool]:
    """What a run's numbers are exact under: the JAX and jaxlib versions, the backend, the CPU
    (XLA's CPU code is built for the host's instruction set and threads: one commit trained the
    MQAR study's runs differently on a 2-core AMD EPYC and a 2-core Intel Xeon) or, on an
    accelerator, its kind and software stack (`accelerator_stack`), whether XLA optimises
    (`jax_disable_most_optimizations`, which the test suite sets, gives other bits) and the
    XLA_FLAGS that can change the numerics (all on an accelerator; read for this record only)."""
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
        out.update(accelerator_stack())
    return out


# Installed packages that decide an accelerator's numerics beside jaxlib: JAX's PJRT plugins,
# the TPU runtime, and the NVIDIA libraries a GPU plugin loads (cuDNN, cuBLAS, the PTX compiler
# and JIT linker, NCCL). The driver, not a package, is read from its kernel module (`_driver`).
_STACK = (
    'jax-cuda',
    'jax-rocm',
    'libtpu',
    'nvidia-cudnn',
    'nvidia-cublas',
    'nvidia-cuda-nvcc',
    'nvidia-nvjitlink',
    'nvidia-nccl',  # the order of a multi-GPU all-reduce
)


# Where NVIDIA's kernel module names its version (the driver's; other accelerators have none)
NVIDIA_DRIVER = '/proc/driver/nvidia/version'


def _driver() -> str:
    """The NVIDIA driver's version from `NVIDIA_DRIVER` ('' without that file): the version
    after 'Kernel Module', else the file's first line."""
    try:
        with open(NVIDIA_DRIVER) as f:
            line = f.readline()
    except OSError:
        return ''
    words = line.split()
    at = next((i for i in range(len(words) - 2) if words[i : i + 2] == ['Kernel', 'Module']), None)
    return words[at + 2] if at is not None else ' '.join(words)


def accelerator_stack() -> dict[str, str]:
    """Off the CPU: the accelerator's kind, its PJRT client's platform version (a GPU's names
    the CUDA its plugin was built for), the installed versions of `_STACK`'s packages and, on an
    NVIDIA GPU, the driver's (`_driver`)."""
    device = jax.devices()[0]
    found = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata['Name'] or '').lower().replace('_', '-')
        if name.startswith(_STACK):
            found[name] = dist.version
    return {
        'accelerator': device.device_kind,
        'platform_version': ' '.join(str(device.client.platform_version).split()),
        'packages': ', '.join(f'{k} {v}' for k, v in sorted(found.items())),
        **({'driver': driver} if (driver := _driver()) else {}),
    }


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
    """'' when `lm/` and `configs/` equal HEAD; else '+' and a digest (8 hex digits) of how they
    differ (the diff against HEAD, and the names and bytes of files git does not track): two
    different edits read apart, the same edit alike."""
    if not _git(root, 'status', '--porcelain', '--', 'lm', 'configs'):
        return ''
    digest = hashlib.sha256(
        (_git(root, 'diff', 'HEAD', '--binary', '--', 'lm', 'configs') or '').encode()
    )
    listed = _git(root, 'ls-files', '--others', '--exclude-standard', '-z', '--', 'lm', 'configs')
    for name in sorted(filter(None, (listed or '').split('\0'))):
        digest.update(name.encode() + b'\0')
        try:
            with open(os.path.join(root, name), 'rb') as f:
                digest.update(f.read())
        except OSError:  # not a readable file (a link to a directory, say): its name alone
            pass
    return '+' + digest.hexdigest()[:8]


def source_commit() -> str:
    """The git commit of the checkout `lm` is imported from, with '+' and the edit's digest
    when `lm/` or `configs/` there differ from it (`_edited`); '' outside such a checkout."""
    root = _checkout()
    head = _git(root, 'rev-parse', 'HEAD') if root else None
    return head + _edited(root) if head else ''


def source_code() -> str:
    """What of the commit trains: a digest of HEAD's `lm/` and `configs/` trees (12 hex digits;
    '+' and the edit's digest when they differ from HEAD: `_edited`), equal across commits that
    change neither (docs, tests, studies); '' outside a checkout."""
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


def log_line(by: dict) -> str:
    """The run log's line of a `trained_by` record: its commit and JAX (and XLA_FLAGS)."""
    flags = f'; XLA_FLAGS {by["xla_flags"]}' if by['xla_flags'] else ''
    commit = by['commit'] or 'not a git checkout'
    return f'code: {commit}; JAX {by["jax"]}, jaxlib {by["jaxlib"]}{flags}'


def _record(entry: dict) -> dict:
    """A session entry's `trained_by` record, without its steps."""
    return {k: v for k, v in entry.items() if k != 'steps'}


def version(by: dict) -> dict:
    """What of a `trained_by` record decides the numbers: the code (its digest; the commit where
    none was recorded: a docs-only commit is not another version) and the toolchain; not the
    devices, nor a session's steps."""
    left_out = ('devices', 'commit', 'steps') if by.get('code') else ('devices', 'steps')
    return {k: v for k, v in by.items() if k not in left_out}


def differences(there: dict, here: dict) -> str:
    """The keys on which two records differ, as 'key: THERE there, HERE here; ...'."""
    keys = sorted(k for k in there.keys() | here.keys() if there.get(k) != here.get(k))
    return '; '.join(f'{k}: {there.get(k)!r} there, {here.get(k)!r} here' for k in keys)


def _through(prior: list[dict] | None, start: int) -> list[dict]:
    """`prior` (a checkpoint's session list) as it stands at `start`, the step resumed from:
    entries past `start` clipped, and steps it does not cover up to `start` (a list that ends
    early; None, a checkpoint saved before checkpoints held one) as one entry without a record."""
    out = []
    for entry in prior or []:
        first, last = entry['steps']
        if first >= start:
            break
        out.append({**entry, 'steps': [first, min(last, start)]})
    end = out[-1]['steps'][1] if out else 0
    return out + [{'steps': [end, start]}] if end < start else out


def sessions_through(prior: list[dict] | None, start: int, step: int, by: dict) -> list[dict]:
    """Which steps of a run each session trained, at `step`: `prior` (the list saved with the
    checkpoint resumed at `start`, read as it stands there: `_through`) then this session's steps
    start..step, trained by `by` (`trained_by`), joined to the last entry when that is the same
    record. Each entry is {'steps': [first, last], **trained_by} (`first` exclusive: the step the
    session began at); steps no record covers are an entry of steps alone."""
    out = _through(prior, start)
    if step > start:
        if out and _record(out[-1]) == by:
            out[-1] = {**out[-1], 'steps': [out[-1]['steps'][0], step]}
        else:
            out.append({'steps': [start, step], **by})
    return out


def resumed_note(prior: list[dict] | None, start: int, end: int, by: dict) -> str:
    """The run log's line for a run continued at `start` (of `end` steps) whose steps so far
    were trained by another version of the code or toolchain than this session's (`by`), or are
    not recorded (those just before `start`); '' for a new run or the same version."""
    if not start:
        return ''
    last = _through(prior, start)[-1]
    if not _record(last):
        return (
            f'continuing at step {start}: its checkpoint (or, for a converted run, its '
            f"source's) does not record what trained steps {last['steps'][0] + 1}-{start} (saved "
            'before checkpoints held it, or from a list that ends early)'
        )
    there, here = version(last), version(by)
    if there == here:
        return ''
    shown = differences(there, here)
    if start >= end:  # only the evaluation is owed
        return (
            f'evaluating step {start}, trained by another version of the code or toolchain '
            f"({shown}): results.json names this process's as evaluated_by"
        )
    return (
        f'continuing at step {start}, trained so far by another version of the code or '
        f'toolchain ({shown}): results.json will list each ({SESSIONS})'
    )


def results_record(sessions: list[dict], step: int, by: dict) -> dict:
    """results.json's provenance of a run finished at `step` by this process (`by`): the record
    of the session that trained its last steps as 'trained_by' (left out where no session
    records one), this process's as 'evaluated_by' when another (a session that only ran the
    evaluation owed), and `sessions` (`sessions_through`) unless one record trained every step."""
    trained = _record(sessions[-1]) if sessions else {}
    out = {'trained_by': trained} if trained else {}
    if trained != by:
        out['evaluated_by'] = by
    if sessions and sessions != [{'steps': [0, step], **trained}]:
        out[SESSIONS] = sessions
    return out
