"""Checksums of a state's arrays, computed on device where they live (sharded or not; a small
array on the host, the same sums).

Each array's bits are read as unsigned words w_i (one per element, by the element's byte width;
i = its flat row-major index) and reduced to two position-weighted sums modulo 2^32:

    a = sum_i w_i * (2 i + 1),    b = sum_i w_i * ((2654435761 i) | 1)

Both weights are odd, so changing any single element changes both sums; integer sums do not
depend on the order of reduction, so the result is the same for any sharding or mesh.

A checkpoint's JSON side-car (config, data position, shapes, the arrays' checksums) carries a
checksum of its own: `meta_checksum`, SHA-256 of its canonical JSON.
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

_WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}
# Arrays this small are checksummed on the host (`array_checksums`).
HOST_ELEMENTS = 1 << 20


def _words(x: jax.Array) -> jax.Array:
    """The bits of each element of x as uint32 (same shape)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x, _WORDS[x.dtype.itemsize]).astype(jnp.uint32)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
    """Row-major flat index of every element, uint32 (wrapping past 2^32), built without a
    reshape so a sharded array stays sharded."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
        stride = stride * shape[axis] % 2**32
    return index


@jax.jit
def _leaf_sums(x: jax.Array) -> jax.Array:
    """[a, b] of one array, as one reduction: two independent reductions of a sharded array
    become two all-reduces that XLA's CPU runtime may start in different orders on different
    devices, which deadlocks."""
    w, i = _words(x), _flat_index(x.shape)
    weights = jnp.stack([2 * i + 1, (i * np.uint32(2654435761)) | 1])
    return jnp.sum(w[None] * weights, axis=tuple(range(1, w.ndim + 1)), dtype=jnp.uint32)


def host_leaf_sums(x: np.ndarray) -> tuple[int, int]:
    """(a, b) of one host array: the same sums as `_leaf_sums`, in numpy's wrapping uint32."""
    if x.dtype == np.bool_:
        w = x.astype(np.uint32)
    else:
        w = x.view(np.dtype(f'uint{8 * x.dtype.itemsize}')).astype(np.uint32)
    i = (np.arange(x.size, dtype=np.uint64) % 2**32).astype(np.uint32)
    a = np.sum(w.ravel() * (2 * i + 1), dtype=np.uint32)
    b = np.sum(w.ravel() * ((i * np.uint32(2654435761)) | 1), dtype=np.uint32)
    return int(a), int(b)


def array_checksums(tree) -> dict[str, str]:
    """{'['params']['embed']': '1f03...', ...}: a 16-hex-digit checksum per array of `tree`,
    one array at a time (the temporaries are one array's, a compile serves every array of the
    same shape, and only one checksum program is in flight). An array of this process of at
    most HOST_ELEMENTS elements is summed on the host instead: the same sums, with no compile
    per shape (most of a small run's checkpoint time)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if leaf.size <= HOST_ELEMENTS and getattr(leaf, 'is_fully_addressable', True):
            a, b = host_leaf_sums(np.asarray(jax.device_get(leaf)))
        else:
            # Fetched before the next leaf is dispatched: XLA:CPU's in-process collectives (a
            # mesh of several CPU devices) can deadlock when many multi-device programs are
            # queued.
            a, b = (int(s) for s in np.asarray(jax.device_get(_leaf_sums(leaf))))
        out[jax.tree_util.keystr(path)] = f'{a:08x}{b:08x}'
    return out


def mismatches(saved: dict[str, str], tree) -> list[str]:
    """Names of the arrays of `tree` whose checksum differs from `saved` (arrays `saved` does
    not list are not checked)."""
    current = array_checksums(tree)
    return [name for name, value in current.items() if saved.get(name, value) != value]


def meta_checksum(meta: dict, key: str) -> str:
    """16 hex digits of SHA-256 over the canonical JSON (sorted keys) of `meta`, less its entry
    `key` (where the checksum itself is kept)."""
    rest = {k: v for k, v in meta.items() if k != key}
    text = json.dumps(rest, sort_keys=True, separators=(',', ':'))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
