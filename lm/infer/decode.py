"""KV-cache decoding for every attention variant: prefill a batch of prompts, then sample token by
token inside one jitted `lax.while_loop` (optionally handing each step's tokens to the host as
they are made, through an ordered `io_callback` that can also stop the loop).

Prompts of different lengths are left-padded to the longest, T. Row b's padding occupies cache
slots [0, pad_b) and is never attended; its tokens sit at positions 0, 1, ... as in a forward
pass of the unpadded prompt. Decode step i writes slot T + i for every row. Prefill and every
step are the model's own forward pass with one `KVCache` per layer (`Transformer.__call__` with
`caches`); each attention variant owns its cache layout (its `init_cache`, lm/model/attention.py):
K and V per KV head for MHA / GQA / MQA (head-major, [B, G, S, D]), the latent c_KV and the
RoPE key(s) for MLA. A local (sliding-window) layer's cache is a ring of W slots, and any
cache may be stored as int8, a full one also as KIVI's 4 bits (lm/model/kv_cache.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import io_callback

from lm.model import attention, layout
from lm.model.config import DTYPES, ModelConfig
from lm.model.kv_cache import KVCache, check_storage
from lm.model.layers import fuse_kernels
from lm.model.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Sampling settings; the defaults are transformers' (temperature 1.0, no truncation).
    temperature 0 = greedy (`GREEDY`); top_k 0 and top_p 1 = no truncation."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0 or self.temperature == float('inf'):  # NaN fails >= 0
            raise ValueError(
                f'sampling temperature must be a finite number >= 0, got {self.temperature}'
            )
        if self.top_k < 0:
            raise ValueError(f'sampling top_k must be >= 0 (0 = off), got {self.top_k}')
        if not 0 < self.top_p <= 1:  # also refuses NaN
            raise ValueError(f'sampling top_p must be in (0, 1], got {self.top_p}')


GREEDY = Sampling(temperature=0.0)
SAMPLING_TYPES = {'temperature': float, 'top_k': int, 'top_p': float}


def _sampling_option(spec: str, item: str) -> tuple[str, float | int]:
    """One 'name=value' item of a sampling spec, typed."""
    name, _, value = item.partition('=')
    name = name.strip()
    if name not in SAMPLING_TYPES:
        raise ValueError(
            f'unknown sampling option {name!r} in {spec!r}; expected '
            f"'greedy' or {sorted(SAMPLING_TYPES)} as name=value pairs"
        )
    try:
        return name, SAMPLING_TYPES[name](value)
    except ValueError:
        kind = 'an int' if SAMPLING_TYPES[name] is int else 'a float'
        raise ValueError(f'sampling option {name}={value!r} is not {kind}') from None


def parse_sampling(spec: str) -> Sampling:
    """'greedy', or comma-separated options such as 'temperature=0.8,top_k=40,top_p=0.95'.
    An option left out keeps its default (temperature 1.0: 'top_p=0.9' samples); options that
    cancel each other (top_k or top_p with temperature=0, which is greedy) are refused."""
    if spec.strip() == 'greedy':
        return GREEDY
    if not spec.strip():  # an empty flag is more likely a lost value than a wish for greedy
        raise ValueError("sampling '': expected 'greedy' or name=value options (temperature=0.8)")
    options: dict[str, float | int] = {}
    for item in spec.split(','):
        if item.strip() == 'greedy':
            raise ValueError(f"sampling {spec!r}: 'greedy' takes no other options")
        name, value = _sampling_option(spec, item)
        if name in options:
            raise ValueError(f'sampling {spec!r} sets {name} twice')
        options[name] = value
    sampling = Sampling(**options)
    ignored = [n for n in ('top_k', 'top_p') if n in options]
    if sampling.temperature == 0 and ignored:
        raise ValueError(
            f'sampling {spec!r}: temperature=0 is greedy decoding, which ignores '
            f'{" and ".join(ignored)}; drop them or set temperature > 0'
        )
    return sampling


CACHE_ALIGN = 128


def cache_capacity(tokens: int) -> int:
    """Slots of a cache that must hold `tokens`: rounded up to a multiple of CACHE_ALIGN. The
    spare slots are never attended. On a GPU an unaligned length costs a copy of the whole
    cache per step (XLA pads the cache for its split-K matmul; docs/performance.md)."""
    return -(-tokens // CACHE_ALIGN) * CACHE_ALIGN


def init_caches(
    cfg: ModelConfig, batch: int, length: int, kv_cache_dtype: str = 'float'
) -> list[KVCache]:
    """One zeroed cache per layer that computes K/V (every layer but CLA consumers,
    lm/model/layout.py), each in its layer's shape, for `length` tokens, in the compute dtype
    or stored as int8 or KIVI's 4 bits in groups of config.model.kv_quant_group tokens
    (`kv_cache_dtype`, lm/model/kv_cache.py): a local layer whose window W is shorter than
    `length` gets a ring of W slots. Refused in one line: `check_storage`."""
    check_storage(cfg, kv_cache_dtype)
    cls, dtype = attention.variant(cfg), DTYPES[cfg.dtype]
    caches = []
    for layer in layout.producers(cfg):
        W = cfg.layer_window(layer)
        window = W if 0 < W < length else 0
        cache = cls.init_cache(layout.layer_config(cfg, layer), batch, window or length, dtype)
        caches.append(cache.configured(window, length, kv_cache_dtype, cfg.kv_quant_group))
    return caches


def cache_elements_per_token(caches: list[KVCache]) -> int:
    """Elements the live cache arrays hold per token (all layers), measured from their shapes."""
    return sum(
        a.size // (c.pad_B.shape[0] * a.shape[-2]) for c in caches for a in c.arrays.values()
    )


def _sample(logits_BV: jax.Array, key: jax.Array, temperature, top_k, top_p) -> jax.Array:
    """One token per row: greedy when temperature == 0, else temperature / top-k / top-p (the
    sorts and the random draw only run when sampling)."""
    return jax.lax.cond(
        temperature > 0,
        _sample_tempered,
        lambda logits_BV, *_: jnp.argmax(logits_BV, axis=-1).astype(jnp.int32),
        logits_BV,
        key,
        temperature,
        top_k,
        top_p,
    )


def _sample_tempered(logits_BV: jax.Array, key: jax.Array, temperature, top_k, top_p):
    """One token per row drawn at `temperature` (> 0) after top-k / top-p truncation."""
    V = logits_BV.shape[-1]
    scaled = logits_BV / jnp.maximum(temperature, 1e-6)
    sorted_BV = jnp.sort(scaled, axis=-1)[:, ::-1]
    kth = jnp.take(sorted_BV, jnp.clip(top_k - 1, 0, V - 1), axis=-1)[:, None]
    scaled = jnp.where((top_k > 0) & (scaled < kth), -jnp.inf, scaled)
    # top-p: keep the most likely tokens until their mass reaches top_p (at least one).
    probs_sorted = jax.nn.softmax(jnp.sort(scaled, axis=-1)[:, ::-1], axis=-1)
    keep = jnp.cumsum(probs_sorted, axis=-1) - probs_sorted < top_p
    cutoff = jnp.min(jnp.where(keep, jnp.sort(scaled, axis=-1)[:, ::-1], jnp.inf), axis=-1)
    scaled = jnp.where(scaled < cutoff[:, None], -jnp.inf, scaled)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)


# XLA:CPU's YNNPACK library fusions off for decoding: with them, a GQA/MQA/MLA step's value sum
# (R >= 2 queries per KV head against the whole cache) ran at ~7 GB/s against ~11 GB/s for
# XLA's default dot, and MQA decoded ~1.25x slower (docs/decoding.md, jaxlib 0.10.2).
CPU_DECODE_XLA_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': ''}


def compute_dtype_weights(params: nnx.State, dtype: jnp.dtype) -> nnx.State:
    """`params` with every float matrix (ndim >= 2: kernels, embeddings) wider than the compute
    `dtype` cast to it once. Every layer casts its weights to that dtype before using them, so
    the model computes the same values; a decode loop given float32 weights of a bfloat16 model
    would cast (read and write) every weight again on each step. Vectors (norm scales, biases)
    and weights already as narrow are kept."""

    size = jnp.dtype(dtype).itemsize

    def cast(x: jax.Array) -> jax.Array:
        wider = jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize > size
        return x.astype(dtype) if wider and x.ndim >= 2 else x

    return jax.tree.map(cast, params)


def _one_token(model: Transformer, tokens_B, pad_B, caches):
    """`model` fed one token per row at the caches' slot -> (logits [B, V], caches)."""
    positions = (caches[0].slot - pad_B)[:, None]
    logits, caches = model(tokens_B[:, None], positions, caches=caches)
    return logits[:, 0], caches


