"""Every shipped config file loads, and every model it describes is valid."""

import importlib.util

import pytest
from conftest import ROOT

from lm.config import load_config_file
from lm.data.checks import check_data_config
from lm.experiments.sweep_points import invalid_reason, point_config
from lm.model.transformer import model_config


def valid_model(config):
    return model_config(config.model, 258)  # the byte tokenizer's vocabulary


@pytest.mark.parametrize(
    'variant,attention,kv',
    [
        ('mha', 'mha', 4),
        ('gqa2', 'gqa', 2),
        ('gqa1', 'gqa', 1),
        ('mqa', 'mqa', 1),
        ('mla', 'mla', 0),  # MLA caches a latent, no K/V heads
    ],
)
def test_shakespeare_char_variants(variant, attention, kv):
    config = load_config_file(str(ROOT / 'configs' / 'shakespeare_char.py'), variant)
    cfg = valid_model(config)
    assert (cfg.attention, cfg.num_kv_heads, cfg.num_layers, cfg.d_model) == (attention, kv, 4, 128)
    assert (config.data.seq_len, config.train.batch_size, config.train.steps) == (64, 12, 2000)
    assert (config.train.lr, config.train.min_lr, config.train.b2) == (1e-3, 1e-4, 0.99)


def test_shakespeare_char_reads_data_tinyshakespeare_and_says_how_to_fetch_it(
    tmp_path, monkeypatch
):
    config = load_config_file(str(ROOT / 'configs' / 'shakespeare_char.py'))
    assert config.data.path == 'data/tinyshakespeare.txt'
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r'python scripts/get_data\.py tinyshakespeare\)$'):
        check_data_config(config.data)
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'tinyshakespeare.txt').write_text('First Citizen:\n')
    check_data_config(config.data)


@pytest.mark.parametrize('variant', ['gqa', 'gqa0', 'gqa02'])
def test_shakespeare_char_unknown_variant(variant):
    what = (
        "variant 'gqa' names an attention kind without its settings"
        if variant == 'gqa'
        else f"unknown variant '{variant}'"
    )
    with pytest.raises(ValueError, match=rf": {what}; expected 'mha', 'gqa<g>'"):
        load_config_file(str(ROOT / 'configs' / 'shakespeare_char.py'), variant)


def test_quickstart_and_base():
    valid_model(load_config_file(str(ROOT / 'configs' / 'quickstart.py')))
    base = load_config_file(str(ROOT / 'configs' / 'base.py'))
    base.model.num_kv_heads = 2
    valid_model(base)


def test_every_base_key_has_a_comment():
    lines = (ROOT / 'configs' / 'base.py').read_text().splitlines()
    settings = [ln for ln in lines if ' = ' in ln and ln.strip().split(' = ')[0].count('.') == 1]
    assert len(settings) > 60
    missing = [ln for ln in settings if '#' not in ln]
    assert not missing, missing


def sweep_file(name):
    spec = importlib.util.spec_from_file_location('sweep_file', ROOT / 'configs' / 'sweeps' / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('name', sorted(p.name for p in (ROOT / 'configs' / 'sweeps').glob('*.py')))
def test_every_sweep_files_points_are_valid(name):
    """Each point of each sweep file gives a valid model config, under a unique name (the data
    files a point reads are not in a fresh clone)."""
    module = sweep_file(name)
    base = module.get_config()
    points = module.get_points()
    assert len({p['name'] for p in points}) == len(points)
    for point in points:
        config = point_config(base, {k: v for k, v in point.items() if k != 'name'})
        assert invalid_reason(config) is None, point
        valid_model(config)


def test_sweep_file_points_are_valid():
    base = sweep_file('attention_kinds.py').get_config()
    kinds = []
    for point in sweep_file('attention_kinds.py').get_points():
        config = point_config(base, {k: v for k, v in point.items() if k != 'name'})
        cfg = valid_model(config)
        kinds.append((cfg.attention, cfg.num_kv_heads, cfg.num_heads, cfg.d_model))
    assert kinds == [
        ('mha', 8, 8, 128),
        ('gqa', 4, 8, 128),
        ('gqa', 2, 8, 128),
        ('mqa', 1, 8, 128),
        ('mla', 0, 8, 128),
    ]


def test_gpt125m_is_gpt2_small_sized():
    from lm.model.accounting import param_counts

    cfg = valid_model(load_config_file(str(ROOT / 'configs' / 'gpt125m.py')))
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.dtype) == (12, 768, 12, 'bfloat16')
    assert 120e6 < param_counts(cfg)['total'] < 130e6


def test_data_sampling_sweep_points_are_valid():

    module = sweep_file('data_sampling.py')
    base = module.get_config()
    settings = []
    for point in module.get_points():
        config = point_config(base, {k: v for k, v in point.items() if k != 'name'})
        settings.append((config.data.sampling, config.data.document_mask, config.eval_tokens))
    assert settings == [('random', False, 0), ('epochs', False, 0), ('epochs', True, 0)]
