"""4-bit KV-cache storage as KIVI does it (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache"; here with 4 bits): asymmetric min/max quantization to codes 0..15,

  scale = (max - min) / 15,  code = round((v - min) / scale) in [0, 15],  v̂ = code · scale + min

keys per channel (min and scale per channel over a group of G consecutive tokens, a row's left
padding left out), values per token (min and scale per cached vector), two codes packed per
uint8 byte along the channels.

Storage of a [B, ..., S, X] array `name` (X even) for G-token groups: `name` the packed codes
[B, ..., S', X/2] uint8 with S' = (ceil(S/G) + 1)·G slots (one spare group, so that writing
whole groups never runs past the end); `name_min` and `name_scale` in the array's float dtype,
[B, ..., S'/G, X] per channel or [B, ..., S', 1] per token; `name_residual` [B, ..., G, X] in
float: the group that is not complete yet. Entries go into the residual and are quantized (the
whole group at once, keys and values alike) when their group of G is complete; the residual
overlays its group's slots on reading, so the last (written mod G) tokens are exact.
Shape letters: see lm/model/transformer.py; N groups, L slots of whole groups.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

LEVELS = 15  # the largest 4-bit code


def pack(codes_BX: jax.Array) -> jax.Array:
    """[..., X] codes in 0..15 (X even) -> [..., X/2] uint8: channel 2i in the low nibble of
    byte i, channel 2i + 1 in its high nibble."""
    codes_BX = codes_BX.astype(jnp.uint8)
    return codes_BX[..., 0::2] | (codes_BX[..., 1::2] << 4)


def unpack(packed_BY: jax.Array) -> jax.Array:
    """The inverse of `pack`: [..., X/2] uint8 -> [..., X] uint8 codes."""
    both_BY2 = jnp.stack([packed_BY & 0xF, packed_BY >> 4], axis=-1)
    return both_BY2.reshape(*packed_BY.shape[:-1], 2 * packed_BY.shape[-1])


def quantize(
    x: jax.Array, axis: int, valid: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(codes uint8 shaped like x, min, scale) with min and scale over `axis` (kept, size 1) in
    x's dtype; the codes are computed from min and scale as stored (rounded to that dtype).
    valid (broadcastable to x): the entries the min and max are taken over (none: 0 and 0)."""
    x32 = x.astype(jnp.float32)
    if valid is None:
        lo = jnp.min(x32, axis=axis, keepdims=True)
        hi = jnp.max(x32, axis=axis, keepdims=True)
    else:
        lo = jnp.min(jnp.where(valid, x32, jnp.inf), axis=axis, keepdims=True)
        hi = jnp.max(jnp.where(valid, x32, -jnp.inf), axis=axis, keepdims=True)
        lo, hi = jnp.where(lo > hi, 0.0, lo), jnp.where(lo > hi, 0.0, hi)
    mn, scale = lo.astype(x.dtype), ((hi - lo) / LEVELS).astype(x.dtype)
    safe = jnp.where(scale > 0, scale.astype(jnp.float32), 1.0)
    codes = jnp.clip(jnp.round((x32 - mn.astype(jnp.float32)) / safe), 0, LEVELS)
    return codes.astype(jnp.uint8), mn, scale


