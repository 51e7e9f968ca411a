"""MHA -> GQA / MQA conversion (Ainslie et al. 2023): exactness, hand-checked pooling, the
script end to end, and its errors."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import (
    read_scalars,
    run_entry,
    sigterm_while_training,
    tiny_config,
    tiny_train_config,
    write_config_file,
)
from flax import nnx
from tensorboard.backend.event_processing import event_accumulator
from test_hf import FIXTURES, base_config
from test_train import read_hparams

import lm.convert.uptrain as uptrain
import lm.data.corpus
import lm.train.loop
from lm.config import default_values
from lm.convert.hf_io import import_hf
from lm.convert.pool_checkpoint import convert_opt_state, convert_params, with_schedule_count
from lm.convert.pooling import merge_kv_heads
from lm.convert.uptrain import (
    ConversionOptions,
    cache_summary,
    check_conversion,
    convert_checkpoint,
    optimizer_state_summary,
    uptrain_config,
)
from lm.data.checks import check_idle_data
from lm.data.corpus import load_corpus, train_batch
from lm.infer.decode import Decoder, cache_elements_per_token, init_caches
from lm.model.transformer import build_model, model_config
from lm.train.checkpoint import Checkpointer, read_step_meta
from lm.train.optimizer import lr_schedule, make_optimizer
from lm.train.provenance import SESSIONS, trained_by
from lm.train.run import assemble
from lm.train.stored import stored_config


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logits(cfg, params, tokens):
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    return nnx.merge(graphdef, params)(tokens)


TOKENS = jax.random.randint(jax.random.key(7), (2, 12), 0, 61)


def source_and_target(num_kv_heads, **model):
    """(source ModelConfig, converted ModelConfig) of a tiny config, the target built by the
    production `uptrain_config` as scripts/uptrain.py builds it."""
    config = tiny_config(**model)
    converted = uptrain_config(config, num_kv_heads, source_step=100)
    return model_config(config.model), model_config(converted.model)


@pytest.mark.parametrize('method', ['mean', 'first'])
def test_conversion_to_as_many_heads_is_exact(method):
    src, dst = source_and_target(4, attention='mha', qkv_bias=True)
    params = params_of(build_model(src, seed=3))
    params['blocks'][0]['attn']['k_proj']['bias'] = jnp.arange(32.0).reshape(4, 8)
    out = convert_params(params, src, 4, method)
    assert dst.attention == 'gqa' and dst.num_kv_heads == 4
    np.testing.assert_array_equal(logits(dst, out, TOKENS), logits(src, params, TOKENS))


def test_mean_pooling_identical_heads_changes_nothing():
    src = model_config(tiny_config(attention='mha').model)
    params = params_of(build_model(src, seed=3))
    for block in params['blocks'].values():
        for name in ('k_proj', 'v_proj'):
            k = block['attn'][name]['kernel']  # [E, 4, D]: make heads (0,1) and (2,3) identical
            block['attn'][name]['kernel'] = jnp.repeat(k[:, ::2], 2, axis=1)
    want = logits(src, params, TOKENS)
    for g in (2, 1):
        if g == 1:  # all four heads identical for MQA
            for block in params['blocks'].values():
                for name in ('k_proj', 'v_proj'):
                    k = block['attn'][name]['kernel']
                    block['attn'][name]['kernel'] = jnp.repeat(k[:, :1], 4, axis=1)
            want = logits(src, params, TOKENS)
        out = convert_params(params, src, g, 'mean')
        _, dst = source_and_target(g, attention='mha')
        assert (dst.attention, dst.num_kv_heads) == ({2: 'gqa', 1: 'mqa'}[g], g)
        # float32 rounding of (x + x) / 2 and of a differently shaped einsum.
        np.testing.assert_allclose(logits(dst, out, TOKENS), want, atol=1e-5)


def test_mean_pooling_against_hand_computed_average():
    kernel = jnp.array([[[0.0], [1.0], [2.0], [4.0]]])  # [E=1, G=4, D=1]
    # Contiguous groups: heads (0, 1) -> 0.5 and (2, 3) -> 3.0 (strided would give 1.0, 2.5).
    np.testing.assert_array_equal(merge_kv_heads(kernel, 1, 2, 'mean'), [[[0.5], [3.0]]])
    np.testing.assert_array_equal(merge_kv_heads(kernel, 1, 1, 'mean'), [[[1.75]]])
    np.testing.assert_array_equal(merge_kv_heads(kernel, 1, 2, 'first'), [[[0.0], [2.0]]])
    bias = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])  # [G=4, D=2]
    np.testing.assert_array_equal(merge_kv_heads(bias, 0, 2, 'mean'), [[2.0, 3.0], [6.0, 7.0]])
    src = model_config(tiny_config(attention='gqa', num_kv_heads=4, num_heads=4).model)
    params = params_of(build_model(src))
    params['blocks'][1]['attn']['v_proj']['kernel'] = jnp.arange(4.0)[None, :, None] * jnp.ones(
        (32, 4, 8)
    )
    out = convert_params(params, src, 2, 'mean')
    np.testing.assert_array_equal(out['blocks'][1]['attn']['v_proj']['kernel'][0, :, 0], [0.5, 2.5])
    assert out['blocks'][1]['attn']['q_proj'] is params['blocks'][1]['attn']['q_proj']


def test_gqa8_to_gqa2_and_random_method():
    src, mid = source_and_target(4, attention='mha', num_heads=8, d_model=32)
    params = params_of(build_model(src))
    step1 = convert_params(params, src, 4, 'mean')
    two_step = convert_params(step1, mid, 2, 'mean')
    direct = convert_params(params, src, 2, 'mean')
    np.testing.assert_allclose(
        two_step['blocks'][0]['attn']['k_proj']['kernel'],
        direct['blocks'][0]['attn']['k_proj']['kernel'],
        atol=1e-7,
    )
    rand = convert_params(params, src, 2, 'random', seed=1)
    k = rand['blocks'][0]['attn']['k_proj']['kernel']
    assert k.shape == (32, 2, 4) and abs(float(k.std()) - 32**-0.5) < 0.05


@pytest.mark.parametrize(
    'model,g,method,message',
    [
        (
            dict(attention='mha'),
            3,
            'mean',
            r'^config.model.num_kv_heads=3 does not divide config.model.num_heads=4$',
        ),
        (
            dict(attention='gqa', num_kv_heads=2),
            4,
            'mean',
            r"^config.model.num_kv_heads=4 is larger than the source's 2 KV heads",
        ),
        (
            dict(attention='mha', num_heads=6, d_model=36),
            4,
            'mean',
            r'^config.model.num_kv_heads=4 does not divide config.model.num_heads=6$',
        ),
        (dict(attention='mha', num_heads=12, d_model=48), 4, 'mean', None),
        (
            dict(attention='gqa', num_heads=12, num_kv_heads=6, d_model=48),
            4,
            'mean',
            r"^config.model.num_kv_heads=4 does not divide the source's 6 KV heads$",
        ),
        (dict(attention='mla'), 1, 'mean', r"uses attention='mla', which has no K/V heads"),
        (dict(attention='mha'), 2, 'median', r'^config.uptrain.method must be one of'),
    ],
)
def test_conversion_errors(model, g, method, message):
    cfg = model_config(tiny_config(**model).model)
    if message is None:
        check_conversion(cfg, ConversionOptions(num_kv_heads=g, method=method))
        return
    with pytest.raises(ValueError, match=message):
        check_conversion(cfg, ConversionOptions(num_kv_heads=g, method=method))


def test_a_conversion_to_the_sources_own_count_is_noted(caplog):
    """--num_kv_heads equal to the source's merges nothing: allowed (a continued-training
    control), with a warning; not for method 'random', which draws new K/V."""
    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2).model)
    for method, warned in (('mean', True), ('random', False)):
        caplog.clear()
        with caplog.at_level('WARNING'):
            check_conversion(cfg, ConversionOptions(num_kv_heads=2, method=method))
        assert ("num_kv_heads=2 is the source's own count" in caplog.text) == warned, method
    caplog.clear()
    with caplog.at_level('WARNING'):
        check_conversion(cfg, ConversionOptions(num_kv_heads=1))
    assert 'own count' not in caplog.text


def test_a_destination_that_is_the_source_lies_inside_it_or_holds_it_is_refused(tmp_path):
    """Refused first, in one line naming both, before anything is read or written (a step
    directory of the source too, which a later check would call unreadable)."""
    src = tmp_path / 'x' / 'src'
    (src / 'checkpoints').mkdir(parents=True)
    for dst, where in [
        (src / 'sub', 'is inside'),
        (src / 'checkpoints' / '30', 'is inside'),
        (tmp_path / 'x', 'holds'),
        (src, 'is'),
    ]:
        message = f"workdir='{dst}' {where} config.uptrain.source_workdir '{src}'"
        with pytest.raises(ValueError, match=f'^{re.escape(message)}$'):
            convert_checkpoint(str(src), ConversionOptions(num_kv_heads=2), str(dst))
    assert os.listdir(tmp_path / 'x') == ['src'] and os.listdir(src) == ['checkpoints']
    assert os.listdir(src / 'checkpoints') == []


def test_cache_summary_words_what_the_cache_holds():
    def summary(**model):
        return cache_summary(tiny_config(**model))

    assert summary(attention='mqa') == '1 KV head'
    assert summary(attention='gqa', num_kv_heads=2) == '2 KV heads'
    assert summary(attention='gqa', num_kv_heads=2, kv_share_every=2) == '2 KV heads (CLA2)'
    per_layer = summary(attention='gqa', num_kv_heads=2, kv_heads_per_layer=(2, 1))
    assert per_layer == '2,1 KV heads per layer'
    assert summary(attention='mla') == 'a latent of 16 + 4 RoPE dims'
    assert summary(attention='mla', rope_heads=2) == 'a latent of 16 + 2 x 4 RoPE dims'


def test_a_source_without_optimizer_state_is_said_to_have_none(tmp_path, monkeypatch):
    """An import's step-0 checkpoint holds no optimizer state: the converted run's is fresh."""
    import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())
    options = ConversionOptions(num_kv_heads=1, steps=2)
    config = convert_checkpoint(str(tmp_path / 'w'), options, str(tmp_path / 'up'))
    assert cache_summary(config) == '1 KV head'
    one_step = ConversionOptions(num_kv_heads=1, steps=1)  # under the recipe's warmup: lr 0
    monkeypatch.setattr(uptrain, '_convert', lambda *a: pytest.fail('converted before refusing'))
    with pytest.raises(ValueError, match=r'^config\.train\.'):  # before the conversion's work
        convert_checkpoint(str(tmp_path / 'w'), one_step, str(tmp_path / 'up1'))
    assert not (tmp_path / 'up1').exists()
    assert optimizer_state_summary(config) == 'a fresh optimizer state (the source has none)'


def test_uptraining_on_another_part_drops_the_settings_it_does_not_read(tmp_path):
    """A source trained on data.split='pretrain' with its own fractions: uptrained on 'uptrain'
    it keeps them; on 'pretrain+uptrain' (contiguous: the whole training split) the
    uptrain_fraction it no longer reads is set back to configs/base.py's, so train.py's
    check_idle_data passes; on the whole corpus ('') it would score other text than the source
    (no held-out cut), so it is refused before anything is written."""
    config = base_config()
    config.data.update(split='pretrain', uptrain_fraction=0.2, heldout_fraction=0.3)
    import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), config)

    def up(part, dst):
        options = ConversionOptions(num_kv_heads=1, steps=2, data_split=part)
        return convert_checkpoint(str(tmp_path / 'w'), options, str(tmp_path / dst)).data

    data = up('uptrain', 'up')
    assert (data.split, data.uptrain_fraction, data.heldout_fraction) == ('uptrain', 0.2, 0.3)
    data = up('pretrain+uptrain', 'both')
    assert (data.uptrain_fraction, data.heldout_fraction) == (0.1, 0.3)
    check_idle_data(data, default_values('data'))
    with pytest.raises(ValueError, match=r"^config\.data\.split='': the source trained with da"):
        up('', 'all')
    assert not (tmp_path / 'all').exists()


def test_uptrain_config_sets_schedule_and_provenance():
    config = tiny_config(attention='mha')
    config.train.update(steps=40, warmup_steps=4)
    config.uptrain.update(fraction=0.25, warmup_steps=-1, schedule='rewarm')
    out = uptrain_config(config, 1, source_step=40, method='mean', source_workdir='/src')
    assert (out.model.attention, out.model.num_kv_heads) == ('mqa', 1)
    # steps continue from the source's: 10 more, a fresh warmup of 10% of them from step 40
    assert (out.train.steps, out.train.warmup_steps, out.train.schedule_start) == (50, 1, 40)
    assert (out.uptrain.source_step, out.uptrain.method, out.uptrain.source_workdir) == (
        40,
        'mean',
        '/src',
    )
    assert config.model.attention == 'mha'  # the source config is not changed
    config.uptrain.update(schedule='continue', warmup_steps=3)
    out = uptrain_config(config, 1, source_step=40)
    assert (out.train.steps, out.train.warmup_steps, out.train.schedule_start) == (50, 4, 0)
    assert (out.train.decay_steps, out.train.ramp_start, out.train.ramp_steps) == (40, 40, 3)
    source, up = lr_schedule(config.train), lr_schedule(out.train)
    # the source's recipe carried on: its final rate (min_lr), ramped up over 3 steps from 0
    np.testing.assert_allclose(source(40), config.train.min_lr, rtol=1e-6)
    for k, ramp in enumerate([0, 1 / 3, 2 / 3, 1, 1, 1]):
        np.testing.assert_allclose(up(40 + k), ramp * source(40 + k), rtol=1e-6)
    config.uptrain.warmup_steps = -1  # 'continue' with -1: no ramp, exactly the source's rate
    out = uptrain_config(config, 1, source_step=30)
    assert out.train.steps == 30 + round(0.25 * 30)
    for step in range(30, 38):
        assert float(lr_schedule(out.train)(step)) == float(source(step))
    imported = uptrain_config(config, 1, source_step=0, steps=7).train  # no schedule yet
    assert (imported.steps, imported.decay_steps, imported.schedule_start) == (7, 0, 0)


def test_rewarm_and_fresh_reproduce_the_old_uptraining():
    """'rewarm' at source_step + k is the old step-0 schedule at k, and a 'fresh' state at that
    step makes exactly the old first AdamW update (Adam's count 0, the schedule's at the step)."""
    config = tiny_config(attention='mha')
    config.train.steps = 200
    config.uptrain.update(fraction=0.1, warmup_steps=-1, schedule='rewarm')
    new = uptrain_config(config, 2, source_step=200).train
    old = optax.warmup_cosine_decay_schedule(0.0, config.train.lr, 2, 20, config.train.min_lr)
    for k in range(22):
        assert float(lr_schedule(new)(200 + k)) == float(old(k)), k
    old_train = config.train.copy_and_resolve_references()
    old_train.update(steps=20, warmup_steps=2)
    params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(3)}
    grads = {'w': jnp.full((2, 3), 0.5), 'b': jnp.linspace(-1, 1, 3)}
    tx_new, tx_old = make_optimizer(new), make_optimizer(old_train)
    state_new = with_schedule_count(tx_new.init(params), 200)
    state_old = tx_old.init(params)
    for _ in range(3):  # the first three updates, bitwise
        up_new, state_new = tx_new.update(grads, state_new, params)
        up_old, state_old = tx_old.update(grads, state_old, params)
        for a, b in zip(jax.tree.leaves(up_new), jax.tree.leaves(up_old), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_converted_optimizer_state_for_random_zeroes_kv_moments():
    src = model_config(tiny_config(attention='mha').model)
    params = params_of(build_model(src, seed=1))
    tx = optax.adamw(1e-3)
    state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.1, params)
    _, state = tx.update(grads, state, params)
    out = convert_opt_state(state, params, 2, 'random')
    mu = out[0].mu['blocks'][0]['attn']
    assert mu['k_proj']['kernel'].shape == (32, 2, 8) and not mu['k_proj']['kernel'].any()
    assert out[0].nu['blocks'][1]['attn']['q_proj'] is state[0].nu['blocks'][1]['attn']['q_proj']
    assert int(out[0].count) == 1
    with pytest.raises(ValueError, match=r"^config.uptrain.schedule must be one of \('continue',"):
        ConversionOptions(num_kv_heads=2, schedule='restart')
    with pytest.raises(ValueError, match=r"^config.uptrain.optimizer_state must be one of \('co"):
        ConversionOptions(num_kv_heads=2, optimizer_state='keep')


def _recorded_batches(monkeypatch) -> dict:
    """{step: batch} of every batch the training loop hands to the train step."""
    seen = {}
    real = lm.data.corpus.call_batch

    def recording(tokens, **kw):
        batch = real(tokens, **kw)
        rows = batch if kw['steps'] > 1 else batch[None]
        for i, rows_i in enumerate(rows):
            seen[kw['step'] + i] = rows_i
        return batch

    monkeypatch.setattr(lm.data.corpus, 'call_batch', recording)
    return seen


@pytest.mark.slow
def test_uptraining_continues_the_source_run(tmp_path, small_text, monkeypatch):
    """Source (8 steps) -> GQA-2 at step 8 -> 4 more steps: batches of steps 8..11 of the source
    recipe, the source's final learning rate, pooled Adam moments, TensorBoard steps after 8."""
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'model.attention': 'mha', 'model.num_kv_heads': 0, 'uptrain.fraction': 0.5},
    )
    src, dst, tb = tmp_path / 'mha', tmp_path / 'gqa', tmp_path / 'tb'
    seen = _recorded_batches(monkeypatch)
    lm.train.loop.train(config, str(src), str(tb))
    assert sorted(seen) == list(range(8))
    source_seen, seen_up = dict(seen), seen
    seen_up.clear()

    up = convert_checkpoint(str(src), ConversionOptions(num_kv_heads=2), str(dst))
    assert (up.train.steps, up.uptrain.schedule, up.uptrain.optimizer_state) == (
        12,
        'continue',
        'convert',
    )
    assert Checkpointer(str(dst), read_only=True).steps() == [8]
    a, b = assemble(str(src), state='restore'), assemble(str(dst), state='restore')
    assert int(b.state['step']) == 8
    adam_a, adam_b = a.state['opt_state'][1][0], b.state['opt_state'][1][0]  # clip, then adamw
    assert int(adam_b.count) == int(adam_a.count) == 8
    for moment in ('mu', 'nu'):
        ma, mb = getattr(adam_a, moment), getattr(adam_b, moment)
        for layer, block in ma['blocks'].items():
            for name in ('k_proj', 'v_proj'):
                k = np.asarray(block['attn'][name]['kernel'])  # [E, 4, D] -> pairs (0,1), (2,3)
                want = np.stack([(k[:, 0] + k[:, 1]) / 2, (k[:, 2] + k[:, 3]) / 2], axis=1)
                np.testing.assert_array_equal(mb['blocks'][layer]['attn'][name]['kernel'], want)
                mb['blocks'][layer]['attn'][name] = block['attn'][name]  # compared: set aside
        for x, y in zip(jax.tree.leaves(ma), jax.tree.leaves(mb), strict=True):
            np.testing.assert_array_equal(x, y)  # every other moment bitwise the source's

    lm.train.loop.train(up, str(dst), str(tb))
    # the source recipe's batches of steps 8..11: new data, none of the source's 0..7 replayed
    assert sorted(seen_up) == [8, 9, 10, 11]
    tokens = load_corpus(config.data).tokens['train']
    for step, batch in seen_up.items():
        np.testing.assert_array_equal(
            batch, train_batch(tokens, seed=config.seed, step=step, batch_size=4, seq_len=16)
        )
        assert not any(np.array_equal(batch, old) for old in source_seen.values())
    # TensorBoard: the converted run's curve continues the source's
    assert sorted(read_scalars(tb / 'mha', 'train/loss')) == list(range(1, 9))
    assert sorted(read_scalars(tb / 'gqa', 'train/loss')) == [9, 10, 11, 12]
    assert sorted(read_scalars(tb / 'gqa', 'eval/loss')) == [8, 12]  # right after conversion
    # 'continue': the rate the source ended at (its cosine reached min_lr at step 8)
    final = float(lr_schedule(config.train)(8))
    np.testing.assert_allclose(final, config.train.min_lr, rtol=1e-6)
    lrs = read_scalars(tb / 'gqa', 'train/lr')
    np.testing.assert_allclose([lrs[s] for s in (9, 10, 11, 12)], final, rtol=1e-6)
    # recorded: the run's config beside its last checkpoint, its HParams and results.json
    saved = stored_config(str(dst)).uptrain
    assert (saved.schedule, saved.optimizer_state, saved.method, saved.source_step) == (
        'continue',
        'convert',
        'mean',
        8,
    )
    assert saved.source_workdir == str(src)
    acc = event_accumulator.EventAccumulator(str(tb / 'gqa'))
    acc.Reload()
    hparams = read_hparams(acc)
    assert {k: v[1] for k, v in hparams.items() if k.startswith('uptrain.')} == {
        'uptrain.method': 'mean',
        'uptrain.grouping': 'contiguous',
    }
    assert json.loads((dst / 'results.json').read_text())['step'] == 12
    # what trained it: the source's steps carried into the conversion, then this session's
    # (one version trained both here: one entry)
    by = [{'steps': [0, 8], **trained_by()}]
    assert read_step_meta(str(dst), 8)[SESSIONS] == read_step_meta(str(src), 8)[SESSIONS] == by
    assert read_step_meta(str(dst), 12)[SESSIONS] == [{**by[0], 'steps': [0, 12]}]


