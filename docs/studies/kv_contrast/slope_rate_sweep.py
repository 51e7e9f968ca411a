r"""The per-halving-slope-at-own-rates question's sweep file (slope_rate_statement.md): the four
KV-head points of configs/sweeps/attention_kinds.py (mha, gqa4, gqa2, mqa: 8, 4, 2, 1 KV heads)
at each peak rate of LADDER, the floor at a tenth of it (the recipe's ratio); points are named
<arm>_lr<rate>.

  python scripts/sweep.py --config=docs/studies/kv_contrast/slope_rate_sweep.py \
      --sweep_dir=runs/slope_rate_grid --points=gqa4_lr0.002,gqa2_lr0.002 --seeds=5 --ensemble
"""

import importlib.util
import os

ARMS = ('mha', 'gqa4', 'gqa2', 'mqa')  # attention_kinds' points, in halvings of the KV heads
LADDER = (1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # the grid, two rungs past it
KINDS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3, 'configs', 'sweeps'
)


def point_name(arm: str, lr: float) -> str:
    """The sweep point of `arm` at peak rate `lr`, e.g. 'gqa4_lr0.002'."""
    return f'{arm}_lr{lr:g}'


def _kinds():
    """configs/sweeps/attention_kinds.py as a module."""
    spec = importlib.util.spec_from_file_location(
        '_attention_kinds', os.path.join(KINDS, 'attention_kinds.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config():
    """configs/sweeps/attention_kinds.py's config, unchanged."""
    return _kinds().get_config()


def get_points():
    kinds = {p['name']: p for p in _kinds().get_points()}
    return [
        {**kinds[arm], 'name': point_name(arm, lr), 'train.lr': lr, 'train.min_lr': lr / 10}
        for arm in ARMS
        for lr in LADDER
    ]
