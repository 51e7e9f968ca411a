"""Which KV heads share, and how they are merged: similarity grouping and aligned merging for
MHA → GQA conversion (lm/convert/uptrain.py), as pure functions over one layer's attention
parameters.

A layer's attention parameters are the checkpointed dict of `GroupedQueryAttention`: q_proj
[E, H, D], k_proj / v_proj [E, G, D], o_proj [H, D, E] (each {'kernel', optional 'bias'}). Query
head i reads KV head i // R, R = H / G. Merging G heads into g = G / r pools runs of r consecutive
KV heads (`lm.convert.pooling.merge_kv_heads`), so both methods here first rewrite the layer so that
the heads to be merged are consecutive and alike, keeping the layer's function exactly:

- Grouping (AsymGQA, arXiv 2406.14963; QCQA, 2406.10247): which r source KV heads share a head.
  `choose_groups` maximises the summed within-group similarity of the head-analysis tool
  (lm/analysis/scores.py: centred cosine of the heads' pre-RoPE keys plus that of their values;
  linear
  CKA for the values when they are aligned first, since alignment removes rotations) over every
  partition into equal groups when there are at most `MAX_EXHAUSTIVE` of them, greedily
  otherwise. `permute_heads` then reorders the KV heads group by group, and the query heads
  and the rows of o_proj with them, so the model is the same function before pooling.
- Aligned merging (arXiv 2412.20677): each head of a group is rotated onto the group's first
  head by orthogonal Procrustes on its activations before the group is averaged; the rotation
  is folded into the projections that read the head, so before pooling nothing changes.
  Values: a full orthogonal Q_V [D, D] (v → v·Q_V, W_O rows of the head's queries ← Q_Vᵀ·W_O).
  Keys: RoPE rotates each frequency pair (i, i + D/2) by a position-dependent angle, and the
  score q·k survives a rotation of k's basis only if the same rotation applied to q commutes with
  every RoPE rotation. The orthogonal matrices that do are the per-pair 2-D rotations (the pairs'
  frequencies are distinct; reflections do not commute), so Q_K is restricted to them: one
  Procrustes angle per pair, applied to k_proj and to the q_proj of the head's queries. A full
  key rotation would be a better fit but would change the model (RoPE would no longer commute).

Shape letters as in lm/model/transformer.py; M calibration tokens, J = D / 2 RoPE frequency pairs.
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np

from lm.analysis import scores

MAX_EXHAUSTIVE = 10_000  # partitions scored one by one up to this many; greedy beyond


def num_partitions(G: int, r: int) -> int:
    """Ways to split G heads into G / r unordered groups of r: G! / (r!^(G/r) · (G/r)!)."""
    g = G // r
    return math.factorial(G) // (math.factorial(r) ** g * math.factorial(g))


def _partitions(heads: tuple[int, ...], r: int):
    """Every partition of `heads` into groups of r, each group led by its smallest head."""
    if not heads:
        yield ()
        return
    first, rest = heads[0], heads[1:]
    for others in itertools.combinations(rest, r - 1):
        left = tuple(h for h in rest if h not in others)
        for tail in _partitions(left, r):
            yield ((first, *others), *tail)


def _score(sim_GG: np.ndarray, groups) -> float:
    """Summed similarity of the pairs of heads that share a group."""
    return sum(sim_GG[a, b] for group in groups for a, b in itertools.combinations(group, 2))


def _greedy_groups(sim_GG: np.ndarray, r: int) -> list[tuple[int, ...]]:
    """Groups grown one at a time: the most similar pair of heads left, then the head with the
    largest summed similarity to the group until it holds r."""
    left, groups = set(range(sim_GG.shape[0])), []
    while left:
        pairs = itertools.combinations(sorted(left), 2)
        group = list(max(pairs, key=lambda p: sim_GG[p[0], p[1]]))
        while len(group) < r:
            group.append(max(sorted(left - set(group)), key=lambda h: sim_GG[h, group].sum()))
        groups.append(tuple(sorted(group)))
        left -= set(group)
    return sorted(groups)


def choose_groups(sim_GG: np.ndarray, r: int) -> list[tuple[int, ...]]:
    """The partition of the G heads into groups of r with the largest summed within-group
    similarity (`sim_GG` symmetric): exhaustive up to MAX_EXHAUSTIVE partitions (ties: the first
    in lexicographic order, so uninformative similarities give contiguous groups), greedy beyond.
    Groups sorted by their smallest head, heads sorted within."""
    G = sim_GG.shape[0]
    if r == 1:
        return [(h,) for h in range(G)]
    if num_partitions(G, r) > MAX_EXHAUSTIVE:
        return _greedy_groups(sim_GG, r)
    return list(max(_partitions(tuple(range(G)), r), key=lambda p: _score(sim_GG, p)))


def group_permutation(groups: list[tuple[int, ...]]) -> np.ndarray:
    """[G] new KV head p holds source head perm[p]: the groups laid out one after another."""
    return np.array([h for group in groups for h in group])


def query_permutation(perm_G: np.ndarray, H: int) -> np.ndarray:
    """[H] the query heads that follow `perm_G`: new KV head p's R = H / G queries are source KV
    head perm[p]'s, in their order."""
    R = H // len(perm_G)
    return (np.asarray(perm_G)[:, None] * R + np.arange(R)[None, :]).reshape(-1)


