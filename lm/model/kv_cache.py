"""The decoding cache every attention variant shares (`KVCache`): one layer's arrays and where
decoding stands, as a pytree. A cache is full (one slot per token, `length` slots) or, for a
local (sliding-window) layer, a ring of W slots, so its memory stays constant with context; its
arrays are stored as they come (float), as int8 codes with one absmax scale per cached vector
(lm/model/kv_quant.py) or, full caches only, as KIVI's 4-bit codes (lm/model/kv_kivi.py: the
arrays the variant names `per_channel`, its keys, per channel over groups of G tokens, the others
per token) with the last incomplete group in float (`KV_CACHE_DTYPES`). Variants never see the
choice: `KVCache.write` takes the new entries and returns what the new queries attend, in float.
Shape letters: see the legend in lm/model/transformer.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from lm.model import kv_kivi, kv_quant
from lm.model.config import ModelConfig

KV_CACHE_DTYPES = ('float', 'int8', 'kivi4')  # how cache arrays are stored (`KVCache.configured`)


def check_storage(
    cfg: ModelConfig, kv_cache_dtype: str, tokens: int | None = None, holds: str = ''
) -> None:
    """One-line ValueError unless a model of `cfg` can decode with caches stored as
    `kv_cache_dtype`: a known one; cross-layer attention reads float caches only; KIVI's grouped
    storage is for full caches, not a local layer's ring, and with the longest sequence a cache
    will hold (`tokens`, described by `holds`) shorter than a group it would quantise nothing."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f'kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}')
    if kv_cache_dtype != 'float' and cfg.kv_share_every > 1:
        raise ValueError(
            f'config.model.kv_share_every={cfg.kv_share_every} with '
            f'kv_cache_dtype={kv_cache_dtype!r}: CLA decodes from float caches only'
        )
    if kv_cache_dtype == 'kivi4' and any(cfg.layer_window(i) for i in range(cfg.num_layers)):
        raise ValueError(
            f'config.model.sliding_window={cfg.sliding_window} with '
            "kv_cache_dtype='kivi4': local layers' ring caches are stored as float or int8 only"
        )
    if kv_cache_dtype == 'kivi4' and tokens is not None and tokens < cfg.kv_quant_group:
        raise ValueError(
            f"kv_cache_dtype='kivi4' would quantise nothing: {holds} ({tokens} tokens) never "
            f'completes a group of config.model.kv_quant_group={cfg.kv_quant_group} (the '
            'residual stays in float)'
        )


def write_cache(cache_B_SX: jax.Array, new_B_TX: jax.Array, slot: jax.Array) -> jax.Array:
    """Writes T new entries into a [B, ..., S, X] cache (slots on the second-to-last axis) at
    slots slot..slot+T-1; the update is in place when the cache buffer is not read elsewhere."""
    new_B_TX = new_B_TX.astype(cache_B_SX.dtype)
    return jax.lax.dynamic_update_slice_in_dim(cache_B_SX, new_B_TX, slot, cache_B_SX.ndim - 2)


def drop_unit_axes(x_B_SX: jax.Array) -> jax.Array:
    """A [B, ..., S, X] array without the size-1 axes before its slots (batch 1, one KV head),
    as `KVCache` stores it: XLA:CPU copies a cache whose size-1 axis the attention strips."""
    return x_B_SX.reshape(tuple(d for d in x_B_SX.shape[:-2] if d != 1) + x_B_SX.shape[-2:])


def cache_mask(
    keys_S: jax.Array, pad_B: jax.Array, slot: jax.Array, T: int, window: int = 0
) -> jax.Array:
    """[B, T, S] mask for T new queries at absolute indices slot..slot+T-1 over keys at absolute
    indices `keys_S` (negative: an empty slot): a query attends keys at or before its own, not
    in its row's left padding (indices < pad_B), and, with a `window` W > 0, fewer than W
    behind it (q - k < W, transformers' sliding-window convention)."""
    q_T1 = slot + jnp.arange(T)[:, None]
    ok_TS = (keys_S[None, :] <= q_T1) & (keys_S[None, :] >= 0)
    if window:
        ok_TS &= q_T1 - keys_S[None, :] < window
    return ok_TS[None] & (keys_S[None, None, :] >= pad_B[:, None, None])


