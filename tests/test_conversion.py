"""Conversion beyond contiguous mean-pooling: similarity grouping, aligned merging and
MHA / GQA → MLA. Exact equivalences are tested as such (float32 rounding); references are
independent (scipy's Procrustes, a brute-force angle search, explicit matrix products)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg
import scipy.stats
from conftest import tiny_config
from flax import nnx

from lm.convert import head_merging
from lm.convert import methods as conversion
from lm.convert import mla as mla_conversion
from lm.convert.options import ConversionOptions
from lm.convert.pool_checkpoint import convert_params
from lm.convert.uptrain import check_conversion
from lm.model.accounting import kv_cache_elements_per_token
from lm.model.transformer import build_model, model_config
from lm.train.optimizer import make_optimizer

TOKENS = jax.random.randint(jax.random.key(7), (2, 12), 0, 61)
ATOL = 2e-5  # float32 logits of a re-associated but equal computation


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logits(cfg, params, tokens=TOKENS):
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    return np.asarray(nnx.merge(graphdef, params)(tokens))


def source(seed=3, **model):
    cfg = model_config(tiny_config(**model).model)
    return cfg, params_of(build_model(cfg, seed=seed))


def calibration(cfg, params, n=48):
    """Attention inputs of every layer on random tokens, as the production probe reads them."""
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    tokens = np.asarray(jax.random.randint(jax.random.key(11), (n * 4,), 0, cfg.vocab_size))
    return conversion.calibration_inputs(nnx.merge(graphdef, params), tokens, 16, n)


def with_layers(params, fn):
    out = dict(params)
    out['blocks'] = {k: {**b, 'attn': fn(b['attn'])} for k, b in params['blocks'].items()}
    return out


@pytest.mark.parametrize(
    'model',
    [
        dict(attention='mha', qkv_bias=True, o_bias=True),
        pytest.param(dict(attention='gqa', num_kv_heads=4, num_heads=8), marks=pytest.mark.slow),
    ],
)
def test_permuting_heads_keeps_the_function(model):
    cfg, params = source(**model)
    for block in params['blocks'].values():  # non-zero biases, so their permutation counts
        for name in ('q_proj', 'k_proj', 'v_proj'):
            if 'bias' in block['attn'][name]:
                block['attn'][name]['bias'] = jax.random.normal(
                    jax.random.key(5), block['attn'][name]['bias'].shape
                )
    perm = np.array([1, 3, 0, 2])  # every KV head moves
    out = with_layers(params, lambda a: head_merging.permute_heads(a, perm))
    np.testing.assert_allclose(logits(cfg, out), logits(cfg, params), atol=ATOL)
    k = params['blocks'][0]['attn']['k_proj']['kernel']
    np.testing.assert_array_equal(out['blocks'][0]['attn']['k_proj']['kernel'], k[:, perm])
    # similarity grouping to g = H heads (no sharing) is the source model itself
    if cfg.num_kv_heads == cfg.num_heads:
        groups = conversion.similarity_groups(
            params, cfg.num_heads, 'mean', calibration(cfg, params)
        )
        same = convert_params(params, cfg, cfg.num_heads, 'mean', groups=groups)
        np.testing.assert_allclose(logits(cfg, same), logits(cfg, params), atol=ATOL)


def test_choose_groups_exhaustive_and_greedy():
    assert [head_merging.num_partitions(G, r) for G, r in [(4, 2), (8, 2), (8, 4), (16, 2)]] == [
        3,
        105,
        35,
        2027025,
    ]
    sim = np.eye(4)
    sim[0, 3] = sim[3, 0] = 0.9
    sim[1, 2] = sim[2, 1] = 0.5
    assert head_merging.choose_groups(sim, 2) == [(0, 3), (1, 2)]
    assert head_merging.choose_groups(np.zeros((4, 4)), 2) == [(0, 1), (2, 3)]  # ties: contiguous
    assert head_merging._greedy_groups(sim, 2) == [(0, 3), (1, 2)]
    rng = np.random.default_rng(1)
    a = rng.normal(size=(8, 8))
    sim = a + a.T
    best = head_merging.choose_groups(sim, 2)
    every = list(head_merging._partitions(tuple(range(8)), 2))
    assert len(every) == 105 and len(set(every)) == 105
    assert head_merging._score(sim, best) == max(head_merging._score(sim, p) for p in every)
    greedy = head_merging._greedy_groups(sim, 4)
    assert sorted(h for g in greedy for h in g) == list(range(8)) and len(greedy) == 2


def test_similarity_grouping_merges_identical_heads_exactly():
    cfg, params = source(attention='mha')
    for block in params['blocks'].values():  # K/V heads 0 = 2 and 1 = 3: a non-contiguous match
        for name in ('k_proj', 'v_proj'):
            k = block['attn'][name]['kernel']
            block['attn'][name]['kernel'] = k[:, [0, 1, 0, 1]]
    want = logits(cfg, params)
    groups = conversion.similarity_groups(params, 2, 'mean', calibration(cfg, params))
    assert groups == [[(0, 2), (1, 3)]] * 2
    dst = model_config(tiny_config(attention='gqa', num_kv_heads=2).model)
    out = convert_params(params, cfg, 2, 'mean', groups=groups)
    np.testing.assert_allclose(logits(dst, out), want, atol=ATOL)
    contiguous = convert_params(params, cfg, 2, 'mean')
    assert np.abs(logits(dst, contiguous) - want).max() > 1e-2


def rope_brute_force(x, y):
    """Per-pair angle minimising ||x·R(φ) − y||² over a fine grid (the independent reference)."""
    D = x.shape[1]
    phis = np.linspace(-np.pi, np.pi, 20001)
    best = []
    for i in range(D // 2):
        a, b = x[:, i], x[:, i + D // 2]
        ya, yb = y[:, i], y[:, i + D // 2]
        c, s = np.cos(phis)[:, None], np.sin(phis)[:, None]
        loss = ((a * c - b * s - ya) ** 2 + (a * s + b * c - yb) ** 2).sum(axis=1)
        best.append(phis[np.argmin(loss)])
    return np.array(best)


def test_procrustes_against_references():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    q = head_merging.procrustes(x.T @ y)
    np.testing.assert_allclose(q, scipy.linalg.orthogonal_procrustes(x, y)[0], atol=1e-10)
    q = head_merging.rope_procrustes(x.T @ y)
    np.testing.assert_allclose(q @ q.T, np.eye(8), atol=1e-12)
    phi = np.arctan2(q[np.arange(4), np.arange(4) + 4], q[np.arange(4), np.arange(4)])
    np.testing.assert_allclose(phi, rope_brute_force(x, y), atol=1e-3)  # grid step 3e-4


def rotate_copies(params, rng):
    """Heads 1 and 3 made rotated copies of heads 0 and 2: K by a RoPE-commuting rotation (one
    angle per frequency pair), V by any orthogonal matrix."""
    for block in params['blocks'].values():
        attn = block['attn']
        for src, dst in ((0, 1), (2, 3)):
            phi = rng.uniform(-np.pi, np.pi, 4)
            q_k = np.zeros((8, 8))
            i = np.arange(4)
            q_k[i, i] = q_k[i + 4, i + 4] = np.cos(phi)
            q_k[i, i + 4], q_k[i + 4, i] = np.sin(phi), -np.sin(phi)
            q_v = scipy.stats.ortho_group.rvs(8, random_state=rng)
            for name, rot in (('k_proj', q_k), ('v_proj', q_v)):
                w = np.array(attn[name]['kernel'])
                w[:, dst] = w[:, src] @ rot
                attn[name]['kernel'] = jnp.asarray(w, jnp.float32)
    return params


def test_aligned_merging_folds_exactly_and_recovers_rotated_copies():
    cfg, params = source(attention='mha')
    inputs = calibration(cfg, params)
    want = logits(cfg, params)
    # folding the rotations, before pooling: the same function
    for layer, (k, block) in enumerate(params['blocks'].items()):
        params_f = dict(params)
        params_f['blocks'] = dict(params['blocks'])
        aligned = head_merging.align_groups(block['attn'], inputs[layer], 2)
        params_f['blocks'][k] = {**block, 'attn': aligned}
        np.testing.assert_allclose(logits(cfg, params_f), want, atol=ATOL)
        assert not np.allclose(aligned['v_proj']['kernel'], block['attn']['v_proj']['kernel'])
    # heads that are rotated copies are merged without loss once aligned, not by plain means
    params = rotate_copies(params, np.random.default_rng(4))
    want = logits(cfg, params)
    dst = model_config(tiny_config(attention='gqa', num_kv_heads=2).model)
    out = convert_params(params, cfg, 2, 'aligned', inputs=calibration(cfg, params))
    np.testing.assert_allclose(logits(dst, out), want, atol=1e-4)
    mean = convert_params(params, cfg, 2, 'mean')
    assert np.abs(logits(dst, mean) - want).max() > 1e-2


@pytest.mark.slow
def test_aligned_first_moment_rotates_like_the_gradient():
    """Adam's mu is an average of gradients, and the gradient of the rotated (same-function)
    model is the rotated gradient: so mu converts exactly; nu by Q∘Q keeps its total per row."""
    cfg, params = source(attention='mha')
    rotations = head_merging.alignments(params, 2, None, calibration(cfg, params))
    rotated = head_merging.permute_and_rotate(params, None, rotations)
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    probe = jax.random.normal(jax.random.key(3), (2, 12, cfg.vocab_size))

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p)(TOKENS) * probe)

    grad, grad_rotated = jax.grad(loss)(params), jax.grad(loss)(rotated)
    want = head_merging.permute_and_rotate(grad, None, rotations)
    for a, b in zip(jax.tree.leaves(grad_rotated), jax.tree.leaves(want), strict=True):
        # float32 rounding, relative to the leaf's largest gradient
        np.testing.assert_allclose(a, b, atol=1e-5 * float(np.abs(b).max()))
    nu = jax.tree.map(jnp.square, grad)
    nu_rot = head_merging.permute_and_rotate(nu, None, rotations, second=True)
    for layer in ('k_proj', 'v_proj'):
        a, b = (
            nu['blocks'][0]['attn'][layer]['kernel'],
            nu_rot['blocks'][0]['attn'][layer]['kernel'],
        )
        assert float(b.min()) >= 0
        np.testing.assert_allclose(a.sum(axis=-1), b.sum(axis=-1), rtol=1e-5)


def mla_conversion_of(cfg, params, C, P=4, inputs=None, rope_heads=1):
    options = ConversionOptions(
        target='mla',
        kv_lora_rank=C,
        qk_rope_head_dim=P,
        rope_heads=rope_heads,
        optimizer_state='fresh',
    )
    check_conversion(cfg, options)
    inputs = calibration(cfg, params) if inputs is None else inputs
    config = tiny_config(attention='mla', num_heads=cfg.num_heads)
    eps = config.model.mla.latent_norm_eps
    out, settings, pairs = conversion.latent_conversion(params, cfg, options, inputs, eps)
    config.model.update(settings)  # the MLA knobs land in config.model.mla
    return model_config(config.model), out, pairs


def test_mla_factors_reproduce_the_non_rope_key_and_value_at_full_rank():
    cfg, params = source(attention='gqa', num_kv_heads=2)
    D, P, G = 8, 4, 2
    full = G * (2 * D - P)  # 24 < d_model 32
    dst, out, pairs = mla_conversion_of(cfg, params, full, P)
    stride = int(pairs.split(',')[1])
    rope_dims, nope_dims = mla_conversion.kept_dims(D, P, stride)
    assert sorted(np.concatenate([rope_dims, nope_dims])) == list(range(D))
    N = D - P
    for layer, block in params['blocks'].items():
        src, mla = block['attn'], out['blocks'][layer]['attn']
        w_dkv = np.asarray(mla['kv_a_proj_with_mqa']['kernel'])[:, :full]
        w_b = np.asarray(mla['kv_b_proj']['kernel'])
        for h in range(4):
            g = h // 2
            k_nope = np.asarray(src['k_proj']['kernel'])[:, g][:, nope_dims]
            np.testing.assert_allclose(w_dkv @ w_b[:, h, :N], k_nope, atol=1e-5)
            np.testing.assert_allclose(
                w_dkv @ w_b[:, h, N:], np.asarray(src['v_proj']['kernel'])[:, g], atol=1e-5
            )
            q = np.asarray(mla['q_proj']['kernel'])[:, h]  # [q_nope; q_rope] column moves
            wq = np.asarray(src['q_proj']['kernel'])[:, h]
            np.testing.assert_array_equal(q, wq[:, np.concatenate([nope_dims, rope_dims])])
    # the shared RoPE key is the mean of the KV heads' kept columns
    w_kr = np.asarray(out['blocks'][0]['attn']['kv_a_proj_with_mqa']['kernel'])[:, full:]
    wk = np.asarray(params['blocks'][0]['attn']['k_proj']['kernel'])[..., rope_dims]
    np.testing.assert_allclose(w_kr, wk.mean(axis=1), atol=1e-6)
    assert dst.rope_theta == pytest.approx(cfg.rope_theta ** (stride * P / D))


@pytest.mark.slow
def test_mla_rope_keys_per_kv_head_or_averaged_over_adjacent_kv_heads():
    """rope_heads R of a GQA source's G = 4 KV heads (of 8 query heads): key r is the mean of
    KV heads r·G/R .. (r + 1)·G/R − 1's kept key columns (R = G: each its own); the queries,
    the latent factors and the cache's latent part do not depend on R. The converted model
    runs, with a cache of C + R·P per token and layer."""
    cfg, params = source(attention='gqa', num_kv_heads=4, num_heads=8, head_dim=8)
    D, P, C, G = 8, 4, 8, 4
    inputs = calibration(cfg, params)
    shared = mla_conversion_of(cfg, params, C, P, inputs)[1]
    for R in (1, 2, 4):
        dst, out, pairs = mla_conversion_of(cfg, params, C, P, inputs, rope_heads=R)
        assert dst.section.rope_heads == R
        assert kv_cache_elements_per_token(dst) == cfg.num_layers * (C + R * P)
        rope_dims = mla_conversion.kept_dims(D, P, int(pairs.split(',')[1]))[0]
        for layer, block in params['blocks'].items():
            a = np.asarray(out['blocks'][layer]['attn']['kv_a_proj_with_mqa']['kernel'])
            wk = np.asarray(block['attn']['k_proj']['kernel'], np.float64)[..., rope_dims]
            for r in range(R):
                heads = list(range(r * G // R, (r + 1) * G // R))
                want = sum(wk[:, g] for g in heads) / len(heads)
                np.testing.assert_allclose(a[:, C + r * P : C + (r + 1) * P], want, atol=1e-6)
            same = shared['blocks'][layer]['attn']
            np.testing.assert_array_equal(a[:, :C], same['kv_a_proj_with_mqa']['kernel'][:, :C])
            for name in ('q_proj', 'kv_b_proj', 'kv_a_layernorm', 'o_proj'):
                got, want = out['blocks'][layer]['attn'][name], same[name]
                assert jax.tree.all(jax.tree.map(np.array_equal, got, want)), name
        assert np.isfinite(logits(dst, out)).all()


def test_mla_rope_heads_must_divide_the_source_kv_heads():
    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2).model)
    options = ConversionOptions(**dict(MLA, rope_heads=4))
    with pytest.raises(ValueError, match=r"rope_heads=4 must divide the source's num_kv_heads=2"):
        check_conversion(cfg, options)


@pytest.mark.slow
def test_mla_logit_error_falls_as_the_latent_grows():
    cfg, params = source(attention='mha')
    want, inputs = logits(cfg, params), calibration(cfg, params)
    errors = []
    for C in (2, 8, 32):
        dst, out, _ = mla_conversion_of(cfg, params, C, inputs=inputs)
        errors.append(float(np.sqrt(np.mean((logits(dst, out) - want) ** 2))))
    assert errors[0] > errors[1] > errors[2], errors


def test_mla_rope_ladder_and_its_frequencies():
    """Slot i of the MLA's RoPE (width P, base θ') turns at the rate of source pair i·s."""
    from lm.model.layers import rope_inv_freq

    D, P, theta = 16, 6, 10_000.0
    assert mla_conversion.rope_strides(D, P) == [1, 2, 3]
    for s in mla_conversion.rope_strides(D, P):
        pairs = mla_conversion.kept_dims(D, P, s)[0][: P // 2]
        np.testing.assert_allclose(
            rope_inv_freq(P // 2, theta ** (s * P / D)),
            rope_inv_freq(D // 2, theta)[pairs],
            rtol=1e-6,
        )
    contribution = np.zeros((2, 8))
    contribution[:, [0, 3, 6]] = 1.0  # stride 3 keeps the most
    assert mla_conversion.choose_stride(contribution, P) == 3


MLA = dict(target='mla', kv_lora_rank=8, qk_rope_head_dim=4, optimizer_state='fresh')


@pytest.mark.parametrize(
    'options,message',
    [
        (dict(num_kv_heads=2, grouping='nearest'), r'^config.uptrain.grouping must be one of'),
        (dict(num_kv_heads=2, target='xyz'), r'^config.uptrain.target must be empty .* got .xyz.'),
        (
            dict(MLA, method='mean'),
            r'^config.uptrain.method=mean does not apply to config.uptrain.target=mla',
        ),
        (
            dict(MLA, grouping='similarity'),
            r'^config.uptrain.grouping=similarity does not apply to config.uptrain.target=mla',
        ),
        (
            dict(MLA, num_kv_heads=2),
            r'^config.model.num_kv_heads does not apply to config.uptrain.target=mla',
        ),
        (dict(MLA, kv_lora_rank=0), r'^config.model.mla.kv_lora_rank must be >= 1 .*got 0$'),
        (
            dict(MLA, qk_rope_head_dim=3),
            r'^config.model.mla.qk_rope_head_dim must be an even number >= 2 .*got 3$',
        ),
        (dict(num_kv_heads=2, data_split='heldout'), r'^config.data.split must be one of'),
        (dict(num_kv_heads=2, lr=0.0), r'^config.train.lr must be a finite number > 0, got 0.0$'),
        (
            dict(num_kv_heads=2, method='random', grouping='similarity'),
            r'^config.uptrain.grouping=similarity has no effect with config.uptrain.method=random',
        ),
        (
            dict(num_kv_heads=2, kv_lora_rank=8),
            r'^config.model.mla.kv_lora_rank, config.model.mla.qk_rope_head_dim and '
            r'config.model.mla.rope_heads apply only to a config.uptrain.target with a KV latent$',
        ),
        (dict(num_kv_heads=2, rope_heads=2), r'^config.model.mla.kv_lora_rank, .* apply only'),
        (dict(MLA, rope_heads=0), r'^config.model.mla.rope_heads must be >= 1 .*got 0$'),
        (
            dict(num_kv_heads=0),
            r'^config.model.num_kv_heads is required \(or config.uptrain.target=mla, '
            r'config.model.kv_share_every > 1 or config.uptrain.kv_budget\)$',
        ),
        (dict(num_kv_heads=-1), r'^config.model.num_kv_heads must be >= 1, got -1$'),
        (dict(num_kv_heads=2, method='joint_svd'), r'^config.uptrain.method must be one of'),
        (dict(num_kv_heads=2, calibration_tokens=0), r'calibration_tokens must be >= 1, got 0$'),
        (dict(num_kv_heads=2, source_step=-1), r'^config.uptrain.source_step must be >= 0'),
        (dict(num_kv_heads=2, steps=-2), r'^ConversionOptions.steps must be >= 0, got -2$'),
        (dict(num_kv_heads=2, fraction=float('inf')), r'^config.uptrain.fraction must be a fin'),
        (dict(num_kv_heads=2, seed=2**32), r'^ConversionOptions.seed must be in \[0, 2\*\*32\)'),
    ],
)
def test_bad_options_are_one_line_errors_naming_config_keys(options, message):
    with pytest.raises(ValueError, match=message) as err:
        ConversionOptions(**options)
    assert '\n' not in str(err.value) and '--' not in str(err.value)


def test_options_default_method_is_the_targets():
    assert ConversionOptions(num_kv_heads=2).method == 'mean'
    assert ConversionOptions(**MLA).method == 'joint_svd'
    assert not ConversionOptions(num_kv_heads=2).needs_calibration
    assert ConversionOptions(num_kv_heads=2, method='aligned').needs_calibration
    assert ConversionOptions(**MLA).latent and ConversionOptions(**MLA).needs_calibration


@pytest.mark.parametrize(
    'model,C,P,message',
    [
        (
            dict(attention='gqa', num_kv_heads=1),
            13,
            4,
            r'^config.model.mla.kv_lora_rank=13 is larger than .* = 12$',
        ),
        (
            dict(attention='mha', num_heads=8),
            4,
            4,
            r"^config.model.mla.qk_rope_head_dim=4 must be smaller than the source's head_dim=4",
        ),
        (dict(attention='mha', qkv_bias=True), 8, 4, r'qkv_bias / o_bias'),
        (dict(attention='mha', rope_scaling='llama3'), 8, 4, r"rope_scaling='llama3'"),
        (dict(attention='mla'), 8, 4, r"attention='mla', which has no K/V heads"),
    ],
)
def test_latent_conversion_source_errors(model, C, P, message):
    cfg = model_config(tiny_config(**model).model)
    options = ConversionOptions(**dict(MLA, kv_lora_rank=C, qk_rope_head_dim=P))
    with pytest.raises(ValueError, match=message):
        check_conversion(cfg, options)


def adam(opt_state) -> optax.ScaleByAdamState:
    is_adam = lambda node: isinstance(node, optax.ScaleByAdamState)  # noqa: E731
    (node,) = [n for n in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(n)]
    return node


@pytest.mark.slow
def test_latent_optimizer_state_carries_the_kept_moments():
    """MHA -> MLA with optimizer_state='convert': Adam's count and the moments of every kept
    parameter carried over (q_proj's columns reordered as its weights are), the new latent
    factors' moments zero, the tree the converted parameters' (a step runs on it)."""
    rng = np.random.default_rng(0)
    E, H, D, C = 8, 2, 8, 4

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    src = {
        'embed': {'embedding': arr(11, E)},
        'blocks': {
            '0': {
                'attn': {n: {'kernel': arr(E, H, D)} for n in ('q_proj', 'k_proj', 'v_proj')}
                | {'o_proj': {'kernel': arr(H, D, E)}},
                'mlp': {'kernel': arr(E, 16)},
                'norm': {'scale': arr(E)},
            }
        },
    }
    attn = {
        'q_proj': {'kernel': arr(E, H, D)},
        'kv_a_proj_with_mqa': {'kernel': arr(E, C + 4)},
        'kv_a_layernorm': {'scale': arr(C)},
        'kv_b_proj': {'kernel': arr(C, H, 2 * D - 4)},
        'o_proj': {'kernel': arr(H, D, E)},
    }
    dst = {**src, 'blocks': {'0': {**src['blocks']['0'], 'attn': attn}}}
    tx = make_optimizer(tiny_config().train)
    state = tx.init(src)
    for _ in range(3):  # three steps of random gradients: moments that differ per entry
        _, state = tx.update(jax.tree.map(lambda p: arr(*p.shape), src), state, src)
    order_D = mla_conversion.q_order(D, np.array([0, 2]))
    out = conversion.latent_opt_state(state, tx.init(dst), order_D)
    order = [1, 3, 5, 7, 0, 2, 4, 6]  # pairs 0 and 2 keep RoPE: dims 0, 2 and 4, 6 (half D)
    adam_src, adam_out = adam(state), adam(out)
    assert int(adam_out.count) == 3
    for name in ('mu', 'nu'):
        s_attn, o_attn = (
            getattr(adam_src, name)['blocks']['0'],
            getattr(adam_out, name)['blocks']['0'],
        )
        np.testing.assert_array_equal(
            o_attn['attn']['q_proj']['kernel'],
            np.asarray(s_attn['attn']['q_proj']['kernel'])[..., order],
        )
        for kept in (('attn', 'o_proj'), ('mlp',), ('norm',)):
            a, b = s_attn, o_attn
            for key in kept:
                a, b = a[key], b[key]
            jax.tree.map(np.testing.assert_array_equal, a, b)
        assert not np.any(o_attn['attn']['kv_b_proj']['kernel'])  # new factor: no history
        assert np.any(o_attn['attn']['q_proj']['kernel'])
    assert jax.tree.structure(out) == jax.tree.structure(tx.init(dst))
    tx.update(jax.tree.map(jnp.ones_like, dst), out, dst)  # a step runs on it
