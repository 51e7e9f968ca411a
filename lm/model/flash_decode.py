"""Flash-decoding as one fused GPU kernel (Pallas on Triton): one new query per sequence attends
the filled part of a head-major cache. Each program of the grid takes one (sequence, KV head) and
one split of the cache's slots, reads its keys and values once, block by block, and keeps the
scores, the softmax and the weighted value sum on chip; a few XLA ops then combine the splits
(flash-decoding, Dao et al. 2023). It replaces the separate kernels XLA makes of the two
matmuls, the masking and the softmax's pieces. `config.model.decode_kernel='pallas'` selects it
for decode steps (T = 1).

Absorbed MLA (FlashMLA's case) is the same kernel with one KV head whose values are the first
`value_width` columns of its keys: each tile of the latent [c_KV; k_R] is read once per step for
every query head, the RoPE columns taking part in the scores only.

Triton tiles are powers of 2: a width of any size is read as its binary pieces (544 = 512 + 32
columns), each piece of 16 or more columns through the matrix units and a narrower one
(8, 4, 2, 1) by elementwise products. The cache must be a multiple of 16 slots or one smaller
power-of-2 tile (`lm.infer.decode.cache_capacity` gives multiples of 128); `unserved` says why a
cache cannot be tiled, and the model then attends with XLA (lm/model/variant.py).
Shape letters: see the legend in lm/model/transformer.py; N = B·G (sequence, KV head) pairs,
P = splits, C = slots per tile, W = a piece's width.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG = float(jnp.finfo(jnp.float32).min)
MIN_DOT = 16  # Triton's smallest matmul tile: rows, slots and the widths it multiplies
TARGET_PROGRAMS = 512  # splits of the slots until B·G·splits reaches this (a few per GPU core)
SHARED_BYTES = 96 * 1024  # tile bytes in flight per program (num_stages tiles of K and V)
NUM_STAGES = 2  # Triton's software pipelining depth over the slot tiles


def slots_per_tile(S: int, block: int) -> int:
    """The tile for a cache of S slots: the largest power of 2 dividing S, at most `block`."""
    return min(block, S & -S)


def pieces(offset: int, width: int) -> tuple[tuple[int, int], ...]:
    """Columns [offset, offset + width) as power-of-2 (offset, width) pieces, widest first."""
    out = []
    for bit in reversed(range(width.bit_length())):
        if width >> bit & 1:
            out.append((offset, 1 << bit))
            offset += 1 << bit
    return tuple(out)


def check_backend(
    setting: str = 'config.model.decode_kernel',
    fix: str = "use 'xla', or 'pallas_interpret' to check the kernel",
) -> None:
    """One-line ValueError naming `setting` (and what to do: `fix`) when 'pallas' is asked of a
    backend without GPUs."""
    if jax.default_backend() != 'gpu':
        raise ValueError(
            f"{setting}='pallas' needs a GPU (Triton kernels); this backend is "
            f'{jax.default_backend()!r}: {fix}'
        )


def unserved(S: int) -> str | None:
    """Why the kernel cannot tile a cache of S slots (None: it can)."""
    if S & -S < MIN_DOT and S & -S != S:
        return (
            f"config.model.decode_kernel='pallas' needs a cache of a multiple of {MIN_DOT} "
            f'slots, got {S} (lm.infer.decode.cache_capacity sizes caches so)'
        )
    return None


def split_slots(n_blocks: int, programs: int) -> tuple[int, int]:
    """(splits, tiles per split): the cache's `n_blocks` tiles split until `programs` · splits
    reaches TARGET_PROGRAMS, none empty."""
    splits = min(n_blocks, max(1, TARGET_PROGRAMS // programs))
    per_split = math.ceil(n_blocks / splits)
    return math.ceil(n_blocks / per_split), per_split


def combine_splits(o_PNRU: jax.Array, l_PNR: jax.Array, m_PNR: jax.Array) -> jax.Array:
    """The softmax-weighted value sums of P splits as one: [N, R, U] =
    sum_p e^{m_p - m} o_p / sum_p e^{m_p - m} l_p, m the largest running max."""
    # the barrier JAX's own decode kernel puts here against NaNs after compilation
    m_1NR = jax.lax.optimization_barrier(m_PNR.max(axis=0, keepdims=True))
    w_PNR = jnp.exp(m_PNR - m_1NR)
    l_NR1 = (l_PNR * w_PNR).sum(axis=0)[..., None]
    tiny = jnp.finfo(jnp.float32).tiny
    return (o_PNRU * w_PNR[..., None]).sum(axis=0) / jnp.maximum(l_NR1, tiny)


def _scores(q_RW: jax.Array, k_CW: jax.Array) -> jax.Array:
    """[R, C] float32 dot products of a piece of the queries and keys."""
    if q_RW.shape[-1] >= MIN_DOT:
        return plgpu.dot(q_RW, k_CW, trans_b=True)
    q_RW, k_CW = q_RW.astype(jnp.float32), k_CW.astype(jnp.float32)
    return (q_RW[:, None, :] * k_CW[None, :, :]).sum(axis=-1)


def _weighted(p_RC: jax.Array, v_CW: jax.Array) -> jax.Array:
    """[R, W] float32: the probabilities times a piece of the values."""
    if v_CW.shape[-1] >= MIN_DOT:
        return plgpu.dot(p_RC.astype(v_CW.dtype), v_CW)
    return (p_RC[:, :, None] * v_CW.astype(jnp.float32)[None, :, :]).sum(axis=1)


def _kernel(*refs, scale, block, per_split, rows, R, key_pieces, value_pieces, shared) -> None:
    """One (sequence, KV head) and one split: blocks [j·per_split, (j+1)·per_split) of the
    filled slots. refs: q [R, D] (loaded as a tile of `rows`, zeros past R), k [S, D], v [S, U]
    (absent when `shared`: the values are the keys' columns [0, U)), mask [S], filled, then the
    outputs o [R, U] (unnormalised), l [R] (sum of exp), m [R] (running max), float32."""
    if shared:
        q_ref, k_ref, mask_ref, filled_ref, o_ref, l_ref, m_ref = refs
        v_ref = k_ref
    else:
        q_ref, k_ref, v_ref, mask_ref, filled_ref, o_ref, l_ref, m_ref = refs
    j = pl.program_id(1)
    n_blocks = pl.cdiv(filled_ref[()], block)
    lo = j * per_split
    hi = jnp.minimum(lo + per_split, n_blocks)
    real_R1 = (jnp.arange(rows) < R)[:, None]
    q_pieces = [
        plgpu.load(q_ref.at[pl.ds(0, rows), pl.ds(off, w)], mask=real_R1, other=0.0)
        for off, w in key_pieces
    ]

    def body(b, carry):
        o_pieces, m_R, l_R = carry
        slots = pl.ds(b * block, block)
        k_tiles = {off: k_ref[slots, pl.ds(off, w)] for off, w in key_pieces}
        pairs = zip(q_pieces, key_pieces, strict=True)
        s_RC = sum(_scores(q, k_tiles[off]) for q, (off, _) in pairs) * scale
        keep_1C = (mask_ref[slots] != 0)[None, :]
        s_RC = jnp.where(keep_1C, s_RC, NEG)
        m_new = jnp.maximum(m_R, s_RC.max(axis=-1))
        p_RC = jnp.where(keep_1C, jnp.exp(s_RC - m_new[:, None]), 0.0)
        rescale = jnp.exp(m_R - m_new)[:, None]
        o_pieces = tuple(
            o_RW * rescale
            + _weighted(p_RC, k_tiles[off] if shared else v_ref[slots, pl.ds(off, w)])
            for o_RW, (off, w) in zip(o_pieces, value_pieces, strict=True)
        )
        return o_pieces, m_new, l_R * rescale[:, 0] + p_RC.sum(axis=-1)

    init = (
        tuple(jnp.zeros((rows, w), jnp.float32) for _, w in value_pieces),
        jnp.full((rows,), NEG, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    o_pieces, m_R, l_R = jax.lax.fori_loop(lo, jnp.maximum(lo, hi), body, init)
    for o_RW, (off, w) in zip(o_pieces, value_pieces, strict=True):
        plgpu.store(o_ref.at[pl.ds(0, rows), pl.ds(off, w)], o_RW, mask=real_R1)
    plgpu.store(l_ref.at[pl.ds(0, rows)], l_R, mask=real_R1[:, 0])
    plgpu.store(m_ref.at[pl.ds(0, rows)], m_R, mask=real_R1[:, 0])


def _blocks(N: int, G: int, S: int, D: int, U: int, R: int, rows: int, splits: int, shared: bool):
    """pallas_call's block specs and output shapes: program (n, j) reads the query rows, keys,
    values (unless `shared`) of sequence-and-KV-head n, its sequence's mask and `filled`, and
    writes split j's o [R, U], l [R], m [R] (float32)."""
    f32 = jnp.float32
    values = [] if shared else [pl.BlockSpec((None, S, U), lambda n, j: (n, 0, 0))]
    return dict(
        in_specs=[
            pl.BlockSpec((None, rows, D), lambda n, j: (n, 0, 0)),
            pl.BlockSpec((None, S, D), lambda n, j: (n, 0, 0)),
            *values,
            pl.BlockSpec((None, S), lambda n, j: (n // G, 0)),
            pl.BlockSpec((), lambda n, j: ()),
        ],
        out_specs=[
            pl.BlockSpec((None, None, rows, U), lambda n, j: (j, n, 0, 0)),
            pl.BlockSpec((None, None, rows), lambda n, j: (j, n, 0)),
            pl.BlockSpec((None, None, rows), lambda n, j: (j, n, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((splits, N, R, U), f32),
            jax.ShapeDtypeStruct((splits, N, R), f32),
            jax.ShapeDtypeStruct((splits, N, R), f32),
        ],
    )


def tile_slots(S: int, block: int, width: int, itemsize: int) -> int:
    """Slots per tile: at most `block`, and few enough that NUM_STAGES tiles of `width` bytes'
    worth of key and value columns fit SHARED_BYTES (at least MIN_DOT)."""
    fit = SHARED_BYTES // (NUM_STAGES * width * itemsize)
    return slots_per_tile(S, max(MIN_DOT, min(block, 1 << max(fit, 1).bit_length() - 1)))


def _pallas(B, G, S, D, U, R, block, shared, scale, interpret) -> Callable:
    """The kernel's pallas_call over (sequence-and-KV-head, split) programs: R query rows per
    program loaded as a power-of-2 tile of `rows`, the slots in splits of whole tiles."""
    rows = max(MIN_DOT, 1 << (R - 1).bit_length())
    splits, per_split = split_slots(S // block, B * G)
    kernel = functools.partial(
        _kernel,
        scale=scale,
        block=block,
        per_split=per_split,
        rows=rows,
        R=R,
        key_pieces=pieces(0, D) if not shared else pieces(0, U) + pieces(U, D - U),
        value_pieces=pieces(0, U),
        shared=shared,
    )
    return pl.pallas_call(
        kernel,
        grid=(B * G, splits),
        **_blocks(B * G, G, S, D, U, R, rows, splits, shared),
        compiler_params=plgpu.CompilerParams(
            num_warps=4 if rows * U <= 64 * 128 else 8, num_stages=NUM_STAGES
        ),
        interpret=interpret,
        name='flash_decode',
    )


def flash_decode(
    q_B1HD: jax.Array,
    k_BGSD: jax.Array,
    v_BGSU: jax.Array | None,
    mask_B1S: jax.Array,
    *,
    scale: float,
    filled: jax.Array,
    value_width: int | None = None,
    block: int = 128,
    interpret: bool = False,
) -> jax.Array:
    """Attention of one new query per sequence over the first `filled` slots: [B, 1, H, U],
    equal to `grouped_attention` with the same mask (up to float rounding).

    k_BGSD / v_BGSU: head-major caches, or [B, S, D] / [B, S, U] for one shared KV head.
    v_BGSU None: the values are the keys' first `value_width` columns, read from the same tiles
    (absorbed MLA's latent [c_KV; k_R]: U = value_width). mask_B1S: True = attend. filled: int32
    scalar, the slots written so far. block: the most slots per tile (a power of 2; the tile is
    the largest power of 2 <= block dividing S that fits the shared-memory budget, at least 16
    unless the whole cache is one smaller power-of-2 tile; `unserved` names a cache it cannot
    tile). interpret: run in Pallas's interpreter (any backend; for tests).
    """
    if not interpret:
        check_backend()
    B, _, H, D = q_B1HD.shape
    shared = v_BGSU is None
    if k_BGSD.ndim == 3:
        k_BGSD = k_BGSD[:, None]
        v_BGSU = None if shared else v_BGSU[:, None]
    G, S = k_BGSD.shape[1], k_BGSD.shape[2]
    U = value_width if shared else v_BGSU.shape[-1]
    R = H // G
    block = tile_slots(S, block, D + (0 if shared else U), k_BGSD.dtype.itemsize)
    if reason := unserved(S):
        raise ValueError(reason)
    q_NRD = q_B1HD.reshape(B * G, R, D).astype(k_BGSD.dtype)  # loaded as `rows`, zeros past R
    values = () if shared else (v_BGSU.reshape(B * G, S, U),)
    mask_BS = mask_B1S[:, 0].astype(jnp.int32)
    call = _pallas(B, G, S, D, U, R, block, shared, scale, interpret)
    o_PNRU, l_PNR, m_PNR = call(
        q_NRD, k_BGSD.reshape(B * G, S, D), *values, mask_BS, jnp.asarray(filled, jnp.int32)
    )
    o_NRU = combine_splits(o_PNRU, l_PNR, m_PNR)
    return o_NRU.reshape(B, 1, H, U).astype(k_BGSD.dtype)
