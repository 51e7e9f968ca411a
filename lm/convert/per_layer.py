"""MHA / GQA → per-layer KV head counts (`config.model.kv_heads_per_layer`) under a total KV
budget, chosen from measured head similarity; pure functions over a checkpointed parameter tree.

Each layer's merge loss at g KV heads is what pooling its G heads into g groups of r = G / g
would lose: the best grouping's (lm/convert/head_merging.py `choose_groups`, the head-analysis
similarity: centred cosine of keys plus values, at most 2) summed 2 - sim over the pairs that
share a group, 0 when only identical heads are merged. `choose_counts` starts every layer at
its fewest heads and, while the budget allows, moves the layer whose next larger count (a
divisor of G and of num_heads) removes the most loss per added head: layers whose heads are
least alike get more KV heads. `convert_params` then pools each layer's chosen groups by mean.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from lm.convert import head_merging
from lm.convert.pooling import map_moments, merge_kv_heads


@dataclasses.dataclass(frozen=True)
class PerLayerRecipe:
    """How a conversion under a KV budget merges each layer's KV heads: to its `counts[layer]`
    heads, pooling the groups `groups[layer]` by their mean."""

    counts: tuple[int, ...]
    groups: list


def similarities(params: dict, inputs: list) -> list[np.ndarray]:
    """[L] each layer's [G, G] KV-head similarity on its attention inputs (`kv_similarity`)."""
    blocks = params['blocks'].values()
    return [head_merging.kv_similarity(b['attn'], x) for b, x in zip(blocks, inputs, strict=True)]


def merge_loss(sim_GG: np.ndarray, g: int) -> float:
    """What pooling the G heads (similarity `sim_GG`) into g groups loses: sum of 2 - sim over
    the pairs that share a group of the best grouping."""
    groups = head_merging.choose_groups(sim_GG, sim_GG.shape[0] // g)
    return sum(2 - sim_GG[a, b] for grp in groups for a, b in itertools.combinations(grp, 2))


def head_counts(G: int, H: int) -> list[int]:
    """The KV head counts a layer of G heads can pool to: divisors of G that divide H."""
    return [g for g in range(1, G + 1) if G % g == 0 and H % g == 0]


def choose_counts(sims: list[np.ndarray], num_heads: int, budget: int) -> tuple[int, ...]:
    """[L] KV heads per layer, summing to at most `budget`, greedily where they remove the
    most merge loss per head (ties: the lower layer); none is added where it removes none."""
    G, L = sims[0].shape[0], len(sims)
    options = head_counts(G, num_heads)
    if not options[0] * L <= budget <= G * L:
        raise ValueError(
            f'kv_budget={budget} must be between {options[0] * L} and {G * L} '
            f'(total KV heads over {L} layers of {G})'
        )
    loss = [{g: merge_loss(sim, g) for g in options} for sim in sims]
    counts = [options[0]] * L
    while True:
        moves = []
        for i, g in enumerate(counts):
            bigger = [h for h in options if h > g and sum(counts) + h - g <= budget]
            if bigger and loss[i][g] > loss[i][bigger[0]]:  # heads that remove no loss: none
                h = bigger[0]
                moves.append(((loss[i][g] - loss[i][h]) / (h - g), -i, h))
        if not moves:
            return tuple(counts)
        _, i, h = max(moves)
        counts[-i] = h


def layer_groups(sims: list[np.ndarray], counts: tuple[int, ...]) -> list:
    """[L] each layer's KV-head groups at its count (the best grouping, `choose_groups`)."""
    pairs = zip(sims, counts, strict=True)
    return [head_merging.choose_groups(sim, sim.shape[0] // g) for sim, g in pairs]


def convert_params(params: dict, counts: tuple[int, ...], groups: list | None = None) -> dict:
    """The parameter tree (or a moment tree shaped like it) with layer i's K/V heads
    mean-pooled to counts[i]: `groups[i]` merged (heads permuted first,
    `head_merging.permute_heads`; default: consecutive runs)."""
    params = head_merging.permute_and_rotate(params, groups, None)
    out = dict(params)
    out['blocks'] = {}
    for (name, block), g in zip(params['blocks'].items(), counts, strict=True):
        attn = dict(block['attn'])
        for proj in ('k_proj', 'v_proj'):
            attn[proj] = {
                k: merge_kv_heads(v, 1 if k == 'kernel' else 0, g, 'mean')
                for k, v in attn[proj].items()
            }
        out['blocks'][name] = {**block, 'attn': attn}
    return out


def convert_opt_state(opt_state, params: dict, counts: tuple[int, ...], groups: list):
    """The optax state with every moment tree shaped like `params` (Adam's mu and nu) pooled
    as `convert_params` pools the weights (the mean of the merged heads' moments); counts and
    the rest kept."""
    return map_moments(opt_state, params, lambda tree, _: convert_params(tree, counts, groups))