class LoopState(NamedTuple):
    """The generation loop's carry: step i, which rows are done (sampled eos_id), how many
    tokens each row made, the tokens [B, S], the logits of the next token, the caches, the
    random key, and whether the host stopped the loop (streaming)."""

    i: jax.Array
    done_B: jax.Array
    counts_B: jax.Array
    out_BS: jax.Array
    logits_BV: jax.Array
    caches: list[KVCache]
    key: jax.Array
    stopped: jax.Array


class Decoder:
    """Jitted prefill, single decode steps, and a whole generation loop for one model.

    `absorb`: each variant's `absorb` (MLA decodes by weight absorption; False: it expands
    per-head K/V from its latent cache, the naive path); variants without that option ignore
    it. `kv_cache_dtype`: how `generate` stores the caches, 'float' (the compute dtype), 'int8'
    or 'kivi4' (`init_caches`; refused here already where the model cannot use it).
    `xla_options`: XLA compiler options of its jitted functions; None: `CPU_DECODE_XLA_OPTIONS`
    on a CPU, XLA's defaults elsewhere; {} for XLA's defaults everywhere."""

    def __init__(
        self,
        model: Transformer,
        absorb: bool = True,
        kv_cache_dtype: str = 'float',
        xla_options: dict[str, str] | None = None,
    ):
        check_storage(model.cfg, kv_cache_dtype)
        self.kv_cache_dtype = kv_cache_dtype
        model = nnx.clone(model)
        attention.set_absorb(model, absorb)
        self.cfg = model.cfg
        self.graphdef, params = nnx.split(model, nnx.Param)
        self.params = compute_dtype_weights(params, DTYPES[self.cfg.dtype])
        # The caches are donated: each call updates them in place (no copy of the whole cache
        # per call); pass the returned caches on and do not reuse the ones passed in.
        if xla_options is None:
            xla_options = CPU_DECODE_XLA_OPTIONS if jax.default_backend() == 'cpu' else {}
        jit = functools.partial(jax.jit, donate_argnames='caches', compiler_options=xla_options)
        self.prefill = jit(self._prefill)
        self.step = jit(self._step)
        self.loop = jit(self._loop)
        self.streaming_loop = jit(functools.partial(self._loop, stream=True))
        self._on_token: Callable[[np.ndarray], bool] | None = None  # see `generate`

    def _emit(self, tokens_B: np.ndarray) -> np.bool_:
        """The streaming loop's host callback: True stops the loop."""
        return np.bool_(bool(self._on_token(np.asarray(tokens_B))))

    def model(self, params) -> Transformer:
        """The model of `params` with its `fused_dense` kernels concatenated once
        (`fuse_kernels`). Inside a jitted function, merge it before a loop over steps: each step
        then reads the concatenated kernels instead of copying most of the weights again."""
        model = nnx.merge(self.graphdef, params)
        fuse_kernels(model)
        return model

    def _prefill(self, params, tokens_BT, pad_B, caches):
        """Left-padded prompts [B, T] into empty caches, from slot 0 -> (logits [B, T, V],
        caches). Row b's padding (slots [0, pad_b)) is marked never to be attended."""
        T = tokens_BT.shape[1]
        positions = jnp.maximum(jnp.arange(T)[None, :] - pad_B[:, None], 0)
        start = jnp.zeros((), jnp.int32)
        caches = [dataclasses.replace(c, slot=start, pad_B=pad_B) for c in caches]
        return self.model(params)(tokens_BT, positions, caches=caches)

    def _step(self, params, tokens_B, pad_B, caches):
        """Feeds one token per row at the caches' slot -> (logits [B, V], caches)."""
        return _one_token(self.model(params), tokens_B, pad_B, caches)

    def _loop(
        self,
        params,
        logits_BV,
        caches,
        pad_B,
        max_new,
        eos_id,
        key,
        temperature,
        top_k,
        top_p,
        stream=False,
    ):
        """Samples up to `max_new` tokens per row (stopping rows at `eos_id`); returns [B, S]
        tokens (the first max_new columns used), per-row counts and the caches (updated in
        place: the ones passed in are donated). All arguments but `stream` are traced, so
        this compiles once per (batch, cache length). `stream`: each step's tokens (-1 for
        rows already stopped) go to `_emit` as they are made, which may stop the loop."""
        B, S = caches[0].pad_B.shape[0], caches[0].length
        model = self.model(params)  # outside the loop: its kernels concatenated once per call

        def cond(s: LoopState):
            return (s.i < max_new) & ~jnp.all(s.done_B) & ~s.stopped

        def body(s: LoopState) -> LoopState:
            key, sub = jax.random.split(s.key)
            tok_B = _sample(s.logits_BV, sub, temperature, top_k, top_p)
            new_B1 = jnp.where(s.done_B, 0, tok_B)[:, None]
            stopped = s.stopped
            if stream:
                shape = jax.ShapeDtypeStruct((), jnp.bool_)
                emitted_B = jnp.where(s.done_B, -1, tok_B)
                stopped = io_callback(self._emit, shape, emitted_B, ordered=True)
            logits_BV, caches = _one_token(model, tok_B, pad_B, s.caches)
            return LoopState(
                i=s.i + 1,
                done_B=s.done_B | (tok_B == eos_id),
                counts_B=s.counts_B + ~s.done_B,
                out_BS=jax.lax.dynamic_update_slice_in_dim(s.out_BS, new_B1, s.i, 1),
                logits_BV=logits_BV,
                caches=caches,
                key=key,
                stopped=stopped,
            )

        start = LoopState(
            i=jnp.int32(0),
            done_B=jnp.zeros(B, bool),
            counts_B=jnp.zeros(B, jnp.int32),
            out_BS=jnp.zeros((B, S), jnp.int32),
            logits_BV=logits_BV,
            caches=caches,
            key=key,
            stopped=jnp.bool_(False),
        )
        end = jax.lax.while_loop(cond, body, start)
        return end.out_BS, end.counts_B, end.caches

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        sampling: Sampling = GREEDY,
        eos_id: int | None = None,
        seed: int = 0,
        cache_len: int | None = None,
        on_token: Callable[[np.ndarray], bool] | None = None,
    ) -> list[list[int]]:
        """Continues each prompt by up to `max_new_tokens` tokens (fewer if it emits eos_id,
        which is included). The cache holds `cache_len` tokens (default: enough, rounded up by
        `cache_capacity`). `on_token(tokens_B)` runs on the host after each step, in order,
        with that step's token per row (-1 for rows already stopped); when it returns True the
        generation ends there (the tokens made so far are returned). Generation is one jitted
        call either way."""
        if not prompts:
            raise ValueError('no prompts given')
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f'prompt {i + 1} is empty; every prompt needs at least one token')
        if max_new_tokens < 1:
            raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
        T = max(len(p) for p in prompts)
        S = cache_len or cache_capacity(T + max_new_tokens)
        if T + max_new_tokens > S:
            raise ValueError(
                f'prompt of {T} tokens + max_new_tokens={max_new_tokens} is longer '
                f'than the cache ({S} tokens)'
            )
        pad = np.array([T - len(p) for p in prompts], np.int32)
        tokens = np.array([[0] * (T - len(p)) + list(p) for p in prompts], np.int32)
        caches = init_caches(self.cfg, len(prompts), S, self.kv_cache_dtype)
        logits, caches = self.prefill(self.params, tokens, pad, caches)
        self._on_token = on_token
        loop = self.loop if on_token is None else self.streaming_loop
        out, counts, _ = loop(
            self.params,
            logits[:, -1],
            caches,
            pad,
            np.int32(max_new_tokens),
            np.int32(-1 if eos_id is None else eos_id),
            jax.random.key(seed),
            np.float32(sampling.temperature),
            np.int32(sampling.top_k),
            np.float32(sampling.top_p),
        )
        out, counts = np.asarray(out), np.asarray(counts)
        return [out[b, : counts[b]].tolist() for b in range(len(prompts))]
