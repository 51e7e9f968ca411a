"""Decode speed and KV-cache size per attention variant and context length, against the
device's memory roofline.

For each batch size, variant and context L, the cache of a model large enough for the cache to
matter is filled to L tokens (random contents: speed depends on the length, not the values), then
the jitted decode loop generates --new_tokens tokens per row; the median of --repeats timed runs
is reported. Cache bytes per token are measured from the live cache arrays and shown next to the
accounting formula (2·g·d_h·L layers for MHA/GQA/MQA, (d_c + R·d_h^R)·L for MLA with R RoPE keys;
with cross-layer attention, 'cla2' / 'mqa_cla2', only every n-th layer holds a cache; a local
layer holds at most W tokens; an int8 cache a byte per element plus a scale per vector; a kivi4
cache half a byte per element plus its group statistics and float residual), per token of the
cache's S slots: L + new tokens rounded up to a multiple of 128 (`cache_capacity`, as generate
sizes it). A variant name ending in '_local' ('gqa4_local') has sliding-window layers (--window,
--layer_pattern); --kv_cache_dtype=int8 stores every cache as int8, =kivi4 as KIVI's 4 bits (full
caches only: not with '_local' or CLA variants) in groups of --kv_quant_group tokens;
--decode_chunk sets config.model.decode_chunk, --decode_kernel config.model.decode_kernel
('pallas': the fused GPU kernel of lm/model/flash_decode.py).

Roofline: a decode step must read every weight and the filled cache once per layer that attends
it (a CLA producer's cache is read by its consumers too: CLA halves what is stored, not what is
read), so its time is at least (bytes read per step) / (bandwidth). The reference bandwidth is
measured in the same run the way the best decoders reach it: a device-to-device copy (bytes read
+ written) and a streaming read (a jitted sum), each at --bandwidth_gib / 4, / 2 and x 1 (median
of 7 repeats), before the rows and after them, the best of all; the vendor's figure for the
device kind is printed beside it (both in lm/train/perf.py). A row that reads faster than the
reference raises it to its own rate, said in the header line, so no row prints more than 100%.
Each row reports the bytes a step reads (weights + the cache filled to L + half the new tokens),
the achieved GB/s, its % of the reference, its speedup over MHA (same batch and context), the
speedup the bytes predict (MHA's bytes per step / the variant's), and the share of that
prediction reached.

  python scripts/bench_decode.py       # the CPU table of docs/studies/decoding/README.md
  python scripts/bench_decode.py --contexts=256,1024 --batch=1,8 --json=decode.json
  python scripts/plot_roofline.py --json=decode.json   # decoding_roofline.png
  python scripts/bench_decode.py --variants=gqa4,gqa4_local --window=256 --kv_cache_dtype=int8
  python scripts/bench_decode.py --contexts=8192 --batch=8 --profile_top=15   # ops per step
"""

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from lm.cli import check_writable_dir, run_app
from lm.config import load_config_file
from lm.experiments import check_output_path
from lm.infer import Decoder, cache_capacity, init_caches
from lm.model import (
    DECODE_KERNELS,
    KV_CACHE_DTYPES,
    build_model,
    check_storage,
    kv_cache_bytes,
    kv_cache_bytes_read,
    model_config,
    param_counts,
    parse_variant,
)
from lm.train import (
    add_roofline,
    device_memory,
    load_profile,
    memory_reference,
    print_profile,
    reference_text,
)

