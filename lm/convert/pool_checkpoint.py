"""MHA → GQA / MQA conversion of a checkpoint's trees, as pure functions (Ainslie et al. 2023,
§2.1): the parameters (`convert_params`), the optimizer's moments like the weights
(`convert_moments`, `convert_opt_state`) and a fresh state's schedule count
(`with_schedule_count`). lm/convert/uptrain.py applies them to a run's checkpoint."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from lm.convert import head_merging
from lm.convert.options import ConversionOptions, check_conversion
from lm.convert.pooling import map_kv, map_moments, map_opt_state, merge_kv_heads, merge_proj
from lm.model.config import DTYPES, ModelConfig


def convert_params(
    params: dict,
    src: ModelConfig,
    num_kv_heads: int,
    method: str,
    seed: int = 0,
    groups: list | None = None,
    inputs: list | None = None,
    rotations: list | None = None,
) -> dict:
    """The parameter tree (pure dict, as checkpointed) with every layer's k_proj / v_proj
    converted to `num_kv_heads` heads, merging `groups[layer]` (default: consecutive runs; the
    heads are permuted first, `head_merging.permute_heads`). 'aligned' rotates heads first by
    `rotations` (default: `alignments` fitted on the layers' attention inputs `inputs`, [M, E]
    each), then mean-pools. Unchanged parameters are shared, not copied."""
    check_conversion(src, ConversionOptions(num_kv_heads=num_kv_heads, method=method))
    if method == 'aligned' and rotations is None:
        if inputs is None:
            raise ValueError("method='aligned' needs the layers' calibration inputs")
        rotations = head_merging.alignments(params, num_kv_heads, groups, inputs)
    params = head_merging.permute_and_rotate(
        params, groups, rotations if method == 'aligned' else None
    )
    if method != 'random':
        return map_kv(params, lambda proj: merge_proj(proj, num_kv_heads, method))
    key = jax.random.key(seed)

    def fresh(proj: dict) -> dict:
        nonlocal key
        key, sub = jax.random.split(key)
        E, _, D = proj['kernel'].shape
        std = 1 / math.sqrt(E)  # the model's own init (lm/model/layers.py)
        proj['kernel'] = std * jax.random.normal(sub, (E, num_kv_heads, D), DTYPES[src.param_dtype])
        if 'bias' in proj:
            proj['bias'] = jnp.zeros((num_kv_heads, D), proj['bias'].dtype)
        return proj

    return map_kv(params, fresh)


def convert_moments(
    moments: dict,
    num_kv_heads: int,
    method: str,
    groups: list | None = None,
    rotations: list | None = None,
    second: bool = False,
    then: Callable[[dict, bool], dict] | None = None,
) -> dict:
    """An optimizer moment tree mirroring the parameters (Adam's mu, or nu if `second`)
    converted like `convert_params` converts the weights: heads permuted to `groups`, rotated
    by `rotations` ('aligned': mu exactly, nu by the squared rotations), K/V moments pooled by
    `method`, zero for 'random' (the fresh K/V have no history); other moments shared. `then`
    (tree, second) -> tree: a further step, such as merging layers (lm/convert/cla.py)."""
    if method != 'random':
        moments = head_merging.permute_and_rotate(moments, groups, rotations, second)
        moments = map_kv(moments, lambda proj: merge_proj(proj, num_kv_heads, method))
    else:
        moments = map_kv(
            moments,
            lambda proj: {
                k: jnp.zeros_like(merge_kv_heads(v, v.ndim - 2, num_kv_heads, 'first'))
                for k, v in proj.items()
            },
        )
    return then(moments, second) if then else moments


def convert_opt_state(
    opt_state,
    params: dict,
    num_kv_heads: int,
    method: str,
    groups: list | None = None,
    rotations: list | None = None,
    then: Callable[[dict, bool], dict] | None = None,
):
    """The optax state `opt_state` (namedtuples, tuples and dicts) with every subtree shaped like
    `params` (the moments; Adam's nu as a second moment) converted by `convert_moments`;
    counts and the rest kept."""
    rotations = rotations if method == 'aligned' else None
    return map_moments(
        opt_state,
        params,
        lambda tree, second: convert_moments(
            tree, num_kv_heads, method, groups, rotations, second=second, then=then
        ),
    )


def with_schedule_count(opt_state, step: int):
    """`opt_state` with the learning-rate schedule's step counts set to `step` (a fresh state of
    a run continuing at `step`: Adam's own count stays 0, the schedule reads the global step)."""

    def schedule_count(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.full_like(node.count, step))
        return None

    return map_opt_state(opt_state, schedule_count)
