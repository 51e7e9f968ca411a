"""Config plumbing: config files (loaded, or checked with one-line errors: `check_config_file`,
`check_config_keys`, `check_value_types`), and dotted-key access and overrides
('model.num_heads=8') used by the command line, sweeps and tests. The typed view of
`config.model` the model reads is `lm.model.config.ModelConfig`.

The schema is configs/base.py: every key with a one-line comment. Configs saved with older
checkpoints are brought up to it by lm/config_migration.py."""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.util
import inspect
import os
import re
import types
from typing import Any

import ml_collections
from absl import logging

from lm.config_migration import ADDED_KEYS, fill_added_keys

# The schema every run config starts from: configs/base.py of this checkout.
BASE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'base.py'
)


@functools.cache
def _base_dict() -> dict:
    return load_config_file(BASE).to_dict()


def default_values(section: str) -> dict[str, tuple]:
    """{key: its default values} of `config.<section>`: configs/base.py's, and for a key added
    since checkpoints were first written also the value an older run's config is upgraded
    with (`ADDED_KEYS`), e.g. to tell a setting changed from its default."""
    added = {k.split('.', 1)[1]: v for k, v in ADDED_KEYS.items() if k.startswith(f'{section}.')}
    return {
        key: (value, added[key]) if key in added and added[key] != value else (value,)
        for key, value in copy.deepcopy(_base_dict()[section]).items()
    }


def load_module(path: str) -> types.ModuleType:
    """The Python file at `path` run as a module (a config or sweep file); one line for a file
    that is missing or not a .py."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'config file {path!r} does not exist')
    spec = importlib.util.spec_from_file_location('_lm_config_file', path)
    if spec is None:  # Python's loader takes only .py
        raise ValueError(f'{path} is not a Python config file (a .py with get_config())')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """Runs `get_config([arg])` from a config file, as `--config=path[:arg]` does on the CLI."""
    module = load_module(path)
    return module.get_config(arg) if arg is not None else module.get_config()


def write_config_file(config: ml_collections.ConfigDict, path: str) -> str:
    """Writes `config` as a config file (`get_config()` returning it) for --config=path."""
    with open(path, 'w') as f:
        f.write(
            'import json\n\nimport ml_collections\n\n\ndef get_config():\n'
            f'    return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n'
        )
    return path


def dotted_keys(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
    """Every leaf key of `config` in dotted form ('model.num_heads', 'model.mla.kv_lora_rank')."""
    keys = []
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            keys += dotted_keys(value, f'{prefix}{name}.')
        else:
            keys.append(prefix + name)
    return keys


def get_key(config: ml_collections.ConfigDict, key: str, flag: str = 'config') -> Any:
    """The value at dotted `key` ('model.num_heads'); ValueError naming `flag` and the nearest
    existing key if absent."""
    node = config
    for part in key.split('.'):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            near = difflib.get_close_matches(key, dotted_keys(config), n=1, cutoff=0.6)
            hint = f' (did you mean {near[0]!r}?)' if near else ''
            raise ValueError(f'{flag}: unknown config key {key!r}{hint}')
        node = node[part]
    return node


def set_key(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the value at dotted `key`, which must exist (`get_key`)."""
    get_key(config, key)
    *parents, leaf = key.split('.')
    node = config
    for part in parents:
        node = node[part]
    node[leaf] = value


def _a_type(kind: type) -> str:
    """A type named with its article, for messages: 'an int', 'a float', 'a bool'."""
    name = kind.__name__
    return f'{"an" if name[0] in "aeiou" else "a"} {name}'


def parse_value(key: str, raw: str, like: Any, flag: str = 'config') -> Any:
    """`raw` parsed with the type of `like`, the config's current value at `key`."""
    if isinstance(like, ml_collections.ConfigDict):
        raise ValueError(f'{flag}: {key!r} is a section, not a value')
    if isinstance(like, tuple | list):  # '4,2,2,1' or '(4, 2, 2, 1)': ints, as the CLI reads
        items = raw.strip().strip('()[]').replace(' ', '')
        try:
            return tuple(int(v) for v in items.split(',') if v) if items else ()
        except ValueError:
            raise ValueError(f'{flag} {key}: {raw!r} is not a tuple of ints (4,2,2,1)') from None
    try:
        if isinstance(like, bool):
            if raw.lower() not in ('true', 'false', '1', '0'):
                raise ValueError
            return raw.lower() in ('true', '1')
        return type(like)(raw)
    except ValueError:
        raise ValueError(f'{flag} {key}: {raw!r} is not {_a_type(type(like))}') from None