def ring_indices(window: int, written: jax.Array) -> jax.Array:
    """[W] absolute index each ring slot holds once `written` tokens went in (slot j holds the
    latest index = j mod W; negative: none yet)."""
    last = written - 1
    return last - jnp.mod(last - jnp.arange(window), window)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """One layer's decoding cache (a pytree).

    arrays: the stored arrays, [B, ..., S, X] each: slots on the second-to-last axis, so a
    per-head cache is head-major, [B, G, S, D], and each head's slots are contiguous for the
    attention of one new token (the variant's `init_cache` says which). With quant 'int8' each
    of the variant's arrays `name` is stored as int8 codes under `name` and its scales,
    [B, ..., S, 1], under `name_scale`; with 'kivi4' as lm/model/kv_kivi.py lays it out.
    slot: the absolute index of the next token (int32 scalar; a ring writes it at slot mod W).
    pad_B: row b's first pad_B[b] indices are left padding, never attended. window: 0 for a
    full cache; W for a ring of W slots (a local layer). length: the tokens the cache was made
    for. quant: '' (float), 'int8' or 'kivi4'. per_channel: the arrays a 'kivi4' cache
    quantizes per channel (the variant's keys, named by its `init_cache`). group: G, the tokens
    of a 'kivi4' group (0 otherwise). lead: the variant's axes before the slots ([B, ...]) when
    the arrays are stored without their size-1 ones (`squeezed`); () when stored as made.
    """

    arrays: dict[str, jax.Array]
    slot: jax.Array
    pad_B: jax.Array
    window: int = dataclasses.field(default=0, metadata={'static': True})
    length: int = dataclasses.field(default=0, metadata={'static': True})
    quant: str = dataclasses.field(default='', metadata={'static': True})
    per_channel: tuple[str, ...] = dataclasses.field(default=(), metadata={'static': True})
    group: int = dataclasses.field(default=0, metadata={'static': True})
    lead: tuple[int, ...] = dataclasses.field(default=(), metadata={'static': True})

    @classmethod
    def empty(cls, per_channel: tuple[str, ...] = (), **arrays_B_SX: jax.Array) -> KVCache:
        """A full cache of the given (zeroed) arrays: slot 0, no padding. per_channel: the
        arrays that hold keys, which a 'kivi4' cache quantizes per channel."""
        shape = next(iter(arrays_B_SX.values())).shape
        B, S = shape[0], shape[-2]
        return cls(
            arrays_B_SX,
            jnp.zeros((), jnp.int32),
            jnp.zeros((B,), jnp.int32),
            length=S,
            per_channel=per_channel,
        )

    def configured(
        self, window: int, length: int, kv_cache_dtype: str = 'float', group: int = 0
    ) -> KVCache:
        """This empty cache as a ring of `window` slots (0: full) for `length` tokens, stored
        as `kv_cache_dtype` (`KV_CACHE_DTYPES`; 'kivi4': full only, in groups of `group`)."""
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f'kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}'
            )
        quant = '' if kv_cache_dtype == 'float' else kv_cache_dtype
        if quant != 'kivi4':
            stored = dataclasses.replace(self, window=window, length=length, quant=quant)
            return dataclasses.replace(stored, arrays=stored._encoded(self.arrays)).squeezed()
        if window or group <= 0:
            raise ValueError(
                f"kv_cache_dtype='kivi4' needs a full cache (window 0, got {window}) and a "
                f'group of > 0 tokens (got {group})'
            )
        arrays = {}
        for n, a in self.arrays.items():
            arrays.update(kv_kivi.empty(n, a, group, n in self.per_channel))
        return dataclasses.replace(self, arrays=arrays, length=length, quant=quant, group=group)

    def squeezed(self) -> KVCache:
        """This cache with its arrays stored without size-1 axes before the slots (batch 1,
        one KV head): XLA:CPU copied every [1, ..., S, X] cache array each decode step, the
        cache write fused twice, into the loop's carry and into the degenerate axis' bitcast
        that the attention matmul reads (`drop_unit_axes`). `read` gives the variant's layout
        back."""
        lead = next(iter(self.arrays.values())).shape[:-2]
        if 1 not in lead:
            return self
        arrays = {n: drop_unit_axes(a) for n, a in self.arrays.items()}
        return dataclasses.replace(self, arrays=arrays, lead=lead)

    def _stored_shape(self, x_B_TX: jax.Array) -> jax.Array:
        """New entries [B, ..., T, X] in the layout the arrays are stored in."""
        return drop_unit_axes(x_B_TX) if self.lead else x_B_TX

    @property
    def filled(self) -> jax.Array | None:
        """After `write`: how many leading slots of what the new queries attend hold tokens, in
        order, so that chunked decoding may read only those (lm/model/chunked.py); None for a
        ring, whose slots are not in token order (attended whole, through the mask)."""
        return None if self.window else self.slot

    def read(self, name: str, dtype) -> jax.Array:
        """The variant's array `name` as stored, in `dtype` (dequantized when quantized)."""
        if self.quant == 'kivi4':  # the residual at the group of token `slot`
            channel = name in self.per_channel
            return kv_kivi.read(
                name, self.arrays, self.slot, self.length, self.group, channel, dtype
            )
        if self.quant:
            out = kv_quant.decode(name, self.arrays, dtype)
        else:
            out = self.arrays[name].astype(dtype)
        return out.reshape(self.lead + out.shape[-2:]) if self.lead else out

    def _encoded(self, new_B_TX: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Entries as this cache stores them (int8 codes and scales when quantized)."""
        if not self.quant:
            return {n: self._stored_shape(x) for n, x in new_B_TX.items()}
        out = {}
        for name, x_B_TX in new_B_TX.items():
            out.update(kv_quant.encode(name, self._stored_shape(x_B_TX)))
        return out

    def write(self, **new_B_TX: jax.Array) -> tuple[KVCache, dict[str, jax.Array], jax.Array]:
        """Writes T new entries of the named arrays, [B, ..., T, X] in the cache's layout, at
        absolute indices slot..slot+T-1. Returns the cache (slot advanced by T), the arrays the
        T new queries attend (in the new entries' dtype; the new entries themselves unrounded
        by quantization) and their [B, T, S'] mask (`cache_mask`). A ring takes T > 1 new
        entries (a prefill) by attending its W slots followed by the T new ones, then keeping
        the last W."""
        if self.quant == 'kivi4':
            return self._write_kivi(new_B_TX)
        T = next(iter(new_B_TX.values())).shape[-2]
        dtype = next(iter(new_B_TX.values())).dtype
        stored_B_TX = self._encoded(new_B_TX)
        if self.window and T > 1:
            keys_S = jnp.concatenate(
                [ring_indices(self.window, self.slot), self.slot + jnp.arange(T)]
            )
            seen = {
                n: jnp.concatenate([self.read(n, dtype), x.astype(dtype)], axis=-2)
                for n, x in new_B_TX.items()
            }
            cache = dataclasses.replace(self, arrays=self._ring_kept(stored_B_TX, T))
        else:
            at = jnp.mod(self.slot, self.window) if self.window else self.slot
            arrays = {n: write_cache(a, stored_B_TX[n], at) for n, a in self.arrays.items()}
            cache = dataclasses.replace(self, arrays=arrays)
            keys_S = (
                ring_indices(self.window, self.slot + T)
                if self.window
                else jnp.arange(next(iter(arrays.values())).shape[-2])
            )
            seen = {n: cache.read(n, dtype) for n in new_B_TX}
            if self.quant:  # the new tokens attend themselves unrounded
                seen = {n: write_cache(s, new_B_TX[n].astype(dtype), at) for n, s in seen.items()}
        mask_BTS = cache_mask(keys_S, self.pad_B, self.slot, T, self.window)
        return dataclasses.replace(cache, slot=self.slot + T), seen, mask_BTS

    def _write_kivi(
        self, new_B_TX: dict[str, jax.Array]
    ) -> tuple[KVCache, dict[str, jax.Array], jax.Array]:
        """`write` for a 'kivi4' cache (full, token i at slot i): the new entries go through
        the residual (lm/model/kv_kivi.py); the new queries attend the cache as read back
        with the new entries themselves unrounded over their slots."""
        T = next(iter(new_B_TX.values())).shape[-2]
        dtype = next(iter(new_B_TX.values())).dtype
        arrays = {}
        for n, x_B_TX in new_B_TX.items():
            channel = n in self.per_channel
            arrays.update(
                kv_kivi.write(n, self.arrays, x_B_TX, self.slot, self.pad_B, self.group, channel)
            )
        cache = dataclasses.replace(self, arrays=arrays, slot=self.slot + T)
        seen = {
            n: write_cache(cache.read(n, dtype), x.astype(dtype), self.slot)
            for n, x in new_B_TX.items()
        }
        mask_BTS = cache_mask(jnp.arange(self.length), self.pad_B, self.slot, T)
        return cache, seen, mask_BTS

    def _ring_kept(self, stored_B_TX: dict[str, jax.Array], T: int) -> dict[str, jax.Array]:
        """The ring after T new stored entries: each slot keeps the latest index it holds."""
        held_W = ring_indices(self.window, self.slot + T)
        src_W = jnp.where(
            held_W >= self.slot, self.window + held_W - self.slot, jnp.arange(self.window)
        )
        return {
            n: jnp.take(
                jnp.concatenate([a, stored_B_TX[n].astype(a.dtype)], axis=-2), src_W, axis=-2
            )
            for n, a in self.arrays.items()
        }
