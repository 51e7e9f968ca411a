"""Hugging Face checkpoints in and out (lm/convert/hf.py, lm/convert/hf_io.py,
scripts/convert_hf.py).

Parity is against transformers' own outputs: committed fixtures (tests/fixtures/hf, made by
make_fixtures.py there with the versions in versions.json) so CI needs no torch; the live tests
at the end run when torch and transformers import. Tolerance: 1e-4 relative to the largest
logit, float32 on both sides (measured: <= 1e-6).
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import reference
from conftest import ENV, ROOT, tiered, tiny_config
from flax import nnx
from safetensors.numpy import load_file, save_file

from lm.config import load_config_file
from lm.convert import hf, uptrain
from lm.convert.hf_io import SafetensorsReader, export_hf, import_hf
from lm.convert.uptrain import uptrain_config
from lm.infer.decode import Decoder, parse_sampling
from lm.model.hf_mapping import interleave_columns
from lm.model.layers import rope_inv_freq
from lm.model.transformer import model_config
from lm.train.checkpoint import Checkpointer
from lm.train.run import assemble
from lm.train.stored import checkpoint_meta

FIXTURES = ROOT / 'tests' / 'fixtures' / 'hf'
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / 'config.json').is_file())
TOKENIZER = FIXTURES / 'llama_mha' / 'tokenizer.json'
RTOL = 1e-4
ATTENTION = {
    'llama_mha': 'mha',
    'llama_gqa': 'gqa',
    'llama_mqa': 'mqa',
    'deepseek_qlora': 'mla',
    'deepseek_qlora_halves': 'mla',
    'deepseek_direct': 'mla',
    'deepseek_direct_halves': 'mla',
}
HAVE_TORCH = all(importlib.util.find_spec(m) for m in ('torch', 'transformers'))
live = pytest.mark.skipif(not HAVE_TORCH, reason='needs torch and transformers')


def base_config():
    config = load_config_file(os.fspath(ROOT / 'configs' / 'base.py'))
    config.compilation_cache_dir = ''
    return config


def model_of(workdir, step=None):
    restored = assemble(str(workdir), state='restore', step=step)
    return nnx.merge(restored.ctx.graphdef, restored.state['params']), restored


def assert_close_logits(got, want):
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=RTOL * scale)


def flat_params(workdir, step=None):
    restored = assemble(str(workdir), state='restore', step=step)
    leaves = jax.tree_util.tree_flatten_with_path(restored.state['params'])[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k


def test_fixture_files_are_small_and_recorded():
    versions = json.loads((FIXTURES / 'versions.json').read_text())
    assert set(versions) == {'torch', 'transformers'}
    assert set(NAMES) == set(ATTENTION)
    total = sum(f.stat().st_size for f in FIXTURES.rglob('*') if f.is_file())
    assert total < 1_000_000


def test_llama3_frequencies_match_reference():
    """Llama 3.1's own settings (head_dim 128, theta 5e5, factor 8, 1 / 4, 8192): all three
    regimes occur."""
    cfg = model_config(
        tiny_config(
            attention='mha', rope_scaling='llama3', rope_theta=5e5, rope_original_max_len=8192
        ).model
    )
    half = 64
    plain = 500_000.0 ** (-np.arange(half) / half)
    want = reference.llama3_frequencies(plain, 8.0, 1.0, 4.0, 8192)
    assert (want == plain).any() and (want == plain / 8).any()
    assert ((want != plain) & (want != plain / 8)).any()
    np.testing.assert_allclose(rope_inv_freq(half, 500_000.0, cfg), want, rtol=2e-6)


# The fast tier: one grouped Llama (MHA and MQA are its g = H and g = 1) and one DeepSeek MLA
@pytest.mark.parametrize('name', tiered(NAMES, fast=['llama_gqa']))
def test_import_matches_transformers(tmp_path, name, caplog):
    """Logits and KV-cache greedy decoding of the imported model equal transformers'; windows
    longer than the model's max_position_embeddings (64 here) are warned about."""
    d = FIXTURES / name
    config = import_hf(str(d), str(tmp_path / 'w'), base_config())
    assert 'seq_len=256 is longer than' in caplog.text
    assert 'max_position_embeddings=64' in caplog.text
    assert config.model.attention == ATTENTION[name]
    assert config.data.eos_token == '</s>'
    model, restored = model_of(tmp_path / 'w')
    assert restored.step == 0
    assert_close_logits(model(np.load(d / 'tokens.npy')), np.load(d / 'logits.npy'))
    prompt, greedy = np.load(d / 'prompt.npy'), np.load(d / 'greedy.npy')
    out = Decoder(model).generate(prompt.tolist(), greedy.shape[1], parse_sampling('greedy'))
    assert out == greedy.tolist()


