"""KV layouts across layers (lm/model/layout.py): cross-layer attention (CLA) and per-layer KV
head counts. The model against a float64 NumPy forward written here, cached decoding against the
full forward, the cache bytes of the per-layer accounting against the live cache arrays and a
hand formula, and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiered, tiny_config
from flax import nnx
from reference import causal_weights, p, rmsnorm, rope

from lm.infer.decode import GREEDY, Decoder, init_caches
from lm.model.accounting import (
    kv_cache_bytes,
    kv_cache_bytes_per_context_token,
    kv_cache_bytes_per_layer,
    kv_cache_bytes_per_token,
    kv_cache_bytes_read,
    param_counts,
)
from lm.model.transformer import build_model, model_config

# (name, config.model settings); tiny_config: d_model 32, 4 heads of 8.
LAYOUTS = [
    ('mqa_cla2', dict(attention='mqa', num_layers=4, kv_share_every=2)),
    ('gqa2_cla3', dict(attention='gqa', num_kv_heads=2, num_layers=5, kv_share_every=3)),
    ('mha_cla2', dict(attention='mha', num_layers=3, kv_share_every=2)),
    # consumers and producers read a decoding cache 4 slots at a time (lm/model/chunked.py)
    ('mqa_cla2_chunked', dict(attention='mqa', num_layers=4, kv_share_every=2, decode_chunk=4)),
    ('per_layer', dict(attention='gqa', num_layers=4, kv_heads_per_layer=(4, 2, 2, 1))),
    (
        'per_layer_cla2',
        dict(attention='gqa', num_layers=4, kv_heads_per_layer=(4, 4, 1, 1), kv_share_every=2),
    ),
]
IDS = [name for name, _ in LAYOUTS]


def layout_config(settings, **more):
    return model_config(tiny_config(**settings, **more).model)


def reference_forward(model, cfg, tokens, share, heads):
    """float64 logits: layer i attends the keys and values computed by layer i - i % share
    from that layer's input, with heads[i] KV heads, each repeated for its H / g queries."""
    B, T = tokens.shape
    pos = np.broadcast_to(np.arange(T, dtype=np.float64), (B, T))
    x = p(model.embed)[tokens]
    H = cfg.num_heads
    for i, blk in enumerate(model.blocks):
        h = rmsnorm(x, p(blk.attn_norm.scale), cfg.norm_eps)
        if i % share == 0:
            k = rope(np.einsum('bte,egd->btgd', h, p(blk.attn.k_proj.kernel)), pos, cfg.rope_theta)
            v = np.einsum('bte,egd->btgd', h, p(blk.attn.v_proj.kernel))
            assert k.shape[2] == heads[i]
            k, v = np.repeat(k, H // heads[i], axis=2), np.repeat(v, H // heads[i], axis=2)
        q = rope(np.einsum('bte,ehd->bthd', h, p(blk.attn.q_proj.kernel)), pos, cfg.rope_theta)
        w = causal_weights(q, k, cfg.head_dim**-0.5)
        o = np.einsum('bhts,bshd->bthd', w, v)
        x = x + np.einsum('bthd,hde->bte', o, p(blk.attn.o_proj.kernel))
        h = rmsnorm(x, p(blk.mlp_norm.scale), cfg.norm_eps)
        gate, up = h @ p(blk.mlp.gate_proj.kernel), h @ p(blk.mlp.up_proj.kernel)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p(blk.mlp.down_proj.kernel)
    x = rmsnorm(x, p(model.final_norm.scale), cfg.norm_eps)
    return x @ p(model.embed).T


def expected_heads(settings):
    L = settings['num_layers']
    if 'kv_heads_per_layer' in settings:
        return list(settings['kv_heads_per_layer'])
    g = {'mha': 4, 'mqa': 1}.get(settings['attention'], settings.get('num_kv_heads'))
    return [g] * L


@pytest.mark.parametrize(
    'name,settings', tiered(LAYOUTS, fast=[LAYOUTS[0], LAYOUTS[-1]]), ids=IDS
)  # fast: CLA, CLA over per-layer heads
def test_forward_matches_float64_reference(name, settings):
    cfg = layout_config(settings)
    model = build_model(cfg, seed=3)
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size))
    share = settings.get('kv_share_every', 1)
    want = reference_forward(model, cfg, tokens, share, expected_heads(settings))
    got = np.asarray(nnx.jit(model)(jnp.asarray(tokens)), np.float64)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)  # float32 against float64


