"""Building blocks: projections with logical axis names, RMSNorm, RoPE and the SwiGLU MLP.

Every parameter carries `axes`: one logical name per dimension (`embed`, `heads`, `kv_heads`,
`head_dim`, `mlp`, `vocab`, `q_lora`, `kv_lora`, `norm`). `lm/sharding.py` maps those names to
mesh axes through the rules table in the config; nothing here knows about meshes.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from lm.model.config import DTYPES, ModelConfig


def residual_scale(cfg: ModelConfig) -> float:
    """Init scale of projections that write into the residual stream (attention and MLP
    outputs): 1 / sqrt(2L), GPT-2 style, so the stream's variance does not grow with depth."""
    return 1 / math.sqrt(2 * cfg.num_layers)


def _lead(x: jax.Array, ndim: int) -> jax.Array:
    """`x` with leading unit axes up to `ndim` dims (explicit broadcasting, no rank promotion)."""
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def head_logits(x_BTE: jax.Array, table_VE: jax.Array, out_dtype: Any = jnp.float32) -> jax.Array:
    """Logits x · tableᵀ [B, T, V] of same-dtype inputs, accumulated in float32 and returned in
    `out_dtype` (float32, or the compute dtype as PyTorch autocast does: half the bytes that the
    loss then reads, the largest tensor of a small model's step).

    The backward multiplies in the inputs' dtype: left to autodiff, a float32 cotangent would
    promote both backward matmuls ([B·T, V] by [V, E]) to float32, TF32 on a GPU at half the
    bfloat16 rate (a fifth of a 125M model's bfloat16 train step on an H200)."""
    # BTE,VE->BTV: each position's hidden state against every token's output row
    return jnp.einsum('BTE,VE->BTV', x_BTE, table_VE, preferred_element_type=out_dtype)


def _head_logits_fwd(x_BTE, table_VE, out_dtype):
    return head_logits(x_BTE, table_VE, out_dtype), (x_BTE, table_VE)


def _head_logits_bwd(out_dtype, res, g_BTV):
    x_BTE, table_VE = res
    g_BTV = g_BTV.astype(x_BTE.dtype)
    # BTV,VE->BTE: back to the hidden states; BTV,BTE->VE: back to the table
    g_x = jnp.einsum('BTV,VE->BTE', g_BTV, table_VE, preferred_element_type=jnp.float32)
    g_table = jnp.einsum('BTV,BTE->VE', g_BTV, x_BTE, preferred_element_type=jnp.float32)
    return g_x.astype(x_BTE.dtype), g_table.astype(table_VE.dtype)


head_logits.defvjp(_head_logits_fwd, _head_logits_bwd)


class Dense(nnx.Module):
    """y = x · W, contracting the trailing `len(in_shape)` dims of x with the leading dims of W.

    The kernel has shape `in_shape + out_shape`, so per-head projections keep their head axis
    (q_proj: [embed, heads, head_dim]) and checkpoint surgery can index heads directly.
    Initialised N(0, scale² / fan_in).
    """

    def __init__(
        self,
        in_shape: tuple[int, ...],
        out_shape: tuple[int, ...],
        axes: tuple[str, ...],
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        use_bias: bool = False,
        scale: float = 1.0,
    ):
        if len(axes) != len(in_shape) + len(out_shape):
            raise ValueError(f'axes {axes} do not match kernel shape {in_shape + out_shape}')
        std = scale / math.sqrt(math.prod(in_shape))
        param_dtype = DTYPES[cfg.param_dtype]
        self.kernel = nnx.Param(
            std * jax.random.normal(rngs.params(), in_shape + out_shape, param_dtype), axes=axes
        )
        self.bias = (
            nnx.Param(jnp.zeros(out_shape, param_dtype), axes=axes[len(in_shape) :])
            if use_bias
            else None
        )
        self.num_in = len(in_shape)
        self.dtype = DTYPES[cfg.dtype]

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...].astype(self.dtype)
        y = jnp.tensordot(x.astype(self.dtype), kernel, axes=self.num_in)
        if self.bias is not None:
            y = y + _lead(self.bias[...].astype(self.dtype), y.ndim)
        return y


class FusedKernel(nnx.Variable):
    """The kernels of Dense layers that read one input, concatenated once (`fuse_kernels`)."""


def fused_name(names: tuple[str, ...]) -> str:
    """The attribute under which `fuse_kernels` stores the group `names`' kernel."""
    return '_'.join(names) + '_fused'


def concat_kernels(layers: list[Dense]) -> jax.Array:
    """The layers' kernels in their compute dtype, concatenated along the first output axis."""
    n_in, dtype = layers[0].num_in, layers[0].dtype
    return jnp.concatenate([layer.kernel[...].astype(dtype) for layer in layers], axis=n_in)