def split_items(text: str) -> list[str]:
    """A flag's list: separated by ';' when the text holds one, so items may contain commas
    ('64,128;256'; a trailing ';' makes one such item: '64,128;'), else by ','."""
    if ';' not in text:
        return text.split(',')
    items = text.split(';')
    return items[:-1] if items[-1] == '' else items


def hides_a_pair(value: str) -> bool:
    """True if a value holds a comma-joined second key=value ('a=1,b=2' gives value '1,b=2'),
    which a list of key=value pairs was probably meant to split off."""
    return re.search(r',\s*[\w.]+=', value) is not None


def parse_assignment(
    config: ml_collections.ConfigDict, item: str, flag: str = 'config'
) -> tuple[str, list[Any]]:
    """'model.num_heads=4,8' -> ('model.num_heads', [4, 8]), typed like the config's values;
    'data.passkey_lengths=64,128;256' -> two text values (`split_items`)."""
    key, sep, values = item.partition('=')
    key = key.strip()
    if not sep or not values.strip():
        raise ValueError(f'{flag} {item!r}: expected key=value1,value2,...')
    like = get_key(config, key, flag)
    return key, [parse_value(key, v.strip(), like, flag) for v in split_items(values)]


def with_values(
    base: ml_collections.ConfigDict, values: dict[str, Any]
) -> ml_collections.ConfigDict:
    """A copy of `base` with `{'model.dtype': 'bfloat16', ...}` set (every key must exist)."""
    config = ml_collections.ConfigDict(copy.deepcopy(base.to_dict()))
    for key, value in values.items():
        like = get_key(config, key)
        try:
            set_key(config, key, value)
        except TypeError:  # ConfigDict keeps each key's type
            raise ValueError(
                f'{key}={value!r} is {_a_type(type(value))}; the config has '
                f'{_a_type(type(like))} there ({like!r})'
            ) from None
    return config


def with_overrides(
    config: ml_collections.ConfigDict, overrides: list[str], flag: str = '--set'
) -> ml_collections.ConfigDict:
    """A copy of `config` with `['model.dtype=bfloat16', ...]` applied, one value per key typed
    like the config's: a text setting keeps its commas ('data.passkey_lengths=128,256'), and
    'key=' sets it to ''."""
    values = {}
    for item in overrides:
        key, sep, raw = item.partition('=')
        key = key.strip()
        if not sep or not key:
            raise ValueError(f'{flag} {item!r}: expected key=value')
        values[key] = parse_value(key, raw.strip(), get_key(config, key, flag), flag)
    return with_values(config, values)


def first_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(e).strip().splitlines()
    return f'{type(e).__name__}: {lines[0]}' if lines else type(e).__name__


