"""Pure functions over checkpointed trees that K/V-head conversions share: pooling runs of
heads, and applying a conversion to every layer's K/V projections or to an optimizer state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import optax

if TYPE_CHECKING:
    from lm.convert.cla import CLARecipe


@dataclasses.dataclass(frozen=True)
class PoolRecipe:
    """How a pooling conversion (MHA -> GQA / MQA, lm/convert/uptrain.py) merges each layer's
    KV heads: to `num_kv_heads` by `method`, the heads permuted to `groups` and rotated by
    `rotations` first (per layer, lm/convert/head_merging.py; None: contiguous runs as they
    are); then, with `cla`, each few layers' K/V merged into one (lm/convert/cla.py)."""

    num_kv_heads: int
    method: str
    groups: list | None = None
    rotations: list | None = None
    cla: CLARecipe | None = None


def merge_kv_heads(x: jax.Array, head_axis: int, num_kv_heads: int, method: str) -> jax.Array:
    """Merges runs of consecutive heads along `head_axis` down to `num_kv_heads` heads."""
    G = x.shape[head_axis]
    r = G // num_kv_heads
    grouped = x.reshape(x.shape[:head_axis] + (num_kv_heads, r) + x.shape[head_axis + 1 :])
    if method in ('mean', 'aligned'):
        return grouped.mean(axis=head_axis + 1, dtype=jnp.float32).astype(x.dtype)
    return jnp.take(grouped, 0, axis=head_axis + 1)


def map_kv(params: dict, fn: Callable[[dict], dict]) -> dict:
    """`params` with fn applied to every layer's k_proj and v_proj dicts; the rest shared."""
    out = dict(params)
    out['blocks'] = {}
    for layer, block in params['blocks'].items():
        attn = dict(block['attn'])
        for name in ('k_proj', 'v_proj'):
            attn[name] = fn(dict(attn[name]))
        out['blocks'][layer] = {**block, 'attn': attn}
    return out


def merge_proj(proj: dict, num_kv_heads: int, method: str) -> dict:
    proj['kernel'] = merge_kv_heads(proj['kernel'], 1, num_kv_heads, method)  # [E, G, D]
    if 'bias' in proj:
        proj['bias'] = merge_kv_heads(proj['bias'], 0, num_kv_heads, method)  # [G, D]
    return proj


def map_opt_state(opt_state, replace):
    """`opt_state` (optax's namedtuples, tuples, lists and dicts) rebuilt with every node for
    which `replace(node)` is not None replaced by that value."""

    def visit(node):
        if (new := replace(node)) is not None:
            return new
        if isinstance(node, tuple) and hasattr(node, '_fields'):
            return type(node)(*(visit(x) for x in node))
        if isinstance(node, (tuple, list)):
            return type(node)(visit(x) for x in node)
        if isinstance(node, dict):
            return {k: visit(v) for k, v in node.items()}
        return node

    return visit(opt_state)


def map_moments(opt_state, params: dict, convert: Callable[[dict, bool], dict]):
    """`opt_state` with every moment tree (a subtree shaped like `params`) replaced by
    `convert(tree, second)`: Adam's mu (second False) and nu (second True), other such trees as
    first moments; counts and the rest kept."""
    treedef = jax.tree.structure(params)

    def moments(node):
        if isinstance(node, optax.ScaleByAdamState):
            return node._replace(mu=convert(node.mu, False), nu=convert(node.nu, True))
        if isinstance(node, dict) and jax.tree.structure(node) == treedef:
            return convert(node, False)
        return None

    return map_opt_state(opt_state, moments)