@pytest.mark.slow
def test_uptrain_end_to_end(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{
            'model.attention': 'mha',
            'model.num_kv_heads': 0,
            'train.steps': 40,
            'checkpoint_every': 40,
            'eval_every': 40,
            'uptrain.fraction': 0.25,
        },
    )
    out = run_entry(
        'train.py',
        f'--config={write_config_file(config, tmp_path / "c.py")}',
        f'--workdir={tmp_path / "mha"}',
        f'--tb_dir={tmp_path / "tb"}',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "gqa"}',
        '--num_kv_heads=2',
        '--method=mean',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'gqa with 2 KV heads' in out.stdout and ', convert optimizer state,' in out.stdout
    assert ', on all the data); next:' in out.stdout  # the source's part: the whole split
    # the converted run logs where its source did: said in the next command, and remembered
    assert out.stdout.strip().endswith(
        f'next: python train.py --workdir={tmp_path / "gqa"} --tb_dir={tmp_path / "tb"}'
    )
    out = run_entry('train.py', f'--workdir={tmp_path / "gqa"}')
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / 'gqa' / 'tb').exists()  # one run, one place in TensorBoard
    evals = read_scalars(tmp_path / 'tb' / 'gqa', 'eval/loss')
    assert sorted(evals) == [40, 50]  # right after conversion, and after 0.25 x 40 steps
    source = read_scalars(tmp_path / 'tb' / 'mha', 'eval/loss')
    assert evals[40] > source[40] - 1e-3  # conversion loses a little...
    assert evals[50] < evals[40]  # ...and uptraining wins it back
    assert sorted(read_scalars(tmp_path / 'tb' / 'gqa', 'train/loss')) == list(range(41, 51))
    # An uptrained run has no config file: --config.KEY=VALUE overrides its saved config.
    out = run_entry('train.py', f'--workdir={tmp_path / "gqa"}', '--config.train.steps=52')
    assert out.returncode == 0, out.stderr[-3000:]
    assert max(read_scalars(tmp_path / 'tb' / 'gqa', 'train/loss')) == 52
    assert stored_config(str(tmp_path / 'gqa')).train.steps == 52
    # --data_split: a part from a source trained on the whole corpus would score other text
    part = [f'--src={tmp_path / "mha"}', '--num_kv_heads=2', '--data_split=uptrain']
    out = run_entry('scripts/uptrain.py', *part, f'--dst={tmp_path / "gqa_up"}')
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith(
        "error: --data_split='uptrain': the source trained with data.split='', so its evaluation"
    ), out.stderr[-2000:]
    assert not (tmp_path / 'gqa_up').exists()
    part[-1] = '--data_split=heldout'  # held-out text is never trained on
    out = run_entry('scripts/uptrain.py', *part, f'--dst={tmp_path / "gqa_h"}')
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith(
        'error: --data_split must be one of'
    ), out.stderr[-2000:]
    # Errors are one line: an existing destination, a workdir with no checkpoint.
    again = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "gqa"}',
        '--num_kv_heads=2',
    )
    assert again.returncode == 1 and 'already holds checkpoints' in again.stderr.splitlines()[-1]
    empty = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "none"}',
        f'--dst={tmp_path / "x"}',
        '--num_kv_heads=2',
    )
    assert empty.returncode == 1 and empty.stderr.splitlines()[-1].startswith('error: --src:')
    assert 'none does not exist' in empty.stderr.splitlines()[-1]
    bad = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "y"}',
        '--num_kv_heads=3',
    )
    assert bad.stderr.splitlines()[-1] == (
        'error: --num_kv_heads=3 does not divide config.model.num_heads=4'
    )
    # The library names config keys; the script shows its flags (--src for the source workdir).
    step = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "y"}',
        '--num_kv_heads=2',
        '--step=5',
    )
    assert re.fullmatch(
        r'error: --src: no checkpoint for step 5 in .*; available: \[40\]',
        step.stderr.splitlines()[-1],
    )
    assert 'Traceback' not in bad.stderr + empty.stderr + again.stderr + step.stderr
    # --warmup_steps and --lr go to the converted run's config (a ramp from 0 under 'continue';
    # min_lr scaled with the peak).
    ramp = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "ramp"}',
        '--num_kv_heads=2',
        '--warmup_steps=3',
        f'--lr={config.train.lr / 2}',
    )
    assert ramp.returncode == 0, ramp.stderr[-3000:]
    saved = stored_config(str(tmp_path / 'ramp'))
    up, train = saved.uptrain, saved.train
    assert (up.warmup_steps, train.ramp_start, train.ramp_steps) == (3, 40, 3)
    assert saved.train.lr == config.train.lr / 2
    assert saved.train.min_lr == pytest.approx(config.train.min_lr / 2, rel=1e-12)
    # MHA -> MLA (lm/convert/methods.py); similarity grouping and aligned merging: the ablation
    # smoke.
    mla = ['--target=mla', '--kv_lora_rank=8', '--qk_rope_head_dim=4', '--calibration_tokens=64']
    bad = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "z"}',
        *mla,
        '--grouping=similarity',
        '--optimizer_state=fresh',
    )
    assert bad.returncode == 1 and not (tmp_path / 'z').exists()
    assert bad.stderr.splitlines()[-1] == (
        'error: --grouping=similarity does not apply to --target=mla (no heads are merged)'
    )
    out = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "mla"}',
        *mla,  # optimizer_state=convert: Adam's count and the kept parameters' moments go on
        '--rope_heads=2',  # two RoPE keys, each the mean of two of the 4 KV heads' kept columns
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'mla with a latent of 8 + 2 x 4 RoPE dims by joint_svd' in out.stdout
    check_mla_decoding(tmp_path / 'mla')
    opt_state = assemble(str(tmp_path / 'mla'), state='restore').state['opt_state']
    is_adam = lambda node: isinstance(node, optax.ScaleByAdamState)  # noqa: E731
    (adam,) = [n for n in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(n)]
    assert int(adam.count) == 40  # the source's steps
    first = next(iter(adam.nu['blocks'].values()))['attn']
    assert np.any(adam.nu['embed']) and np.any(first['o_proj']['kernel'])  # carried over
    assert not np.any(first['kv_b_proj']['kernel'])  # a new latent factor: no history


