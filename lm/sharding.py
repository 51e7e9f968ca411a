"""Device mesh from `config.mesh` and logical-axis rules that map parameter axes onto it.

Parameters carry logical axis names (`lm/model/layers.py`); `config.mesh.rules` maps each name to
mesh axes ('data', 'fsdp', 'tensor', comma-separated, '' = replicated), MaxText-style, so a
run is re-sharded by editing config only. A dimension that a rule would split unevenly (MQA's
single KV head over a tensor axis of 4, say) is replicated instead, with one log line.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental.multihost_utils import process_allgather
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from lm.config import dotted_keys, get_key

MESH_AXES = ('data', 'fsdp', 'tensor')
# config.mesh.cpu_devices at most: XLA starts a thread per CPU device and aborts the process
# (no Python error) when the system refuses one (100,000 did on a 2-core machine).
MAX_CPU_DEVICES = 4096


def _check_cpu_count(n: int) -> None:
    if not 0 <= n <= MAX_CPU_DEVICES:
        raise ValueError(
            f"config.mesh.cpu_devices must be in [0, {MAX_CPU_DEVICES}] (0 = JAX's default), "
            f'got {n}'
        )


# Settings that say where a host keeps things, which may differ between the processes of a run.
HOST_LOCAL_KEYS = ('compilation_cache_dir', 'data.cache_dir', 'data.num_proc')


def set_cpu_devices(mesh_config: ml_collections.ConfigDict) -> None:
    """Applies `config.mesh.cpu_devices` (the CPU backend as N devices, so data parallelism uses
    every core with one thread each). Must run before JAX initialises a backend; a no-op for 0.
    On GPU / TPU hosts the setting only concerns the unused CPU backend."""
    n = mesh_config.cpu_devices
    _check_cpu_count(n)
    forced = re.search(
        r'--xla_force_host_platform_device_count=(\d+)', os.environ.get('XLA_FLAGS', '')
    )
    if n and forced and int(forced.group(1)) != n:
        logging.warning(
            'config.mesh.cpu_devices=%d wins over XLA_FLAGS=%s; for %s CPU devices set '
            '--config.mesh.cpu_devices=%s',
            n,
            forced.group(0),
            forced.group(1),
            forced.group(1),
        )
    if n and jax.config.jax_num_cpu_devices != n:
        try:
            jax.config.update('jax_num_cpu_devices', n)
        except RuntimeError as e:
            raise ValueError(
                f'config.mesh.cpu_devices={n} must be applied before JAX starts; '
                f'call lm.sharding.set_cpu_devices first ({e})'
            ) from None


def check_cpu_devices(mesh_config: ml_collections.ConfigDict) -> None:
    """`config.mesh.cpu_devices` must be in [0, MAX_CPU_DEVICES] and, when set, already applied by
    `set_cpu_devices` (which `lm.cli.bootstrap` calls before JAX starts)."""
    n = mesh_config.cpu_devices
    _check_cpu_count(n)
    if n and jax.config.jax_num_cpu_devices != n:
        raise ValueError(
            f'config.mesh.cpu_devices={n} is not applied (JAX has '
            f'jax_num_cpu_devices={jax.config.jax_num_cpu_devices}): call '
            'lm.sharding.set_cpu_devices (lm.cli.bootstrap does) before JAX starts'
        )


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
    """Axis sizes for ('data', 'fsdp', 'tensor'), with one -1 filled by the remaining devices."""
    sizes = [mesh_config[a] for a in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f'config.mesh: at most one axis may be -1, got {_named(sizes)}')
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f'config.mesh axis sizes must be >= 1 or -1, got {_named(sizes)}')
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(
                f'config.mesh: {num_devices} devices do not divide by the fixed axes '
                f'{_named(sizes)}'
            )
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f'config.mesh {_named(sizes)} needs {math.prod(sizes)} '
            f'devices, but {num_devices} are available (on a CPU, config.mesh.cpu_devices sets '
            'how many; a run resumes on another mesh from its config file with --config.mesh.*)'
        )
    return tuple(sizes)


def fit_mesh(mesh_config: ml_collections.ConfigDict, num_devices: int) -> ml_collections.ConfigDict:
    """`mesh_config` when its mesh fits `num_devices`, else a copy that keeps as much of its
    parameter sharding as the devices here allow (tensor, then fsdp, each cut to its greatest
    common divisor with the devices left; every other device on 'data'), logged: how a run
    trained on another device count is read (evaluated, decoded, exported, converted), its mesh
    being a setting of its training only. A cut size divides the trained one, so it divides
    every array dimension the trained mesh sharded."""
    try:
        mesh_shape(mesh_config, num_devices)
        return mesh_config
    except ValueError as e:
        reason = str(e)
    tensor = math.gcd(max(mesh_config.tensor, 1), num_devices)
    fsdp = math.gcd(max(mesh_config.fsdp, 1), num_devices // tensor)
    fitted = ml_collections.ConfigDict(mesh_config.to_dict())
    fitted.update(data=-1, fsdp=fsdp, tensor=tensor)
    logging.warning(
        "the run's %s; reading it on a mesh of the %d devices here instead: %s",
        reason.split(' (on a CPU')[0],
        num_devices,
        _named(list(mesh_shape(fitted, num_devices))),
    )
    return fitted


def _named(sizes: list[int]) -> dict[str, int]:
    return dict(zip(MESH_AXES, sizes, strict=True))


def rules_table(mesh_config: ml_collections.ConfigDict) -> dict[str, tuple[str, ...]]:
    """`config.mesh.rules` as {logical name: mesh axes}; unknown mesh axes are an error."""
    table = {}
    for name, value in mesh_config.rules.items():
        axes = tuple(a.strip() for a in value.split(',') if a.strip())
        for a in axes:
            if a not in MESH_AXES:
                raise ValueError(
                    f'config.mesh.rules.{name}={value!r} names unknown mesh axis '
                    f'{a!r}; mesh axes are {MESH_AXES}'
                )
        if len(set(axes)) < len(axes):
            raise ValueError(
                f'config.mesh.rules.{name}={value!r} names a mesh axis twice; '
                f'expected distinct axes of {MESH_AXES}'
            )
        table[name] = axes
    return table


def make_mesh(mesh_config: ml_collections.ConfigDict, devices: list | None = None) -> Mesh:
    """The ('data', 'fsdp', 'tensor') mesh over all (or the given) devices."""
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(mesh_config, len(devices))
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def data_parallel_size(mesh: Mesh, rules: dict[str, tuple[str, ...]]) -> int:
    return math.prod(mesh.shape[a] for a in rules.get('batch', ()))


def spec_for(
    axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh, rules: dict
) -> tuple[PartitionSpec, list[str]]:
    """PartitionSpec for one array from its logical axes (None = replicated), and a note for
    each dimension that its rule would split unevenly and that is replicated instead. A mesh
    axis already used by an earlier dimension is not used again."""
    used, spec, notes = set(), [], []
    for logical, dim in zip(axes, shape, strict=True):
        if logical is not None and logical not in rules:
            raise ValueError(f'logical axis {logical!r} has no entry in config.mesh.rules')
        wanted = rules[logical] if logical is not None else ()
        mesh_axes = tuple(a for a in wanted if a not in used and mesh.shape[a] > 1)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if dim % size:
            notes.append(
                f'{logical}={dim} does not divide over mesh axes {mesh_axes} (size {size})'
            )
            mesh_axes = ()
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None))
    return PartitionSpec(*spec), notes


def activation_constraint(mesh: Mesh, rules: dict):
    """constrain(x, logical_axes) for the model: pins activations to the rules' mesh axes."""

    def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
        spec, _ = spec_for(axes, x.shape, mesh, rules)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return constrain


