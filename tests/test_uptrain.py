"""MHA -> GQA / MQA conversion (Ainslie et al. 2023): exactness, hand-checked pooling, the
script end to end, and its errors."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, read_scalars, tiny_config, tiny_train_config, write_config_file
from flax import nnx

from lm.model import build_model, model_config
from lm.uptrain import check_conversion, convert_params, merge_kv_heads, target_config


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def logits(cfg, params, tokens):
    graphdef, _ = nnx.split(build_model(cfg), nnx.Param)
    return nnx.merge(graphdef, params)(tokens)


TOKENS = jax.random.randint(jax.random.key(7), (2, 12), 0, 61)


@pytest.mark.parametrize('method', ['mean', 'first'])
def test_conversion_to_as_many_heads_is_exact(method):
    src = model_config(tiny_config(attention='mha', qkv_bias=True).model)
    params = params_of(build_model(src, seed=3))
    params['blocks'][0]['attn']['k_proj']['bias'] = jnp.arange(32.0).reshape(4, 8)
    out = convert_params(params, src, 4, method)
    dst = target_config(src, 4)
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
        # float32 rounding of (x + x) / 2 and of a differently shaped einsum.
        np.testing.assert_allclose(logits(target_config(src, g), out, TOKENS), want, atol=1e-5)


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
    src = model_config(tiny_config(attention='mha', num_heads=8, d_model=32).model)
    params = params_of(build_model(src))
    step1 = convert_params(params, src, 4, 'mean')
    two_step = convert_params(step1, target_config(src, 4), 2, 'mean')
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
        (dict(attention='mha'), 3, 'mean', r'num_heads=4 is not divisible by --num_kv_heads=3'),
        (
            dict(attention='gqa', num_kv_heads=2),
            4,
            'mean',
            r'--num_kv_heads=4 is larger than the '
            r"source's 2 KV heads",
        ),
        (
            dict(attention='mha', num_heads=6, d_model=36),
            4,
            'mean',
            r'num_heads=6 is not divisible',
        ),
        (dict(attention='mha', num_heads=12, d_model=48), 4, 'mean', None),
        (
            dict(attention='gqa', num_heads=12, num_kv_heads=6, d_model=48),
            4,
            'mean',
            r"the source's 6 KV heads are not divisible by --num_kv_heads=4",
        ),
        (dict(attention='mla'), 1, 'mean', r"uses attention='mla'"),
        (dict(attention='mha'), 2, 'median', r'--method must be one of'),
    ],
)
def test_conversion_errors(model, g, method, message):
    cfg = model_config(tiny_config(**model).model)
    if message is None:
        check_conversion(cfg, g, method)
        return
    with pytest.raises(ValueError, match=message):
        check_conversion(cfg, g, method)


def cli(*args):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__('os').environ, 'JAX_PLATFORMS': 'cpu'},
    )


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
    out = cli(
        ROOT / 'train.py',
        f'--config={write_config_file(config, tmp_path / "c.py")}',
        f'--workdir={tmp_path / "mha"}',
        f'--tb_dir={tmp_path / "tb"}',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = cli(
        ROOT / 'scripts' / 'uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "gqa"}',
        '--num_kv_heads=2',
        '--method=mean',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'gqa with 2 KV heads' in out.stdout
    out = cli(ROOT / 'train.py', f'--workdir={tmp_path / "gqa"}', f'--tb_dir={tmp_path / "tb"}')
    assert out.returncode == 0, out.stderr[-3000:]
    evals = read_scalars(tmp_path / 'tb' / 'gqa', 'eval/loss')
    assert sorted(evals) == [0, 10]  # right after conversion, and after 0.25 x 40 steps
    source = read_scalars(tmp_path / 'tb' / 'mha', 'eval/loss')
    assert evals[0] > source[40] - 1e-3  # conversion loses a little...
    assert evals[10] < evals[0]  # ...and uptraining wins it back
    assert sorted(read_scalars(tmp_path / 'tb' / 'gqa', 'train/loss')) == list(range(1, 11))
    # Errors are one line: an existing destination, a workdir with no checkpoint.
    again = cli(
        ROOT / 'scripts' / 'uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "gqa"}',
        '--num_kv_heads=2',
    )
    assert again.returncode == 1 and 'already holds checkpoints' in again.stderr.splitlines()[-1]
    empty = cli(
        ROOT / 'scripts' / 'uptrain.py',
        f'--src={tmp_path / "none"}',
        f'--dst={tmp_path / "x"}',
        '--num_kv_heads=2',
    )
    assert empty.returncode == 1 and empty.stderr.splitlines()[-1].startswith('error: --src:')
    assert 'holds no checkpoint' in empty.stderr.splitlines()[-1]
    bad = cli(
        ROOT / 'scripts' / 'uptrain.py',
        f'--src={tmp_path / "mha"}',
        f'--dst={tmp_path / "y"}',
        '--num_kv_heads=3',
    )
    assert bad.returncode == 1 and 'not divisible by --num_kv_heads=3' in bad.stderr
    assert 'Traceback' not in bad.stderr + empty.stderr + again.stderr


def test_ablation_script_smoke(tmp_path, small_text):
    out = cli(
        ROOT / 'scripts' / 'uptrain_ablation.py',
        f'--data_path={small_text}',
        f'--out_dir={tmp_path / "abl"}',
        '--steps=6',
        '--seeds=1',
        '--fractions=0,0.5',
        '--methods=mean',
        '--targets=1',
        '--eval_batches=2',
        f'--report={tmp_path / "table.md"}',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = (tmp_path / 'table.md').read_text()
    for row in (
        '| MHA (source) | — | — (6 steps) |',
        '| MQA | mean | 0 (0) |',
        '| MQA | mean | 0.5 (3) |',
        '| MQA | from scratch | — (9 steps) |',
    ):
        assert row in table, table
    again = cli(
        ROOT / 'scripts' / 'uptrain_ablation.py',
        f'--data_path={small_text}',
        f'--out_dir={tmp_path / "abl"}',
        '--steps=6',
        '--seeds=1',
        '--fractions=0,0.5',
        '--methods=mean',
        '--targets=1',
        '--eval_batches=2',
    )
    assert again.returncode == 0 and table.strip() in again.stdout  # cached, same numbers
    assert 'eval loss' not in again.stderr  # nothing retrained