def check_config_file(spec: str, flag: str = '--config') -> ml_collections.ConfigDict:
    """Loads `path[:arg]` as `--config` does, with a one-line ValueError naming the flag for a
    missing file, a syntax error, an error while it runs, no `get_config`, an argument that
    `get_config` does not take (or rejects), and a result that is not a ConfigDict."""
    path, sep, arg = spec.partition(':')
    where = f'{flag}={spec}'
    if os.path.isdir(path):
        raise ValueError(f'{where}: {path!r} is a directory, not a config file')
    if not os.path.isfile(path):
        raise ValueError(f'{where}: config file {path!r} does not exist')
    if not path.endswith('.py'):  # Python's loader takes only .py (a run's config.json, say)
        raise ValueError(f'{where}: {path} is not a Python config file (a .py with get_config())')
    try:
        with open(path, 'rb') as f:
            compile(f.read(), path, 'exec')
    except SyntaxError as e:
        raise ValueError(f'{where}: syntax error in {path} line {e.lineno}: {e.msg}') from None
    except ValueError as e:  # null bytes: not a Python file
        raise ValueError(f'{where}: {path} is not a Python config file ({e})') from None
    try:
        module = load_module(path)
    except Exception as e:  # noqa: BLE001 - any error in the user's file is reported in one line
        raise ValueError(f'{where}: {path} fails to run ({first_line(e)})') from None
    get_config = getattr(module, 'get_config', None)
    if not callable(get_config):
        raise ValueError(f'{where}: {path} defines no get_config() function')
    args = (arg,) if sep else ()
    try:
        inspect.signature(get_config).bind(*args)
    except TypeError:
        if sep:
            raise ValueError(f'{where}: get_config() in {path} takes no argument') from None
        raise ValueError(f'{where}: get_config() in {path} needs an argument (path:ARG)') from None
    try:
        config = get_config(*args)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f'{where}: get_config() failed ({first_line(e)})') from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(
            f'{where}: get_config() returned {type(config).__name__}, '
            'not an ml_collections.ConfigDict'
        )
    if isinstance(config, ml_collections.FrozenConfigDict):  # overrides could not be set
        raise ValueError(
            f'{where}: get_config() returned a FrozenConfigDict; return an '
            'ml_collections.ConfigDict (the command line and sweeps set values on it)'
        )
    return config


def check_config_keys(config: ml_collections.ConfigDict, flag: str = '--config') -> None:
    """A run config must hold every key of configs/base.py (configs start from it); keys added
    to base.py since the config was written (lm.config_migration.ADDED_KEYS, e.g. a sweep's
    per-run config from before a code update) are filled with their recorded values, with a
    warning. Values are checked first (`check_value_types`)."""
    check_value_types(config, flag)
    if filled := fill_added_keys(config):
        shown = ', '.join(f'{k}={ADDED_KEYS[k]!r}' for k in filled)
        logging.warning(
            '%s: keys added since the config was written, set as before: %s', flag, shown
        )
    base = load_config_file(BASE)

    def missing(want, have, prefix):
        for key, value in want.items():
            if key not in have:
                yield prefix + key
            elif isinstance(value, ml_collections.ConfigDict):
                if isinstance(have[key], ml_collections.ConfigDict):
                    yield from missing(value, have[key], f'{prefix}{key}.')
                else:
                    yield prefix + key

    if gaps := list(missing(base, config, '')):
        shown = ', '.join(gaps[:5]) + (f' and {len(gaps) - 5} more' if len(gaps) > 5 else '')
        raise ValueError(
            f'{flag}: the config lacks {shown}; start it from configs/base.py '
            '(load_config_file(base.py) and change values)'
        )


def _fits(value: Any, like: Any) -> bool:
    """True if `value` may stand where configs/base.py has `like`: the same type, an int for
    a float, a list for a tuple; never a bool for a number."""
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(like, bool)
    if isinstance(like, float):
        return isinstance(value, (int, float))
    if isinstance(like, (tuple, list)):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(like))


def check_value_types(config: ml_collections.ConfigDict, flag: str = '--config') -> None:
    """One-line ValueError for a value whose type is not the one configs/base.py gives its key
    ('model.num_heads=4.0' where base has an int), before it reaches a shape or an optimizer.
    A config built from base.get_config() cannot hold one (ConfigDict keeps types); one built
    from a dict, or read from JSON, can."""

    def check(want: dict, have: ml_collections.ConfigDict, prefix: str) -> None:
        for key, like in want.items():
            if key not in have:
                continue  # `check_config_keys` reports missing keys
            value = have[key]
            if isinstance(like, dict):
                if isinstance(value, ml_collections.ConfigDict):
                    check(like, value, f'{prefix}{key}.')
                else:
                    raise ValueError(
                        f'{flag}: config.{prefix}{key} is a section in configs/base.py, '
                        f'not a value ({value!r})'
                    )
            elif not _fits(value, like):
                raise ValueError(
                    f'{flag}: config.{prefix}{key}={value!r} is {_a_type(type(value))}; '
                    f'configs/base.py has {_a_type(type(like))} there ({like!r})'
                )

    check(_base_dict(), config, '')
