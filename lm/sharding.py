"""Device mesh from `config.mesh` and logical-axis rules that map parameter axes onto it.

Parameters carry logical axis names (`lm/layers.py`); `config.mesh.rules` maps each name to
mesh axes ('data', 'fsdp', 'tensor', comma-separated, '' = replicated), MaxText-style, so a
run is re-sharded by editing config only. A dimension that a rule would split unevenly (MQA's
single KV head over a tensor axis of 4, say) is replicated instead, with one log line.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor')


def mesh_shape(mesh: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
    """Axis sizes for ('data', 'fsdp', 'tensor'), with one -1 filled by the remaining devices."""
    sizes = [mesh[a] for a in MESH_AXES]
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
            f'devices, but {num_devices} are available'
        )
    return tuple(sizes)


def _named(sizes: list[int]) -> dict[str, int]:
    return dict(zip(MESH_AXES, sizes, strict=True))


def rules_table(mesh: ml_collections.ConfigDict) -> dict[str, tuple[str, ...]]:
    """`config.mesh.rules` as {logical name: mesh axes}; unknown mesh axes are an error."""
    table = {}
    for name, value in mesh.rules.items():
        axes = tuple(a.strip() for a in value.split(',') if a.strip())
        for a in axes:
            if a not in MESH_AXES:
                raise ValueError(
                    f'config.mesh.rules.{name}={value!r} names unknown mesh axis '
                    f'{a!r}; mesh axes are {MESH_AXES}'
                )
        table[name] = axes
    return table


def make_mesh(mesh: ml_collections.ConfigDict, devices: list | None = None) -> Mesh:
    """The ('data', 'fsdp', 'tensor') mesh over all (or the given) devices."""
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(mesh, len(devices))
    rules_table(mesh)
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def data_parallel_size(mesh: Mesh, rules: dict[str, tuple[str, ...]]) -> int:
    return math.prod(mesh.shape[a] for a in rules.get('batch', ()))


def spec_for(
    axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh, rules: dict, name: str = ''
) -> PartitionSpec:
    """PartitionSpec for one array: each logical axis goes to its rule's mesh axes, unless the
    dimension does not divide evenly or a mesh axis is already used by an earlier dimension."""
    used, spec = set(), []
    for logical, dim in zip(axes, shape, strict=True):
        if logical not in rules:
            raise ValueError(
                f'logical axis {logical!r} of {name} has no entry in config.mesh.rules'
            )
        mesh_axes = tuple(a for a in rules[logical] if a not in used and mesh.shape[a] > 1)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if mesh_axes and dim % size:
            logging.log_first_n(
                logging.WARNING,
                '%s: %s=%d does not divide over mesh axes %s (size %d); replicating that dimension',
                1,
                name,
                logical,
                dim,
                mesh_axes,
                size,
            )
            mesh_axes = ()
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None))
    return PartitionSpec(*spec)


def param_shardings(abstract_params: nnx.State, mesh: Mesh, rules: dict) -> dict:
    """NamedSharding for every parameter (as a pure dict), from its `axes` metadata."""
    out = {}
    for path, var in nnx.to_flat_state(abstract_params):
        name = '/'.join(map(str, path))
        spec = spec_for(var.get_metadata()['axes'], var.shape, mesh, rules, name)
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = NamedSharding(mesh, spec)
    return out


def batch_sharding(mesh: Mesh, rules: dict) -> NamedSharding:
    """Sharding of a [batch, ...] array: rows over the 'batch' rule's mesh axes."""
    axes = tuple(a for a in rules.get('batch', ()) if mesh.shape[a] > 1)
    return NamedSharding(mesh, PartitionSpec(axes or None))


def global_batch(local: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Assembles the global batch from each process's rows."""
    global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
    return jax.make_array_from_process_local_data(sharding, local, global_shape)
