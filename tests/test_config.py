"""Bad model configs fail with a ValueError naming the setting, before any array is built;
variant sections, old configs and the dotted-key helpers."""

import dataclasses
import json

import ml_collections
import pytest
from conftest import ROOT, tiny_config

from lm.config import (
    get_key,
    load_config_file,
    set_key,
    split_items,
    with_overrides,
    with_values,
)
from lm.config_migration import MOVED_KEYS, REPLACED_KEYS, upgrade_config
from lm.model.mla import MLAConfig
from lm.model.transformer import check_model_config, model_config
from lm.train.hparams import hparam_values
from lm.train.run_log import shown_config

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
    (dict(attention='mla', qkv_bias=True), r"qkv_bias / o_bias apply to .*attention='mla' has no"),
    (dict(attention='mla', o_bias=True), r"qkv_bias / o_bias apply to .*attention='mla' has no"),
    (
        dict(attention='mla', qk_rope_head_dim=5),
        r'config.model.mla.qk_rope_head_dim=5 must be even',
    ),
    (dict(attention='mla', kv_lora_rank=0), r'config.model.mla.kv_lora_rank must be > 0'),
    (dict(attention='mla', qk_nope_head_dim=-1), r'config.model.mla.qk_nope_head_dim must be > 0'),
    (dict(attention='mla', v_head_dim=0), r'config.model.mla.v_head_dim must be > 0'),
    (dict(attention='mla', q_lora_rank=-2), r'config.model.mla.q_lora_rank must be >= 0'),
    (dict(attention='mla', latent_norm_eps=-1.0), r'config.model.mla.latent_norm_eps must be >= 0'),
    (
        dict(attention='mla', latent_norm_eps=float('nan')),
        r'config.model.mla.latent_norm_eps must be >= 0',
    ),
    (dict(attention='mha', rope_theta=float('inf')), r'config.model.rope_theta must be a finite'),
    (dict(attention='mha', norm_eps=float('nan')), r'config.model.norm_eps must be a finite'),
    (dict(attention='mha', init_std=float('inf')), r'config.model.init_std must be a finite'),
    (
        dict(attention='mha', rope_scaling='llama3', rope_scaling_factor=float('inf')),
        r'config.model.rope_scaling_factor must be a finite number, got inf',
    ),
    (dict(attention='mla', num_kv_heads=2), r"num_kv_heads=2 does not apply to attention='mla'"),
    (
        dict(attention='mla', rope_heads=3),
        r'config.model.mla.rope_heads=3 must be >= 1 and divide config.model.num_heads=4',
    ),
    (dict(attention='mla', rope_heads=0), r'config.model.mla.rope_heads=0 must be >= 1'),
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


@pytest.mark.parametrize(
    'name,value',
    [('rope_scaling_factor', 2.0), ('rope_low_freq_factor', 2.0), ('rope_original_max_len', 4096)],
)
def test_llama3_knobs_without_rope_scaling_are_refused(name, value):
    """A llama3 knob changed while rope_scaling is '' would do nothing: refused for a new run,
    taken with rope_scaling='llama3'; a saved run's config loads as it was."""
    from lm.train.run import check_config

    config = with_values(tiny_config(attention='mha'), {f'model.{name}': value})
    with pytest.raises(ValueError, match=rf'^config.model.{name}={value} does nothing with '):
        check_config(config)
    check_config(config, saved=True)
    check_config(with_values(config, {'model.rope_scaling': 'llama3'}))


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


def test_variant_sections_are_read_by_their_variant_only():
    """MLA reads its own section; an MHA run carries none, whatever the MLA keys hold."""
    mla = model_config(tiny_config(attention='mla', kv_lora_rank=12).model)
    assert (mla.section.kv_lora_rank, mla.section.qk_rope_head_dim) == (12, 4)
    assert model_config(tiny_config(attention='mha', kv_lora_rank=-1).model).section is None
    config = tiny_config(attention='mla')
    config.model.mla.unlock()
    config.model.mla.kv_rank = 4
    with pytest.raises(ValueError, match=r"config.model.mla has unknown key\(s\) \['kv_rank'\]"):
        model_config(config.model)
    del config.model.mla['kv_rank']
    del config.model.mla['v_head_dim']
    with pytest.raises(ValueError, match=r"config.model.mla is missing key\(s\) \['v_head_dim'\]"):
        model_config(config.model)
    config.model.unlock()
    del config.model['mla']
    with pytest.raises(ValueError, match=r"config.model.mla is missing \(attention='mla'"):
        model_config(config.model)


