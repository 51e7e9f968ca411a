"""`config.uptrain` of a run to train, checked when train.py starts: the defaults scripts/uptrain.py
reads from it later and the choices it records there (lm/convert/uptrain.py writes them). A module
of its own, so train.py checks it without importing the conversions."""

from __future__ import annotations

import math

import ml_collections

from lm.convert.methods import GROUPINGS, LATENT_METHODS, OPTIMIZER_STATES, POOL_METHODS, SCHEDULES
from lm.model import attention


def check_uptrain_config(up: ml_collections.ConfigDict) -> None:
    """One-line errors for `config.uptrain` of a run to train: the defaults scripts/uptrain.py
    reads from it later (fraction, warmup_steps, calibration_tokens) and the choices it records
    there, each one of its values (a run converted by it always passes)."""
    if not (math.isfinite(up.fraction) and up.fraction >= 0):
        raise ValueError(f'config.uptrain.fraction must be a finite number >= 0, got {up.fraction}')
    for key, least in (('warmup_steps', -1), ('kv_budget', 0), ('calibration_tokens', 1)):
        if up[key] < least:
            raise ValueError(f'config.uptrain.{key} must be >= {least}, got {up[key]}')
    if up.source_step < -1:
        raise ValueError(f'config.uptrain.source_step must be >= -1, got {up.source_step}')
    for key, allowed in (
        ('schedule', SCHEDULES),
        ('optimizer_state', OPTIMIZER_STATES),
        ('grouping', GROUPINGS),
        ('method', ('', *POOL_METHODS, *LATENT_METHODS)),
        ('target', ('', *sorted(attention.VARIANTS))),
    ):
        if up[key] not in allowed:
            raise ValueError(f'config.uptrain.{key} must be one of {allowed}, got {up[key]!r}')
