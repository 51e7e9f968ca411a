"""Flash-decoding as one fused GPU kernel (Pallas on Triton): one new query per sequence attends
the filled part of a head-major cache. Each program of the grid takes one (sequence, KV head) and
one split of the cache's slots, reads its keys and values once, block by block, and keeps the
scores, the softmax and the weighted value sum on chip; a few XLA ops then combine the splits
(flash-decoding, Dao et al. 2023). It replaces the separate kernels XLA makes of the two
matmuls, the masking and the softmax's pieces (docs/performance.md: on an H100 it reads the cache
at ~2.5 TB/s). `config.model.decode_kernel='pallas'` selects it for decode steps (T = 1).
Triton loads power-of-2 tiles: the key and value widths must be powers of 2 and the cache a
multiple of 16 slots or one smaller power-of-2 tile (`lm.infer.decode.cache_capacity` gives
multiples of 128).
Shape letters: see the legend in lm/model/transformer.py; N = B·G (sequence, KV head) pairs,
P = splits, C = slots per tile.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

NEG = float(jnp.finfo(jnp.float32).min)
MIN_ROWS = 16  # Triton's smallest matmul tile: a KV head's R query heads are padded to this.
MIN_SLOTS = 16  # Triton's smallest matmul tile along the cache: a tile holds at least this many.
TARGET_PROGRAMS = 512  # splits of the slots until B·G·splits reaches this (a few per GPU core)


def slots_per_tile(S: int, block: int) -> int:
    """The tile for a cache of S slots: the largest power of 2 dividing S, at most `block`."""
    return min(block, S & -S)


def check_shapes(k_BGSD: jax.Array, v_BGSU: jax.Array, block: int) -> None:
    """ValueError naming the setting when the kernel cannot take this cache (tiles of `block`)."""
    D, U, S = k_BGSD.shape[-1], v_BGSU.shape[-1], k_BGSD.shape[-2]
    for name, width in (('key', D), ('value', U)):
        if width < 16 or width & (width - 1):
            raise ValueError(
                f"config.model.decode_kernel='pallas' needs power-of-2 {name} widths >= 16 "
                f"(Triton tiles); this variant's are {width}; use decode_kernel='xla'"
            )
    if block < MIN_SLOTS and block != S:
        raise ValueError(
            f"config.model.decode_kernel='pallas' needs a cache of a multiple of {MIN_SLOTS} "
            f'slots, got {S} (lm.infer.decode.cache_capacity sizes caches so)'
        )


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


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    mask_ref,
    filled_ref,
    o_ref,
    l_ref,
    m_ref,
    *,
    scale,
    block,
    per_split,
    rows,
    R,
) -> None:
    """One (sequence, KV head) and one split: blocks [j·per_split, (j+1)·per_split) of the
    filled slots. q [R, D] (loaded as a tile of `rows`, zeros past R), k [S, D], v [S, U],
    mask [S] -> o [R, U] (unnormalised), l [R] (sum of exp), m [R] (running max), float32."""
    j = pl.program_id(1)
    n_blocks = pl.cdiv(filled_ref[()], block)
    lo = j * per_split
    hi = jnp.minimum(lo + per_split, n_blocks)
    real_R1 = (jnp.arange(rows) < R)[:, None]
    q_RD = plgpu.load(q_ref.at[pl.ds(0, rows), :], mask=real_R1, other=0.0)
    U = v_ref.shape[-1]

    def body(b, carry):
        o_RU, m_R, l_R = carry
        slots = pl.ds(b * block, block)
        s_RC = plgpu.dot(q_RD, k_ref[slots, :], trans_b=True) * scale  # <q_r, k_c>, float32
        keep_1C = (mask_ref[slots] != 0)[None, :]
        s_RC = jnp.where(keep_1C, s_RC, NEG)
        m_new = jnp.maximum(m_R, s_RC.max(axis=-1))
        p_RC = jnp.where(keep_1C, jnp.exp(s_RC - m_new[:, None]), 0.0)
        rescale = jnp.exp(m_R - m_new)
        v_CU = v_ref[slots, :]
        o_RU = o_RU * rescale[:, None] + plgpu.dot(p_RC.astype(v_CU.dtype), v_CU)  # sum_c p·v
        return o_RU, m_new, l_R * rescale + p_RC.sum(axis=-1)

    init = (
        jnp.zeros((rows, U), jnp.float32),
        jnp.full((rows,), NEG, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
    )
    o_RU, m_R, l_R = jax.lax.fori_loop(lo, jnp.maximum(lo, hi), body, init)
    plgpu.store(o_ref.at[pl.ds(0, rows), :], o_RU, mask=real_R1)
    plgpu.store(l_ref.at[pl.ds(0, rows)], l_R, mask=real_R1[:, 0])
    plgpu.store(m_ref.at[pl.ds(0, rows)], m_R, mask=real_R1[:, 0])


def _blocks(N: int, G: int, S: int, D: int, U: int, R: int, rows: int, splits: int) -> dict:
    """pallas_call's block specs and output shapes: program (n, j) reads the query rows, keys,
    values of sequence-and-KV-head n, its sequence's mask and `filled`, and writes split j's
    o [R, U], l [R], m [R] (float32)."""
    f32 = jnp.float32
    return dict(
        in_specs=[
            pl.BlockSpec((None, rows, D), lambda n, j: (n, 0, 0)),
            pl.BlockSpec((None, S, D), lambda n, j: (n, 0, 0)),
            pl.BlockSpec((None, S, U), lambda n, j: (n, 0, 0)),
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


def flash_decode(
    q_B1HD: jax.Array,
    k_BGSD: jax.Array,
    v_BGSU: jax.Array,
    mask_B1S: jax.Array,
    *,
    scale: float,
    filled: jax.Array,
    block: int = 128,
    interpret: bool = False,
) -> jax.Array:
    """Attention of one new query per sequence over the first `filled` slots: [B, 1, H, U],
    equal to `grouped_attention` with the same mask (up to float rounding).

    k_BGSD / v_BGSU: head-major caches, or [B, S, D] / [B, S, U] for one shared KV head (absorbed
    MLA's latent). mask_B1S: True = attend. filled: int32 scalar, the slots written so far.
    block: the most slots per tile (a power of 2; the tile is the largest power of 2 <= block
    dividing S, at least 16 unless the whole cache is one smaller power-of-2 tile).
    interpret: run in Pallas's interpreter (any backend; for tests).
    """
    if not interpret and jax.default_backend() != 'gpu':
        raise ValueError(
            "config.model.decode_kernel='pallas' needs a GPU (Triton kernels); this backend is "
            f"{jax.default_backend()!r}: use 'xla', or 'pallas_interpret' to check the kernel"
        )
    B, _, H, D = q_B1HD.shape
    if k_BGSD.ndim == 3:
        k_BGSD, v_BGSU = k_BGSD[:, None], v_BGSU[:, None]
    G, S, U = k_BGSD.shape[1], k_BGSD.shape[2], v_BGSU.shape[-1]
    R = H // G
    block = slots_per_tile(S, block)
    check_shapes(k_BGSD, v_BGSU, block)
    rows = max(MIN_ROWS, 1 << (R - 1).bit_length())
    splits, per_split = split_slots(S // block, B * G)
    q_NRD = q_B1HD.reshape(B * G, R, D).astype(k_BGSD.dtype)  # loaded as `rows`, zeros past R
    k_NSD, v_NSU = k_BGSD.reshape(B * G, S, D), v_BGSU.reshape(B * G, S, U)
    mask_BS = mask_B1S[:, 0].astype(jnp.int32)
    kernel = functools.partial(
        _kernel, scale=scale, block=block, per_split=per_split, rows=rows, R=R
    )
    o_PNRU, l_PNR, m_PNR = pl.pallas_call(
        kernel,
        grid=(B * G, splits),
        **_blocks(B * G, G, S, D, U, R, rows, splits),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name='flash_decode',
    )(q_NRD, k_NSD, v_NSU, mask_BS, jnp.asarray(filled, jnp.int32))
    o_NRU = combine_splits(o_PNRU, l_PNR, m_PNR)
    return o_NRU.reshape(B, 1, H, U).astype(v_BGSU.dtype)