def test_consumers_have_no_kv_projections():
    cfg = layout_config(dict(attention='gqa', num_kv_heads=2, num_layers=5, kv_share_every=3))
    model = build_model(cfg)
    assert [blk.attn.k_proj is not None for blk in model.blocks] == [1, 0, 0, 1, 0]
    assert [blk.attn.v_proj is not None for blk in model.blocks] == [1, 0, 0, 1, 0]
    # q and o in every layer, k and v (E x g x D each) in the 2 producers only.
    E, H, g, D = 32, 4, 2, 8
    assert param_counts(cfg)['attention'] == 5 * 2 * E * H * D + 2 * 2 * E * g * D


@pytest.mark.parametrize(
    'name,settings', tiered(LAYOUTS, fast=[LAYOUTS[-1]]), ids=IDS
)  # fast: CLA over per-layer heads
def test_cached_decoding_matches_full_forward(name, settings):
    cfg = layout_config(settings)
    model = build_model(cfg, seed=4)
    tokens = jax.random.randint(jax.random.key(2), (2, 10), 0, cfg.vocab_size)
    forward = nnx.jit(lambda m, *args, **kw: m(*args, **kw))
    full = np.asarray(forward(model, tokens))
    caches = init_caches(cfg, 2, 10)
    logits, caches = forward(model, tokens[:, :6], caches=caches)  # prefill 6, then 1 by 1
    steps = [np.asarray(logits)]
    for t in range(6, 10):
        logits, caches = forward(model, tokens[:, t : t + 1], jnp.full((2, 1), t), caches=caches)
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('name,settings', LAYOUTS[:1] + LAYOUTS[4:], ids=IDS[:1] + IDS[4:])
def test_generate_with_padding_matches_greedy_full_forward(name, settings):
    cfg = layout_config(settings)
    model = build_model(cfg, seed=5)
    prompts = [[3, 14, 15, 9, 26], [5, 35]]  # the second is left-padded in the cache
    got = Decoder(model).generate(prompts, 5, GREEDY)
    forward = nnx.jit(lambda m, tokens: m(tokens)[0])
    T = max(map(len, prompts)) + 5  # right-padded to one length: one compile (causal)
    for prompt, out in zip(prompts, got, strict=True):
        seq = list(prompt)
        for _ in range(5):
            logits = forward(model, jnp.asarray([seq + [0] * (T - len(seq))]))
            seq.append(int(np.argmax(np.asarray(logits[len(seq) - 1]))))
        assert out == seq[len(prompt) :]


def test_document_mask_keeps_consumers_within_their_document():
    cfg = layout_config(dict(attention='mqa', num_layers=4, kv_share_every=2))
    model = build_model(cfg, seed=6)
    a, b = [7, 1, 8, 2, 8], [1, 8, 2, 8, 4, 5]
    packed = jnp.asarray([a + b])
    segments = jnp.asarray([[0] * len(a) + [1] * len(b)])
    positions = jnp.asarray([list(range(len(a))) + list(range(len(b)))])
    forward = nnx.jit(lambda m, *args, **kw: m(*args, **kw))
    logits = forward(model, packed, positions, segment_ids_BT=segments)
    alone = forward(model, jnp.asarray([b]))
    np.testing.assert_allclose(np.asarray(logits[:, len(a) :]), np.asarray(alone), atol=1e-5)


@pytest.mark.parametrize('name,settings', LAYOUTS, ids=IDS)
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_cache_bytes_formula_equals_measured_per_layer(name, settings, dtype):
    cfg = layout_config(settings, dtype=dtype)
    caches = iter(init_caches(cfg, 3, 11))
    share = settings.get('kv_share_every', 1)
    measured = [
        sum(a.nbytes for a in next(caches).arrays.values()) // (3 * 11) if i % share == 0 else 0
        for i in range(cfg.num_layers)
    ]
    assert next(caches, None) is None  # one cache per producing layer, no more
    assert kv_cache_bytes_per_layer(cfg, dtype) == measured
    size = 2 if dtype == 'bfloat16' else 4
    hand = [
        2 * g * 8 * size if i % share == 0 else 0 for i, g in enumerate(expected_heads(settings))
    ]
    assert measured == hand  # 2 · g_i · d_h bytes-per-element for producers, 0 for consumers
    assert kv_cache_bytes_per_token(cfg, dtype) == sum(hand)


def test_mqa_cla2_halves_mqa_cache():
    mqa = layout_config(dict(attention='mqa', num_layers=4))
    cla = layout_config(dict(attention='mqa', num_layers=4, kv_share_every=2))
    assert 2 * kv_cache_bytes_per_token(cla) == kv_cache_bytes_per_token(mqa)