def test_rope_interleave_is_a_column_permutation(tmp_path):
    """The same DeepSeek model saved with and without rope_interleave imports to identical
    lm parameters once its RoPE rows are de-interleaved."""
    src = FIXTURES / 'deepseek_direct_halves'
    other = tmp_path / 'interleaved'
    shutil.copytree(src, other)
    cfg_json = json.loads((src / 'config.json').read_text())
    cfg_json['rope_interleave'] = True
    (other / 'config.json').write_text(json.dumps(cfg_json))
    tensors = load_file(src / 'model.safetensors')
    Dn, Dr, C = cfg_json['qk_nope_head_dim'], cfg_json['qk_rope_head_dim'], cfg_json['kv_lora_rank']
    back = np.argsort(interleave_columns(Dn + Dr, Dr))
    for name, w in tensors.items():
        if name.endswith('q_proj.weight'):
            H = cfg_json['num_attention_heads']
            tensors[name] = w.reshape(H, Dn + Dr, -1)[:, back].reshape(w.shape)
        if name.endswith('kv_a_proj_with_mqa.weight'):
            tensors[name] = w[np.argsort(interleave_columns(C + Dr, Dr))]
    save_file(tensors, other / 'model.safetensors', metadata={'format': 'pt'})
    import_hf(str(src), str(tmp_path / 'a'), base_config())
    import_hf(str(other), str(tmp_path / 'b'), base_config())
    assert_bitwise_equal(flat_params(tmp_path / 'a'), flat_params(tmp_path / 'b'))


def write_run(workdir, seed=0, **model):
    """A step-0 lm run with N(0, 1) parameters (biases and norms too) and AdamW's initial state
    (zeros), the fixture tokenizer. Made on the host from the run's abstract state: running the
    model's init and a random draw per parameter at -O0 took 10-15 s for a model of ~30M
    parameters."""
    config = tiny_config(**model)
    config.data.update(tokenizer=str(TOKENIZER), eos_token='</s>')
    config.seed = seed
    run = assemble(config)
    rng = np.random.default_rng(seed + 1)

    def value(path, leaf):
        is_param = jax.tree_util.keystr(path).startswith("['params']")
        x = rng.standard_normal(leaf.shape, np.float32) if is_param else np.zeros(leaf.shape)
        return jax.device_put(x.astype(leaf.dtype), leaf.sharding)

    state = jax.tree_util.tree_map_with_path(value, run.ctx.abstract_state)
    ckpt = Checkpointer(str(workdir), async_save=False)
    ckpt.save(0, state, checkpoint_meta(run.config, 'test', 0, run.ctx.abstract_state['params']))
    ckpt.close()


