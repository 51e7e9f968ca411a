"""KV layouts across layers: which layers compute K/V and how many KV heads each one has.

- Cross-layer attention (CLA, Brandon et al. 2024): with `kv_share_every = n`, layer i reads the
  K/V of layer i - i % n, its producer. Only producers have K/V projections and a cache entry;
  the n - 1 layers above a producer (its consumers) have only q_proj and o_proj. n = 1 is off.
- Per-layer KV head counts: `kv_heads_per_layer[i]` KV heads in layer i (each dividing
  num_heads); () = every layer has num_kv_heads. With CLA a consumer has its producer's count.

The variant computes each layer as usual from `layer_config(cfg, i)` (num_kv_heads set to the
layer's count); the model (lm/model/transformer.py) builds producers and consumers and passes a
producer's K/V up; accounting (lm/model/accounting.py) sums the cache layer by layer.
"""

from __future__ import annotations

import dataclasses

from lm.model.config import ModelConfig


def resolve(cls, cfg: ModelConfig) -> ModelConfig:
    """`cls.resolve(cfg)` (the attention variant's checks) with the layout's: num_kv_heads 0
    becomes max(kv_heads_per_layer) when that is set. One-line ValueError naming the key."""
    per_layer = cfg.kv_heads_per_layer
    if per_layer and not cls.poolable_kv_heads:
        raise ValueError(
            'config.model.kv_heads_per_layer needs K/V heads (mha / gqa / mqa), '
            f"got attention='{cfg.attention}'"
        )
    if per_layer:
        _check_counts(cfg)
    if per_layer and cfg.num_kv_heads == 0:
        cfg = dataclasses.replace(cfg, num_kv_heads=max(per_layer))
    cfg = cls.resolve(cfg)
    n = cfg.kv_share_every
    if n < 1:
        raise ValueError(f'config.model.kv_share_every must be >= 1 (1 = off), got {n}')
    if n > cfg.num_layers:  # layer 0 would serve every layer, as n = num_layers says
        raise ValueError(
            f'config.model.kv_share_every={n} must be <= config.model.num_layers='
            f"{cfg.num_layers} (kv_share_every={cfg.num_layers}: the first layer's K/V serves "
            'every layer)'
        )
    if n > 1 and not cls.cross_layer_kv:
        raise ValueError(
            f'config.model.kv_share_every={n} needs an attention variant with K/V heads '
            f"(mha / gqa / mqa), got attention='{cfg.attention}'"
        )
    if n > 1 and cfg.sliding_window:
        raise ValueError(
            f'config.model.kv_share_every={n} with config.model.sliding_window='
            f'{cfg.sliding_window}: cross-layer attention over local layers is not supported'
        )
    if per_layer:
        _check_per_layer(cfg)
    return cfg


def _check_counts(cfg: ModelConfig) -> None:
    key, per_layer, H = 'config.model.kv_heads_per_layer', cfg.kv_heads_per_layer, cfg.num_heads
    if len(per_layer) != cfg.num_layers:
        raise ValueError(
            f'{key}={per_layer} must list one count per layer (num_layers={cfg.num_layers})'
        )
    if bad := [g for g in per_layer if isinstance(g, bool) or not isinstance(g, int)]:
        raise ValueError(f'{key}={per_layer} must list whole numbers, got {bad}')
    if bad := [g for g in per_layer if g < 1]:
        raise ValueError(f'{key}={per_layer}: every count must be >= 1, got {bad}')
    if bad := [g for g in per_layer if H % g]:
        raise ValueError(f'{key}: {bad} do not divide num_heads={H}')


def _check_per_layer(cfg: ModelConfig) -> None:
    key, per_layer = 'config.model.kv_heads_per_layer', cfg.kv_heads_per_layer
    if cfg.num_kv_heads != max(per_layer):
        raise ValueError(
            f'config.model.num_kv_heads={cfg.num_kv_heads} must be 0 or max({key}) = '
            f'{max(per_layer)}'
        )
    if mismatch := [
        i for i in range(cfg.num_layers) if per_layer[i] != per_layer[kv_source(cfg, i)]
    ]:
        raise ValueError(
            f'{key}: layers {mismatch} read the K/V of a layer below '
            f'(kv_share_every={cfg.kv_share_every}) and must have its count'
        )


def kv_source(cfg: ModelConfig, layer: int) -> int:
    """The layer whose K/V `layer` attends (itself for a producer)."""
    return layer - layer % cfg.kv_share_every


def is_producer(cfg: ModelConfig, layer: int) -> bool:
    """Whether `layer` computes (and caches) K/V."""
    return kv_source(cfg, layer) == layer


def producers(cfg: ModelConfig) -> list[int]:
    """The layers that compute and cache K/V, in order (one cache entry each)."""
    return [i for i in range(cfg.num_layers) if is_producer(cfg, i)]


def kv_heads_of(cfg: ModelConfig, layer: int) -> int:
    """KV heads of `layer` (its producer's for a consumer)."""
    return cfg.kv_heads_per_layer[layer] if cfg.kv_heads_per_layer else cfg.num_kv_heads


def layer_config(cfg: ModelConfig, layer: int) -> ModelConfig:
    """The config `layer`'s attention is built from: num_kv_heads is the layer's own count."""
    if not cfg.kv_heads_per_layer:
        return cfg
    return dataclasses.replace(cfg, num_kv_heads=kv_heads_of(cfg, layer))


def sharing(cfg: ModelConfig, layer: int) -> dict[str, bool]:
    """Keywords for the attention constructor of a variant with `cross_layer_kv` ({} without
    CLA): `kv_from_below` (a consumer) and `kv_to_above` (a producer with consumers)."""
    n = cfg.kv_share_every
    if n == 1:
        return {}
    consumers = layer + 1 < cfg.num_layers and not is_producer(cfg, layer + 1)
    return {'kv_from_below': not is_producer(cfg, layer), 'kv_to_above': consumers}


def describe(cfg: ModelConfig, heads: str) -> str:
    """`heads` (one layer's, as the variant says) with the layout added: the per-layer counts
    ('4,2,2,1') and the CLA factor (' CLA2')."""
    if cfg.kv_heads_per_layer:
        heads = ','.join(map(str, cfg.kv_heads_per_layer))
    return heads + (f' CLA{cfg.kv_share_every}' if cfg.kv_share_every > 1 else '')