def param_shardings(abstract_params: nnx.State, mesh: Mesh, rules: dict) -> dict:
    """NamedSharding for every parameter (as a pure dict), from its `axes` metadata.

    Dimensions that cannot be split as the rules say are replicated, with one log line per
    kind (e.g. MQA's single KV head on a tensor axis of 4)."""
    out, replicated = {}, {}
    for path, var in nnx.to_flat_state(abstract_params):
        spec, notes = spec_for(var.get_metadata()['axes'], var.shape, mesh, rules)
        for note in notes:
            replicated.setdefault(note, []).append('/'.join(map(str, path)))
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = NamedSharding(mesh, spec)
    for note, names in replicated.items():
        logging.warning(
            'sharding: %s; replicating it in %d parameter(s): %s',
            note,
            len(names),
            ', '.join(names[:4]) + (', ...' if len(names) > 4 else ''),
        )
    return out


def batch_sharding(mesh: Mesh, rules: dict) -> NamedSharding:
    """Sharding of a [batch, ...] array: rows over the 'batch' rule's mesh axes."""
    axes = tuple(a for a in rules.get('batch', ()) if mesh.shape[a] > 1)
    return NamedSharding(mesh, PartitionSpec(axes or None))


def stacked_sharding(sharding: NamedSharding, axes: tuple[str, ...] = ()) -> NamedSharding:
    """Sharding of arrays stacked on a new leading axis, [N, ...]: that axis over the mesh
    `axes` (default: replicated), the others as `sharding` says."""
    lead = axes[0] if len(axes) == 1 else (axes or None)
    return NamedSharding(sharding.mesh, PartitionSpec(lead, *sharding.spec))