def check_mla_decoding(workdir):
    """The converted MLA checkpoint decodes with its absorbed latent cache, C + 2·P = 8 + 2·4
    elements per token per layer (two RoPE keys), as its full forward pass computes."""
    restored = assemble(str(workdir), state='restore')
    cfg = restored.model_cfg
    mla = cfg.section
    assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim) == (8, 4, 4)
    assert mla.rope_heads == 2
    assert 'mla' in restored.config.model and 'kv_lora_rank' not in restored.config.model
    assert restored.config.uptrain.rope_pairs.count(',') == 1  # two frequency pairs kept
    model = nnx.merge(restored.ctx.graphdef, restored.state['params'])
    decoder = Decoder(model, absorb=True)
    caches = init_caches(cfg, 1, 8)
    assert cache_elements_per_token(caches) == cfg.num_layers * (8 + 2 * 4)
    tokens = np.array([[3, 5, 7, 11, 2, 9]], np.int32)
    pad = np.zeros(1, np.int32)
    prefill, caches = decoder.prefill(decoder.params, tokens[:, :5], pad, caches)
    step, _ = decoder.step(decoder.params, tokens[:, 5], pad, caches)
    full = np.asarray(model(tokens))[0]
    np.testing.assert_allclose(prefill[0], full[:5], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(step[0], full[5], atol=2e-5, rtol=1e-4)


def read_images(logdir):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return acc.Tags()['images']


@pytest.mark.slow
def test_ablation_script_smoke(tmp_path):
    words = 'the of and to a in that is was he for it with as his on be at by'.split()
    text = tmp_path / 'words.txt'  # ~25 kB: validation and held-out parts of ~20 windows of 64
    text.write_text(' '.join(np.random.default_rng(0).choice(words, 7_000)))
    args = [
        f'--data_path={text}',
        f'--out_dir={tmp_path / "abl"}',
        '--steps=6',
        '--seeds=2',
        '--fractions=0.5',
        '--methods=mean',  # the method grid: tests/test_cla_conversion.py
        '--targets=1',
        '--mla_ranks=8',
        '--calibration_tokens=256',
        '--set=model.num_layers=1',  # a small recipe: one layer of width 64 (4 heads of 16)
        '--set=model.d_model=64',
    ]
    both = '--schedule=continue,rewarm'
    out = run_entry('scripts/uptrain_ablation.py', *args, both, f'--report={tmp_path / "t.md"}')
    assert out.returncode == 0, out.stderr[-3000:]
    table = (tmp_path / 't.md').read_text()
    for row in (
        '| MHA (source) | — | — | 6 |',
        '| MQA | mean | 0.5 (3) | 9 |',
        '| MQA | rewarm-mean | 0.5 (3) | 9 |',  # the schedule x method grid
        '| MQA | from scratch | — | 9 |',  # exactly the source + uptraining budget
        '| MQA | 0.5 | mean | rewarm-mean |',  # paired comparisons across schedules
        '| MLA-8 | rewarm-joint_svd | 0.5 (3) | 9 |',
        '| MLA-8 | from scratch | — | 9 |',
    ):
        assert row in table, table
    assert '| MQA | from scratch | — | 6 |' not in table
    assert 'Final loss on the held-out part' in table
    assert 'Holm-corrected over the' in table
    assert (tmp_path / 'abl' / 'pareto_heldout_loss.png').stat().st_size > 10_000  # and in TB:
    assert read_images(tmp_path / 'abl' / 'tb' / 'pareto') == ['pareto/heldout/loss']
    num = r'-?\d\.\d{4}'
    arm = rf'\| MQA \| mean \| 0\.5 \(3\) \| 9 \| {num} ± {num} \| \[{num}, {num}\] \| '
    assert re.search(arm + rf'[+-]\d\.\d{{4}} \[{num}, {num}\]', table), table
    # KV cache bytes per token, then the learning rate: 1 layer x (2 x 16) bf16 for MQA, 8 + 8
    assert re.search(r'\| MQA \| from scratch \| — \| 9 \| .* \| 64 \| 0.001 \|$', table, re.M)
    assert re.search(r'\| MLA-8 \| from scratch \| — \| 9 \| .* \| 32 \| 0.001 \|$', table, re.M)

    def result(out_dir, name):
        return json.loads((tmp_path / out_dir / name / 'result.json').read_text())

    # the held-out loss is reported, the validation loss kept beside it
    heldout = [result('abl', f'MQA_mean_a0.5_s{s}')['heldout']['loss'] for s in (0, 1)]
    want = np.mean(heldout) - np.mean(
        [result('abl', f'MQA_scratch_9_s{s}')['heldout']['loss'] for s in (0, 1)]
    )
    assert f'| MQA | mean | 0.5 (3) | 9 | {np.mean(heldout):.4f} ±' in table, table
    assert f'| {want:+.4f} [' in table, table
    arm_config = stored_config(str(tmp_path / 'abl' / 'MQA_rewarm-mean_a0.5_s0'))
    up = arm_config.uptrain
    assert (up.method, up.grouping, up.groups, up.schedule) == (
        'mean',
        'contiguous',
        '',  # contiguous groups are not written out
        'rewarm',
    )
    assert arm_config.data.split == 'uptrain'  # disjoint from the source's part
    assert stored_config(str(tmp_path / 'abl' / 'mha_s0')).data.split == 'pretrain'
    assert (
        stored_config(str(tmp_path / 'abl' / 'MQA_scratch_9_s0')).data.split == 'pretrain+uptrain'
    )
    again = run_entry('scripts/uptrain_ablation.py', *args, both)
    assert again.returncode == 0 and table.strip() in again.stdout  # cached, same numbers
    assert 'eval loss' not in again.stderr  # nothing retrained
    # One schedule in its own --out_dir: every run copied (same settings), compared by name.
    rewarm = [*args[:1], f'--out_dir={tmp_path / "rewarm"}', *args[2:], '--schedule=rewarm']
    out = run_entry(
        'scripts/uptrain_ablation.py',
        *rewarm,
        '--mla_ranks=',
        f'--reuse={tmp_path / "abl"}',
        '--parallel=2',
        f'--compare_with={tmp_path / "abl"}',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logs = ''.join((tmp_path / 'rewarm' / f'seed{s}.log').read_text() for s in (0, 1))
    assert not re.findall(r'\] (\S+): eval loss', logs) and 'copied from' in logs
    same = '| MQA | rewarm-mean | 0.5 | +0.0000 [0.0000, 0.0000] p=1 (sign-flip 1) | 2 |'
    assert same in out.stdout
    # A learning-rate grid: each arm at the rate with the lower mean validation loss.
    grid = [*args[:1], f'--out_dir={tmp_path / "grid"}', *args[2:5], '--methods=mean', *args[6:]]
    out = run_entry(
        'scripts/uptrain_ablation.py',
        *grid,
        '--mla_ranks=',
        '--lrs=1e-3,3e-3',
        f'--reuse={tmp_path / "abl"}',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    val = {
        lr: np.mean([result('grid', f'MQA_mean_a0.5_lr{lr}_s{s}')['eval']['loss'] for s in (0, 1)])
        for lr in ('0.001', '0.003')
    }
    grid_config = stored_config(str(tmp_path / 'grid' / 'MQA_mean_a0.5_lr0.003_s0'))
    assert (grid_config.train.lr, grid_config.data.split) == (0.003, 'uptrain')
    source_lr = stored_config(str(tmp_path / 'abl' / 'mha_s0')).train
    assert grid_config.train.min_lr == pytest.approx(3 * source_lr.min_lr)  # lr 3x the recipe's
    best = min(val, key=val.get)
    assert re.search(
        rf'\| MQA \| mean \| 0\.5 \(3\) \| 9 \| .* \| 64 \| {best} \|$', out.stdout, re.M
    )
    # An out_dir of the earlier protocol (no corpus parts recorded) is refused in one line.
    old = tmp_path / 'old' / 'mha_s0'
    old.mkdir(parents=True)
    saved = result('abl', 'mha_s0')
    for key in ('split', 'lr'):
        del saved['fingerprint'][key]
    (old / 'result.json').write_text(json.dumps(saved))
    refused = run_entry(
        'scripts/uptrain_ablation.py', *args[:1], f'--out_dir={tmp_path / "old"}', *args[2:]
    )
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1].startswith(
        f"error: --out_dir: {old} was made with other settings: lr: '(absent)' -> 0.001; split:"
    ), refused.stderr[-2000:]
    # --scratch_fractions: from-scratch baselines only at these alphas' budgets (none here).
    no_scratch = [*args[:4], '--fractions=0', '--scratch_fractions=', '--methods=mean', *args[6:]]
    out = run_entry('scripts/uptrain_ablation.py', *no_scratch, '--mla_ranks=')
    assert out.returncode == 0, out.stderr[-3000:]
    assert '| MQA | mean | 0 (0) | 6 |' in out.stdout and '— (not trained)' in out.stdout
    assert 'from scratch |' not in out.stdout
    bad = run_entry('scripts/uptrain_ablation.py', *args, '--scratch_fractions=0.3')
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        'error: --scratch_fractions: every alpha must also be in --fractions'
    )


@pytest.mark.slow
def test_ablation_run_stopped_by_sigterm_is_not_cached(tmp_path, small_text):
    """A run stopped before its last step (SIGTERM) leaves no cached result, so repeating the
    command retrains it instead of using its partial loss."""
    out_dir = tmp_path / 'abl'
    code, err = sigterm_while_training(
        'scripts/uptrain_ablation.py',
        f'--data_path={small_text}',
        f'--out_dir={out_dir}',
        '--steps=100000',
        '--seeds=1',
        '--set=model.num_layers=1',
        '--set=model.d_model=64',
    )
    assert code == 143, err[-2000:]
    assert re.fullmatch(
        r'mha_s0 stopped by SIGTERM at step [1-9]\d* \(its checkpoint kept; the ablation starts '
        r'an unfinished run again from its beginning\); no further runs started',
        [line for line in err.strip().splitlines() if not line.startswith('I')][-1],
    ), err[-2000:]
    assert not (out_dir / 'mha_s0' / 'result.json').exists()
