"""Per-layer KV head counts from measured head similarity under a total KV budget
(lm/convert/per_layer.py): the greedy choice on hand-made similarities, and a conversion that
is exact where a layer's heads are identical."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from lm.convert import methods as conversion
from lm.convert import per_layer
from lm.model.accounting import kv_cache_bytes_per_layer
from lm.model.transformer import build_model, model_config


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