def test_head_dim_set_independently_skips_divisibility():
    cfg = model_config(tiny_config(attention='mha', d_model=30, head_dim=8).model)
    assert cfg.head_dim == 8 and cfg.num_kv_heads == 4


def test_resolution_of_implied_values():
    assert model_config(tiny_config(attention='mha').model).num_kv_heads == 4
    assert model_config(tiny_config(attention='mqa').model).num_kv_heads == 1
    assert model_config(tiny_config(attention='mha').model).head_dim == 8
    assert model_config(tiny_config(attention='mha', mlp_dim=0).model).mlp_dim == 128


def test_vocab_size_comes_from_the_tokenizer_when_0():
    assert model_config(tiny_config(attention='mha', vocab_size=0).model, 258).vocab_size == 258
    assert model_config(tiny_config(attention='mha', vocab_size=300).model, 258).vocab_size == 300
    with pytest.raises(ValueError, match=r'vocab_size=100 is smaller than the tokenizer .*258'):
        model_config(tiny_config(attention='mha', vocab_size=100).model, 258)
    unknown = check_model_config(tiny_config(attention='mha', vocab_size=0).model)
    assert unknown.vocab_size == 0  # not yet known: every other knob is checked


def flat_keys(d, prefix=''):
    keys = set()
    for k, v in d.items():
        keys |= flat_keys(v, f'{prefix}{k}.') if isinstance(v, dict) else {prefix + k}
    return keys


OLD_CONFIGS = sorted((ROOT / 'tests' / 'old_configs').glob('*.json'))


def test_there_are_frozen_old_configs():
    assert [p.name for p in OLD_CONFIGS] == ['v1.json', 'v2.json']


@pytest.mark.parametrize('path', OLD_CONFIGS, ids=lambda p: p.name)
def test_configs_of_earlier_versions_upgrade_to_exactly_todays_keys(path):
    """A key added to configs/base.py without an entry in lm/config_migration.py fails here."""
    saved = json.loads(path.read_text())
    today = load_config_file(str(ROOT / 'configs' / 'base.py')).to_dict()
    upgraded = upgrade_config(saved)
    assert flat_keys(upgraded.to_dict()) == flat_keys(today)
    for key in flat_keys(saved) - set(REPLACED_KEYS):  # saved values are kept
        assert get_key(upgraded, key) == get_key(ml_collections.ConfigDict(saved), key)
    for old, new in MOVED_KEYS.items():  # moved ones keep theirs in their new place
        if old in flat_keys(saved):
            assert get_key(upgraded, new) == get_key(ml_collections.ConfigDict(saved), old)
    upgraded.model.num_kv_heads = 2  # v1 saved base.py's gqa with 0 KV heads: set one
    assert model_config(upgraded.model).vocab_size == saved['model']['vocab_size']


def test_flat_mla_keys_of_an_old_mla_run_move_into_its_section():
    saved = json.loads(OLD_CONFIGS[-1].read_text())
    saved['model'].update(attention='mla', kv_lora_rank=24, latent_norm_eps=1e-6)
    cfg = model_config(upgrade_config(saved).model)
    assert (cfg.section.kv_lora_rank, cfg.section.latent_norm_eps) == (24, 1e-6)
    assert cfg.section.qk_rope_head_dim == saved['model']['qk_rope_head_dim']


def test_upgrade_fills_added_keys_with_their_old_behaviour():
    saved = json.loads(OLD_CONFIGS[0].read_text())
    upgraded = upgrade_config(saved)
    assert upgraded.train.steps_per_call == 1 and upgraded.compilation_cache_dir == ''
    current = tiny_config()
    current.train.steps_per_call = 10
    assert upgrade_config(current.to_dict()).train.steps_per_call == 10  # present keys kept


@pytest.mark.parametrize(
    'text,items',
    [
        ('4,8', ['4', '8']),
        ('64,128;256', ['64,128', '256']),
        ('64,128;', ['64,128']),  # a trailing ';': one item that holds commas
        ('a;b;', ['a', 'b']),
        ('a,,b', ['a', '', 'b']),  # an empty item stays (a text setting's '')
        ('', ['']),
    ],
)
def test_split_items_by_semicolons_when_there_is_one(text, items):
    assert split_items(text) == items