_CONTEXTS = flags.DEFINE_list('contexts', ['256', '1024', '4096', '8192'], 'Cache fill lengths.')
_VARIANTS = flags.DEFINE_list(
    'variants',
    ['mha', 'gqa2', 'mqa', 'mla', 'cla2', 'mqa_cla2'],
    "Attention variants; '<variant>_cla<n>' (and 'cla<n>' = MHA's) share K/V across n layers.",
)
_BATCH = flags.DEFINE_list('batch', ['4'], 'Rows decoded together (one table per value).')
_NEW = flags.DEFINE_integer('new_tokens', 32, 'Tokens generated per timed run.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed runs per point (median reported).')
_DTYPE = flags.DEFINE_string('dtype', 'float32', 'Compute (and cache) dtype.')
_D_MODEL = flags.DEFINE_integer('d_model', 512, 'Model width (--num_heads heads of d_model / H).')
_HEADS = flags.DEFINE_integer('num_heads', 8, "Query heads H ('gqa4': 4 KV heads of them).")
_LAYERS = flags.DEFINE_integer('num_layers', 4, 'Layers.')
_JSON = flags.DEFINE_string('json', '', 'Also write the rows as JSON here.')
_BW_GIB = flags.DEFINE_float('bandwidth_gib', 1.0, 'Array size of the bandwidth measurement.')
_WINDOW = flags.DEFINE_integer('window', 256, "Sliding window W of a '<variant>_local' variant.")
_PATTERN = flags.DEFINE_string(
    'layer_pattern', 'LLLG', "Local/global layers of a '<variant>_local' variant ('' = all L)."
)
_KV_DTYPE = flags.DEFINE_enum(
    'kv_cache_dtype',
    'float',
    list(KV_CACHE_DTYPES),
    'Cache storage: the compute dtype, int8 or kivi4 (KIVI, 4 bits).',
)
_GROUP = flags.DEFINE_integer(
    'kv_quant_group', 32, 'config.model.kv_quant_group: tokens per kivi4 key group.'
)
_PROFILE = flags.DEFINE_integer(
    'profile_top', 0, 'Trace one more call per row and list its top N ops per step (0: off).'
)
_PROFILE_DIR = flags.DEFINE_string('profile_dir', '/tmp/lm_decode_profile', 'Where traces go.')
_XLA_DEFAULTS = flags.DEFINE_bool(
    'xla_defaults', False, "Compile the decoder with XLA's defaults (not CPU_DECODE_XLA_OPTIONS)."
)
_CHUNK = flags.DEFINE_integer(
    'decode_chunk', 0, 'config.model.decode_chunk: cache slots read per chunk (0 = all at once).'
)
_KERNEL = flags.DEFINE_enum(
    'decode_kernel', 'xla', DECODE_KERNELS, "config.model.decode_kernel ('pallas': GPU kernel)."
)

BASE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'base.py'
)


def model_for(variant: str):
    config = load_config_file(BASE)
    E, H = _D_MODEL.value, _HEADS.value
    config.model.update(
        vocab_size=256,
        d_model=E,
        num_layers=_LAYERS.value,
        num_heads=_HEADS.value,
        dtype=_DTYPE.value,
        decode_chunk=_CHUNK.value,
        decode_kernel=_KERNEL.value,
        kv_quant_group=_GROUP.value,
    )
    config.model.mla.update(
        kv_lora_rank=E // 2,
        qk_nope_head_dim=E // H,
        qk_rope_head_dim=E // (2 * H),
        v_head_dim=E // H,
    )
    base, local = variant.removesuffix('_local'), variant.endswith('_local')
    config.model.update(parse_variant(base))
    if local:  # local (sliding-window) layers by --layer_pattern
        config.model.update(sliding_window=_WINDOW.value, layer_pattern=_PATTERN.value)
    return model_config(config.model)


def random_like(key: jax.Array, a: jax.Array) -> jax.Array:
    """Random contents of a cache array's shape and dtype (int8 codes: uniform in +-127;
    kivi4's uint8 bytes of two codes: uniform in 0..255)."""
    if jnp.issubdtype(a.dtype, jnp.integer):
        lo = -127 if a.dtype == jnp.int8 else 0
        return jax.random.randint(key, a.shape, lo, jnp.iinfo(a.dtype).max + 1).astype(a.dtype)
    return jax.random.normal(key, a.shape, a.dtype)


def filled_caches(cfg, B: int, S: int, context: int) -> list:
    """The decoder's caches of `S` slots for a batch of `B`, filled with random values up to
    slot `context`."""
    key = jax.random.key(0)
    return [
        dataclasses.replace(
            c,
            arrays={k: random_like(key, a) for k, a in c.arrays.items()},
            slot=np.int32(context),
        )
        for c in init_caches(cfg, B, S, _KV_DTYPE.value)
    ]


