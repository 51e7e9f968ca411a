"""ModelConfig: the typed, validated view of `config.model` that the model code reads."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import jax.numpy as jnp
import ml_collections

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}
ATTENTION_IMPLS = ('einsum', 'dot_product')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every model knob; see configs/base.py for what each one means.

    `num_kv_heads`, `head_dim` and `mlp_dim` are resolved: after `lm.attention.resolve` they hold
    the values the model uses, never the 0 = "derive it" placeholder of the config file.
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
    mlp_dim: int
    rope_theta: float
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
        if self.rope_theta <= 0 or self.norm_eps <= 0 or self.init_std <= 0:
            raise ValueError('config.model.rope_theta, norm_eps and init_std must all be > 0')


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


# Keys added to configs/base.py after checkpoints were first written, each with the value that
# reproduces how runs behaved before the key existed. `upgrade_config` fills them into configs
# read back from older checkpoints, so those runs still resume, evaluate and decode.
ADDED_KEYS = {
    'train.steps_per_call': 1,
    'compilation_cache_dir': '',
    'data.decode_errors': 'replace',
    'data.hf_sample_by': 'line',
}


def upgrade_config(saved: dict) -> ml_collections.ConfigDict:
    """A config saved with a checkpoint, with the keys added since it was written filled in."""
    config = ml_collections.ConfigDict(saved)
    for key, value in ADDED_KEYS.items():
        *parents, leaf = key.split('.')
        node = config
        for name in parents:
            node = node[name]
        if leaf not in node:
            node[leaf] = value
    return config


def write_config_file(config: ml_collections.ConfigDict, path: str) -> str:
    """Writes `config` as a config file (`get_config()` returning it) for --config=path."""
    with open(path, 'w') as f:
        f.write(
            'import json\n\nimport ml_collections\n\n\ndef get_config():\n'
            f'    return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n'
        )
    return path
