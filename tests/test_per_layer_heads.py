"""Per-layer KV head counts from measured head similarity under a total KV budget
(lm/convert/per_layer.py): the greedy choice on hand-made similarities, and a conversion that
is exact where a layer's heads are identical."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import run_entry, tiny_config, tiny_train_config, write_config_file
from flax import nnx

from lm.convert import methods as conversion
from lm.convert import per_layer
from lm.convert.options import ConversionOptions, check_conversion
from lm.model.accounting import kv_cache_bytes_per_layer
from lm.model.transformer import build_model, model_config
from lm.train.run import assemble


def sim(off_diagonal: float, G: int = 4) -> np.ndarray:
    return np.full((G, G), off_diagonal) + np.eye(G) * (2 - off_diagonal)


def test_merge_loss_by_hand():
    s = sim(0.5)
    assert per_layer.merge_loss(s, 4) == 0  # nothing merged
    assert per_layer.merge_loss(s, 2) == pytest.approx(2 * 1.5)  # two pairs, 2 - 0.5 each
    assert per_layer.merge_loss(s, 1) == pytest.approx(6 * 1.5)  # all six pairs
    assert per_layer.merge_loss(sim(2.0), 1) == 0  # identical heads merge for free


def test_greedy_gives_heads_to_the_least_similar_layers():
    sims = [sim(2.0), sim(-1.0), sim(1.0), sim(0.0)]  # identical, opposed, alike, unrelated
    assert per_layer.choose_counts(sims, 4, 4) == (1, 1, 1, 1)
    assert per_layer.choose_counts(sims, 4, 5) == (1, 2, 1, 1)
    # per added head: 1 -> 2 heads removes 4 pairs' loss, 2 -> 4 two pairs' over two heads
    assert per_layer.choose_counts(sims, 4, 8) == (1, 2, 2, 2)
    assert per_layer.choose_counts(sims, 4, 9) == (1, 4, 2, 2)
    assert per_layer.choose_counts(sims, 4, 16) == (1, 4, 4, 4)  # identical heads stay merged
    assert per_layer.head_counts(4, 8) == [1, 2, 4] and per_layer.head_counts(6, 4) == [1, 2]
    with pytest.raises(ValueError, match='kv_budget=3 must be between 4 and 16'):
        per_layer.choose_counts(sims, 4, 3)


@pytest.mark.slow
def test_conversion_pools_identical_heads_exactly_and_keeps_distinct_ones():
    cfg = model_config(tiny_config(attention='mha').model)
    params = nnx.to_pure_dict(nnx.state(build_model(cfg, seed=2), nnx.Param))
    attn0 = params['blocks'][0]['attn']
    for name in ('k_proj', 'v_proj'):  # layer 0: four copies of one K/V head
        w = np.asarray(attn0[name]['kernel'])
        attn0[name]['kernel'] = jnp.asarray(np.repeat(w[:, :1], 4, axis=1))
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    model = nnx.merge(graphdef, params)
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (256,), 0, cfg.vocab_size))
    inputs = conversion.calibration_inputs(model, tokens, 16, 128)
    sims = per_layer.similarities(params, inputs)
    counts = per_layer.choose_counts(sims, cfg.num_heads, 5)
    assert counts == (1, 4)
    out = per_layer.convert_params(params, counts, per_layer.layer_groups(sims, counts))
    dst = model_config(tiny_config(attention='gqa', kv_heads_per_layer=counts).model)
    assert kv_cache_bytes_per_layer(dst, 'float32') == [2 * 1 * 8 * 4, 2 * 4 * 8 * 4]
    tokens_BT = jnp.asarray(tokens[:24].reshape(2, 12))
    got = nnx.merge(nnx.split(build_model(dst), nnx.Param)[0], out)(tokens_BT)
    np.testing.assert_allclose(np.asarray(got), np.asarray(model(tokens_BT)), atol=2e-5)


def test_moments_pool_like_the_weights_per_layer():
    """Adam's mu and nu of layer i, KV head j: the mean of the merged heads' moments (a NumPy
    mean over groups[i][j], written here), for every layer at its own count."""
    cfg = model_config(tiny_config(attention='mha').model)
    params = nnx.to_pure_dict(nnx.state(build_model(cfg, seed=4), nnx.Param))
    state = optax.adam(1e-3).init(params)
    rng = np.random.default_rng(0)
    mu = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), params)
    nu = jax.tree.map(lambda x: jnp.asarray(rng.random(size=x.shape), x.dtype), params)
    state = (state[0]._replace(mu=mu, nu=nu), *state[1:])
    counts, groups = (1, 2), [[[0, 1, 2, 3]], [[0, 3], [1, 2]]]
    out = per_layer.convert_opt_state(state, params, counts, groups)[0]
    for tree, src in ((out.mu, mu), (out.nu, nu)):
        for i, layer_groups in enumerate(groups):
            w = np.asarray(src['blocks'][i]['attn']['k_proj']['kernel'])  # [E, G, D]
            want = np.stack([w[:, g].mean(axis=1) for g in layer_groups], axis=1)
            got = np.asarray(tree['blocks'][i]['attn']['k_proj']['kernel'])
            np.testing.assert_allclose(got, want, rtol=1e-6)
    assert out.count is state[0].count


def test_budget_options_are_checked_naming_config_keys():
    ok = {'kv_budget': 5, 'grouping': 'similarity', 'method': 'mean'}
    assert ConversionOptions(**ok).needs_calibration
    # left out, grouping and method are the budget's: similarity and mean
    assert ConversionOptions(kv_budget=5) == ConversionOptions(**ok)
    assert ConversionOptions(num_kv_heads=2).grouping == 'contiguous'
    for bad, message in [
        ({'num_kv_heads': 2}, 'leave config.model.num_kv_heads unset'),
        ({'kv_share_every': 2}, 'does not combine with config.model.kv_share_every'),
        ({'grouping': 'contiguous'}, 'set config.uptrain.grouping=similarity'),
        ({'method': 'aligned'}, 'and config.uptrain.method=mean'),
        ({'kv_budget': -1}, 'config.uptrain.kv_budget must be >= 0'),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            ConversionOptions(**{**ok, **bad})
    src = model_config(tiny_config(attention='mha').model)  # 2 layers of 4 KV heads
    with pytest.raises(ValueError, match=r'kv_budget=9 must be between 2 and 8 '):
        check_conversion(src, ConversionOptions(**{**ok, 'kv_budget': 9}))


@pytest.mark.slow
def test_uptrain_script_gives_each_layer_its_heads_and_the_run_continues(tmp_path, small_text):
    """scripts/uptrain.py --kv_budget on a trained MHA run (2 layers of 4 heads; counts 1, 2
    or 4): budget 6 gives one layer 4 heads and the other 2 (trained heads are never alike
    enough to merge for free), the checkpoint's K/V shapes are those counts, and train.py
    continues it."""
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'model.attention': 'mha', 'model.num_kv_heads': 0, 'train.steps': 8},
    )
    src, dst = tmp_path / 'mha', tmp_path / 'kv6'
    cfg_file = write_config_file(config, tmp_path / 'mha.py')
    run_entry('train.py', f'--config={cfg_file}', f'--workdir={src}', check=True)
    flags = ['--kv_budget=6', '--steps=4']  # grouping similarity, method mean: its defaults
    out = run_entry(
        'scripts/uptrain.py',
        f'--src={src}',
        f'--dst={dst}',
        *flags,
        '--calibration_tokens=64',
        check=True,
    )
    run = assemble(str(dst), state='params')
    counts = tuple(run.config.model.kv_heads_per_layer)
    assert sorted(counts) == [2, 4] and run.config.uptrain.kv_budget == 6, out.stdout
    for i, g in enumerate(counts):
        assert run.state['params']['blocks'][i]['attn']['k_proj']['kernel'].shape[1] == g
    run_entry('train.py', f'--workdir={dst}', check=True)
    assert assemble(str(dst), state='params').step == 12
    refused = run_entry(
        'scripts/uptrain.py',
        f'--src={src}',
        f'--dst={tmp_path / "x"}',
        '--kv_budget=5',
        '--num_kv_heads=2',
        '--grouping=similarity',
    )
    assert refused.returncode != 0
    assert '--kv_budget=5 chooses each layer' in refused.stderr.strip().splitlines()[-1]
    assert not (tmp_path / 'x' / 'checkpoints').exists()
