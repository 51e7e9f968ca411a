"""Local (sliding-window) / global layer patterns: the window mask, the forward against a float64
reference, cached decoding through a ring of W slots against the full forward, cache sizes
constant with context, the accounting, the config checks and the Qwen2 mapping."""

import dataclasses

import jax
import numpy as np
import pytest
import reference
from conftest import full_forward_rows, tiny_config

from lm.convert import hf
from lm.infer.decode import Decoder, init_caches
from lm.model import accounting
from lm.model.attention import window_mask
from lm.model.transformer import build_model, model_config
from lm.train.run import check_config

PROMPTS = [[5, 9, 2, 7, 1, 3, 8, 4, 2], [4, 4, 10], [11, 2, 6, 6, 1]]  # left-padded; 9 > W


def local_cfg(**model):
    settings = dict(attention='gqa', num_kv_heads=2, num_layers=3, sliding_window=4)
    if model.get('attention') == 'mla':
        settings['num_kv_heads'] = 0
    return model_config(tiny_config(**{**settings, **model}).model)


def windowed_forward(model, cfg, tokens):
    """float64 logits: reference.forward's blocks with each local layer's softmax restricted to
    keys 0 <= t - s < W (written here: the reference masks causally only)."""
    B, T = tokens.shape
    pos = np.broadcast_to(np.arange(T, dtype=np.float64), (B, T))
    x = reference.p(model.embed)[tokens]
    for i, blk in enumerate(model.blocks):
        h = reference.rmsnorm(x, reference.p(blk.attn_norm.scale), cfg.norm_eps)
        q, k, v, scale = reference.qkv(blk.attn, cfg, h, pos)
        s = np.einsum('bthd,bshd->bhts', q, k) * scale
        diff = np.arange(T)[:, None] - np.arange(T)[None, :]
        W = cfg.layer_window(i) or T
        s = np.where((diff >= 0) & (diff < W), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum('bhts,bshd->bthd', w / w.sum(-1, keepdims=True), v)
        x = x + np.einsum('bthd,hde->bte', o, reference.p(blk.attn.o_proj.kernel))
        h = reference.rmsnorm(x, reference.p(blk.mlp_norm.scale), cfg.norm_eps)
        gate = h @ reference.p(blk.mlp.gate_proj.kernel)
        up = h @ reference.p(blk.mlp.up_proj.kernel)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ reference.p(blk.mlp.down_proj.kernel)
    x = reference.rmsnorm(x, reference.p(model.final_norm.scale), cfg.norm_eps)
    return x @ reference.p(model.embed).T


@pytest.mark.slow
def test_window_mask_is_transformers_convention():
    """A query sees W keys, itself included (transformers: kv_idx > q_idx - W, kv <= q)."""
    pytest.importorskip('transformers')
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    T, W = 9, 3
    overlay = sliding_window_overlay(W)
    want = np.array(
        [
            [causal_mask_function(0, 0, q, k) and overlay(0, 0, q, k) for k in range(T)]
            for q in range(T)
        ]
    )
    np.testing.assert_array_equal(np.asarray(window_mask(T, W)), want)
    assert want.sum(1).max() == W


@pytest.mark.parametrize(
    'pattern',
    [pytest.param('', marks=pytest.mark.slow), 'LG', pytest.param('GLL', marks=pytest.mark.slow)],
)
def test_forward_equals_float64_reference(pattern):
    """Logits within 1e-5 of the largest |logit| of a float64 reference (T = 12 > W = 4)."""
    cfg = local_cfg(layer_pattern=pattern)
    model = build_model(cfg, seed=1)
    tokens = np.asarray(jax.random.randint(jax.random.key(0), (2, 12), 0, cfg.vocab_size))
    want = windowed_forward(model, cfg, tokens)
    got = np.asarray(model(tokens))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    full = windowed_forward(
        model, dataclasses.replace(cfg, sliding_window=0, layer_pattern=''), tokens
    )
    assert np.abs(full - want).max() > 1e-3  # the window changes the logits


def teacher_forced(model, cont, kv_cache_dtype='float'):
    """Each row's logits from its first real token: PROMPTS prefilled (left-padded), then the
    continuation `cont` [B, n] one step at a time."""
    decoder = Decoder(model)
    B, n, P = len(PROMPTS), cont.shape[1], max(len(p) for p in PROMPTS)
    pad = np.array([P - len(p) for p in PROMPTS], np.int32)
    tokens = np.array([[0] * (P - len(p)) + p for p in PROMPTS], np.int32)
    caches = init_caches(model.cfg, B, P + n, kv_cache_dtype)
    logits, caches = decoder.prefill(decoder.params, tokens, pad, caches)
    rows = [[logits[b, t] for t in range(pad[b], P)] for b in range(B)]
    for i in range(n):
        step, caches = decoder.step(decoder.params, cont[:, i], pad, caches)
        for b in range(B):
            rows[b].append(step[b])
    return [np.stack(r) for r in rows]


def assert_equals_full_forward(model, cont, rows):
    wants = full_forward_rows(model, [p + cont[b].tolist() for b, p in enumerate(PROMPTS)])
    for row, want in zip(rows, wants, strict=True):
        np.testing.assert_allclose(row, want, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('attention', ['gqa', 'mla'])
def test_decode_equals_full_forward_past_the_window(attention):
    """Prefill (prompts longer and shorter than W, left-padded) then 12 steps through rings of
    W = 4 slots give the full forward's logits token for token (atol 2e-5, rtol 1e-4)."""
    cfg = local_cfg(attention=attention, layer_pattern='LG')
    model = build_model(cfg, seed=2)
    assert [c.window for c in init_caches(cfg, 1, 21)] == [4, 0, 4]
    cont = np.asarray(jax.random.randint(jax.random.key(3), (3, 12), 0, cfg.vocab_size), np.int32)
    assert_equals_full_forward(model, cont, teacher_forced(model, cont))
    out = Decoder(model).generate(PROMPTS, 6)
    fulls = full_forward_rows(model, [p + n for p, n in zip(PROMPTS, out, strict=True)])
    for prompt, new, full in zip(PROMPTS, out, fulls, strict=True):
        np.testing.assert_array_equal(np.argmax(full[len(prompt) - 1 : -1], -1), new)


@pytest.mark.slow
@pytest.mark.parametrize('kv_cache_dtype', ['float', 'int8'])
def test_chunked_decoding_with_local_layers_and_per_layer_heads(kv_cache_dtype):
    """Local/global layers (W = 4) with per-layer KV heads (2, 1, 2) and decode_chunk = 3: the
    global layer's 21-slot cache is read 3 slots at a time, the rings whole. Each cache has its
    layer's heads and slots and the bytes of `kv_cache_bytes_by_layer`; the logits equal
    decode_chunk = 0's (atol 1e-5) and, float, the full forward's (atol 2e-5, rtol 1e-4)."""
    cfg = local_cfg(layer_pattern='LG', num_kv_heads=0, kv_heads_per_layer=(2, 1, 2))
    cfg = dataclasses.replace(cfg, decode_chunk=3)
    caches = init_caches(cfg, 3, 21, kv_cache_dtype)
    assert [c.arrays['k'].shape[1:-1] for c in caches] == [(2, 4), (21,), (2, 4)]
    measured = [sum(a.nbytes for a in c.arrays.values()) for c in caches]
    assert measured == [
        3 * b for b in accounting.kv_cache_bytes_by_layer(cfg, 21, cfg.dtype, kv_cache_dtype)
    ]
    cont = np.asarray(jax.random.randint(jax.random.key(5), (3, 12), 0, cfg.vocab_size), np.int32)
    model = build_model(cfg, seed=4)
    rows = teacher_forced(model, cont, kv_cache_dtype)
    whole = build_model(dataclasses.replace(cfg, decode_chunk=0), seed=4)
    for got, want in zip(rows, teacher_forced(whole, cont, kv_cache_dtype), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    if kv_cache_dtype == 'float':
        assert_equals_full_forward(model, cont, rows)


def test_cla_with_local_layers_or_int8_is_refused():
    """Cross-layer attention reads its producer's full float cache: a window or an int8 cache
    with kv_share_every > 1 is refused in one line naming the keys."""
    with pytest.raises(ValueError, match=r'^config.model.kv_share_every=2 with config.model.sli'):
        local_cfg(kv_share_every=2)
    cla = local_cfg(sliding_window=0, kv_share_every=2)
    with pytest.raises(ValueError, match=r"^config.model.kv_share_every=2 with kv_cache_dtype='i"):
        init_caches(cla, 1, 8, 'int8')


@pytest.mark.parametrize('kv_cache_dtype', ['float', pytest.param('int8', marks=pytest.mark.slow)])
def test_local_cache_is_constant_with_context(kv_cache_dtype):
    """Local layers' arrays hold W slots whatever the length; the bytes equal the formula."""
    cfg = local_cfg(layer_pattern='LLG', dtype='bfloat16')
    for length in (3, 16, 64):
        caches = init_caches(cfg, 2, length, kv_cache_dtype)
        for i, cache in enumerate(caches):
            slots = {a.shape[-2] for a in cache.arrays.values()}
            assert slots == ({min(4, length)} if cfg.layer_window(i) else {length})
        measured = sum(a.nbytes for c in caches for a in c.arrays.values())
        formula = accounting.kv_cache_bytes(cfg, length, 'bfloat16', kv_cache_dtype)
        assert measured == 2 * formula
    # 64 tokens: two local layers of 4 slots and one global of 64, 2·g·d_h elements each
    per_token = 2 * 2 * 8 * 2 if kv_cache_dtype == 'float' else 2 * 2 * 8 + 2 * 2 * 2
    assert formula == (4 + 4 + 64) * per_token


@pytest.mark.parametrize(
    'model, message',
    [
        (dict(layer_pattern='LX'), r"layer_pattern='LX' must hold only 'L'"),
        (dict(sliding_window=0, layer_pattern='LG'), r"layer_pattern='LG' needs .*sliding_window"),
        (dict(layer_pattern='GGG'), r'sliding_window=4 applies to no layer'),
        (dict(sliding_window=-1), r'sliding_window must be >= 0'),
    ],
)
def test_refused_patterns(model, message):
    with pytest.raises(ValueError, match=message):
        local_cfg(**model)


def test_hf_config_round_trip_and_refusals():
    """Qwen2's layer_types carry the pattern both ways; what has no mapping is refused in one
    line naming the config key."""
    cfg = local_cfg(num_layers=6, layer_pattern='LLG', qkv_bias=True)
    out = hf.hf_from_model(cfg, 64)
    assert out['architectures'] == ['Qwen2ForCausalLM']
    assert out['layer_types'] == ['sliding_attention'] * 2 + ['full_attention'] + [
        'sliding_attention'
    ] * 2 + ['full_attention']
    model, _ = hf.model_from_hf(out)
    assert (model['sliding_window'], model['layer_pattern'], model['qkv_bias']) == (4, 'LLG', True)
    with pytest.raises(ValueError, match=r'^config.model.qkv_bias=False with o_bias=False: Qwen2'):
        hf.hf_from_model(local_cfg(), 64)
    with pytest.raises(ValueError, match=r"^config.model.sliding_window=4 with attention='mla'"):
        hf.hf_from_model(local_cfg(attention='mla'), 64)
    plain = hf.hf_from_model(local_cfg(sliding_window=0), 64)
    assert plain['architectures'] == ['LlamaForCausalLM']
    short = {**out, 'layer_types': out['layer_types'][:5]}  # 5 for 6 layers: none guessed
    with pytest.raises(ValueError, match=r'^config.json layer_types=.*one entry per layer, 6 '):
        hf.model_from_hf(short)


@pytest.mark.slow
def test_qwen2_logits_and_decoding_equal_transformers(tmp_path):
    """A random Qwen2 model with layers sliding, full, sliding (W = 3) imported from
    transformers: logits on 12 tokens and 8 greedy tokens past the window equal transformers'
    (logits within 1e-4 of the largest), and its export loads in transformers with the same
    logits."""
    torch = pytest.importorskip('torch')
    transformers = pytest.importorskip('transformers')
    import importlib.util

    from test_hf import FIXTURES, assert_close_logits, base_config, model_of, transformers_logits

    from lm.convert.hf_io import export_hf, import_hf

    spec = importlib.util.spec_from_file_location('make_fixtures', FIXTURES / 'make_fixtures.py')
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    config = transformers.Qwen2Config(
        vocab_size=fixtures.VOCAB,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=3,
        layer_types=['sliding_attention', 'full_attention', 'sliding_attention'],
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(7)
    hf_model = transformers.Qwen2ForCausalLM(config).eval()
    fixtures.randomise(hf_model, 7)
    src = tmp_path / 'src'
    hf_model.save_pretrained(src)
    fixtures.tokenizer().save(str(src / 'tokenizer.json'))
    tokens = np.random.default_rng(7).integers(3, fixtures.VOCAB, size=(2, 12))
    prompt = torch.from_numpy(tokens[:, :4])
    with torch.no_grad():
        want = hf_model(torch.from_numpy(tokens)).logits.float().numpy()
        greedy = hf_model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[:, 4:]
    lm_config = import_hf(str(src), str(tmp_path / 'w'), base_config())
    assert (lm_config.model.sliding_window, lm_config.model.layer_pattern) == (3, 'LG')
    model, _ = model_of(tmp_path / 'w')
    assert_close_logits(model(tokens), want)
    out = Decoder(model).generate(tokens[:, :4].tolist(), 8)
    assert out == greedy.numpy().tolist()
    export_hf(str(tmp_path / 'w'), str(tmp_path / 'out'))
    assert_close_logits(transformers_logits(tmp_path / 'out', tokens), want)


def test_bytes_per_context_token_count_a_local_layer_at_its_window():
    """Per token of a 16-token sequence: the local layer holds 4 slots, the global one 16, so
    (4 + 16) / 16 slots of 2 K/V heads of 8 in bfloat16; a model without local layers gets its
    per-token bytes."""
    local = model_config(tiny_config(num_kv_heads=2, sliding_window=4, layer_pattern='LG').model)
    slot = 2 * 2 * 8 * 2  # K and V, 2 heads of 8, 2 bytes
    assert accounting.kv_cache_bytes_per_context_token(local, 16) == round((4 + 16) * slot / 16)
    full = model_config(tiny_config(num_kv_heads=2).model)
    assert accounting.kv_cache_bytes_per_context_token(full, 16) == 2 * slot
    assert accounting.kv_cache_bytes_per_token(full) == 2 * slot


def test_a_window_as_long_as_the_row_is_warned(caplog):
    """sliding_window >= data.seq_len windows nothing in training (q - k < W for every pair of
    a row): the run's config check warns once, naming both settings; a shorter window and no
    window are silent."""
    seq_len = tiny_config().data.seq_len
    for window, warned in ((seq_len + 7, True), (seq_len, True), (seq_len - 1, False), (0, False)):
        local = {'sliding_window': window, 'layer_pattern': 'LG'} if window else {}
        caplog.clear()
        with caplog.at_level('WARNING'):
            check_config(tiny_config(attention='gqa', num_kv_heads=2, **local))
        lines = [r.getMessage() for r in caplog.records if 'sliding_window' in r.getMessage()]
        expected = (
            f'config.model.sliding_window={window} >= config.data.seq_len={seq_len}: the local '
            'layers see the whole row in training and evaluation (as global ones); only decoding '
            f'past {window} tokens is windowed'
        )
        assert lines == ([expected] if warned else []), window