def permute_heads(attn: dict, perm_G: np.ndarray) -> dict:
    """The layer's attention dict (parameters, or an Adam moment tree of the same shape) with KV
    heads reordered by `perm_G` and query heads and o_proj rows with them: the same function."""
    H = attn['q_proj']['kernel'].shape[1]
    perm_H = query_permutation(perm_G, H)
    out = dict(attn)
    for name, perm, axis_of in (
        ('q_proj', perm_H, {'kernel': 1, 'bias': 0}),
        ('k_proj', perm_G, {'kernel': 1, 'bias': 0}),
        ('v_proj', perm_G, {'kernel': 1, 'bias': 0}),
        ('o_proj', perm_H, {'kernel': 0}),  # o_proj's bias [E] has no head axis
    ):
        out[name] = {
            k: jnp.take(v, perm, axis=axis_of[k]) if k in axis_of else v
            for k, v in attn[name].items()
        }
    return out


def projections(proj: dict, x_ME: np.ndarray) -> np.ndarray:
    """[M, heads, D] float64: x·W (+ b) of a projection with a head axis (pre-RoPE)."""
    y = np.einsum('ME,EGD->MGD', x_ME, np.asarray(proj['kernel'], np.float64))
    return y + np.asarray(proj['bias'], np.float64)[None] if 'bias' in proj else y


def kv_similarity(attn: dict, x_ME: np.ndarray, value_metric: str = 'cosine') -> np.ndarray:
    """[G, G] the head-analysis tool's similarity of the layer's KV heads on inputs x_ME:
    centred cosine of keys plus `value_metric` ('cosine' | 'cka') of values."""
    metric = {'cosine': scores.centred_cosine, 'cka': scores.linear_cka}
    sims = []
    for name, kind in (('k_proj', 'cosine'), ('v_proj', value_metric)):
        moments = scores.head_moments(jnp.asarray(projections(attn[name], x_ME), jnp.float32))
        sims.append(metric[kind](scores.head_covariance(moments)))
    return sims[0] + sims[1]


def procrustes(cross_DD: np.ndarray) -> np.ndarray:
    """The orthogonal Q minimising ||X·Q - Y||_F given cross_DD = Xᵀ·Y: U·Vᵀ of its SVD."""
    u, _, vt = np.linalg.svd(cross_DD)
    return u @ vt


