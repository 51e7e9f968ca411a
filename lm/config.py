"""Config plumbing: ModelConfig (the typed view of `config.model` the model code reads; resolved
by `lm.model.model_config`), config files, and dotted-key access and overrides
('model.num_heads=8') used by the command line, sweeps and tests.

The schema is configs/base.py: every key with a one-line comment. Configs saved with older
checkpoints are brought up to it by lm/config_migration.py."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
from typing import Any

import jax.numpy as jnp
import ml_collections

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
ATTENTION_IMPLS = ('einsum', 'dot_product', 'cudnn')
ROPE_SCALINGS = ('', 'llama3')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every model knob; see configs/base.py for what each one means.

    Built by `lm.model.model_config`, the one resolver: `num_kv_heads`, `head_dim`, `mlp_dim`
    and `vocab_size` then hold the values the model uses, never the 0 = "derive it" of the config
    file (MLA's `num_kv_heads` is 0: its cache holds no K/V heads).
    """

    vocab_size: int
    d_model: int
    num_layers: int
    attention: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_impl: str
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
    init_std: float
    param_dtype: str
    dtype: str
    kv_lora_rank: int
    q_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    latent_norm_eps: float

    @classmethod
    def from_config(cls, model: ml_collections.ConfigDict) -> ModelConfig:
        """Builds the config from `config.model`, checking the knobs shared by every variant."""
        fields = {f.name for f in dataclasses.fields(cls)}
        given = set(model.keys())
        if unknown := sorted(given - fields):
            raise ValueError(
                f'config.model has unknown key(s) {unknown}; known keys: {sorted(fields)}'
            )
        if missing := sorted(fields - given):
            raise ValueError(f'config.model is missing key(s) {missing}')
        cfg = cls(**{k: model[k] for k in fields})
        cfg.check_shared()
        mlp_dim = cfg.mlp_dim or _round_up(8 * cfg.d_model // 3, 64)
        return dataclasses.replace(cfg, mlp_dim=mlp_dim)

    def check_shared(self) -> None:
        """Raises ValueError naming the first knob that is out of range."""
        for name in ('d_model', 'num_layers', 'num_heads'):
            if getattr(self, name) <= 0:
                raise ValueError(f'config.model.{name} must be > 0, got {getattr(self, name)}')
        for name in ('vocab_size', 'num_kv_heads', 'head_dim', 'mlp_dim'):
            if getattr(self, name) < 0:
                raise ValueError(f'config.model.{name} must be >= 0, got {getattr(self, name)}')
        for name in ('param_dtype', 'dtype'):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f'config.model.{name} must be one of {sorted(DTYPES)}, '
                    f'got {getattr(self, name)!r}'
                )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f'config.model.attention_impl must be one of {ATTENTION_IMPLS}, '
                f'got {self.attention_impl!r}'
            )
        if self.attention_impl == 'cudnn' and self.dtype not in ('bfloat16', 'float16'):
            raise ValueError(
                "config.model.attention_impl='cudnn' needs config.model.dtype bfloat16 or "
                f'float16 (cuDNN fused attention), got {self.dtype!r}'
            )
        if self.rope_theta <= 0 or self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError('config.model.rope_theta, norm_eps and init_std must all be > 0')
        if self.latent_norm_eps < 0:
            raise ValueError(
                f'config.model.latent_norm_eps must be >= 0 (0 = norm_eps), '
                f'got {self.latent_norm_eps}'
            )
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


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def load_config_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """Runs `get_config([arg])` from a config file, as `--config=path[:arg]` does on the CLI."""
    spec = importlib.util.spec_from_file_location('_lm_config_file', path)
    if spec is None or not os.path.isfile(path):
        raise FileNotFoundError(f'config file {path!r} does not exist')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg is not None else module.get_config()


def write_config_file(config: ml_collections.ConfigDict, path: str) -> str:
    """Writes `config` as a config file (`get_config()` returning it) for --config=path."""
    with open(path, 'w') as f:
        f.write(
            'import json\n\nimport ml_collections\n\n\ndef get_config():\n'
            f'    return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n'
        )
    return path


def get_key(config: ml_collections.ConfigDict, key: str, flag: str = 'config') -> Any:
    """The value at dotted `key` ('model.num_heads'); ValueError naming `flag` if absent."""
    node = config
    for part in key.split('.'):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ValueError(f'{flag}: unknown config key {key!r}')
        node = node[part]
    return node


def set_key(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the value at dotted `key`, which must exist (`get_key`)."""
    get_key(config, key)
    *parents, leaf = key.split('.')
    node = config
    for part in parents:
        node = node[part]
    node[leaf] = value


def parse_value(key: str, raw: str, like: Any, flag: str = 'config') -> Any:
    """`raw` parsed with the type of `like`, the config's current value at `key`."""
    if isinstance(like, ml_collections.ConfigDict):
        raise ValueError(f'{flag}: {key!r} is a section, not a value')
    try:
        if isinstance(like, bool):
            if raw.lower() not in ('true', 'false', '1', '0'):
                raise ValueError
            return raw.lower() in ('true', '1')
        return type(like)(raw)
    except ValueError:
        raise ValueError(f'{flag} {key}: {raw!r} is not a {type(like).__name__}') from None


def parse_assignment(
    config: ml_collections.ConfigDict, item: str, flag: str = 'config'
) -> tuple[str, list[Any]]:
    """'model.num_heads=4,8' -> ('model.num_heads', [4, 8]), typed like the config's values."""
    key, sep, values = item.partition('=')
    key = key.strip()
    if not sep or not values.strip():
        raise ValueError(f'{flag} {item!r}: expected key=value1,value2,...')
    like = get_key(config, key, flag)
    return key, [parse_value(key, v.strip(), like, flag) for v in values.split(',')]


def with_values(
    base: ml_collections.ConfigDict, values: dict[str, Any]
) -> ml_collections.ConfigDict:
    """A copy of `base` with `{'model.dtype': 'bfloat16', ...}` set (every key must exist)."""
    config = ml_collections.ConfigDict(copy.deepcopy(base.to_dict()))
    for key, value in values.items():
        set_key(config, key, value)
    return config


def with_overrides(
    config: ml_collections.ConfigDict, overrides: list[str], flag: str = '--set'
) -> ml_collections.ConfigDict:
    """A copy of `config` with `['model.dtype=bfloat16', ...]` applied (values typed like the
    config's)."""
    values = {}
    for item in overrides:
        key, parsed = parse_assignment(config, item, flag)
        values[key] = parsed[-1]
    return with_values(config, values)
