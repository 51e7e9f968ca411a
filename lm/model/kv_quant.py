"""int8 storage of KV-cache arrays: symmetric absmax quantization with one scale per cached
vector (per token, and per KV head where the cache has a head axis; MLA: per token's latent).

  scale = max_x |v_x| / 127,  code_x = round(v_x / scale) in [-127, 127],  v̂_x = code_x · scale

A [B, ..., S, X] array `name` is stored as int8 codes under `name` and its scales [B, ..., S, 1]
(in the array's float dtype) under `name_scale`. Shape letters: see lm/model/transformer.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

INT8_MAX = 127


def encode(name: str, x_B_SX: jax.Array) -> dict[str, jax.Array]:
    """{name: int8 codes [B, ..., S, X], name_scale: scales [B, ..., S, 1]} of a float array."""
    absmax_B_S1 = jnp.max(jnp.abs(x_B_SX.astype(jnp.float32)), axis=-1, keepdims=True)
    scale_B_S1 = (absmax_B_S1 / INT8_MAX).astype(x_B_SX.dtype)  # rounded as it is stored
    safe_B_S1 = jnp.where(scale_B_S1 > 0, scale_B_S1.astype(jnp.float32), 1.0)
    codes = jnp.clip(jnp.round(x_B_SX.astype(jnp.float32) / safe_B_S1), -INT8_MAX, INT8_MAX)
    return {name: codes.astype(jnp.int8), f'{name}_scale': scale_B_S1}


def decode(name: str, stored: dict[str, jax.Array], dtype) -> jax.Array:
    """The array `name` back from its codes and scales, in `dtype`."""
    return stored[name].astype(dtype) * stored[f'{name}_scale'].astype(dtype)