def rope_procrustes(cross_DD: np.ndarray) -> np.ndarray:
    """The Q minimising ||X·Q - Y||_F (cross_DD = Xᵀ·Y) among the rotations that commute with
    RoPE (rotate-half layout): a 2-D rotation of each pair (i, i + D/2) by the angle
    atan2(Σ x_a·y_b − x_b·y_a, Σ x_a·y_a + x_b·y_b), a = i, b = i + D/2."""
    D = cross_DD.shape[0]
    a, b = np.arange(D // 2), np.arange(D // 2) + D // 2
    phi_J = np.arctan2(cross_DD[a, b] - cross_DD[b, a], cross_DD[a, a] + cross_DD[b, b])
    q_DD = np.zeros((D, D))
    q_DD[a, a] = q_DD[b, b] = np.cos(phi_J)
    q_DD[a, b], q_DD[b, a] = np.sin(phi_J), -np.sin(phi_J)
    return q_DD


def _rotate(proj: dict, heads: list[int], q_DD: np.ndarray, rows: bool) -> dict:
    """`proj` with the head-axis entries `heads` of its kernel and bias multiplied by q_DD on the
    right ([E, heads, D] kernels, [heads, D] biases) or, `rows` (o_proj [H, D, E]), by q_DDᵀ on
    the left; o_proj's bias [E] has no head axis and stays."""
    out = dict(proj)
    for k, v in proj.items():
        if rows and k == 'bias':
            continue
        w = np.array(v, np.float64)
        if rows:
            # w'[h, f, e] = sum_d q[d, f] · w[h, d, e]
            w[heads] = np.einsum('DF,HDE->HFE', q_DD, w[heads])
        elif k == 'kernel':
            w[:, heads] = w[:, heads] @ q_DD
        else:
            w[heads] = w[heads] @ q_DD
        out[k] = jnp.asarray(w, v.dtype)
    return out


def alignment_rotations(attn: dict, x_ME: np.ndarray, r: int) -> dict[int, tuple]:
    """{KV head: (Q_K, Q_V)} rotating every head of each run of r consecutive KV heads onto the
    run's first head: keys by `rope_procrustes`, values by `procrustes`, fitted on the layer's
    attention inputs x_ME (raw, uncentred projections: the mean is pooled too)."""
    G = attn['k_proj']['kernel'].shape[1]
    cross = {}
    for name in ('k_proj', 'v_proj'):
        y_MGD = projections(attn[name], x_ME)
        # cross[g, d, h, e] = sum_m y[m, g, d] · y[m, h, e]
        cross[name] = np.einsum('MGD,MHE->GDHE', y_MGD, y_MGD)
    return {
        head: (
            rope_procrustes(cross['k_proj'][head, :, head - head % r, :]),
            procrustes(cross['v_proj'][head, :, head - head % r, :]),
        )
        for head in range(G)
        if head % r
    }


def rotate_heads(attn: dict, rotations: dict[int, tuple], second_moment: bool = False) -> dict:
    """The layer with KV head j's keys rotated by Q_K (and its query heads' q_proj with them)
    and its values by Q_V (its query heads' o_proj rows by Q_Vᵀ): the same function.
    `second_moment`: `attn` is Adam's nu, which is carried by Q∘Q (elementwise squares), exact
    when the gradient's coordinates are uncorrelated; first moments rotate like the weights."""
    G, H = attn['k_proj']['kernel'].shape[1], attn['q_proj']['kernel'].shape[1]
    R = H // G
    out = dict(attn)
    for head, (q_k, q_v) in rotations.items():
        if second_moment:
            q_k, q_v = q_k**2, q_v**2
        queries = list(range(head * R, (head + 1) * R))
        out['k_proj'] = _rotate(out['k_proj'], [head], q_k, rows=False)
        out['q_proj'] = _rotate(out['q_proj'], queries, q_k, rows=False)
        out['v_proj'] = _rotate(out['v_proj'], [head], q_v, rows=False)
        out['o_proj'] = _rotate(out['o_proj'], queries, q_v, rows=True)
    return out


def align_groups(attn: dict, x_ME: np.ndarray, r: int) -> dict:
    """The layer with the heads of each run of r consecutive KV heads aligned to the run's first
    (`alignment_rotations`, folded by `rotate_heads`): the same function, ready to mean-pool."""
    return rotate_heads(attn, alignment_rotations(attn, x_ME, r))


def alignments(params: dict, num_kv_heads: int, groups: list | None, inputs: list) -> list:
    """[L] {KV head: (Q_K, Q_V)}: method 'aligned''s rotations of each layer's heads (permuted
    to `groups`) onto their group's first head, fitted on the attention inputs `inputs`."""
    params = permute_and_rotate(params, groups, None)
    rotations = []
    for block, x_ME in zip(params['blocks'].values(), inputs, strict=True):
        r = block['attn']['k_proj']['kernel'].shape[1] // num_kv_heads
        rotations.append(alignment_rotations(block['attn'], x_ME, r))
    return rotations


def permute_and_rotate(
    tree: dict, groups: list | None, rotations: list | None, second: bool = False
) -> dict:
    """`tree` (parameters or an Adam moment) with each layer's heads permuted so that
    `groups[layer]` are consecutive, then rotated by `rotations[layer]` (`second`: a second
    moment, `rotate_heads`); the same function for parameters."""
    if groups is None and rotations is None:
        return tree
    out = dict(tree)
    out['blocks'] = {}
    for i, (layer, block) in enumerate(tree['blocks'].items()):
        attn = block['attn']
        if groups is not None:
            attn = permute_heads(attn, group_permutation(groups[i]))
        if rotations is not None:
            attn = rotate_heads(attn, rotations[i], second)
        out['blocks'][layer] = {**block, 'attn': attn}
    return out