def global_batch(local: np.ndarray, sharding: NamedSharding, batch_axis: int = 0) -> jax.Array:
    """Assembles the global batch from each process's rows (rows on axis `batch_axis`)."""
    global_shape = list(local.shape)
    global_shape[batch_axis] *= jax.process_count()
    return jax.make_array_from_process_local_data(sharding, local, tuple(global_shape))


def _digest(text: str) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(text.encode()).digest()[:8], np.uint32)


def config_digests(
    config: ml_collections.ConfigDict, flags: Mapping[str, str] | None = None
) -> tuple[list[str], np.ndarray]:
    """(names, a [names, 2] uint32 digest of each value) of every setting of `config` but
    HOST_LOCAL_KEYS ('config.train.lr', ...), then of the entry point's `flags`
    ({'--workdir': path})."""
    flags = dict(flags or {})
    keys = sorted(k for k in dotted_keys(config) if k not in HOST_LOCAL_KEYS)
    values = [get_key(config, k) for k in keys] + list(flags.values())
    names = [f'config.{k}' for k in keys] + list(flags)
    return names, np.stack([_digest(repr(v)) for v in values])


def first_difference(names: list[str], gathered: np.ndarray) -> tuple[str, int] | None:
    """(name, process) of the first of `names` whose digest (`gathered`: [processes, names, 2])
    differs on some process from process 0's; None when all agree."""
    differs = (gathered != gathered[:1]).any(axis=-1)  # [processes, names]
    for i, name in enumerate(names):
        if differs[:, i].any():
            return name, int(np.argmax(differs[:, i]))
    return None


def check_same_config(
    config: ml_collections.ConfigDict, flags: Mapping[str, str] | None = None
) -> None:
    """Every process of a multi-host run must run the same config and `flags` (the same
    command on every host; HOST_LOCAL_KEYS may differ): else each stops in one line naming the
    first setting that differs, before any work, instead of training apart silently, crashing
    in a collective or hanging in a checkpoint save. A no-op in one process."""
    if jax.process_count() == 1:
        return
    names, digests = config_digests(config, flags)
    listed = _digest(' '.join(names))
    if (np.asarray(process_allgather(listed)) != listed).any():
        raise ValueError(
            'the processes of this multi-host run have configs with different keys (another '
            'version of lm on some host?): every process needs the same code and config'
        )
    if found := first_difference(names, np.asarray(process_allgather(digests))):
        name, p = found
        value = (flags or {}).get(name) if name.startswith('-') else get_key(config, name[7:])
        raise ValueError(
            f'{name} differs between process 0 and process {p} of this multi-host run '
            f'({value!r} on process {jax.process_index()}): run the same command with the same '
            'config on every process'
        )
