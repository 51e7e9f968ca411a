"""ModelConfig: the typed, resolved view of `config.model` that the model code reads
(built by `lm.model.transformer.model_config`; the schema is configs/base.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

import jax.numpy as jnp
import ml_collections
from absl import logging

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
ATTENTION_IMPLS = ('einsum', 'dot_product', 'cudnn')
ROPE_SCALINGS = ('', 'llama3')
LOGITS_DTYPES = ('float32', 'compute')
DECODE_KERNELS = ('xla', 'pallas', 'pallas_interpret')
# Float knobs that must be finite (the llama3 factors too: inf is no scaling, silently).
FLOAT_KNOBS = (
    'rope_theta',
    'rope_scaling_factor',
    'rope_low_freq_factor',
    'rope_high_freq_factor',
    'norm_eps',
    'init_std',
)


LLAMA3_KNOBS = (  # read only when rope_scaling = 'llama3'
    'rope_scaling_factor',
    'rope_low_freq_factor',
    'rope_high_freq_factor',
    'rope_original_max_len',
)


def check_idle_rope_knobs(model: ml_collections.ConfigDict, defaults: dict[str, tuple]) -> None:
    """A llama3 scaling knob away from its defaults (`defaults`: `lm.config.default_values` of
    config.model) while rope_scaling is off would do nothing: one-line error (the train wing
    calls it for a new run's config only; saved runs load as they were)."""
    if model.rope_scaling:
        return
    for name in LLAMA3_KNOBS:
        if model[name] not in defaults[name]:
            raise ValueError(
                f"config.model.{name}={model[name]} does nothing with rope_scaling='' (plain "
                f"RoPE): set config.model.rope_scaling='llama3', or leave it at "
                f'{defaults[name][0]}'
            )


def warn_idle_window(model: ml_collections.ConfigDict, seq_len: int) -> None:
    """A warning when config.model.sliding_window >= seq_len: a query at most seq_len - 1 tokens
    past its first key sees every key (window: q - k < W), so local layers act as global ones in
    training and evaluation; only decoding past W tokens windows them. Not an error: a model
    imported with a long window and fine-tuned on short rows keeps its window for decoding."""
    W = model.sliding_window
    if W and W >= seq_len:
        logging.warning(
            'config.model.sliding_window=%d >= config.data.seq_len=%d: the local layers see the '
            'whole row in training and evaluation (as global ones); only decoding past %d tokens '
            'is windowed',
            W,
            seq_len,
            W,
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every model knob; see configs/base.py for what each one means.

    Built by `lm.model.transformer.model_config`, the one resolver: `num_kv_heads`, `head_dim`,
    `mlp_dim` and `vocab_size` then hold the values the model uses, never the 0 = "derive it" of
    the config file (MLA's `num_kv_heads` is 0: its cache holds no K/V heads). `section` is the
    active variant's own `config.model.<name>` section as its frozen dataclass
    (`AttentionVariant.config_class`; MLA's ranks), None for a variant without one; the
    sections of the other variants are not carried.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    attention: str
    num_heads: int
    num_kv_heads: int
    kv_share_every: int
    kv_heads_per_layer: tuple[int, ...]
    head_dim: int
    attention_impl: str
    decode_chunk: int
    decode_kernel: str
    kv_quant_group: int
    qkv_bias: bool
    o_bias: bool
    mlp_dim: int
    rope_theta: float
    rope_scaling: str
    rope_scaling_factor: float
    rope_low_freq_factor: float
    rope_high_freq_factor: float
    rope_original_max_len: int
    norm_eps: float
    tie_embeddings: bool
    logits_dtype: str
    init_std: float
    param_dtype: str
    dtype: str
    sliding_window: int
    layer_pattern: str
    section: Any = None

    @classmethod
    def from_config(
        cls,
        model: ml_collections.ConfigDict,
        section: Any = None,
        sections: Collection[str] = (),
    ) -> ModelConfig:
        """Builds the config from `config.model`, checking the knobs shared by every variant.
        `sections`: the names of the variants' own sections in `config.model` (not fields here);
        `section`: the active variant's, already read by it."""
        fields = {f.name for f in dataclasses.fields(cls)} - {'section'}
        given = set(model.keys()) - set(sections)
        if unknown := sorted(given - fields):
            raise ValueError(
                f'config.model has unknown key(s) {unknown}; known keys: {sorted(fields)}'
            )
        if missing := sorted(fields - given):
            raise ValueError(f'config.model is missing key(s) {missing}')
        values = {k: model[k] for k in fields}
        values['kv_heads_per_layer'] = tuple(values['kv_heads_per_layer'])  # JSON gives a list
        cfg = cls(**values, section=section)
        cfg.check_shared()
        mlp_dim = cfg.mlp_dim or _round_up(8 * cfg.d_model // 3, 64)
        return dataclasses.replace(cfg, mlp_dim=mlp_dim)

    def check_shared(self) -> None:
        """Raises ValueError naming the first knob that is out of range."""
        for name in ('d_model', 'num_layers', 'num_heads'):
            if getattr(self, name) <= 0:
                raise ValueError(f'config.model.{name} must be > 0, got {getattr(self, name)}')
        for name in ('vocab_size', 'num_kv_heads', 'head_dim', 'mlp_dim', 'decode_chunk'):
            if getattr(self, name) < 0:
                raise ValueError(f'config.model.{name} must be >= 0, got {getattr(self, name)}')
        if self.kv_quant_group <= 0:
            raise ValueError(
                f'config.model.kv_quant_group must be > 0 (tokens per KIVI key group), '
                f'got {self.kv_quant_group}'
            )
        for name, allowed in (
            ('param_dtype', sorted(DTYPES)),
            ('dtype', sorted(DTYPES)),
            ('attention_impl', ATTENTION_IMPLS),
            ('logits_dtype', LOGITS_DTYPES),
            ('decode_kernel', DECODE_KERNELS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f'config.model.{name} must be one of {allowed}, got {getattr(self, name)!r}'
                )
        if self.attention_impl == 'cudnn' and self.dtype not in ('bfloat16', 'float16'):
            raise ValueError(
                "config.model.attention_impl='cudnn' needs config.model.dtype bfloat16 or "
                f'float16 (cuDNN fused attention), got {self.dtype!r}'
            )
        self.check_layer_pattern()
        for name in FLOAT_KNOBS:  # NaN and inf pass the range checks and train to NaN
            if not math.isfinite(getattr(self, name)):
                raise ValueError(
                    f'config.model.{name} must be a finite number, got {getattr(self, name)}'
                )
        if self.rope_theta <= 0 or self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError('config.model.rope_theta, norm_eps and init_std must all be > 0')
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(
                f'config.model.rope_scaling must be one of {ROPE_SCALINGS}, '
                f'got {self.rope_scaling!r}'
            )
        if self.rope_scaling == 'llama3' and not (
            self.rope_scaling_factor > 0
            and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor
            and self.rope_original_max_len > 0
        ):
            raise ValueError(
                "config.model.rope_scaling='llama3' needs rope_scaling_factor > 0, "
                '0 < rope_low_freq_factor < rope_high_freq_factor and rope_original_max_len > 0'
            )

    def check_layer_pattern(self) -> None:
        """Raises ValueError for a sliding window or local/global pattern that cannot apply."""
        W, pattern = self.sliding_window, self.layer_pattern
        if W < 0:
            raise ValueError(f'config.model.sliding_window must be >= 0 (0 = off), got {W}')
        if set(pattern) - set('LG'):
            raise ValueError(
                f"config.model.layer_pattern={pattern!r} must hold only 'L' (local) and 'G' "
                "(global), e.g. 'LG' or 'LLLLLG'"
            )
        if pattern and not W:
            raise ValueError(
                f'config.model.layer_pattern={pattern!r} needs config.model.sliding_window > 0'
            )
        if W and pattern and 'L' not in pattern[: self.num_layers]:
            raise ValueError(
                f'config.model.sliding_window={W} applies to no layer: '
                f'config.model.layer_pattern={pattern!r} has no local layer'
            )

    def layer_window(self, layer: int) -> int:
        """The sliding window of layer `layer` (0-based): sliding_window for a local layer of
        `layer_pattern` (repeated over the layers; '' = every layer local), 0 for a global one."""
        pattern = self.layer_pattern or 'L'
        return self.sliding_window if pattern[layer % len(pattern)] == 'L' else 0


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
