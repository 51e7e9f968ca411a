"""KV-cache decoding: prefill + incremental steps equal a full forward pass for every variant."""

import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import (
    ENV,
    ROOT,
    full_forward_rows,
    run_entry,
    tiered,
    tiny_config,
    tiny_train_config,
)
from flax import nnx

from lm.infer.decode import (
    GREEDY,
    Decoder,
    Sampling,
    cache_capacity,
    cache_elements_per_token,
    init_caches,
    parse_sampling,
)
from lm.model import attention
from lm.model.accounting import kv_cache_bytes_per_token, kv_cache_elements_per_token
from lm.model.transformer import build_model, model_config
from lm.train.loop import train

VARIANTS = {
    'mha': dict(attention='mha'),
    'gqa2': dict(attention='gqa', num_kv_heads=2),
    'mqa': dict(attention='mqa'),
    'gqa2_dot_product': dict(attention='gqa', num_kv_heads=2, attention_impl='dot_product'),
    'mla': dict(attention='mla'),
    'mla_qlora': dict(attention='mla', q_lora_rank=8),
    'mla_rope_heads2': dict(attention='mla', rope_heads=2),
    # the cache read in chunks of 4 slots (lm/model/chunked.py): the caches below hold 15
    'mha_chunked': dict(attention='mha', decode_chunk=4),
    'gqa2_chunked': dict(attention='gqa', num_kv_heads=2, decode_chunk=4),
    'mqa_chunked': dict(attention='mqa', decode_chunk=4),
    'mla_chunked': dict(attention='mla', decode_chunk=4),
}
PROMPTS = [[5, 9, 2, 7, 1, 3, 8], [4, 4, 10], [11, 2, 6, 6, 1]]  # different lengths: left padding
# float32: the cached path reduces over a padded cache of a different shape.
ATOL, RTOL = 2e-5, 1e-4


def teacher_forced_logits(decoder, prompts, continuation):
    """Per-row logits at every position of prompt + continuation, via prefill then steps."""
    B, n = continuation.shape
    P = max(len(p) for p in prompts)
    pad = np.array([P - len(p) for p in prompts], np.int32)
    tokens = np.array([[0] * (P - len(p)) + p for p in prompts], np.int32)
    caches = init_caches(decoder.cfg, B, P + n + 3)  # a few spare slots that stay empty
    logits, caches = decoder.prefill(decoder.params, tokens, pad, caches)
    rows = [[logits[b, t] for t in range(pad[b], P)] for b in range(B)]
    for i in range(n):
        assert int(caches[0].slot) == P + i
        step_logits, caches = decoder.step(decoder.params, continuation[:, i], pad, caches)
        for b in range(B):
            rows[b].append(step_logits[b])
    return [np.stack(r) for r in rows]


def model_and_decoder(seed=0, absorb=True, **model):
    cfg = model_config(tiny_config(**model).model)
    m = build_model(cfg, seed=seed)
    return cfg, m, Decoder(m, absorb=absorb)