def dequantize(codes: jax.Array, mn: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    """code · scale + min (broadcast), computed in float32, returned in `dtype`."""
    f32 = jnp.float32
    return (codes.astype(f32) * scale.astype(f32) + mn.astype(f32)).astype(dtype)


def quantize_per_channel(
    x_B_LX: jax.Array, group: int, valid_B_L1: jax.Array | None = None
) -> tuple[jax.Array, ...]:
    """Keys: (codes [..., L, X], min and scale [..., L/G, X]) over each group of G tokens (those
    `valid_B_L1` marks, [..., L, 1], broadcastable: all when None)."""
    *lead, L, X = x_B_LX.shape
    x_BNGX = x_B_LX.reshape(*lead, L // group, group, X)
    if valid_B_L1 is not None:
        valid_B_L1 = valid_B_L1.reshape(*valid_B_L1.shape[:-2], L // group, group, 1)
    codes_BNGX, mn_BN1X, scale_BN1X = quantize(x_BNGX, -2, valid_B_L1)
    return codes_BNGX.reshape(x_B_LX.shape), mn_BN1X[..., 0, :], scale_BN1X[..., 0, :]


def quantize_per_token(x_B_LX: jax.Array) -> tuple[jax.Array, ...]:
    """Values: (codes [..., L, X], min and scale [..., L, 1]) over each token's vector."""
    return quantize(x_B_LX, -1)


def empty(name: str, x_B_SX: jax.Array, group: int, per_channel: bool) -> dict[str, jax.Array]:
    """Zeroed storage (see the module docstring) for an array shaped and typed like x_B_SX."""
    *lead, S, X = x_B_SX.shape
    if X % 2:
        raise ValueError(
            f"kv_cache_dtype='kivi4' packs two 4-bit codes per byte: cache array {name!r} "
            f'has an odd width {X}'
        )
    slots = (math.ceil(S / group) + 1) * group
    stats = (*lead, slots // group, X) if per_channel else (*lead, slots, 1)
    return {
        name: jnp.zeros((*lead, slots, X // 2), jnp.uint8),
        f'{name}_min': jnp.zeros(stats, x_B_SX.dtype),
        f'{name}_scale': jnp.zeros(stats, x_B_SX.dtype),
        f'{name}_residual': jnp.zeros((*lead, group, X), x_B_SX.dtype),
    }


def write(
    name: str,
    stored: dict[str, jax.Array],
    new_B_TX: jax.Array,
    slot: jax.Array,
    pad_B: jax.Array,
    group: int,
    per_channel: bool,
) -> dict[str, jax.Array]:
    """The storage of `name` after T new entries at absolute slots slot..slot+T-1: the residual
    (slot mod G entries) followed by the new ones is a buffer of 1 + ceil(T/G) whole groups
    starting at group slot // G; every group of it is quantized and written there (the
    incomplete ones too: their slots are overlaid by the residual, or not yet attended, until
    a later write rewrites them whole), and the residual becomes the group holding the last
    (slot + T) mod G entries. Row b's left padding (slots < pad_B[b], never attended) is left
    out of the per-channel statistics, so that it cannot widen a group's range."""
    residual_B_GX = stored[f'{name}_residual']
    *lead, T, X = new_B_TX.shape
    axis = new_B_TX.ndim - 2
    n = 1 + math.ceil(T / group)
    buf_B_LX = jnp.concatenate(
        [residual_B_GX, jnp.zeros((*lead, (n - 1) * group, X), residual_B_GX.dtype)], axis=axis
    )
    start = jnp.mod(slot, group)
    buf_B_LX = jax.lax.dynamic_update_slice_in_dim(
        buf_B_LX, new_B_TX.astype(buf_B_LX.dtype), start, axis
    )
    if per_channel:
        slots_L = slot // group * group + jnp.arange(n * group)
        valid_BL = slots_L[None, :] >= pad_B[:, None]
        valid_B_L1 = valid_BL.reshape(valid_BL.shape[0], *[1] * (axis - 1), n * group, 1)
        codes, mn, scale = quantize_per_channel(buf_B_LX, group, valid_B_L1)
        stat_at = slot // group
    else:
        codes, mn, scale = quantize_per_token(buf_B_LX)
        stat_at = slot // group * group
    at = slot // group * group

    def put(a, x, i):
        return jax.lax.dynamic_update_slice_in_dim(a, x, i, axis)

    last = (start + T) // group * group
    return {
        name: put(stored[name], pack(codes), at),
        f'{name}_min': put(stored[f'{name}_min'], mn, stat_at),
        f'{name}_scale': put(stored[f'{name}_scale'], scale, stat_at),
        f'{name}_residual': jax.lax.dynamic_slice_in_dim(buf_B_LX, last, group, axis),
    }


def read(
    name: str,
    stored: dict[str, jax.Array],
    written: jax.Array,
    length: int,
    group: int,
    per_channel: bool,
    dtype,
) -> jax.Array:
    """The array `name` [B, ..., length, X] in `dtype` once `written` tokens went in: the
    dequantized groups, with the residual over the slots of group written // G."""
    codes_B_LX = unpack(stored[name])
    *lead, L, X = codes_B_LX.shape
    mn, scale = stored[f'{name}_min'], stored[f'{name}_scale']
    if per_channel:  # one min and scale per channel of each group: [..., N, 1, X]
        codes_BNGX = codes_B_LX.reshape(*lead, L // group, group, X)
        x_B_LX = dequantize(codes_BNGX, mn[..., None, :], scale[..., None, :], dtype)
        x_B_LX = x_B_LX.reshape(codes_B_LX.shape)
    else:
        x_B_LX = dequantize(codes_B_LX, mn, scale, dtype)
    axis = x_B_LX.ndim - 2
    residual_B_GX = stored[f'{name}_residual'].astype(dtype)
    x_B_LX = jax.lax.dynamic_update_slice_in_dim(
        x_B_LX, residual_B_GX, written // group * group, axis
    )
    return jax.lax.slice_in_dim(x_B_LX, 0, length, axis=axis)
