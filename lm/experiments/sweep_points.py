"""Sweep points: the grid's (`parse_grid`), their configs (`point_config`), short run names
(`run_name`), and which of
them can run (`valid_points`): a model that cannot be built is skipped, a data setting a point
gives that its run would not read is dropped (`_without_idle`), a base data setting some points
do not read is reset in those (`_reset_idle`), and a grid value no point can run with refused.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection
from typing import Any

import ml_collections

from lm.config import default_values, parse_assignment, with_values
from lm.data.checks import (
    check_data_config,
    reset_idle_data,
    unread_data_keys,
)
from lm.experiments.pareto import TB_RUN
from lm.model import attention
from lm.model.transformer import check_model_config
from lm.train.identity import flat_config
from lm.train.optimizer import check_train_config
from lm.train.run import check_loop_config
from lm.train.workdir import safe_name

SHORT = {
    'model.num_heads': 'h',
    'model.num_kv_heads': 'kv',
    'model.num_layers': 'l',
    'model.d_model': 'd',
    'model.head_dim': 'hd',
    'model.mla.kv_lora_rank': 'dc',
    'train.lr': 'lr',
    'train.batch_size': 'b',
    'data.seq_len': 't',
    'seed': 's',
}


def parse_grid(config: ml_collections.ConfigDict, grids: list[str]) -> list[dict[str, Any]]:
    """`['model.num_heads=4,8', ...]` -> the cartesian product as a list of points."""
    axes, keys = [], set()
    for grid in grids:
        key, values = parse_assignment(config, grid, '--grid')
        if key in keys:
            raise ValueError(f'--grid: {key} is given twice; list its values once ({key}=a,b)')
        if len(set(map(repr, values))) < len(values):
            raise ValueError(f'--grid {grid!r}: a value is repeated; each value once')
        keys.add(key)
        axes.append([(key, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def point_config(
    base: ml_collections.ConfigDict, point: dict[str, Any]
) -> ml_collections.ConfigDict:
    """`base` with a point's values set ('seeds' is the sweep's, not a config key)."""
    return with_values(base, {k: v for k, v in point.items() if k != 'seeds'})


def invalid_reason(config: ml_collections.ConfigDict) -> str | None:
    """Why a point's model config cannot be built, or None if it can."""
    try:
        check_model_config(config.model)
    except ValueError as e:
        return str(e)
    return None


def _without_idle(named: dict, config: ml_collections.ConfigDict) -> tuple[dict, dict]:
    """`named` (a point) without the data settings it gives that its run would not read
    (`data.bpe_vocab_size` with the byte tokenizer), its name without their values and its
    `config` reset to configs/base.py's for them (in place); and {key: why} of those dropped."""
    defaults = default_values('data')
    unread = unread_data_keys(config.data)
    dropped = {f'data.{k}': why for k, why in unread.items() if f'data.{k}' in named}
    kept = {k: v for k, v in named.items() if k not in dropped}
    for key in dropped:
        config.data[key[5:]] = defaults[key[5:]][0]
        if kept.get('name'):  # a sweep-file point's name carries the grid's values
            kept['name'] = kept['name'].replace('_' + value_parts({key: named[key]})[0], '')
    return kept, dropped


def _reset_idle(valid: list[tuple]) -> None:
    """Sets the data settings of the base config (or --config) that a point's run never reads
    back to configs/base.py's (`reset_idle_data`), so its config says what it uses, with a
    one-line note per setting; a setting no point reads is refused (it would do nothing)."""
    defaults, idle = default_values('data'), {}
    for name, _, config in valid:
        for setting, why in reset_idle_data(config.data, defaults).items():
            idle.setdefault((f'data.{setting}', why), []).append(name)
    for (setting, why), names in idle.items():
        if len(names) == len(valid):
            raise ValueError(
                f'config.{setting} does nothing in any sweep point ({why}); leave it out'
            )
        print(f'{setting} does nothing in {", ".join(names)} ({why}): left at its default there')


# Keys the kind-and-heads part of a run's name already says.
NAMED = ('seeds', 'model.attention', 'model.num_heads', 'model.num_kv_heads')


