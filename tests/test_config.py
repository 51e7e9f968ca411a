"""Bad model configs fail with a ValueError naming the setting, before any array is built."""

import pytest
from conftest import tiny_config

from lm.model import model_config

BAD = [
    (
        dict(attention='gqa', num_heads=4, num_kv_heads=3),
        r'num_heads=4 must be divisible by '
        r'num_kv_heads=3',
    ),
    (dict(attention='gqa', num_kv_heads=8), r'num_kv_heads=8 must be <= num_heads=4'),
    (dict(attention='gqa', num_kv_heads=0), r'num_kv_heads must be set'),
    (dict(attention='mha', num_kv_heads=2), r"num_kv_heads=2 contradicts attention='mha'"),
    (dict(attention='mqa', num_kv_heads=2), r"num_kv_heads=2 contradicts attention='mqa'"),
    (dict(attention='sliding'), r"config.model.attention must be one of .*'sliding'"),
    (dict(attention='mha', head_dim=7), r'head_dim=7 must be even for RoPE'),
    (dict(attention='mla', qk_rope_head_dim=5), r'qk_rope_head_dim=5 must be even'),
    (dict(attention='mla', kv_lora_rank=0), r'kv_lora_rank must be > 0'),
    (dict(attention='mla', qk_nope_head_dim=-1), r'qk_nope_head_dim must be > 0'),
    (dict(attention='mla', v_head_dim=0), r'v_head_dim must be > 0'),
    (dict(attention='mla', q_lora_rank=-2), r'q_lora_rank must be >= 0'),
    (dict(attention='mla', num_kv_heads=2), r"num_kv_heads=2 does not apply to attention='mla'"),
    (
        dict(attention='mha', d_model=30),
        r'd_model=30 must be divisible by num_heads=4 when '
        r'head_dim is 0',
    ),
    (dict(attention='mha', attention_impl='flash'), r'attention_impl must be one of'),
    (dict(attention='mha', dtype='float64'), r'config.model.dtype must be one of'),
    (dict(attention='mha', num_layers=0), r'num_layers must be > 0'),
    (dict(attention='mha', vocab_size=0), r'vocab_size must be > 0'),
]


@pytest.mark.parametrize('overrides,message', BAD)
def test_bad_config_raises_named_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        model_config(tiny_config(**overrides).model)


def test_unknown_and_missing_keys():
    config = tiny_config()
    config.model.unlock()
    config.model.num_expert = 4
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['num_expert'\]"):
        model_config(config.model)
    del config.model['num_expert']
    del config.model['rope_theta']
    with pytest.raises(ValueError, match=r"missing key\(s\) \['rope_theta'\]"):
        model_config(config.model)


def test_head_dim_set_independently_skips_divisibility():
    cfg = model_config(tiny_config(attention='mha', d_model=30, head_dim=8).model)
    assert cfg.head_dim == 8 and cfg.num_kv_heads == 4


def test_resolution_of_implied_values():
    assert model_config(tiny_config(attention='mha').model).num_kv_heads == 4
    assert model_config(tiny_config(attention='mqa').model).num_kv_heads == 1
    assert model_config(tiny_config(attention='mha').model).head_dim == 8
    assert model_config(tiny_config(attention='mha', mlp_dim=0).model).mlp_dim == 128


def test_upgrade_config_fills_only_keys_added_since_a_checkpoint_was_written():
    from lm.config import ADDED_KEYS, upgrade_config

    saved = tiny_config().to_dict()
    del saved['train']['steps_per_call'], saved['compilation_cache_dir']
    saved['train']['batch_size'] = 7
    upgraded = upgrade_config(saved)
    assert upgraded.train.steps_per_call == ADDED_KEYS['train.steps_per_call'] == 1
    assert upgraded.compilation_cache_dir == '' and upgraded.train.batch_size == 7
    current = tiny_config()
    current.train.steps_per_call = 10
    assert upgrade_config(current.to_dict()).train.steps_per_call == 10  # present keys kept
