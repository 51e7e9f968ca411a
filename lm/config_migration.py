"""Configs saved with older checkpoints, brought up to today's schema (configs/base.py).

Every key added to configs/base.py after checkpoints were first written is listed here with
the value that reproduces how runs behaved before it existed, and every key that moved with the
key that replaced it (MLA's knobs moved into the `model.mla` section). tests/old_configs/ holds
frozen
configs of earlier versions; tests check each upgrades to exactly today's keys, so a key added
without an entry here fails them.
"""

from __future__ import annotations

import ml_collections

# dotted key -> value that reproduces runs from before the key existed
ADDED_KEYS = {
    'train.steps_per_call': 1,
    'compilation_cache_dir': '',
    'model.o_bias': False,
    'model.rope_scaling': '',
    'model.rope_scaling_factor': 8.0,
    'model.rope_low_freq_factor': 1.0,
    'model.rope_high_freq_factor': 4.0,
    'model.rope_original_max_len': 8192,
    'model.mla.latent_norm_eps': 0.0,
    'data.eos_token': '',
    'train.max_loss_ratio': 0.0,
    'eval_tokens': 0,
    'eval_batch_size': 0,
    'data.decode_errors': 'replace',
    'data.hf_sample_by': 'line',
    'train.schedule_start': 0,
    'train.decay_steps': 0,
    'train.ramp_start': 0,
    'train.ramp_steps': 0,
    'uptrain.schedule': 'rewarm',
    'uptrain.optimizer_state': 'fresh',
    'data.num_proc': 1,
    'data.sampling': 'random',
    'data.document_mask': False,
    'uptrain.grouping': 'contiguous',
    'uptrain.target': '',
    'uptrain.groups': '',
    'uptrain.rope_pairs': '',
    'uptrain.calibration_tokens': 8192,
    'model.sliding_window': 0,
    'model.layer_pattern': '',
    'model.decode_chunk': 0,
    'model.decode_kernel': 'xla',
    'data.recall_seed': 0,
    'data.recall_eval_examples': 1000,
    'data.recall_pairs': 8,
    'data.recall_vocab': 256,
    'data.recall_power_a': 0.01,
    'data.passkey_lengths': '128,256',
    'data.passkey_depths': '0,0.25,0.5,0.75,1',
    'model.kv_share_every': 1,
    'model.kv_heads_per_layer': (),
    'data.split': '',
    'data.uptrain_fraction': 0.1,
    'data.heldout_fraction': 0.5,
    'uptrain.kv_budget': 0,
    'model.kv_quant_group': 32,
    'model.mla.rope_heads': 1,
    'model.logits_dtype': 'float32',
    'train.xla_options': '',
    'data.recall_train_pairs': '',
    'train.ensemble': 0,
    'train.ensemble_loop': False,
    'train.ensemble_lr': '',
    'train.ensemble_min_lr': '',
    'eval_at_start': True,
    'mesh.rules.member': 'data',
    'data.split_layout': 'contiguous',
    'data.split_block': 1024,
}

# dotted key of an earlier version -> the same setting's key today (value kept)
MOVED_KEYS = {
    f'model.{name}': f'model.mla.{name}'
    for name in (
        'kv_lora_rank',
        'q_lora_rank',
        'qk_nope_head_dim',
        'qk_rope_head_dim',
        'v_head_dim',
        'latent_norm_eps',
    )
}
# dotted key of an earlier version -> the key that replaced it (`upgrade_config` converts it)
REPLACED_KEYS = {'eval_batches': 'eval_tokens', **MOVED_KEYS}


def _node(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    """(the section holding dotted `key`, made if absent; the key's last name)."""
    *parents, leaf = key.split('.')
    node = config
    for name in parents:
        if name not in node:
            node[name] = ml_collections.ConfigDict()
        node = node[name]
    return node, leaf


def _move_keys(config: ml_collections.ConfigDict) -> None:
    """Each `MOVED_KEYS` key present moves to its new place with its value."""
    for old, new in MOVED_KEYS.items():
        section, leaf = _node(config, old)
        if leaf in section:
            value = section[leaf]
            del section[leaf]
            node, name = _node(config, new)
            node[name] = value


def _upgrade_eval_batches(config: ml_collections.ConfigDict) -> None:
    """An old `eval_batches = N` becomes `eval_tokens`: 0 (whole split) stays 0; N > 0 keeps its
    cost, N · batch_size · seq_len tokens, now spread evenly over the whole split instead of
    taken from its start (the first windows were not representative). An explicit
    `eval_tokens` > 0 beside it wins."""
    if 'eval_batches' not in config:
        return
    n = config.eval_batches
    del config['eval_batches']
    if not config.get('eval_tokens'):
        config.eval_tokens = n * config.train.batch_size * config.data.seq_len if n > 0 else 0


def fill_added_keys(config: ml_collections.ConfigDict) -> list[str]:
    """Sets each `ADDED_KEYS` key that `config` lacks (a config written by older code, e.g. by a
    sweep started before the key existed) to its recorded value; returns the keys it set."""
    filled = []
    with config.unlocked():
        for key, value in ADDED_KEYS.items():
            node, leaf = _node(config, key)
            if leaf not in node:
                node[leaf] = value
                filled.append(key)
    return filled


def upgrade_config(saved: dict) -> ml_collections.ConfigDict:
    """A config saved with a checkpoint (or an older config file), with moved keys in their new
    places, the keys added since it was written filled in and `eval_batches` converted to
    `eval_tokens`."""
    config = ml_collections.ConfigDict(saved)
    _upgrade_eval_batches(config)
    _move_keys(config)
    fill_added_keys(config)
    return config