def run_name(point: dict[str, Any], config: ml_collections.ConfigDict) -> str:
    """A short name that TensorBoard shows whole: the attention kind and query heads, the KV
    heads where the kind leaves them free (`gqa_h8_kv2`, `mha_h8`, `mqa_h8`, `mla_h8`), then
    the point's other values ({'train.lr': 0.001} -> `_lr0.001`)."""
    cfg = check_model_config(config.model)
    kind = attention.variant(cfg)
    parts = [cfg.attention, f'h{cfg.num_heads}']
    implied = kind.parse_spec(cfg.attention) or {}
    if cfg.num_kv_heads and 'num_kv_heads' not in implied:  # the kind's name leaves them free
        parts.append(f'kv{cfg.num_kv_heads}')
    return '_'.join(parts + value_parts({k: v for k, v in point.items() if k not in NAMED}))


def value_parts(values: dict[str, Any]) -> list[str]:
    """A run name's parts for these values: {'train.lr': 0.001} -> ['lr0.001'], with any
    character a directory or CSV name should not hold as '-' ('128,256' -> '128-256')."""

    def text(value: Any) -> str:
        return '-'.join(map(str, value)) if isinstance(value, tuple | list) else str(value)

    return [
        SHORT.get(key, key.split('.')[-1]) + re.sub(r'[^A-Za-z0-9.+-]', '-', text(value))
        for key, value in values.items()
    ]


def valid_points(
    base: ml_collections.ConfigDict,
    points: list[dict],
    chosen: bool = False,
    grid_keys: Collection[str] = (),
) -> list[tuple]:
    """[(name, point, config)] of the points whose model can be built; a one-line note for each
    skipped one, or, when the points were `chosen` by name (--points), a one-line error. A value
    of a `grid_keys` key that no point can run with (a typo: `model.attention=gqa,weird`) is
    refused: skipping is for combinations of values that do not fit together. A data setting a
    point gives that its run would not read is dropped from it (`_without_idle`), and a point
    that is then another's run is left out; a grid key dropped from every point is refused."""
    valid, skipped, dropped = [], {}, {}
    for named in points:
        try:
            config = point_config(base, {k: v for k, v in named.items() if k != 'name'})
        except (TypeError, ValueError) as e:  # a key the config lacks, a value of another type
            raise ValueError(f'sweep point {named.get("name") or named}: {e}') from None
        given, (named, idle) = named, _without_idle(named, config)
        dropped.update(idle)
        point = {k: v for k, v in named.items() if k != 'name'}
        if reason := invalid_reason(config):
            if chosen:
                raise ValueError(f'--points: {named.get("name") or point} cannot run: {reason}')
            print(f'skipping {named.get("name") or point}: {reason}')
            for key in (k for k in grid_keys if k in point):
                skipped.setdefault((key, repr(point[key])), (point[key], reason))
            continue
        name = safe_name(named.get('name') or run_name(point, config), 'sweep point')
        same = idle and next((n for n, _, c in valid if flat_config(c) == flat_config(config)), '')
        if same:
            shown = given.get('name') or {k: v for k, v in given.items() if k != 'name'}
            print(f'leaving out {shown}: the run of {same} ({", ".join(idle)} would do nothing)')
            continue
        _check_point(name, config)
        valid.append((name, point, config))
    _check_grid_values(valid, skipped, dropped, grid_keys)
    _reset_idle(valid)
    return valid


def _check_point(name: str, config: ml_collections.ConfigDict) -> None:
    """Refuses now, not in each of its runs, a setting no run of the point can train with."""
    if name == TB_RUN:
        raise ValueError(
            f"sweep point {name}: '{TB_RUN}' is the TensorBoard run of the sweep's Pareto "
            'figures; give the point another name'
        )
    try:
        check_train_config(config.train)
        check_loop_config(config)
        check_data_config(config.data)
    except ValueError as e:
        raise ValueError(f'sweep point {name}: {e}') from None


def _check_grid_values(valid: list, skipped: dict, dropped: dict, grid_keys) -> None:
    """Refuses a grid value that no valid point runs with, a grid key dropped from every
    point as a setting its runs would not read, and a sweep with no valid point."""
    ran = {(k, repr(p[k])) for _, p, _ in valid for k in grid_keys if k in p}
    for (key, _), (value, reason) in skipped.items():
        if (key, repr(value)) not in ran:
            raise ValueError(f'--grid {key}={value!r}: no point can run with it ({reason})')
    for key in grid_keys:
        if key in dropped and not any(key in p for _, p, _ in valid):
            raise ValueError(f'--grid {key}: does nothing in any point ({dropped[key]})')
    if not valid:
        raise ValueError('the sweep has no valid point')