def test_dotted_key_helpers():
    config = tiny_config()
    assert get_key(config, 'model.num_heads') == 4
    changed = with_overrides(config, ['model.num_heads=8', 'model.qkv_bias=true', 'train.lr=0.5'])
    assert (changed.model.num_heads, changed.model.qkv_bias, changed.train.lr) == (8, True, 0.5)
    assert config.model.num_heads == 4  # a copy
    assert with_values(config, {'model.d_model': 64}).model.d_model == 64
    with pytest.raises(ValueError, match=r"--set: unknown config key 'model.nope'"):
        with_overrides(config, ['model.nope=1'])
    with pytest.raises(ValueError, match=r"--set model.num_heads: 'x' is not an int"):
        with_overrides(config, ['model.num_heads=x'])
    with pytest.raises(ValueError, match=r"--set train.lr: 'x' is not a float"):
        with_overrides(config, ['train.lr=x'])
    with pytest.raises(ValueError, match=r"--set model.qkv_bias: 'maybe' is not a bool"):
        with_overrides(config, ['model.qkv_bias=maybe'])
    # one value per key: 'key=' clears a text setting, which keeps its commas; a number needs
    # one value (no silent last-of-a-list)
    cleared = with_overrides(
        with_values(config, {'model.layer_pattern': 'LG'}), ['model.layer_pattern=']
    )
    assert cleared.model.layer_pattern == ''
    listed = with_overrides(config, ['data.passkey_lengths=64,128', 'train.xla_options=a=1,b=2'])
    assert (listed.data.passkey_lengths, listed.train.xla_options) == ('64,128', 'a=1,b=2')
    with pytest.raises(ValueError, match=r"^--set train.lr: '' is not a float$"):
        with_overrides(config, ['train.lr='])
    with pytest.raises(ValueError, match=r"^--set model.num_heads: '4,8' is not an int$"):
        with_overrides(config, ['model.num_heads=4,8'])
    with pytest.raises(ValueError, match=r"^--set 'model.num_heads': expected key=value$"):
        with_overrides(config, ['model.num_heads'])
    with pytest.raises(ValueError, match=r"config: unknown config key 'train.nope'"):
        set_key(config, 'train.nope', 1)
    with pytest.raises(
        ValueError,
        match=r"--grid: unknown config key 'model.num_hedas' \(did you mean 'model.num_heads'\?\)$",
    ):
        with_overrides(config, ['model.num_hedas=4'], '--grid')
    with pytest.raises(
        ValueError, match=r"'model.rope_thetta' \(did you mean 'model.rope_theta'\?\)$"
    ):
        get_key(config, 'model.rope_thetta')
    with pytest.raises(ValueError, match=r"unknown config key 'zzz.qqq'$"):  # nothing near
        get_key(config, 'zzz.qqq')


