"""MHA / GQA → cross-layer attention (CLA, Brandon et al. 2024) checkpoint conversion, as pure
functions over a checkpointed parameter tree (or an Adam moment tree of the same shape).

With sharing factor n, layers i, ..., i + n - 1 (i a multiple of n) become one producer (layer i)
and its consumers: the producer's K/V projections are merged from the group's, the consumers'
are dropped (lm/model/layout.py). The merge mirrors MHA → GQA pooling (lm/convert/uptrain.py),
head h of every layer of a group pooled into the producer's head h:

- 'mean': the group's K and V projections (and biases) averaged;
- 'first' and 'random': the producer's own kept ('random' re-initialises K/V before, when the
  heads are pooled);
- 'aligned': each consumer's head h rotated onto the producer's head h by Procrustes on their
  activations on the same tokens (keys by the RoPE-commuting per-pair rotations, values by a full
  orthogonal matrix, lm/convert/head_merging.py), folded into the consumer's q_proj / o_proj
  (the same function before merging), then 'mean'.
`grouping='similarity'` first permutes each consumer's KV heads (with their query heads and
o_proj rows, the same function) so that head h is the one most like the producer's head h: the
assignment maximising the summed cross-layer similarity (the head-analysis measures: centred
cosine of keys plus values, linear CKA of both for 'aligned', whose rotations it must not see).
A consumer's keys come from its own input before the merge and from the producer's after it:
the merged model is an approximation, which uptraining then repairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from scipy import optimize

from lm.analysis import scores
from lm.convert import head_merging

MERGING = ('mean', 'aligned')  # methods that average the group; the others keep the producer's


def cross_similarity(
    attn_a: dict, x_a: np.ndarray, attn_b: dict, x_b: np.ndarray, aligned: bool = False
) -> np.ndarray:
    """[G, G]: similarity of head g of layer a with head h of layer b on the same tokens (their
    attention inputs x_a, x_b [M, E]): centred cosine of the keys plus that of the values, or
    (`aligned`, heads rotated before they are merged) their linear CKA, blind to rotations."""
    G, sim_GG = attn_a['k_proj']['kernel'].shape[1], 0.0
    metric = scores.linear_cka if aligned else scores.centred_cosine
    for name in ('k_proj', 'v_proj'):
        y_MGD = np.concatenate(
            [
                head_merging.projections(attn_a[name], x_a),
                head_merging.projections(attn_b[name], x_b),
            ],
            axis=1,
        )
        moments = scores.head_moments(jnp.asarray(y_MGD, jnp.float32))
        sim_GG = sim_GG + metric(scores.head_covariance(moments))[:G, G:]
    return sim_GG


def matching(sim_GG: np.ndarray) -> np.ndarray:
    """[G] perm: layer b's head perm[p] goes to place p, maximising sum_p sim[p, perm[p]]."""
    rows, cols = optimize.linear_sum_assignment(-sim_GG)
    return cols[np.argsort(rows)]


def _rotations(attn: dict, x: np.ndarray, producer: dict, x_p: np.ndarray) -> dict[int, tuple]:
    """{head: (Q_K, Q_V)} rotating each of the layer's KV heads onto the producer's same head."""
    out, G = {}, attn['k_proj']['kernel'].shape[1]
    cross = {}
    for name in ('k_proj', 'v_proj'):
        y_MGD = head_merging.projections(attn[name], x)
        # cross[g, d, e] = sum_m y[m, g, d] · y_producer[m, g, e]
        cross[name] = np.einsum(
            'MGD,MGE->GDE', y_MGD, head_merging.projections(producer[name], x_p)
        )
    for head in range(G):
        q_k = head_merging.rope_procrustes(cross['k_proj'][head])
        out[head] = (q_k, head_merging.procrustes(cross['v_proj'][head]))
    return out


@dataclasses.dataclass(frozen=True)
class CLARecipe:
    """How a CLA conversion merges each `share` adjacent layers' K/V: by `method`, after each
    consumer's heads are permuted to `groups` and rotated by `rotations` (per layer, for
    `head_merging.permute_and_rotate`; None: as they are)."""

    share: int
    method: str
    groups: list | None = None
    rotations: list | None = None


def plan(params: dict, share: int, method: str, grouping: str, inputs: list | None) -> CLARecipe:
    """The recipe merging each `share` layers by `method`: each consumer's heads matched to its
    producer's (`grouping='similarity'`) and rotated onto them (`method='aligned'`), fitted on
    the layers' calibration `inputs`."""
    if grouping != 'similarity' and method != 'aligned':
        return CLARecipe(share, method)
    blocks = [block['attn'] for block in params['blocks'].values()]
    G = blocks[0]['k_proj']['kernel'].shape[1]
    groups, rotations = [], []
    for j, attn in enumerate(blocks):
        i = j - j % share
        perm = np.arange(G)
        if j != i and grouping == 'similarity':
            sim_GG = cross_similarity(blocks[i], inputs[i], attn, inputs[j], method == 'aligned')
            perm = matching(sim_GG)
        groups.append([(int(h),) for h in perm])
        if j != i and method == 'aligned':
            attn = head_merging.permute_heads(attn, perm)
            rotations.append(_rotations(attn, inputs[j], blocks[i], inputs[i]))
        else:
            rotations.append({})
    return CLARecipe(share, method, groups, rotations if method == 'aligned' else None)


def share_layers(tree: dict, share: int, method: str) -> dict:
    """`tree` (parameters or a moment tree) with each producer's k_proj / v_proj merged from its
    group's (`MERGING` methods: the mean; otherwise its own) and the consumers' removed."""
    out, layers = dict(tree), list(tree['blocks'].items())
    out['blocks'] = {}
    for j, (name, block) in enumerate(layers):
        attn = dict(block['attn'])
        if j % share:
            del attn['k_proj'], attn['v_proj']
        elif method in MERGING:
            group = [blk['attn'] for _, blk in layers[j : j + share]]
            for proj in ('k_proj', 'v_proj'):
                attn[proj] = {
                    k: jnp.mean(
                        jnp.stack([a[proj][k] for a in group]), axis=0, dtype=jnp.float32
                    ).astype(v.dtype)
                    for k, v in attn[proj].items()
                }
        out['blocks'][name] = {**block, 'attn': attn}
    return out


def convert(tree: dict, recipe: CLARecipe, second: bool = False) -> dict:
    """`tree` (parameters, or a moment tree: `second` for Adam's nu) permuted and rotated by
    `recipe`, then merged by `share_layers`."""
    tree = head_merging.permute_and_rotate(tree, recipe.groups, recipe.rotations, second)
    return share_layers(tree, recipe.share, recipe.method)


def moment_step(recipe: CLARecipe) -> Callable[[dict, bool], dict]:
    """(moment tree, second) -> the tree converted like the parameters (`convert`): the last
    step of lm.convert.pool_checkpoint.convert_moments for a CLA target."""
    return lambda tree, second: convert(tree, recipe, second)
