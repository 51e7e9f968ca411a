"""Hugging Face round trips that close (lm/convert/hf_files.py): a byte-tokenizer run trained here
exports a tokenizer transformers loads and imports back as the same run; tokenizer and generation
files (chat template, generation_config.json) are carried through import and export; an MLA run
converted from an imported Llama exports; a GGUF-only directory says what to do.

The transformers parts skip where it is not installed. Logit tolerance: 1e-4 relative to the
largest logit, float32 on both sides (tests/test_hf.py)."""

import json
import shutil

import numpy as np
import pytest
import tokenizers
from conftest import small_text, stdlib_text, tiny_config, tiny_train_config  # noqa: F401
from test_hf import (
    FIXTURES,
    assert_bitwise_equal,
    assert_close_logits,
    base_config,
    flat_params,
    model_of,
)

from lm.convert import hf, uptrain
from lm.convert import methods as conversion
from lm.convert.hf_io import export_hf, import_hf
from lm.data.tokenizer import EOS, PAD, ByteTokenizer, is_byte_tokenizer
from lm.infer.decode import Decoder, parse_sampling
from lm.train.checkpoint import Checkpointer
from lm.train.loop import train
from lm.train.run import assemble
from lm.train.stored import checkpoint_meta


def random_text(rng, n):
    """ASCII, accented Latin, CJK, emoji and control characters, mixed."""
    ranges = [(32, 127), (9, 14), (0xC0, 0x250), (0x4E00, 0x4F00), (0x1F300, 0x1F400)]
    picks = [ranges[i] for i in rng.integers(0, len(ranges), n)]
    return ''.join(chr(int(rng.integers(lo, hi))) for lo, hi in picks)


def test_byte_tokenizer_json_encodes_and_decodes_as_lm(tmp_path):
    """The byte tokenizer as a tokenizer.json (read back from the file) gives lm's ids on random
    text, and its decode equals lm's on random ids, invalid UTF-8 (U+FFFD) and specials
    included."""
    byte = ByteTokenizer()
    path = tmp_path / 'tokenizer.json'
    byte.hf_tokenizer().save(str(path))
    tok = tokenizers.Tokenizer.from_file(str(path))
    assert tok.get_vocab_size() == 258 and is_byte_tokenizer(tok)
    assert (tok.token_to_id(EOS), tok.token_to_id(PAD)) == (byte.eos_id, byte.pad_id)
    rng = np.random.default_rng(0)
    for _ in range(200):
        text = random_text(rng, int(rng.integers(0, 40)))
        assert tok.encode(text).ids == byte.encode(text)
        ids = rng.integers(0, 258, int(rng.integers(0, 30))).tolist()
        assert tok.decode(ids) == byte.decode(ids)
    other = tokenizers.Tokenizer.from_file(str(FIXTURES / 'llama_mha' / 'tokenizer.json'))
    assert not is_byte_tokenizer(other)


def write_byte_run(workdir):
    """A step-0 run of the byte tokenizer (vocabulary 258), initial parameters."""
    config = tiny_config(attention='gqa', num_kv_heads=2, vocab_size=258)
    config.data.tokenizer = 'byte'
    run = assemble(config, state='init')
    ckpt = Checkpointer(str(workdir), async_save=False)
    meta = checkpoint_meta(run.config, 'test', 0, run.ctx.abstract_state['params'])
    ckpt.save(0, run.state, meta)
    ckpt.close()


@pytest.fixture(scope='module')
def byte_run(tmp_path_factory):
    """A byte-tokenizer run, exported: (workdir, export dir)."""
    root = tmp_path_factory.mktemp('byte')
    write_byte_run(root / 'run')
    export_hf(str(root / 'run'), str(root / 'hf'))
    return root / 'run', root / 'hf'


def check_byte_export(run, out, tmp_path):
    """The export of byte run `run` holds the byte tokenizer and imports back as the same run:
    tokenizer 'byte', bitwise-equal parameters, and an equal export of its own."""
    assert is_byte_tokenizer(tokenizers.Tokenizer.from_file(str(out / 'tokenizer.json')))
    tok_config = json.loads((out / 'tokenizer_config.json').read_text())
    assert tok_config['eos_token'] == EOS and tok_config['pad_token'] == PAD
    assert tok_config['split_special_tokens'] is True  # lm encodes '<|endoftext|>' as bytes
    hf_config = json.loads((out / 'config.json').read_text())
    assert (hf_config['eos_token_id'], hf_config['pad_token_id']) == (256, 257)
    config = import_hf(str(out), str(tmp_path / 'back'), base_config())
    assert config.data.tokenizer == 'byte' and config.data.eos_token == ''
    assert_bitwise_equal(flat_params(run), flat_params(tmp_path / 'back'))
    export_hf(str(tmp_path / 'back'), str(tmp_path / 'again'))
    for name in ('tokenizer.json', 'tokenizer_config.json'):
        assert (tmp_path / 'again' / name).read_bytes() == (out / name).read_bytes()