def fused_dense(x: jax.Array, owner: nnx.Module, names: tuple[str, ...]) -> list[jax.Array]:
    """`[getattr(owner, n)(x) for n in names]` as one matmul: Dense layers that read the same
    input have their kernels concatenated along the first output axis (fewer, larger matmuls run
    faster on CPU and GPU alike). Same maths; the parameters stay separate. A kernel that
    `fuse_kernels` concatenated beforehand is read as stored: a decode loop concatenates once
    per call instead of once per step (XLA on a GPU left the copy of most of the weights
    inside the loop: 7% of an MQA step, docs/studies/performance)."""
    layers = [getattr(owner, name) for name in names]
    n_in, dtype = layers[0].num_in, layers[0].dtype
    stored = getattr(owner, fused_name(names), None)
    kernel = stored[...] if stored is not None else concat_kernels(layers)
    y = jnp.tensordot(x.astype(dtype), kernel, axes=n_in)
    if any(layer.bias is not None for layer in layers):
        y = y + _lead(
            jnp.concatenate(
                [
                    layer.bias[...].astype(dtype)
                    if layer.bias is not None
                    else jnp.zeros(layer.kernel.shape[n_in:], dtype)
                    for layer in layers
                ]
            ),
            y.ndim,
        )
    sizes = [layer.kernel.shape[n_in] for layer in layers]
    return jnp.split(y, list(itertools.accumulate(sizes[:-1])), axis=x.ndim - n_in)


def fuse_kernels(model: nnx.Module) -> None:
    """Stores on each module of `model` the concatenated kernel of every group it runs through
    `fused_dense` (its class's `fused_groups`), as a `FusedKernel`; calls read it from then on.
    Meant for a model merged inside a jitted function, before a loop over steps."""
    for _, module in nnx.iter_graph(model):
        for names in getattr(type(module), 'fused_groups', ()):
            layers = [getattr(module, name, None) for name in names]
            if all(isinstance(layer, Dense) for layer in layers):  # a CLA consumer has no K/V
                setattr(module, fused_name(names), FusedKernel(concat_kernels(layers)))


class RMSNorm(nnx.Module):
    """x / rms(x) · scale, computed in float32 and returned in the compute dtype."""

    def __init__(self, dim: int, cfg: ModelConfig, eps: float = 0.0):
        self.scale = nnx.Param(jnp.ones((dim,), DTYPES[cfg.param_dtype]), axes=('norm',))
        self.eps = eps or cfg.norm_eps
        self.dtype = DTYPES[cfg.dtype]

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * _lead(self.scale[...].astype(jnp.float32), x.ndim)).astype(self.dtype)


def rope_inv_freq(half: int, theta: float, cfg: ModelConfig | None = None) -> jax.Array:
    """RoPE inverse frequencies theta^(-2i/D), i < D/2, with `cfg.rope_scaling` applied.

    'llama3' (Llama 3.1): with wavelength w = 2π / f and L = rope_original_max_len, frequencies
    with w > L / low_freq_factor are divided by rope_scaling_factor, those with
    w < L / high_freq_factor are kept, and those between are interpolated linearly in L / w.
    """
    inv_freq_F = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if cfg is None or not cfg.rope_scaling:
        return inv_freq_F
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    context_over_wavelen_F = cfg.rope_original_max_len * inv_freq_F / (2 * math.pi)
    smooth_F = jnp.clip((context_over_wavelen_F - low) / (high - low), 0.0, 1.0)
    return (1 - smooth_F) * inv_freq_F / factor + smooth_F * inv_freq_F


def rope(
    x: jax.Array, positions_BT: jax.Array, theta: float, cfg: ModelConfig | None = None
) -> jax.Array:
    """Rotary position embedding (rotate-half layout, as Llama / Hugging Face).

    x: [B, T, ..., D] with D even; positions_BT: [B, T] integer positions.
    Dimension pair (i, i + D/2) is rotated by angle position · theta^(-2i/D) (frequencies
    rescaled as `cfg.rope_scaling` says, see `rope_inv_freq`).
    """
    half = x.shape[-1] // 2
    inv_freq_F = rope_inv_freq(half, theta, cfg)  # [D/2]
    angle = positions_BT.astype(jnp.float32)[..., None] * inv_freq_F[None, None]  # [B, T, D/2]
    angle = angle.reshape(angle.shape[:2] + (1,) * (x.ndim - 3) + (half,))
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class SwiGLU(nnx.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), Shazeer (2020)."""

    fused_groups: ClassVar = (('gate_proj', 'up_proj'),)  # read the same input: `fused_dense`

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, F = cfg.d_model, cfg.mlp_dim
        self.gate_proj = Dense((E,), (F,), ('embed', 'mlp'), cfg, rngs=rngs)
        self.up_proj = Dense((E,), (F,), ('embed', 'mlp'), cfg, rngs=rngs)
        self.down_proj = Dense(
            (F,), (E,), ('mlp', 'embed'), cfg, rngs=rngs, scale=residual_scale(cfg)
        )

    def __call__(self, x_BTE: jax.Array) -> jax.Array:
        gate_BTF, up_BTF = fused_dense(x_BTE, self, ('gate_proj', 'up_proj'))
        return self.down_proj(jax.nn.silu(gate_BTF) * up_BTF)