def test_hparams_and_config_text_show_only_the_active_variants_section():
    mla_keys = {f.name for f in dataclasses.fields(MLAConfig)}
    mha = tiny_config(attention='mha')
    values = hparam_values(mha, model_config(mha.model), 1)
    assert not [k for k in values if k.split('.')[-1] in mla_keys or k.startswith('mla')]
    assert values['num_kv_heads'] == 4  # MHA: one KV head per query head
    assert 'mla' not in shown_config(mha).model and 'mla' in mha.model  # the run's own: kept
    mla = tiny_config(attention='mla', kv_lora_rank=12)
    values = hparam_values(mla, model_config(mla.model), 1)
    dims = {k for k in mla_keys if k != 'latent_norm_eps'}  # widths and ranks
    assert {k for k in values if k.startswith('mla.')} == {f'mla.{k}' for k in dims}
    assert values['mla.kv_lora_rank'] == 12 and 'num_kv_heads' not in values  # no K/V heads
    assert shown_config(mla).model.mla.kv_lora_rank == 12


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'train.min_lr': 0.01}, r'^config.train.min_lr=0.01 must be <= lr=0.003 \(the cosine'),
        ({'train.weight_decay': -1.0}, r'^config.train.weight_decay must be >= 0, got -1.0$'),
        ({'train.lr': -1.0}, r'^config.train.lr must be > 0, got -1.0$'),
        ({'train.min_lr': -1e-4}, r'^config.train.min_lr must be >= 0, got -0.0001$'),
        ({'train.warmup_steps': -5}, r'^config.train.warmup_steps must be >= 0, got -5$'),
        ({'train.grad_clip': -1.0}, r'^config.train.grad_clip must be >= 0 \(0 = off\), got -1'),
        ({'train.eps': 0.0}, r'^config.train.eps must be > 0, got 0.0$'),
        ({'train.peak_flops': -1.0}, r'^config.train.peak_flops must be >= 0 \(FLOP/s per'),
        (
            {'train.ensemble': 2, 'train.ensemble_lr': '1e-3,1e-2', 'train.min_lr': 2e-3},
            r'^config.train: member 0 of the ensemble would decay from lr 0.001 up to min_lr',
        ),
        (
            {'train.steps': 3, 'train.ramp_steps': 5, 'train.ramp_start': 1000},
            r'^config.train.ramp_start=1000 \(ramp_steps=5\) must be < train.steps - 1 = 2: .*'
            r'the learning rate is 0 at every step of the run \(0 .. 2\)$',
        ),
        (
            {'train.steps': 3, 'train.ramp_steps': 5, 'train.ramp_start': 2},
            r'^config.train.ramp_start=2 .* the learning rate is 0 at every step',
        ),
        (
            {'train.steps': 3, 'train.warmup_steps': 1, 'train.schedule_start': 100},
            r'^config.train.schedule_start=100 \(warmup_steps=1\) must be < train.steps - 1 = 2,'
            r' or warmup_steps 0: .* the learning rate is 0 at every step of the run',
        ),
        (
            {'train.steps': 1, 'train.warmup_steps': 100},
            r'^config.train.schedule_start=0 \(warmup_steps=100\) .* is 0 at every step',
        ),
    ],
)
def test_schedule_and_optimizer_settings_out_of_range_are_refused(overrides, message):
    """Settings the schedule and AdamW would take silently but wrongly: a min_lr above lr (the
    'decay' rises), negative weight decay or clipping, a zero eps; per ensemble member too."""
    from lm.config import with_values
    from lm.train.ensemble import check_ensemble_config
    from lm.train.optimizer import check_train_config

    config = with_values(tiny_config(), {'train.lr': 3e-3, **overrides})
    with pytest.raises(ValueError, match=message):
        check_train_config(config.train)
        check_ensemble_config(config)


def test_an_eps_that_rounds_to_zero_in_the_parameters_dtype_is_refused():
    """float16 parameters keep AdamW's state in float16, where eps=1e-8 is 0 and updates turn
    NaN (they did at step 2): refused before any work; 1e-4 and bfloat16's range are fine."""
    from lm.config import with_values
    from lm.train.run import check_config

    half = {'model.attention': 'mha', 'model.dtype': 'float16', 'model.param_dtype': 'float16'}
    refused = r'^config.train.eps=1e-08 is below 6.1e-05, the smallest normal float16 \(config'
    with pytest.raises(ValueError, match=refused + r'.model.param_dtype, .* use eps >= 6.1e-05'):
        check_config(with_values(tiny_config(), half))
    check_config(with_values(tiny_config(), {**half, 'train.eps': 1e-4}))
    check_config(with_values(tiny_config(attention='mha'), {'model.param_dtype': 'bfloat16'}))