@pytest.mark.slow
def test_byte_run_exports_a_tokenizer_and_imports_back(byte_run, tmp_path):
    check_byte_export(*byte_run, tmp_path)


def test_import_tokenizer_byte(byte_run, tmp_path):
    """--tokenizer=byte is accepted for a model with the byte ids and no other tokenizer.json,
    and refused in one line where the ids would mean something else."""
    _, out = byte_run
    bare = tmp_path / 'bare'
    shutil.copytree(out, bare)
    for name in ('tokenizer.json', 'tokenizer_config.json'):
        (bare / name).unlink()
    with pytest.raises(FileNotFoundError, match='--tokenizer=byte'):
        import_hf(str(bare), str(tmp_path / 'w0'), base_config())
    with pytest.raises(FileNotFoundError, match=r'^--tokenizer=\S*nope\.json does not exist'):
        import_hf(str(bare), str(tmp_path / 'w0'), base_config(), str(tmp_path / 'nope.json'))
    config = import_hf(str(bare), str(tmp_path / 'w'), base_config(), 'byte')
    assert config.data.tokenizer == 'byte'
    with pytest.raises(ValueError, match=r'vocab_size >= 258 .*got 48') as e:
        import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w1'), base_config(), 'byte')
    assert '\n' not in str(e.value)
    other = tmp_path / 'other'
    shutil.copytree(bare, other)
    shutil.copy(FIXTURES / 'llama_mha' / 'tokenizer.json', other)
    with pytest.raises(ValueError, match="is not lm's byte tokenizer"):
        import_hf(str(other), str(tmp_path / 'w2'), base_config(), 'byte')


@pytest.mark.slow
def test_trained_byte_run_round_trip(tmp_path):
    """A byte run trained here for 4 steps -> export -> import gives the same run; transformers
    loads the export: tokenizer ids and decoding equal lm's (special-token text included),
    logits equal lm's, greedy `generate` gives lm's greedy tokens."""
    text = tmp_path / 'text.txt'
    text.write_text(stdlib_text(30_000), encoding='utf-8')
    config = tiny_train_config(tmp_path, text, **{'data.tokenizer': 'byte', 'train.steps': 4})
    config.update(eval_every=4, checkpoint_every=4)
    run, out = tmp_path / 'run', tmp_path / 'hf'
    train(config, str(run))
    export_hf(str(run), str(out))
    check_byte_export(run, out, tmp_path)
    pytest.importorskip('transformers')
    import torch
    import transformers

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    byte = ByteTokenizer()
    rng = np.random.default_rng(1)
    for text in [random_text(rng, 50) for _ in range(20)] + [f'a{EOS}b{PAD}']:
        assert hf_tok(text)['input_ids'] == byte.encode(text)
        ids = rng.integers(0, 258, 30).tolist()
        assert hf_tok.decode(ids, skip_special_tokens=True) == byte.decode(ids)
    model, _ = model_of(run)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = np.asarray([byte.encode('def main(args):\n    return')], np.int64)
    with torch.no_grad():
        want = hf_model(torch.from_numpy(tokens)).logits.float().numpy()
        greedy = hf_model.generate(
            torch.from_numpy(tokens), max_new_tokens=8, do_sample=False, eos_token_id=None
        )[:, tokens.shape[1] :]
    assert_close_logits(model(tokens), want)
    lm_greedy = Decoder(model).generate(tokens.tolist(), 8, parse_sampling('greedy'))
    assert lm_greedy == greedy.numpy().tolist()


def with_carried_files(tmp_path):
    """The llama_mha fixture (which has a generation_config.json) with a chat template, a named
    extra template and an added_tokens.json."""
    src = tmp_path / 'src'
    shutil.copytree(FIXTURES / 'llama_mha', src)
    (src / 'chat_template.jinja').write_text('{% for m in messages %}{{ m.content }}{% endfor %}')
    (src / 'additional_chat_templates').mkdir()
    (src / 'additional_chat_templates' / 'tool.jinja').write_text('{{ messages | length }}')
    (src / 'added_tokens.json').write_text('{}')
    return src


CARRIED = (
    'chat_template.jinja',
    'additional_chat_templates/tool.jinja',
    'added_tokens.json',
    'generation_config.json',
    'tokenizer_config.json',
    'tokenizer.json',
)


def test_tokenizer_and_generation_files_are_carried(tmp_path):
    """import -> uptrain -> export keeps every tokenizer and generation file byte for byte."""
    src = with_carried_files(tmp_path)
    import_hf(str(src), str(tmp_path / 'w'), base_config())
    export_hf(str(tmp_path / 'w'), str(tmp_path / 'out'))
    for name in CARRIED:
        assert (tmp_path / 'out' / name).read_bytes() == (src / name).read_bytes(), name
    uptrain.copy_run_files(str(tmp_path / 'w'), str(tmp_path / 'up'))
    assert (tmp_path / 'up' / 'hf' / 'chat_template.jinja').is_file()