@pytest.mark.parametrize(
    'settings,message',
    [
        (dict(kv_share_every=0), 'config.model.kv_share_every must be >= 1'),
        (dict(kv_share_every=3), 'kv_share_every=3 must be <= config.model.num_layers=2'),
        (dict(attention='mla', kv_share_every=2, num_kv_heads=0), 'kv_share_every=2 needs'),
        (dict(kv_heads_per_layer=(2,)), 'must list one count per layer'),
        (dict(kv_heads_per_layer=(4, 3)), '[3] do not divide num_heads=4'),
        (dict(kv_heads_per_layer=(3, 3)), 'kv_heads_per_layer: [3, 3] do not divide num_heads'),
        (dict(kv_heads_per_layer=(2.0, 'a')), "must list whole numbers, got [2.0, 'a']"),
        (dict(kv_heads_per_layer=(0, 2)), 'kv_heads_per_layer=(0, 2): every count must be >= 1'),
        (  # names the key set, not the num_kv_heads derived from it
            dict(attention='mha', kv_heads_per_layer=(4, 2)),
            "kv_heads_per_layer=(4, 2) contradicts attention='mha' (which means 4 in every",
        ),
        (
            dict(attention='mqa', kv_heads_per_layer=(1, 2)),
            "kv_heads_per_layer=(1, 2) contradicts attention='mqa' (which means 1 in every",
        ),
        (dict(kv_heads_per_layer=(2, 1), num_kv_heads=1), 'must be 0 or max('),
        (dict(attention='mla', kv_heads_per_layer=(2, 1)), 'needs K/V heads'),
        (dict(kv_heads_per_layer=(2, 1), kv_share_every=2), 'layers [1] read the K/V'),
    ],
)
def test_layout_errors_name_the_key(settings, message):
    per_layer = 'kv_heads_per_layer' in settings
    settings = {'attention': 'gqa', 'num_kv_heads': 0 if per_layer else 2, **settings}
    with pytest.raises(ValueError, match='config.model') as err:
        model_config(tiny_config(**settings).model)
    assert message in str(err.value)


def test_kv_layouts_sweep_points_are_valid_and_smaller_than_mha():
    import importlib.util

    from conftest import ROOT

    from lm.experiments.sweep_points import invalid_reason, point_config

    path = ROOT / 'configs' / 'sweeps' / 'kv_layouts.py'
    spec = importlib.util.spec_from_file_location('kv_layouts', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base, kv = module.get_config(), {}
    for point in module.get_points():
        config = point_config(base, {k: v for k, v in point.items() if k != 'name'})
        assert invalid_reason(config) is None, point
        cfg = model_config(config.model, 256)
        kv[point['name']] = kv_cache_bytes_per_context_token(cfg, config.data.seq_len)
    # bf16, 4 layers, d_h 16: 2·g·16·2 bytes per producing layer and token; a 64-token
    # sequence's three local layers hold 16 of its tokens each
    assert kv == {
        'mha': 4 * 512,
        'gqa2': 4 * 128,
        'mqa': 4 * 64,
        'mla': 4 * (64 + 8) * 2,
        'cla2': 2 * 512,
        'gqa2_cla2': 2 * 128,
        'mqa_cla2': 2 * 64,
        'kv_8421': 512 + 256 + 128 + 64,
        'mha_local': 512 + 3 * 512 * 16 // 64,
    }


def test_a_decode_step_reads_each_producer_cache_once_per_attending_layer():
    # bf16, d_h 8, 10 tokens: one KV head is 2·8·2 = 32 B per token and layer
    per_head = 32 * 10
    cases = [  # (settings, heads each layer attends, heads stored)
        ('mqa_cla2', (1, 1, 1, 1), 2),
        ('gqa2_cla3', (2, 2, 2, 2, 2), 4),
        ('per_layer', (4, 2, 2, 1), 9),
        ('per_layer_cla2', (4, 4, 1, 1), 5),
    ]
    for name, read, stored in cases:
        cfg = layout_config(dict(LAYOUTS)[name])
        assert kv_cache_bytes(cfg, 10, 'bfloat16') == stored * per_head, name
        assert kv_cache_bytes_read(cfg, 10, 'bfloat16') == sum(read) * per_head, name


def test_hf_export_refuses_layouts_llama_cannot_hold():
    from lm.convert.hf import export_mapping

    for settings in LAYOUTS:
        with pytest.raises(ValueError, match='export supports uniform layouts only'):
            export_mapping(layout_config(settings[1]))