@pytest.mark.parametrize(
    'overrides,warned',
    [
        (
            {'train.steps': 50, 'train.warmup_steps': 100},
            'warmup_steps=100 (from step 0) ends after the last step 50: the rate rises only to '
            '0.49 of lr=0.001, at the last update (step 49)',
        ),
        ({'train.steps': 900, 'train.warmup_steps': 100, 'train.schedule_start': 850}, 'ends'),
        (
            {
                'train.steps': 10,
                'train.warmup_steps': 0,
                'train.ramp_steps': 5,
                'train.ramp_start': 7,
            },
            'ramp_steps=5 (from step 7) ends after the last step 10: the rate is scaled only by '
            '0.4 at the last update (step 9)',
        ),
        (
            {
                'train.steps': 10,
                'train.warmup_steps': 0,
                'train.ramp_steps': 5,
                'train.ramp_start': 5,
            },
            None,  # full at step 10
        ),
        ({'train.steps': 900, 'train.warmup_steps': 100, 'train.decay_steps': 50}, 'cut to one'),
        ({'train.steps': 100, 'train.warmup_steps': 100}, None),  # peak at the last step
        ({'train.steps': 0, 'train.warmup_steps': 100}, None),  # evaluate only
        # no warmup: the cosine from schedule_start starts at lr (was a ZeroDivisionError)
        ({'train.steps': 2, 'train.warmup_steps': 0, 'train.schedule_start': 5}, None),
    ],
)
def test_a_schedule_whose_warmup_outlasts_the_run_is_warned_about(overrides, warned, caplog):
    """Legal but likely not meant: a warmup or ramp that ends after the last step (lr never
    reached; tiny runs with the base config's 100 warmup steps), a decay that ends before the
    warmup."""
    from lm.config import with_values
    from lm.train.optimizer import warn_schedule

    with caplog.at_level('WARNING'):
        warn_schedule(with_values(tiny_config(), overrides).train)
    lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
    assert len(lines) == (warned is not None) and (warned is None or warned in lines[0]), lines


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'train.max_loss_ratio': 0.5}, r'^config.train.max_loss_ratio must be 0 \(off\) or > 1'),
        (
            {'train.max_loss_ratio': float('nan')},
            r'max_loss_ratio must be 0 \(off\) or > 1, got nan',
        ),
        (
            {'eval_tokens': 16, 'data.seq_len': 16},
            r'^config.eval_tokens=16: expected 0 \(the whole split\) or more than one window of '
            r'config.data.seq_len=16 tokens',
        ),
    ],
)
def test_loop_settings_out_of_range_are_refused(overrides, message):
    """Settings training would take silently but wrongly: a loss-spike ratio <= 1 stops a run
    at its first loss above the median; one eval window has no standard error."""
    from lm.train.evaluation import check_eval_config
    from lm.train.run import check_loop_config

    config = with_values(tiny_config(), overrides)
    with pytest.raises(ValueError, match=message):
        check_loop_config(config)
        check_eval_config(config, 1)


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'uptrain.fraction': -0.5}, r'^config.uptrain.fraction must be a finite number >= 0'),
        ({'uptrain.fraction': float('nan')}, r'^config.uptrain.fraction must be a finite number'),
        ({'uptrain.warmup_steps': -2}, r'^config.uptrain.warmup_steps must be >= -1, got -2$'),
        ({'uptrain.calibration_tokens': 0}, r'^config.uptrain.calibration_tokens must be >= 1'),
        ({'uptrain.kv_budget': -1}, r'^config.uptrain.kv_budget must be >= 0, got -1$'),
        ({'uptrain.grouping': 'x'}, r"^config.uptrain.grouping must be one of .*, got 'x'$"),
        ({'uptrain.method': 'svd'}, r"^config.uptrain.method must be one of .*, got 'svd'$"),
        ({'uptrain.target': 'gqa4'}, r"^config.uptrain.target must be one of .*, got 'gqa4'$"),
    ],
)
def test_uptrain_settings_out_of_range_are_refused(overrides, message):
    """`config.uptrain` of a run to train: scripts/uptrain.py reads its defaults later."""
    from lm.convert import check_uptrain_config

    check_uptrain_config(tiny_config().uptrain)
    with pytest.raises(ValueError, match=message):
        check_uptrain_config(with_values(tiny_config(), overrides).uptrain)


def test_the_schedule_warning_is_for_runs_that_train_after_every_check(caplog):
    """`assemble` warns about a warmup that outlasts the run only for a run that trains (state
    'init' or 'resume'), never for one that reads or evaluates, and not before a config error,
    which then stands alone."""
    from lm.config import with_values
    from lm.train.run import assemble

    config = with_values(
        tiny_config(attention='mha'), {'train.steps': 5, 'train.warmup_steps': 100}
    )
    for state, warned in (('none', False), ('init', True)):
        caplog.clear()
        with caplog.at_level('WARNING'):
            assemble(config, state=state).close()
        assert ('ends after the last step 5' in caplog.text) == warned, state
    caplog.clear()
    with caplog.at_level('WARNING'), pytest.raises(ValueError, match='must be divisible'):
        assemble(with_values(config, {'model.num_heads': 3}), state='init')
    assert 'ends after' not in caplog.text


def test_load_config_file_refuses_a_file_that_is_not_python(tmp_path):
    """A library caller's load_config_file of a non-.py file (a run's config.json) is a one-line
    ValueError naming it, not importlib's AttributeError; a missing file is FileNotFoundError."""
    saved = tmp_path / 'config.json'
    saved.write_text('{"model": {}}')
    with pytest.raises(ValueError, match=r'config\.json is not a Python config file'):
        load_config_file(str(saved))
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_config_file(str(tmp_path / 'none.py'))