ROUND_TRIPS = {
    'mha_bias_llama3': dict(
        attention='mha', qkv_bias=True, o_bias=True, rope_scaling='llama3', tie_embeddings=False
    ),
    'mqa_tied_bf16_hd12': dict(
        attention='mqa', head_dim=12, param_dtype='bfloat16', kv_quant_group=3, decode_chunk=8
    ),
    'mla_qlora': dict(attention='mla', q_lora_rank=12, latent_norm_eps=1e-6),
    'mla_direct_bf16': dict(
        attention='mla', latent_norm_eps=1e-6, param_dtype='bfloat16', tie_embeddings=False
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', ROUND_TRIPS)
def test_import_of_export_is_bitwise_equal(tmp_path, case):
    write_run(tmp_path / 'run', **ROUND_TRIPS[case])
    export_hf(str(tmp_path / 'run'), str(tmp_path / 'hf'))
    if 'bf16' in case:
        assert SafetensorsReader(str(tmp_path / 'hf')).dtype('model.embed_tokens.weight') == (
            'bfloat16'
        )
    config = import_hf(str(tmp_path / 'hf'), str(tmp_path / 'back'), base_config())
    assert config.model.attention == ROUND_TRIPS[case]['attention']
    want = ROUND_TRIPS[case]
    carried = {k: want[k] for k in ('kv_quant_group', 'decode_chunk') if k in want}
    assert {k: config.model[k] for k in carried} == carried  # in config.json's lm_model
    assert_bitwise_equal(flat_params(tmp_path / 'run'), flat_params(tmp_path / 'back'))


@pytest.mark.slow
def test_export_shards_and_sharded_import(tmp_path):
    """Over-size exports are split with an index; the index form reads back bitwise."""
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    export_hf(str(tmp_path / 'run'), str(tmp_path / 'hf'), max_shard_bytes=20_000)
    index = json.loads((tmp_path / 'hf' / 'model.safetensors.index.json').read_text())
    assert len(set(index['weight_map'].values())) > 2
    assert not (tmp_path / 'hf' / 'model.safetensors').exists()
    import_hf(str(tmp_path / 'hf'), str(tmp_path / 'back'), base_config())
    assert_bitwise_equal(flat_params(tmp_path / 'run'), flat_params(tmp_path / 'back'))
    # a single file beside the index is another checkpoint (transformers would load it)
    shutil.copy(FIXTURES / 'llama_gqa' / 'model.safetensors', tmp_path / 'hf')
    with pytest.raises(ValueError, match=r'holds both model\.safetensors and model\.safetensors\.'):
        import_hf(str(tmp_path / 'hf'), str(tmp_path / 'again'), base_config())
    assert not (tmp_path / 'again').exists()


def test_bf16_checkpoint_stays_bf16(tmp_path):
    import ml_dtypes

    src = tmp_path / 'bf16'
    shutil.copytree(FIXTURES / 'llama_gqa', src)
    tensors = {
        k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(src / 'model.safetensors').items()
    }
    save_file(tensors, src / 'model.safetensors', metadata={'format': 'pt'})
    config = import_hf(str(src), str(tmp_path / 'w'), base_config())
    assert config.model.param_dtype == 'bfloat16'
    params = flat_params(tmp_path / 'w')
    q = params["['blocks'][0]['attn']['q_proj']['kernel']"]
    assert q.dtype == ml_dtypes.bfloat16
    want = tensors['model.layers.0.self_attn.q_proj.weight'].T.reshape(q.shape)
    assert np.array_equal(q.view(np.uint16), want.view(np.uint16))


MESH_WORKER = r"""
import json, sys
import numpy as np
from flax import nnx
from lm.convert import hf_io
from lm.config import load_config_file
from lm.cli import bootstrap
from lm.train.run import assemble

src, workdir, base = sys.argv[1:4]
config = load_config_file(base)
config.compilation_cache_dir = ''
config.mesh.update(cpu_devices=4, data=1, fsdp=2, tensor=2)
bootstrap(config)
reads = []
original = hf_io.SafetensorsReader.read
def read(self, name, rows, cols):
    block = original(self, name, rows, cols)
    reads.append((name, block.size))
    return block
hf_io.SafetensorsReader.read = read
hf_io.import_hf(src, workdir, config)
restored = assemble(workdir, state='restore')
model = nnx.merge(restored.ctx.graphdef, restored.state['params'])
q = restored.state['params']['blocks'][0]['attn']['q_proj']['kernel']
logits = np.asarray(model(np.load(src + '/tokens.npy')))
print(json.dumps({
    'reads': [[n, s] for n, s in reads if n == 'model.layers.0.self_attn.q_proj.weight'],
    'q_shards': [list(s.data.shape) for s in q.addressable_shards],
    'err': float(np.abs(logits - np.load(src + '/logits.npy')).max()),
    'scale': float(np.abs(np.load(src + '/logits.npy')).max()),
}))
"""


@pytest.mark.slow
def test_sharded_index_placed_on_mesh(tmp_path):
    """A sharded safetensors index on a 2 x 2 (fsdp x tensor) mesh of 4 CPU devices: each
    device's block is read on its own (a quarter of q_proj per read), the logits still match."""
    src = tmp_path / 'sharded'
    shutil.copytree(FIXTURES / 'llama_gqa', src)
    tensors = load_file(src / 'model.safetensors')
    names = sorted(tensors)
    parts = {
        'model-00001-of-00002.safetensors': names[::2],
        'model-00002-of-00002.safetensors': names[1::2],
    }
    for file, part in parts.items():
        save_file({n: tensors[n] for n in part}, src / file, metadata={'format': 'pt'})
    (src / 'model.safetensors').unlink()
    weight_map = {n: f for f, part in parts.items() for n in part}
    (src / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': weight_map}))
    out = subprocess.run(
        [
            sys.executable,
            '-c',
            MESH_WORKER,
            str(src),
            str(tmp_path / 'w'),
            str(ROOT / 'configs' / 'base.py'),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    full = tensors['model.layers.0.self_attn.q_proj.weight'].size
    assert result['q_shards'] == [[16, 2, 8]] * 4
    assert [s for _, s in result['reads']] == [full // 4] * 4
    assert result['err'] <= RTOL * result['scale']


# -- refusals: one line each, naming the config.json field --------------------------------------


def llama_json():
    return json.loads((FIXTURES / 'llama_gqa' / 'config.json').read_text())


def deepseek_json():
    return json.loads((FIXTURES / 'deepseek_qlora' / 'config.json').read_text())


REFUSED = {
    'model_type': (llama_json, {'model_type': 'mistral'}, 'model_type'),
    'hidden_act': (llama_json, {'hidden_act': 'gelu'}, 'hidden_act'),
    'mlp_bias': (llama_json, {'mlp_bias': True}, 'mlp_bias'),
    'rope_type': (
        llama_json,
        {'rope_parameters': {'rope_type': 'yarn', 'rope_theta': 1e4, 'factor': 4.0}},
        'rope_type',
    ),
    'legacy_rope_scaling': (
        llama_json,
        {'rope_parameters': None, 'rope_theta': 1e4, 'rope_scaling': {'type': 'linear'}},
        'rope_type',
    ),
    'llama3_incomplete': (
        llama_json,
        {'rope_parameters': {'rope_type': 'llama3', 'rope_theta': 1e4, 'factor': 8.0}},
        'rope_scaling.low_freq_factor',
    ),
    'partial_rotary': (
        llama_json,
        {'rope_parameters': {'rope_type': 'default', 'partial_rotary_factor': 0.5}},
        'partial_rotary_factor',
    ),
    'missing_field': (llama_json, {'intermediate_size': None}, 'intermediate_size'),
    'kv_heads_not_dividing': (llama_json, {'num_key_value_heads': 3}, 'num_key_value_heads=3'),
    'kv_heads_a_string': (llama_json, {'num_key_value_heads': '2'}, "num_key_value_heads='2'"),
    'no_heads': (llama_json, {'num_attention_heads': 0}, 'num_attention_heads=0'),
    'deepseek_moe': (deepseek_json, {'first_k_dense_replace': 1}, 'first_k_dense_replace'),
    'deepseek_bias': (deepseek_json, {'attention_bias': True}, 'attention_bias'),
    'deepseek_yarn': (
        deepseek_json,
        {'rope_parameters': {'rope_type': 'yarn', 'rope_theta': 1e4, 'factor': 40.0}},
        'rope_type',
    ),
}


@pytest.mark.parametrize('case', REFUSED)
def test_refused_config_fields(case):
    make, change, field = REFUSED[case]
    config = {**make(), **change}
    with pytest.raises(ValueError, match=field) as e:
        hf.model_from_hf(config)
    assert '\n' not in str(e.value) and 'config.json' in str(e.value)


def test_legacy_rope_layout_is_read():
    """Pre-5 config.json: rope_theta and rope_scaling at the top level."""
    config = {**llama_json(), 'rope_theta': 5e5, 'rope_parameters': None}
    config['rope_scaling'] = {
        'rope_type': 'llama3',
        'factor': 8.0,
        'low_freq_factor': 1.0,
        'high_freq_factor': 4.0,
        'original_max_position_embeddings': 8192,
    }
    model, _ = hf.model_from_hf(config)
    assert model['rope_theta'] == 5e5 and model['rope_scaling'] == 'llama3'
    assert model['rope_original_max_len'] == 8192


def test_deepseek_import_sets_one_shared_rope_key():
    """DeepseekV3 has one RoPE key: an import sets rope_heads 1 whatever the base config says
    (the section is merged into it)."""
    model, _ = hf.model_from_hf(deepseek_json())
    assert model['mla']['rope_heads'] == 1
    base = tiny_config(attention='mla', rope_heads=2)
    base.model.update(model)
    assert base.model.mla.rope_heads == 1


def edited_fixture(tmp_path, name, edit_tensors=None, edit_config=None):
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    if edit_tensors:
        tensors = load_file(d / 'model.safetensors')
        edit_tensors(tensors)
        save_file(tensors, d / 'model.safetensors', metadata={'format': 'pt'})
    if edit_config:
        config = json.loads((d / 'config.json').read_text())
        edit_config(config)
        (d / 'config.json').write_text(json.dumps(config))
    return d


def _tie_mismatch(t):
    t['lm_head.weight'] = t['model.embed_tokens.weight'] + 1


def _extra_bias(t):
    t['model.layers.0.mlp.up_proj.bias'] = np.zeros(32, np.float32)


def _extra_tensor(t):
    t['model.layers.0.mlp.extra.weight'] = np.zeros((2, 2), np.float32)


def _missing(t):
    del t['model.layers.1.self_attn.k_proj.weight']


def _wrong_shape(t):
    t['model.layers.0.self_attn.k_proj.weight'] = np.zeros((8, 32), np.float32)


def _untie(c):
    c['tie_word_embeddings'] = False


def _int8(t):
    t['model.embed_tokens.weight'] = t['model.embed_tokens.weight'].astype(np.int8)


def _nan(t):
    t['model.layers.1.mlp.down_proj.weight'][3, 5] = np.nan


def _inf(t):
    t['model.norm.weight'][0] = -np.inf


FILE_REFUSALS = {
    'tie_mismatch': ('llama_mha', _tie_mismatch, None, 'tie_word_embeddings=True'),
    'untied_without_head': ('llama_mha', None, _untie, 'tie_word_embeddings=False'),
    'unexpected_bias': ('llama_mha', _extra_bias, None, 'up_proj.bias'),
    'unexpected_tensor': ('llama_mha', _extra_tensor, None, 'mlp.extra.weight'),
    'missing_tensor': ('llama_mha', _missing, None, 'k_proj.weight'),
    'wrong_shape': ('llama_mha', _wrong_shape, None, 'k_proj.weight has shape'),
    'int8': ('llama_mha', _int8, None, 'dtype I8'),
    'nan': (
        'llama_mha',
        _nan,
        None,
        r'tensor model.layers.1.mlp.down_proj.weight holds non-finite',
    ),
    'inf': ('llama_gqa', _inf, None, r'tensor model.norm.weight holds non-finite'),
    'lm_field_unknown_key': (
        'llama_mha',
        None,
        lambda c: c.update(lm_model={'kv_quant_grup': 3}),
        r'config.json lm_model.kv_quant_grup=3: not a config.model key of this version',
    ),
}


@pytest.mark.parametrize('case', FILE_REFUSALS)
def test_refused_checkpoints(tmp_path, case):
    name, edit_tensors, edit_config, message = FILE_REFUSALS[case]
    d = edited_fixture(tmp_path, name, edit_tensors, edit_config)
    with pytest.raises(ValueError, match=message) as e:
        import_hf(str(d), str(tmp_path / 'w'), base_config())
    assert '\n' not in str(e.value)
    assert not (tmp_path / 'w' / 'checkpoints').exists()


DAMAGES = {
    'truncated': (lambda raw: raw[: len(raw) - 100], 'is truncated or damaged: tensor'),
    'cut_header': (lambda raw: raw[:20], 'hold no complete header'),
    'empty': (lambda raw: b'', 'hold no complete header'),
    'garbled_header': (lambda raw: raw[:8] + b'\xff' * 16 + raw[24:], 'damaged safetensors header'),
    'header_without_shape': (
        lambda raw: raw.replace(b'"shape"', b'"shapf"', 1),
        r"damaged safetensors header: tensor \S+ lacks a 'dtype', 'shape'",
    ),
}


@pytest.mark.parametrize('case', DAMAGES)
def test_damaged_safetensors_is_one_line_naming_the_file(tmp_path, case):
    damage, message = DAMAGES[case]
    d = edited_fixture(tmp_path, 'llama_mha')
    f = d / 'model.safetensors'
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(ValueError, match=message) as e:
        import_hf(str(d), str(tmp_path / 'w'), base_config())
    assert '\n' not in str(e.value) and str(f) in str(e.value)
    assert not (tmp_path / 'w' / 'checkpoints').exists()


def test_refused_tokenizers(tmp_path):
    d = edited_fixture(tmp_path, 'llama_mha')
    (d / 'tokenizer.json').unlink()
    with pytest.raises(FileNotFoundError, match='--tokenizer') as e:
        import_hf(str(d), str(tmp_path / 'w'), base_config())
    assert '\n' not in str(e.value)
    small = edited_fixture(tmp_path, 'llama_gqa', edit_config=lambda c: c.update(vocab_size=40))
    with pytest.raises(ValueError, match='vocab_size=40'):
        import_hf(str(small), str(tmp_path / 'w'), base_config())


def test_refused_sources(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match='neither a directory nor a hub id'):
        import_hf(str(tmp_path / 'no' / 'such' / 'dir'), str(tmp_path / 'w'), base_config())
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    with pytest.raises(FileNotFoundError, match='could not be fetched') as e:
        import_hf('nobody-xyz/no-such-model', str(tmp_path / 'w'), base_config())
    assert '\n' not in str(e.value)
    import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())
    with pytest.raises(FileExistsError, match='already holds checkpoints'):
        import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())


EXPORT_REFUSALS = {
    'qkv_bias_only': (dict(attention='gqa', num_kv_heads=2, qkv_bias=True), 'qkv_bias=True'),
    'latent_eps': (dict(attention='mla'), 'latent_norm_eps'),
    'mla_llama3': (dict(attention='mla', rope_scaling='llama3'), "rope_scaling='llama3'"),
    'mla_rope_heads': (
        dict(attention='mla', rope_heads=2, latent_norm_eps=1e-6),
        'rope_heads=2, but DeepseekV3 has one RoPE key',
    ),
}


@pytest.mark.parametrize('case', EXPORT_REFUSALS)
def test_refused_exports(case):
    model, message = EXPORT_REFUSALS[case]
    with pytest.raises(ValueError, match=message) as e:
        hf.hf_from_model(model_config(tiny_config(**model).model), 64)
    assert '\n' not in str(e.value)


def test_uptrain_of_a_step0_import_needs_steps(tmp_path, monkeypatch):
    config = tiny_config(attention='mha')
    with pytest.raises(ValueError, match='set ConversionOptions.steps'):
        uptrain_config(config, 2, 0)
    assert uptrain_config(config, 2, 0, steps=3).train.steps == 3
    import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())
    monkeypatch.setattr(uptrain, 'assemble', None)  # refused before any array is read
    with pytest.raises(ValueError, match='set ConversionOptions.steps'):
        options = uptrain.ConversionOptions(num_kv_heads=2)
        uptrain.convert_checkpoint(str(tmp_path / 'w'), options, str(tmp_path / 'up'))


@pytest.mark.slow
def test_imported_and_uptrained_runs_can_be_moved_and_name_a_missing_tokenizer(tmp_path):
    """An import keeps its tokenizer inside the run, saved relative to it, and an uptrained run
    copies what its source lent it: both can be moved (or archived and restored) and still
    restore, tokenise and export, the uptrained one without its source. A missing tokenizer is
    refused naming the file and the remedy."""
    from lm.convert.hf_files import run_tokenizer
    from lm.train.checkpoint import read_latest_meta

    src, up = tmp_path / 'w', tmp_path / 'up'
    import_hf(str(FIXTURES / 'llama_mha'), str(src), base_config())
    options = uptrain.ConversionOptions(num_kv_heads=2, steps=2)
    uptrain.convert_checkpoint(str(src), options, str(up))
    for run in (src, up):
        assert read_latest_meta(str(run))['config']['data']['tokenizer'] == 'hf/tokenizer.json'
    archive = tmp_path / 'archive'
    archive.mkdir()
    src.rename(archive / 'w')
    up.rename(archive / 'up')
    restored = assemble(str(archive / 'w'), state='params')
    assert restored.config.data.tokenizer == str(archive / 'w' / 'hf' / 'tokenizer.json')
    shutil.rmtree(archive / 'w')  # the uptrained run no longer needs its source
    restored = assemble(str(archive / 'up'), state='params')
    assert restored.config.data.tokenizer == str(archive / 'up' / 'hf' / 'tokenizer.json')
    assert run_tokenizer(restored.config).encode('hello')
    export_hf(str(archive / 'up'), str(tmp_path / 'out'))
    assert (tmp_path / 'out' / 'tokenizer.json').read_bytes() == (
        FIXTURES / 'llama_mha' / 'tokenizer.json'
    ).read_bytes()
    (archive / 'up' / 'hf' / 'tokenizer.json').unlink()
    with pytest.raises(FileNotFoundError) as missing:
        assemble(str(archive / 'up'), state='params')
    assert str(missing.value) == (
        f'--workdir={archive / "up"}: the tokenizer {archive / "up" / "hf" / "tokenizer.json"} '
        '(config.data.tokenizer) is missing; the run keeps it in hf/: restore the run whole '
        '(from the backup or archive it came from), or import or convert it again'
    )


@pytest.mark.slow
def test_command_refusal_is_one_line(tmp_path):
    d = edited_fixture(
        tmp_path, 'deepseek_qlora', edit_config=lambda c: c.update(first_k_dense_replace=1)
    )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / 'scripts' / 'convert_hf.py'),
            'import',
            f'--hf_dir={d}',
            f'--workdir={tmp_path / "w"}',
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=ENV,
    )
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith('error: config.json first_k_dense_replace=1: layers 1..1 of 2 are MoE layers')
    )
    assert not (tmp_path / 'w' / 'checkpoints').exists()


