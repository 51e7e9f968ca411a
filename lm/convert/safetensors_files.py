"""Safetensors files read block by block (`SafetensorsReader`: one file or a sharded index) and
written one tensor at a time (`ShardWriter`), so no host holds a whole checkpoint."""

from __future__ import annotations

import json
import math
import os

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

SAFETENSORS_DTYPES = {'F32': 'float32', 'BF16': 'bfloat16', 'F16': 'float16'}
ITEM_BYTES = {
    'F64': 8,
    'F32': 4,
    'BF16': 2,
    'F16': 2,
    'I64': 8,
    'I32': 4,
    'I16': 2,
    'I8': 1,
    'U8': 1,
    'BOOL': 1,
    'F8_E4M3': 1,
    'F8_E5M2': 1,
}


def check_safetensors(path: str) -> None:
    """One-line ValueError naming `path` when it is not a whole safetensors file: a header that
    is cut, not JSON, or names bytes past the end of the file (a truncated download)."""
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(8)
        n = int.from_bytes(head, 'little') if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise ValueError(
                f'{path} is not a safetensors file (its {size} bytes hold no complete header)'
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f'{path} has a damaged safetensors header (not JSON)') from None
    data = size - 8 - n
    if not isinstance(header, dict):
        raise ValueError(f'{path} has a damaged safetensors header (not a JSON object)')
    for name, entry in header.items():
        if name == '__metadata__':
            continue
        if not _is_entry(entry):
            raise ValueError(
                f"{path} has a damaged safetensors header: tensor {name} lacks a 'dtype', "
                "'shape' or 'data_offsets' of the right kind (download it again)"
            )
        start, end = entry['data_offsets']
        want = math.prod(entry['shape']) * ITEM_BYTES.get(entry['dtype'], 0)
        if end > data or (want and end - start != want):
            raise ValueError(
                f'{path} is truncated or damaged: tensor {name} needs bytes {start}..{end} of '
                f'its data, the file holds {data} (download it again)'
            )


def _is_entry(entry) -> bool:
    """Whether a safetensors header entry has a dtype, a shape and two data offsets."""

    def counts(xs) -> bool:
        return isinstance(xs, list) and all(isinstance(x, int) and x >= 0 for x in xs)

    return (
        isinstance(entry, dict)
        and isinstance(entry.get('dtype'), str)
        and counts(entry.get('shape'))
        and counts(entry.get('data_offsets'))
        and len(entry['data_offsets']) == 2
    )


def _read_index(index: str) -> dict[str, str]:
    """The weight map of a `model.safetensors.index.json` (one-line ValueError if damaged)."""
    try:
        with open(index) as f:
            return dict(json.load(f)['weight_map'])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{index} is not a safetensors index (JSON with a 'weight_map')") from None


class SafetensorsReader:
    """The tensors of `model.safetensors` or of the shards a `model.safetensors.index.json`
    names; reads any block of one tensor without reading the rest."""

    def __init__(self, directory: str):
        index = os.path.join(directory, 'model.safetensors.index.json')
        single = os.path.join(directory, 'model.safetensors')
        if os.path.isfile(index):
            weight_map = _read_index(index)
            if os.path.isfile(single) and 'model.safetensors' not in weight_map.values():
                raise ValueError(  # transformers would load the single file, lm the shards
                    f'{directory} holds both model.safetensors and model.safetensors.index.json '
                    'naming other shards: two checkpoints; keep the one that is the model'
                )
            self.files = {n: os.path.join(directory, p) for n, p in weight_map.items()}
        elif os.path.isfile(single):
            check_safetensors(single)
            with safe_open(single, 'numpy') as f:
                self.files = {n: single for n in f.keys()}
        else:
            raise FileNotFoundError(
                f'{directory} has neither model.safetensors nor model.safetensors.index.json '
                '(only safetensors checkpoints are read)'
            )
        self._open: dict[str, object] = {}

    def _slice(self, name: str):
        path = self.files[name]
        if path not in self._open:
            if not os.path.isfile(path):
                raise FileNotFoundError(f'{path} (named in the safetensors index) is missing')
            check_safetensors(path)
            self._open[path] = safe_open(path, 'numpy')
        return self._open[path].get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        code = self._slice(name).get_dtype()
        if code not in SAFETENSORS_DTYPES:
            raise ValueError(
                f'tensor {name} has dtype {code}; lm reads {sorted(SAFETENSORS_DTYPES)}'
            )
        return SAFETENSORS_DTYPES[code]

    def read(self, name: str, rows: slice, cols: slice | None) -> np.ndarray:
        """A block of tensor `name`; ValueError when it holds NaN or infinity."""
        s = self._slice(name)
        block = s[rows] if cols is None else s[rows, cols]
        if not np.isfinite(block).all():  # bfloat16 too (ml_dtypes), without a copy
            raise ValueError(
                f'{self.files[name]}: tensor {name} holds non-finite values (NaN or inf); '
                'refusing to import it'
            )
        return block

    def close(self) -> None:
        self._open.clear()


class ShardWriter:
    """Streams tensors into safetensors files of at most `max_bytes` each (plus an index when
    there is more than one); the header is written first from the known shapes."""

    def __init__(self, directory: str, entries: list[tuple[str, tuple, np.dtype]], max_bytes: int):
        self.directory = directory
        groups: list[list] = [[]]
        size = 0
        for name, shape, dtype in entries:
            nbytes = math.prod(shape) * dtype.itemsize
            if groups[-1] and size + nbytes > max_bytes:
                groups.append([])
                size = 0
            groups[-1].append((name, shape, dtype, nbytes))
            size += nbytes
        n = len(groups)
        self.files = (
            ['model.safetensors']
            if n == 1
            else [f'model-{i + 1:05d}-of-{n:05d}.safetensors' for i in range(n)]
        )
        self.groups = groups
        self.codes = {jnp.dtype(v): k for k, v in SAFETENSORS_DTYPES.items()}

    def write(self, values) -> None:
        """`values`: the tensors' arrays in entry order (an iterator, one at a time)."""
        weight_map, total = {}, 0
        for file, group in zip(self.files, self.groups, strict=True):
            header, offset = {'__metadata__': {'format': 'pt'}}, 0
            for name, shape, dtype, nbytes in group:
                header[name] = {
                    'dtype': self.codes[np.dtype(dtype)],
                    'shape': list(shape),
                    'data_offsets': [offset, offset + nbytes],
                }
                offset += nbytes
                weight_map[name] = file
            raw = json.dumps(header).encode()
            raw += b' ' * (-len(raw) % 8)
            with open(os.path.join(self.directory, file), 'wb') as f:
                f.write(len(raw).to_bytes(8, 'little'))
                f.write(raw)
                for name, shape, dtype, _ in group:
                    value = next(values)
                    if value.shape != tuple(shape) or value.dtype != dtype:
                        raise RuntimeError(f'{name}: got {value.shape} {value.dtype}')
                    f.write(np.ascontiguousarray(value).tobytes())
            total += offset
        if len(self.files) > 1:
            with open(os.path.join(self.directory, 'model.safetensors.index.json'), 'w') as f:
                json.dump(
                    {'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=1
                )
