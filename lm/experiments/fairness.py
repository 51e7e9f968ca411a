"""Equal budgets for comparisons: an equal-parameter sweep widens (or narrows) the SwiGLU width
of each point so its parameter count is within 1% of the MHA point's (Shazeer 2019 kept
parameters equal this way when comparing multi-query with multi-head attention).

Equal width (the default) changes nothing: every point keeps the base config's shapes.
"""

from __future__ import annotations

import copy

import ml_collections

from lm.data.corpus import load_tokenizer
from lm.model import attention
from lm.model.accounting import param_counts
from lm.model.config import ModelConfig
from lm.model.transformer import model_config

MATCHES = ('width', 'params')
TOLERANCE = 0.01

DESCRIPTIONS = {
    'width': 'equal width: every point has the base config’s depth, d_model and mlp_dim',
    'params': (
        'equal parameters: each point’s mlp_dim is set so its parameter count is within '
        '1% of the MHA reference’s'
    ),
}


def _model(config: ml_collections.ConfigDict, vocab_size: int, mlp_dim: int = 0) -> ModelConfig:
    model = copy.deepcopy(config.model.to_dict())
    model['vocab_size'] = model['vocab_size'] or vocab_size
    if mlp_dim:
        model['mlp_dim'] = mlp_dim
    return model_config(ml_collections.ConfigDict(model))


def reference_config(
    base: ml_collections.ConfigDict, configs: list[ml_collections.ConfigDict]
) -> ml_collections.ConfigDict:
    """The sweep's first MHA point, or the base config made MHA when no point is MHA."""
    mha = attention.baseline()
    for config in configs:
        if config.model.attention == mha['attention']:
            return config
    ref = ml_collections.ConfigDict(copy.deepcopy(base.to_dict()))
    ref.model.update(mha)
    return ref


def match_parameters(
    configs: list[ml_collections.ConfigDict],
    reference: ml_collections.ConfigDict,
    names: list[str] | None = None,
) -> list[ml_collections.ConfigDict]:
    """Copies of `configs` whose `model.mlp_dim` puts each within 1% of `reference`'s
    parameters (`lm.model.accounting.param_counts`; multiples of `mesh.tensor` when it is > 1).
    Raises a one-line ValueError naming a point that the MLP width alone cannot match."""
    vocab = reference.model.vocab_size or load_tokenizer(reference.data).vocab_size
    target = param_counts(_model(reference, vocab))['total']
    out = []
    for i, config in enumerate(configs):
        name = names[i] if names else f'point {i}'
        cfg = _model(config, vocab)
        total = param_counts(cfg)['total']
        per_unit = param_counts(_model(config, vocab, cfg.mlp_dim + 1))['total'] - total
        multiple = max(1, config.mesh.tensor)
        mlp_dim = round((cfg.mlp_dim + (target - total) / per_unit) / multiple) * multiple
        got = param_counts(_model(config, vocab, max(mlp_dim, 1)))['total']
        if mlp_dim < 1 or abs(got - target) > TOLERANCE * target:
            raise ValueError(
                f"--match=params: {name} cannot come within 1% of the reference's {target:,} "
                f'parameters by its MLP width (mlp_dim={mlp_dim} gives {got:,})'
            )
        matched = ml_collections.ConfigDict(copy.deepcopy(config.to_dict()))
        matched.model.mlp_dim = mlp_dim
        out.append(matched)
    return out
