"""MHA → cross-layer attention conversion (lm/convert/cla.py): the merge against hand-computed
averages, exactness where the source's layers already agree, the matching and alignment of
permuted and rotated copies, the options' checks, the ablation's CLA arms, and (slow) the
production path from a trained checkpoint to uptraining and decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from conftest import tiny_config, tiny_train_config
from flax import nnx

from lm.convert import cla, head_merging
from lm.convert import methods as conversion
from lm.convert.options import ConversionOptions
from lm.convert.uptrain import check_conversion
from lm.experiments import ablation, ablation_arms
from lm.model.accounting import kv_cache_bytes_per_token
from lm.model.transformer import build_model, model_config

TOKENS = jax.random.randint(jax.random.key(7), (2, 12), 0, 61)


MEAN2 = cla.CLARecipe(2, 'mean')  # each 2 layers' K/V averaged, heads as they are


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logits(cfg, params, tokens=TOKENS):
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    return np.asarray(nnx.jit(lambda m, t: m(t))(nnx.merge(graphdef, params), tokens))


def mha(num_layers=2, seed=3):
    cfg = model_config(tiny_config(attention='mha', num_layers=num_layers).model)
    return cfg, params_of(build_model(cfg, seed=seed))


def cla_cfg(num_layers=2, share=2):
    return model_config(
        tiny_config(attention='mha', num_layers=num_layers, kv_share_every=share).model
    )


def calibration(cfg, params, n=48):
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    tokens = np.asarray(jax.random.randint(jax.random.key(11), (n * 4,), 0, cfg.vocab_size))
    return conversion.calibration_inputs(nnx.merge(graphdef, params), tokens, 16, n)


def layer0_is_identity(params):
    """Layer 0 writes nothing into the residual stream (o_proj and down_proj zero), so layer 1
    reads the same attention input as layer 0: a CLA consumer's K/V from layer 0's input are
    then exactly its own, when its projections equal layer 0's."""
    block = params['blocks'][0]
    for path in (('attn', 'o_proj'), ('mlp', 'down_proj')):
        node = block[path[0]][path[1]]
        node['kernel'] = jnp.zeros_like(node['kernel'])
    return params


def test_mean_merge_is_the_hand_computed_average_and_first_keeps_the_producer():
    cfg, params = mha(num_layers=5)
    out = cla.convert(params, cla.CLARecipe(3, 'mean'))
    for name in ('k_proj', 'v_proj'):
        for producer, group in ((0, (0, 1, 2)), (3, (3, 4))):
            kernels = [
                np.asarray(params['blocks'][i]['attn'][name]['kernel'], np.float64) for i in group
            ]
            np.testing.assert_allclose(
                out['blocks'][producer]['attn'][name]['kernel'],
                sum(kernels) / len(group),
                atol=1e-7,
            )
    assert [('k_proj' in b['attn']) for b in out['blocks'].values()] == [1, 0, 0, 1, 0]
    first = cla.convert(params, cla.CLARecipe(3, 'first'))
    np.testing.assert_array_equal(
        first['blocks'][3]['attn']['v_proj']['kernel'],
        params['blocks'][3]['attn']['v_proj']['kernel'],
    )
    # the converted tree is the CLA model's: it loads and runs
    assert logits(cla_cfg(5, 3), out).shape == (2, 12, 61)


def test_identical_adjacent_kv_merge_to_the_same_output():
    cfg, params = mha()
    params = layer0_is_identity(params)
    attn0, attn1 = params['blocks'][0]['attn'], params['blocks'][1]['attn']
    for name in ('k_proj', 'v_proj'):
        attn1[name] = dict(attn0[name])
    want = logits(cfg, params)
    np.testing.assert_allclose(logits(cla_cfg(), cla.convert(params, MEAN2)), want, atol=2e-5)
    # control: layer 1's own K/V differing from layer 0's, the merged model is another function
    _, other = mha(seed=4)
    for name in ('k_proj', 'v_proj'):
        attn1[name] = other['blocks'][1]['attn'][name]
    assert np.abs(logits(cla_cfg(), cla.convert(params, MEAN2)) - logits(cfg, params)).max() > 1e-3


def permuted_rotated_copy(params, rng):
    """Layer 1's K/V heads made copies of layer 0's in another order, keys rotated by a
    RoPE-commuting rotation (one angle per frequency pair), values by an orthogonal matrix."""
    attn0, attn1 = params['blocks'][0]['attn'], params['blocks'][1]['attn']
    perm = rng.permutation(4)
    for h in range(4):
        phi, i = rng.uniform(-np.pi, np.pi, 4), np.arange(4)
        q_k = np.zeros((8, 8))
        q_k[i, i] = q_k[i + 4, i + 4] = np.cos(phi)
        q_k[i, i + 4], q_k[i + 4, i] = np.sin(phi), -np.sin(phi)
        q_v = scipy.stats.ortho_group.rvs(8, random_state=rng)
        for name, rot in (('k_proj', q_k), ('v_proj', q_v)):
            w = np.array(attn1[name]['kernel'])
            w[:, perm[h]] = np.asarray(attn0[name]['kernel'])[:, h] @ rot
            attn1[name]['kernel'] = jnp.asarray(w, jnp.float32)
    return params, perm