@pytest.mark.parametrize(
    'variant',  # the fast tier keeps GQA and MQA read in chunks (MLA's absorbed decoding:
    # test_mla_absorbed_equals_naive); every other variant in the full suite only
    tiered(
        VARIANTS,
        fast=['gqa2', 'mqa_chunked'],  # grouped, chunked reads (MLA: test_mla_absorbed_*)
    ),
)
def test_cached_decoding_equals_full_forward(variant):
    cfg, model, decoder = model_and_decoder(**VARIANTS[variant])
    cont = np.asarray(jax.random.randint(jax.random.key(1), (3, 5), 0, cfg.vocab_size), np.int32)
    got = teacher_forced_logits(decoder, PROMPTS, cont)
    wants = full_forward_rows(model, [p + cont[b].tolist() for b, p in enumerate(PROMPTS)])
    for b, want in enumerate(wants):
        np.testing.assert_allclose(got[b], want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize('variant', tiered(['gqa2', 'mla'], fast=['mla']))  # MLA: more casts
def test_bfloat16_decoder_holds_its_matrices_in_bfloat16_with_the_same_logits(variant):
    """A bfloat16 model's decoder casts its float32 kernels and embeddings to bfloat16 once
    (norm scales stay float32) and decodes what the float32 parameters give when every layer
    casts them itself: exactly on a CPU; on a GPU, XLA may fold the float32 -> bfloat16
    conversion into the matmul and skip the weights' rounding, so there within bfloat16's
    resolution (an H100 differed by up to 0.007 on logits of magnitude ~0.1)."""
    cfg, model, decoder = model_and_decoder(**VARIANTS[variant], dtype='bfloat16')
    leaves = jax.tree.leaves(decoder.params)
    assert {x.dtype.name for x in leaves if x.ndim >= 2} == {'bfloat16'}
    assert {x.dtype.name for x in leaves if x.ndim == 1} == {'float32'}
    cont = np.asarray(jax.random.randint(jax.random.key(4), (3, 4), 0, cfg.vocab_size), np.int32)
    got = teacher_forced_logits(decoder, PROMPTS, cont)
    decoder.params = nnx.split(model, nnx.Param)[1]  # the model's own, float32
    assert {x.dtype.name for x in jax.tree.leaves(decoder.params)} == {'float32'}
    want = teacher_forced_logits(decoder, PROMPTS, cont)
    atol = 0.0 if jax.default_backend() == 'cpu' else 0.02
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


@pytest.mark.parametrize(
    'q_lora_rank,rope_heads',
    tiered([(0, 1), (8, 1), (0, 2)], fast=[(0, 2)]),  # RoPE heads: more
)
def test_mla_absorbed_equals_naive(q_lora_rank, rope_heads):
    mla = dict(attention='mla', q_lora_rank=q_lora_rank, rope_heads=rope_heads)
    _, _, absorbed = model_and_decoder(**mla)
    _, _, naive = model_and_decoder(**mla, absorb=False)
    cont = np.asarray(jax.random.randint(jax.random.key(2), (3, 6), 0, 61), np.int32)
    for a, b in zip(
        teacher_forced_logits(absorbed, PROMPTS, cont),
        teacher_forced_logits(naive, PROMPTS, cont),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('variant', VARIANTS)
def test_cache_sizes_equal_the_accounting_formulas(variant):
    for dtype in ('float32', 'bfloat16'):
        cfg = model_config(tiny_config(**VARIANTS[variant], dtype=dtype).model)
        caches = init_caches(cfg, batch=3, length=10)
        assert cache_elements_per_token(caches) == kv_cache_elements_per_token(cfg)
        nbytes = sum(a.nbytes for c in caches for a in c.arrays.values())
        assert nbytes == 3 * 10 * kv_cache_bytes_per_token(cfg, dtype)
    if variant == 'mla':
        assert cache_elements_per_token(caches) == 2 * (16 + 4)  # L · (d_c + d_h^R)
    if variant == 'mla_rope_heads2':
        assert cache_elements_per_token(caches) == 2 * (16 + 2 * 4)  # L · (d_c + 2 · d_h^R)
    if variant == 'gqa2':
        assert cache_elements_per_token(caches) == 2 * 2 * 2 * 8  # L · 2 · g · d_h


@pytest.mark.slow
def test_greedy_generation_follows_the_argmax_and_stops_at_eos():
    cfg, model, decoder = model_and_decoder(attention='gqa', num_kv_heads=2, seed=4)
    outs = decoder.generate(PROMPTS, max_new_tokens=6)
    fulls = full_forward_rows(model, [p + o for p, o in zip(PROMPTS, outs, strict=True)])
    for prompt, out, logits in zip(PROMPTS, outs, fulls, strict=True):
        assert len(out) == 6
        np.testing.assert_array_equal(np.argmax(logits[len(prompt) - 1 : -1], -1), out)
    first = outs[0][0]
    stopped = decoder.generate(PROMPTS[:1], max_new_tokens=6, eos_id=first)
    assert stopped == [[first]]


@pytest.mark.slow
def test_decode_loop_compiles_once_per_batch_and_cache_length():
    _, _, decoder = model_and_decoder(attention='mla')
    decoder.generate([[1, 2, 3], [4]], max_new_tokens=4, cache_len=32)
    decoder.generate(
        [[1, 2, 3, 4, 5, 6], [7, 8]],
        max_new_tokens=9,
        cache_len=32,
        sampling=Sampling(temperature=0.7, top_k=5, top_p=0.9),
        eos_id=3,
    )
    decoder.generate([[9] * 20, [1]], max_new_tokens=2, cache_len=32, seed=5)
    assert decoder.loop._cache_size() == 1


def test_generate_sizes_its_cache_in_aligned_slots_that_are_never_attended():
    """The default cache is rounded up to a multiple of 128 slots (an unaligned length costs a
    GPU a copy of the cache per step); the spare slots change no token: greedy generation
    equals the same generation in a cache of exactly prompt + new tokens."""
    assert [cache_capacity(n) for n in (1, 128, 129, 8224)] == [128, 128, 256, 8320]
    _, _, decoder = model_and_decoder(attention='gqa', num_kv_heads=2)
    T = max(map(len, PROMPTS))
    aligned = decoder.generate(PROMPTS, 6, GREEDY)
    decoder.generate(PROMPTS, 9, GREEDY)  # 7 + 9 tokens: the same 128 slots, no new compile
    assert decoder.loop._cache_size() == 1
    assert aligned == decoder.generate(PROMPTS, 6, GREEDY, cache_len=T + 6)
    assert decoder.loop._cache_size() == 2


NO_COPY = ['mha', 'gqa2', 'mqa', 'mla', 'mha_chunked', 'mqa_chunked', 'mla_chunked']


def test_every_registered_variant_decodes_in_these_tables():
    """A new variant (lm/model/attention.py's registry) is refused here until it has a case in
    VARIANTS (its decoding against the full forward, its cache sizes against the accounting)
    and in NO_COPY."""
    for table in (VARIANTS, NO_COPY):
        cases = table.values() if isinstance(table, dict) else (VARIANTS[v] for v in table)
        assert {case['attention'] for case in cases} >= set(attention.VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize('B', [1, 3])
@pytest.mark.parametrize('variant', NO_COPY)
def test_decode_loop_reads_the_cache_without_copying_it(variant, B):
    """The compiled generation loop neither copies nor transposes a cache array (the caches
    are donated and updated in place; the kernel reads the head-major layout as it is): no
    copy or transpose in the optimised HLO yields as many elements as a cache array. With the
    [B, S, G, D] layout XLA transposed K every step, and with a size-1 axis before the slots
    (one KV head, or batch 1) it copied each cache array several times per step."""
    cfg, _, decoder = model_and_decoder(**VARIANTS[variant])
    S = 37
    caches = init_caches(cfg, B, S)
    sizes = {a.size for c in caches for a in c.arrays.values()}
    logits = np.zeros((B, cfg.vocab_size), np.float32)
    args = (np.zeros(B, np.int32), np.int32(4), np.int32(-1), jax.random.key(0), np.float32(0))
    loop = decoder.loop.lower(decoder.params, logits, caches, *args, np.int32(0), np.float32(1))
    hlo = loop.compile().as_text()
    copied = []
    for line in hlo.splitlines():
        match = re.search(r'= [a-z0-9]+\[([0-9,]*)\][^ ]* (copy|transpose)\(', line)
        if match and int(np.prod([int(d) for d in match.group(1).split(',') if d])) in sizes:
            copied.append(line.strip()[:120])
    assert not copied, copied


@pytest.mark.parametrize('variant', tiered(['gqa2', 'mla'], fast=['gqa2']))
def test_decode_loop_concatenates_no_weights_per_step(variant):
    """The generation loop's body concatenates no loop-carried value: the Q/K/V and gate/up
    kernels are concatenated once, before the loop (`Decoder.model`), and the body reads them as
    they are. Checked before XLA's passes: on a GPU XLA left a per-step concatenate of the
    weights in the loop (7% of an MQA step at 8k / 64), which the CPU pipeline hoists."""
    cfg, _, decoder = model_and_decoder(**VARIANTS[variant])
    B = 2
    caches = init_caches(cfg, B, 16)
    logits = np.zeros((B, cfg.vocab_size), np.float32)
    args = (np.zeros(B, np.int32), np.int32(4), np.int32(-1), jax.random.key(0), np.float32(0))
    text = decoder.loop.lower(decoder.params, logits, caches, *args, np.int32(0), 1.0).as_text()
    body = text[text.index('stablehlo.while') :]
    concats = [line.strip() for line in body.splitlines() if 'stablehlo.concatenate' in line]
    assert concats, 'no concatenate at all: the check below would pass vacuously'
    carried = [c[:160] for c in concats if '%iterArg' in c.split('dim =')[0]]
    assert not carried, carried
    before = text[: text.index('stablehlo.while')]
    assert before.count('stablehlo.concatenate') >= cfg.num_layers  # the hoisted kernels


@pytest.mark.slow
def test_decoder_compiles_with_its_xla_options():
    """On a CPU the decoder's functions compile with CPU_DECODE_XLA_OPTIONS (no YNNPACK library
    fusion in the loop); `xla_options={}` compiles with XLA's defaults (which, in a jaxlib that
    emits them, fuse the value sum into one), with the same tokens."""
    if jax.default_backend() != 'cpu':
        pytest.skip('CPU compiler options')
    cfg = model_config(tiny_config(attention='mqa', d_model=64).model)
    model = build_model(cfg, seed=2)
    B, S = 4, 256
    args = (np.zeros(B, np.int32), np.int32(4), np.int32(-1), jax.random.key(0), np.float32(0))
    hlo = {}
    for name, options in (('ours', None), ('defaults', {})):
        decoder = Decoder(model, xla_options=options)
        logits = np.zeros((B, cfg.vocab_size), np.float32)
        caches = init_caches(cfg, B, S)
        lowered = decoder.loop.lower(decoder.params, logits, caches, *args, np.int32(0), 1.0)
        hlo[name] = lowered.compile().as_text()
    assert '__ynn_fusion' not in hlo['ours']
    if '__ynn_fusion' not in hlo['defaults']:
        pytest.skip('this jaxlib emits no YNNPACK fusion for the loop by default')
    ours, defaults = Decoder(model), Decoder(model, xla_options={})
    assert ours.generate(PROMPTS, 5, GREEDY) == defaults.generate(PROMPTS, 5, GREEDY)


@pytest.mark.slow
def test_on_token_sees_each_step_in_order_and_can_stop_the_loop():
    """`on_token` gets each step's tokens as they are made (-1 for rows already at EOS), the
    result is unchanged by it, and returning True ends the generation after that step."""
    _, _, decoder = model_and_decoder(attention='gqa', num_kv_heads=2, seed=4)
    want = decoder.generate(PROMPTS, max_new_tokens=6)
    eos = want[1][2]  # row 1 stops at its third token
    want = decoder.generate(PROMPTS, max_new_tokens=6, eos_id=eos)
    seen = []
    got = decoder.generate(PROMPTS, 6, eos_id=eos, on_token=lambda t: seen.append(t.copy()))
    assert got == want
    for b, row in enumerate(want):
        column = [int(step[b]) for step in seen]
        assert column[: len(row)] == row and set(column[len(row) :]) <= {-1}
    assert len(seen) == max(len(r) for r in want)
    steps = []
    stopped = decoder.generate(PROMPTS, 6, on_token=lambda t: steps.append(t) or len(steps) == 2)
    assert len(steps) == 2 and all(len(r) == 2 for r in stopped)
    assert stopped == [r[:2] for r in decoder.generate(PROMPTS, 6)]


STOP_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, 'tests')
from conftest import tiny_config
from lm.infer.decode import Decoder
from lm.model.transformer import build_model, model_config
from lm.train.interrupt import Interrupted, StopRequest

decoder = Decoder(build_model(model_config(tiny_config(attention='mqa').model), seed=1))
steps = []

def on_token(tokens_B):
    steps.append(tokens_B)
    if len(steps) == 3:
        os.kill(os.getpid(), signal.SIGTERM)
        # The kernel may run the C handler on another thread a little later (under load):
        # wait until the flag shows it here, then let the next token's callback stop the loop.
        deadline = time.monotonic() + 60
        while not stop.arrived() and time.monotonic() < deadline:
            time.sleep(0.01)
        return False
    return stop.arrived()

with StopRequest() as stop:
    out = decoder.generate([[5, 9, 2], [4]], 50, on_token=on_token)
    try:
        stop.check()
    except Interrupted as e:
        print(e, len(steps), [len(r) for r in out])
"""


@pytest.mark.slow
def test_a_stop_signal_during_the_jitted_loop_stops_it_at_the_next_token():
    """SIGTERM arriving while the main thread is inside the jitted loop: Python's handler waits
    for the loop to return, but `StopRequest.arrived` (read by the loop's host callback) sees
    the signal at once, so the loop ends at the next token and `check` then raises. (In a
    fresh process: a test runner's worker may handle signals its own way.)"""
    out = subprocess.run(
        [sys.executable, '-c', STOP_SCRIPT],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.strip() == 'stopped by SIGTERM 4 [4, 4]', out.stderr[-2000:]


@pytest.mark.slow
def test_sampling_options():
    _, _, decoder = model_and_decoder(attention='mqa', seed=2)
    greedy = decoder.generate(PROMPTS, max_new_tokens=5)
    assert decoder.generate(PROMPTS, 5, Sampling(temperature=2.0, top_k=1), seed=3) == greedy
    assert decoder.generate(PROMPTS, 5, Sampling(temperature=2.0, top_p=1e-6), seed=3) == greedy
    hot = Sampling(temperature=5.0)
    a, b = (decoder.generate(PROMPTS, 8, hot, seed=s) for s in (0, 0))
    assert a == b and a != greedy and decoder.generate(PROMPTS, 8, hot, seed=1) != a
    assert parse_sampling('temperature=0.8,top_k=40,top_p=0.95') == Sampling(0.8, 40, 0.95)
    assert parse_sampling('greedy') == GREEDY == Sampling(temperature=0.0)


def test_a_sampling_option_alone_keeps_the_other_defaults():
    assert parse_sampling('top_p=0.9') == Sampling(temperature=1.0, top_k=0, top_p=0.9)
    assert parse_sampling('top_k=5') == Sampling(temperature=1.0, top_k=5, top_p=1.0)
    _, _, decoder = model_and_decoder(attention='mqa', seed=2)
    top_p = parse_sampling('top_p=0.99')
    runs = [decoder.generate(PROMPTS, 12, top_p, seed=s) for s in (1, 2)]
    assert runs[0] != runs[1], 'top_p alone must sample, so seeds must matter'


@pytest.mark.parametrize(
    'spec, message',
    [
        ('temperature=0,top_k=40', 'temperature=0 is greedy decoding, which ignores top_k;'),
        ('top_p=0.5,temperature=0', 'temperature=0 is greedy decoding, which ignores top_p;'),
        ('greedy,top_k=3', "'greedy' takes no other options"),
        ('top_k=3,top_k=4', 'sets top_k twice'),
        ('', "sampling '': expected 'greedy' or name=value options"),  # not silently greedy
    ],
)
def test_sampling_specs_that_cancel_are_refused(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_sampling(spec)


def test_one_line_errors():
    _, _, decoder = model_and_decoder(attention='gqa', num_kv_heads=2)
    with pytest.raises(
        ValueError,
        match=r'prompt of 7 tokens \+ max_new_tokens=4 is longer than '
        r'the cache \(8 tokens\)',
    ):
        decoder.generate(PROMPTS, 4, cache_len=8)
    with pytest.raises(ValueError, match=r'^prompt 2 is empty'):  # counted from 1
        decoder.generate([[1], []], 4)
    with pytest.raises(ValueError, match=r"unknown sampling option 'beam'"):
        parse_sampling('beam=4')
    with pytest.raises(ValueError, match=r'top_p must be in \(0, 1\]'):
        parse_sampling('top_p=1.5')
    with pytest.raises(ValueError, match=r"top_k=.*'x' is not an int"):
        parse_sampling('top_k=x')
    with pytest.raises(ValueError, match=r"temperature=.*'x' is not a float"):
        parse_sampling('temperature=x')


@pytest.mark.slow
def test_generate_script_prints_text_from_a_checkpoint(tmp_path, small_text):
    train(tiny_train_config(tmp_path, small_text, **{'train.steps': 4}), str(tmp_path / 'run'))
    out = run_entry(
        'scripts/generate.py',
        f'--workdir={tmp_path / "run"}',
        '--prompt=ROMEO:',
        '--prompt=JULIET:',
        '--max_new_tokens=9',  # 'JULIET:' + 9 bytes fill the run's 16-position context
        '--sampling=greedy',
        check=True,
    )
    blocks = out.stdout.split('-' * 40)
    assert blocks[0].startswith('ROMEO:') and len(blocks[0].strip()) > len('ROMEO:')
    assert blocks[1].strip().startswith('JULIET:')
    bad = run_entry('scripts/generate.py', f'--workdir={tmp_path / "run"}', '--sampling=beam=3')
    assert bad.returncode == 1 and "unknown sampling option 'beam'" in bad.stderr.splitlines()[-1]