# -- helpers for the round trips elsewhere -------------------------------------------------------


def save_pretrained_llama(out, num_key_value_heads=4, seed=0):
    """A fresh tiny random Llama written by transformers' save_pretrained, with a tokenizer."""
    spec = importlib.util.spec_from_file_location('make_fixtures', FIXTURES / 'make_fixtures.py')
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**fixtures.LLAMA, 'num_key_value_heads': 4})
    config.num_key_value_heads = num_key_value_heads
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    fixtures.randomise(model, seed)
    model.save_pretrained(out)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=fixtures.tokenizer(), eos_token='</s>', bos_token='<s>'
    )
    tok.save_pretrained(out)
    return model


def transformers_logits(directory, tokens):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, np.int64))).logits.float().numpy()


# -- live: fresh random models in transformers --------------------------------------------------


@pytest.mark.slow
@live
@pytest.mark.parametrize('name', NAMES)
def test_live_parity_and_export(tmp_path, name):
    """A fresh random model of each fixture's config, saved by transformers: imported logits and
    greedy tokens equal transformers', and export(import(hf)) loads in transformers with the
    same logits."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
    torch.manual_seed(7)
    reference_model = transformers.AutoModelForCausalLM.from_config(config).eval()
    spec = importlib.util.spec_from_file_location('make_fixtures', FIXTURES / 'make_fixtures.py')
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    fixtures.randomise(reference_model, 7)
    src = tmp_path / 'src'
    reference_model.save_pretrained(src)
    shutil.copy(FIXTURES / name / 'tokenizer.json', src)
    tokens = np.random.default_rng(7).integers(3, fixtures.VOCAB, size=(2, 10))
    prompt = torch.from_numpy(tokens[:, :4])
    reference_model.generation_config.eos_token_id = None  # lm's decoder runs to the end too
    with torch.no_grad():
        want = reference_model(torch.from_numpy(tokens)).logits.float().numpy()
        greedy = reference_model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[:, 4:]
    import_hf(str(src), str(tmp_path / 'w'), base_config())
    model, _ = model_of(tmp_path / 'w')
    assert_close_logits(model(tokens), want)
    out = Decoder(model).generate(tokens[:, :4].tolist(), 6, parse_sampling('greedy'))
    assert out == greedy.numpy().tolist()
    export_hf(str(tmp_path / 'w'), str(tmp_path / 'out'))
    assert_close_logits(transformers_logits(tmp_path / 'out', tokens), want)