def test_similarity_matching_and_alignment_recover_permuted_rotated_copies():
    cfg, params = mha()
    params, perm = permuted_rotated_copy(layer0_is_identity(params), np.random.default_rng(5))
    inputs = calibration(cfg, params)
    want = logits(cfg, params)
    attn0, attn1 = params['blocks'][0]['attn'], params['blocks'][1]['attn']
    sim = cla.cross_similarity(attn0, inputs[0], attn1, inputs[1], aligned=True)
    np.testing.assert_array_equal(cla.matching(sim), perm)  # layer 1's perm[h] copies head h
    recipe = cla.plan(params, 2, 'aligned', 'similarity', inputs)
    # permuting and rotating the consumers before the merge keeps the function
    folded = head_merging.permute_and_rotate(params, recipe.groups, recipe.rotations)
    np.testing.assert_allclose(logits(cfg, folded), want, atol=2e-5)
    out = cla.convert(params, recipe)
    np.testing.assert_allclose(logits(cla_cfg(), out), want, atol=1e-4)
    # plain means of the unmatched, unrotated heads lose it
    assert np.abs(logits(cla_cfg(), cla.convert(params, MEAN2)) - want).max() > 1e-2


def test_cross_layer_options_are_checked_naming_config_keys():
    with pytest.raises(ValueError, match=r'config.model.kv_share_every must be >= 1'):
        ConversionOptions(kv_share_every=0, num_kv_heads=1)
    with pytest.raises(ValueError, match=r'^config.model.num_kv_heads is required \(or '):
        ConversionOptions()  # without CLA, 0 KV heads is no target
    with pytest.raises(ValueError, match=r'config.model.kv_share_every does not apply'):
        ConversionOptions(
            target='mla',
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            optimizer_state='fresh',
            kv_share_every=2,
        )
    assert ConversionOptions(kv_share_every=2).num_kv_heads == 0  # the source's heads kept
    with pytest.raises(ValueError, match='shares K/V across layers'):
        check_conversion(cla_cfg(), ConversionOptions(num_kv_heads=1))
    mha = cla_cfg(share=1)
    check_conversion(mha, ConversionOptions(kv_share_every=2))
    with pytest.raises(ValueError, match=r'^config.model.kv_share_every=3 is more than the sou'):
        check_conversion(mha, ConversionOptions(kv_share_every=3))


def test_ablation_cla_arms_and_their_cache_bytes():
    ab = ablation_arms.Ablation(
        config_file='configs/shakespeare_char.py',
        data_path='unused.txt',
        steps=10,
        seeds=1,
        fractions=(0.1,),
        scratch_fractions=(),
        targets=(1,),
        methods=('mean', 'similarity-aligned'),
        cla=('cla2', 'mqa_cla2'),
    )
    arms = ablation_arms.arms(ab)
    assert set(arms) == {'MQA', 'CLA2', 'MQA-CLA2'}
    options = arms['MQA-CLA2'][1]['similarity-aligned']
    assert (options.num_kv_heads, options.kv_share_every, options.grouping) == (1, 2, 'similarity')
    kv = ablation.kv_bytes(ab)
    assert 2 * kv['CLA2'] == kv[ablation_arms.SOURCE] and 2 * kv['MQA-CLA2'] == kv['MQA']
    assert ablation_arms.parse_cla(ab, 'gqa2_cla3') == (2, 3)
    assert ablation_arms.parse_cla(ab, 'mqa_cla2') == (1, 2)
    assert ablation_arms.parse_cla(ab, 'cla2') == (0, 2)
    with pytest.raises(ValueError, match="'cla<n>'"):
        ablation_arms.parse_cla(ab, 'cla1')
    with pytest.raises(ValueError, match=r"^--cla: arm mla_cla2: .*'mla' with CLA is not conv"):
        ablation_arms.parse_cla(ab, 'mla_cla2')  # not MHA-CLA2 labelled CLA2


@pytest.mark.slow
def test_uptrain_to_mqa_cla2_from_a_trained_checkpoint(tmp_path, small_text):
    from lm.convert.uptrain import convert_checkpoint
    from lm.infer.decode import Decoder
    from lm.train import loop
    from lm.train.run import assemble

    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'model.attention': 'mha', 'model.num_kv_heads': 0, 'train.steps': 8},
    )
    loop.train(config, str(tmp_path / 'mha'), str(tmp_path / 'tb'))
    options = ConversionOptions(
        num_kv_heads=1,
        kv_share_every=2,
        method='aligned',
        grouping='similarity',
        steps=4,
        calibration_tokens=64,
    )
    converted = convert_checkpoint(str(tmp_path / 'mha'), options, str(tmp_path / 'cla'))
    assert (converted.model.attention, converted.model.kv_share_every) == ('mqa', 2)
    cfg = model_config(converted.model)
    assert kv_cache_bytes_per_token(cfg) == 2 * 1 * 8 * 2  # one producer of two layers, bf16
    result = loop.train(converted, str(tmp_path / 'cla'), str(tmp_path / 'tb'))
    assert np.isfinite(result['eval']['loss'])
    run = assemble(str(tmp_path / 'cla'), state='restore')
    model = nnx.merge(run.ctx.graphdef, run.state['params'])
    assert len(Decoder(model).generate([[1, 2, 3]], 4)[0]) == 4