def bench(variant: str, context: int, B: int) -> dict:
    cfg = model_for(variant)
    decoder = Decoder(build_model(cfg), xla_options={} if _XLA_DEFAULTS.value else None)
    n = _NEW.value
    S = cache_capacity(context + n)  # as generate sizes it
    caches = filled_caches(cfg, B, S, context)
    measured = sum(a.nbytes for c in caches for a in c.arrays.values()) / (B * S)
    logits = np.zeros((B, cfg.vocab_size), np.float32)
    args = [
        decoder.params,
        logits,
        caches,
        np.zeros(B, np.int32),
        np.int32(n),
        np.int32(-1),
        jax.random.key(1),
        np.float32(0),
        np.int32(0),
        np.float32(1),
    ]
    times = []
    for _ in range(_REPEATS.value + 1):  # the first call compiles
        args[2] = jax.block_until_ready(jax.tree.map(jnp.copy, caches))  # the loop donates them
        t = time.perf_counter()
        jax.block_until_ready(decoder.loop(*args))
        times.append(time.perf_counter() - t)
    compile_s, times = times[0], times[1:]
    if _PROFILE.value:
        profile_loop(decoder, args, caches, f'{variant}, context {context}, batch {B}')
    dt = float(np.median(times))
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(decoder.params))
    return {
        'variant': variant,
        'context': context,
        'batch': B,
        'params': param_counts(cfg)['total'],
        'cache_bytes_per_token_measured': measured,
        'cache_bytes_per_token_formula': kv_cache_bytes(cfg, S, _DTYPE.value, _KV_DTYPE.value) / S,
        'kv_cache_dtype': _KV_DTYPE.value,
        'kv_quant_group': _GROUP.value,
        'cache_bytes_total': int(measured * B * S),
        'decode_tokens_per_sec': B * n / dt,
        'ms_per_step': dt / n * 1e3,
        'first_call_s': compile_s,
        'dtype': _DTYPE.value,
        'decode_chunk': _CHUNK.value,
        'decode_kernel': _KERNEL.value,
        'xla_defaults': _XLA_DEFAULTS.value,
        # what one step must read: every weight, and the cache filled to L + n/2 on average (a
        # local layer's ring: at most W of them; formula = measured bytes, tests/test_decode.py),
        # read by every layer that attends it (a CLA producer's cache by its consumers too)
        'bytes_per_step': weight_bytes
        + B * kv_cache_bytes_read(cfg, context + n // 2, _DTYPE.value, _KV_DTYPE.value),
    }


def profile_loop(decoder: Decoder, args: list, caches: list, label: str) -> None:
    """Traces one more decode call and prints its ops per decode step (lm/train/profile.py)."""
    args[2] = jax.tree.map(jnp.copy, caches)
    hlo = decoder.loop.lower(*args).compile().as_text()
    trace_dir = os.path.join(_PROFILE_DIR.value, label.replace(', ', '_').replace(' ', ''))
    args[2] = jax.block_until_ready(jax.tree.map(jnp.copy, caches))
    jax.profiler.start_trace(trace_dir)
    jax.block_until_ready(decoder.loop(*args))
    jax.profiler.stop_trace()
    p = load_profile(trace_dir, hlo, _NEW.value)
    print(f'\nprofile of {label}: {p.busy:.3f} ms of op time per decode step')
    print_profile(p, _PROFILE.value)


def ratio(x: float | None) -> str:
    return '' if x is None else f'{x:.2f}×'


def percent(x: float | None) -> str:
    return '' if x is None else f'{100 * x:.0f}%'


def print_table(rows: list[dict], B: int) -> None:
    print(
        f'\ndecode benchmark: {jax.devices()[0].device_kind}, batch {B}, '
        f'{_NEW.value} new tokens, {_DTYPE.value} ({_KV_DTYPE.value} cache), '
        f'd_model {_D_MODEL.value}, '
        f'{_LAYERS.value} layers, decode_chunk {_CHUNK.value}, decode_kernel {_KERNEL.value}, '
        f'{_HEADS.value} heads ({rows[0]["params"]:,} params for {rows[0]["variant"]})'
    )
    print(
        '| variant | context | cache B/token (measured) | formula | cache total | '
        'decode tok/s | ms/step | MB read/step | GB/s | % of bandwidth | speedup vs MHA | '
        'bytes ratio | % of bytes ratio |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        print(
            f'| {r["variant"]} | {r["context"]} | {r["cache_bytes_per_token_measured"]:,.0f} | '
            f'{r["cache_bytes_per_token_formula"]:,.0f} | {r["cache_bytes_total"] / 2**20:,.1f} MiB'
            f' | {r["decode_tokens_per_sec"]:,.0f} | {r["ms_per_step"]:.2f} | '
            f'{r["bytes_per_step"] / 1e6:,.1f} | {r["achieved_GBps"]:.1f} | '
            f'{100 * r["fraction_of_bandwidth"]:.0f}% | {ratio(r["speedup_vs_mha"])} | '
            f'{ratio(r["predicted_speedup"])} | {percent(r["fraction_of_predicted"])} |'
        )


def counts(flag: flags.FlagHolder) -> list[int]:
    """A list flag's values as whole numbers >= 1 (one line otherwise)."""
    try:
        values = [int(v) for v in flag.value]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(
            f'--{flag.name}={",".join(flag.value)}: expected whole numbers >= 1, comma-separated'
        )
    return values


def check_flags() -> tuple[list[int], list[int]]:
    """(batches, contexts) after one-line refusals of every flag no row could run with, before
    any row is measured: counts, the --json path, and each variant with the cache storage."""
    batches, contexts = counts(_BATCH), counts(_CONTEXTS)
    for name in ('new_tokens', 'repeats'):
        if flags.FLAGS[name].value < 1:
            raise ValueError(f'--{name} must be >= 1, got {flags.FLAGS[name].value}')
    if not _BW_GIB.value > 0:
        raise ValueError(f'--bandwidth_gib must be > 0 (GiB copied and read), got {_BW_GIB.value}')
    if _JSON.value:
        check_output_path(_JSON.value, '--json', '.json')
        check_writable_dir(os.path.dirname(os.path.abspath(_JSON.value)), '--json')
    for variant in _VARIANTS.value:
        try:
            check_storage(model_for(variant), _KV_DTYPE.value)
        except ValueError as e:
            raise ValueError(f'--variants: {variant}: {e}') from None
    check_unused_flags()
    check_memory(max(batches), max(contexts))
    return batches, contexts


def check_unused_flags() -> None:
    """One-line refusals of flags given that no row reads: --window and --layer_pattern without
    a '<variant>_local' variant, --kv_quant_group without --kv_cache_dtype=kivi4."""
    local = any(v.endswith('_local') for v in _VARIANTS.value)
    for flag in (_WINDOW, _PATTERN):
        if flags.FLAGS[flag.name].present and not local:
            raise ValueError(
                f"--{flag.name} shapes '<variant>_local' variants only; --variants has none"
            )
    if flags.FLAGS[_GROUP.name].present and _KV_DTYPE.value != 'kivi4':
        raise ValueError(
            f'--kv_quant_group groups a kivi4 cache only; --kv_cache_dtype is {_KV_DTYPE.value}'
        )


def check_memory(B: int, context: int) -> None:
    """Refuses, before any row runs, a largest row whose cache (B rows of the context plus
    --new_tokens) and weights exceed a device's memory, and a bandwidth measurement whose copy
    (its array twice) does; they would fail allocating, in a traceback."""
    limit = device_memory()
    if limit is None:
        return
    if 2 * _BW_GIB.value * 2**30 > limit:
        raise ValueError(
            f'--bandwidth_gib={_BW_GIB.value}: its copy holds {2 * _BW_GIB.value:.1f} GiB, more '
            f'than the {limit / 2**30:.1f} GiB a device has'
        )
    S = cache_capacity(context + _NEW.value)
    for variant in _VARIANTS.value:
        cfg = model_for(variant)
        cache = B * kv_cache_bytes(cfg, S, _DTYPE.value, _KV_DTYPE.value)
        weights = param_counts(cfg)['total'] * np.dtype(cfg.param_dtype).itemsize
        if cache + weights > limit:
            raise ValueError(
                f"--batch={B} --contexts={context}: {variant}'s cache of {S} slots per row "
                f'({cache / 2**30:.1f} GiB) and weights ({weights / 2**30:.1f} GiB) exceed the '
                f'{limit / 2**30:.1f} GiB a device has: a smaller --batch, --contexts or --d_model'
            )


def run() -> int:
    batches, contexts = check_flags()
    references = [memory_reference(_BW_GIB.value)]
    rows = [bench(v, c, B) for B in batches for v in _VARIANTS.value for c in contexts]
    references.append(memory_reference(_BW_GIB.value))  # the machine may be shared: the best
    reference = max(references, key=lambda r: r['reference'])
    reference = add_roofline(rows, reference, baseline='mha')
    print(reference_text(reference))
    for B in batches:
        print_table([r for r in rows if r['batch'] == B], B)
    if _JSON.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
        with open(_JSON.value, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    run_app(run)
