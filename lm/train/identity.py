"""A run's config identity: which settings may change when it resumes (`RESUMABLE_KEYS`), its
fingerprint over the others (`config_fingerprint`: sweeps and results.json record it), and the
changes a resume under another config would make (`config_changes`), refused unless allowed
(`check_config_change`)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import ml_collections

from lm.config import default_values
from lm.config_migration import upgrade_config
from lm.data.checks import reset_idle_data
from lm.data.files import split_paths

# Config keys (or whole sections, ending in '.') that may change when a run resumes: they set
# how long it trains, how often it logs / evaluates / saves, where caches go, how devices are
# laid out and how XLA compiles the step (its kernels, so its rounding; an ensemble's members
# looped or vmapped), but not the maths a step asks for. Any other change needs
# --allow_config_change.
RESUMABLE_KEYS = (
    'train.steps',
    'train.steps_per_call',
    'train.ensemble_loop',
    'train.xla_options',
    'train.peak_flops',
    'train.max_loss_ratio',
    'eval_every',
    'eval_at_start',
    'eval_batches',
    'log_every',
    'checkpoint_every',
    'keep_checkpoints',
    'async_checkpointing',
    'compilation_cache_dir',
    'data.cache_dir',
    'data.num_proc',
    'mesh.',
)


def flat_config(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """{'train.lr': 0.001, ...} with values as JSON gives them back (tuples become lists)."""
    tree = json.loads(config.to_json()) if hasattr(config, 'to_json') else config
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f'{prefix}{key}.')
            else:
                out[f'{prefix}{key}'] = value

    walk(tree, '')
    return out


def resumable_key(key: str) -> bool:
    """Whether config key `key` may change when a run resumes (`RESUMABLE_KEYS`)."""
    return any(key == k or (k.endswith('.') and key.startswith(k)) for k in RESUMABLE_KEYS)


def config_fingerprint(config: ml_collections.ConfigDict) -> str:
    """A short hash of every setting outside RESUMABLE_KEYS: equal for configs a run may resume
    under, different for any other change."""
    flat = {k: v for k, v in flat_config(config).items() if not resumable_key(k)}
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:16]


def as_used(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config`, read back from a run, with the data settings the run never read set back to
    configs/base.py's (`lm.data.checks.reset_idle_data`; in place, and returned): a run made
    before such a setting was refused reads back as what it used, not as a config new runs
    refuse."""
    reset_idle_data(config.data, default_values('data'))
    return config


def config_changes(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
    """['train.lr: 0.001 -> 0.003', ...]: the settings outside RESUMABLE_KEYS in which `config`
    differs from `saved` (a checkpoint's config, upgraded to today's keys, `as_used`). A
    `model.vocab_size` of 0 ("from the tokenizer") matches any saved size, and a `data.path`
    that names the same files (absolute or relative) matches."""
    old, new = flat_config(as_used(upgrade_config(saved))), flat_config(config)
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, '(absent)'), new.get(key, '(absent)')
        if a == b or resumable_key(key) or (key == 'model.vocab_size' and b == 0):
            continue
        if key == 'data.path' and _same_files(a, b):
            continue
        changes.append(f'{key}: {a!r} -> {b!r}')
    return changes


def _same_files(a: Any, b: Any) -> bool:
    """Whether two `data.path` values name the same files in the same order, each read from
    here (one given absolute, the other relative to this directory, say)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    one, two = split_paths(a), split_paths(b)
    return len(one) == len(two) and all(
        x == y or (os.path.isfile(x) and os.path.isfile(y) and os.path.samefile(x, y))
        for x, y in zip(one, two, strict=True)
    )


def check_config_change(
    saved: dict | None, config: ml_collections.ConfigDict, where: str, allow: bool
) -> list[str]:
    """Raises a one-line ValueError when `config` differs from the config `saved` with the
    checkpoint in `where` (see `config_changes`), unless `allow`; returns the changes."""
    if saved is None:
        return []
    changes = config_changes(saved, config)
    if changes and not allow:
        raise ValueError(
            f'{where} was trained with a different config: {"; ".join(changes)}; resume with '
            'the same settings, use a new workdir, or pass --allow_config_change to go on '
            'under the new ones'
        )
    return changes