def test_mla_conversion_sets_the_latent_eps_export_needs():
    """A source with norm_eps 1e-5 (base and imported Llamas): the converted config is one
    DeepseekV3 can express; a latent_norm_eps set in the source's section is kept."""
    from test_conversion import mla_conversion_of, source

    src, params = source(attention='mha')
    assert src.norm_eps == 1e-5
    cfg, _, _ = mla_conversion_of(src, params, 8)
    assert cfg.section.latent_norm_eps == 1e-6
    assert hf.hf_from_model(cfg, 64)['model_type'] == 'deepseek_v3'
    options = uptrain.ConversionOptions(
        target='mla', kv_lora_rank=8, qk_rope_head_dim=4, optimizer_state='fresh'
    )
    inputs = [np.zeros((4, 32), np.float32)] * 2
    _, settings, _ = conversion.latent_conversion(params, src, options, inputs, 1e-3)
    assert settings['mla']['latent_norm_eps'] == 1e-3


@pytest.mark.slow
def test_mla_conversion_of_an_imported_llama_exports(tmp_path, small_text):  # noqa: F811
    """The imported Llama's norm eps is 1e-5; the converted MLA run gets latent_norm_eps 1e-6,
    which DeepseekV3 fixes, so it exports and reads back bitwise."""
    base = base_config()
    base.data.update(source='text', path=str(small_text), cache_dir=str(tmp_path / 'cache'))
    base.data.seq_len = 16
    config = import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base)
    assert config.model.norm_eps == 1e-5
    options = uptrain.ConversionOptions(
        target='mla',
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        steps=2,
        calibration_tokens=64,
        optimizer_state='fresh',
    )
    converted = uptrain.convert_checkpoint(str(tmp_path / 'w'), options, str(tmp_path / 'mla'))
    assert converted.model.mla.latent_norm_eps == 1e-6
    export_hf(str(tmp_path / 'mla'), str(tmp_path / 'out'))
    assert json.loads((tmp_path / 'out' / 'config.json').read_text())['model_type'] == (
        'deepseek_v3'
    )
    assert (tmp_path / 'out' / 'generation_config.json').is_file()  # carried from the import
    import_hf(str(tmp_path / 'out'), str(tmp_path / 'back'), base_config())
    assert_bitwise_equal(flat_params(tmp_path / 'mla'), flat_params(tmp_path / 'back'))


def test_gguf_only_directory_says_what_to_do(tmp_path):
    (tmp_path / 'gguf').mkdir()
    (tmp_path / 'gguf' / 'model-Q4_K_M.gguf').write_bytes(b'GGUF')
    with pytest.raises(FileNotFoundError, match='not GGUF') as e:
        import_hf(str(tmp_path / 'gguf'), str(tmp_path / 'w'), base_config())
    message = str(e.value)
    assert '\n' not in message and "gguf_file='model-Q4_K_M.gguf'" in message
    assert 'save_pretrained' in message


def test_malformed_config_json_names_the_file(tmp_path):
    (tmp_path / 'bad').mkdir()
    (tmp_path / 'bad' / 'config.json').write_text('{"model_type": "llama",\n')
    with pytest.raises(ValueError, match=r'^--hf_dir: \S*bad/config\.json is not valid JSON \('):
        import_hf(str(tmp_path / 'bad'), str(tmp_path / 'w'), base_config())
    assert not (tmp_path / 'w').exists()


CHAT = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    '{% if add_generation_prompt %}<s>assistant:{% endif %}'
)


@pytest.mark.slow
def test_instruct_model_round_trip_in_transformers(tmp_path):
    """An instruct-style directory written by transformers (chat template, sampling defaults in
    generation_config.json) -> import -> export: apply_chat_template gives the original's
    text and ids, the generation config is equal, and so are the logits."""
    pytest.importorskip('transformers')
    import transformers
    from test_hf import save_pretrained_llama, transformers_logits

    src = tmp_path / 'src'
    model = save_pretrained_llama(src)
    model.generation_config.update(do_sample=True, temperature=0.7, top_p=0.9, eos_token_id=2)
    model.generation_config.save_pretrained(src)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    tok.chat_template = CHAT
    tok.save_pretrained(src)
    assert (src / 'chat_template.jinja').is_file()
    import_hf(str(src), str(tmp_path / 'w'), base_config())
    export_hf(str(tmp_path / 'w'), str(tmp_path / 'out'))
    messages = [{'role': 'user', 'content': 'the quick fox'}]
    for kwargs in (dict(tokenize=False), dict(tokenize=True)):
        want = tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        back = transformers.AutoTokenizer.from_pretrained(tmp_path / 'out')
        assert back.apply_chat_template(messages, add_generation_prompt=True, **kwargs) == want
    load = transformers.GenerationConfig.from_pretrained
    assert load(tmp_path / 'out').to_dict() == load(src).to_dict()
    tokens = np.random.default_rng(3).integers(3, 40, size=(2, 10))
    assert_close_logits(
        transformers_logits(tmp_path / 'out', tokens), transformers_logits(src, tokens)
    )
