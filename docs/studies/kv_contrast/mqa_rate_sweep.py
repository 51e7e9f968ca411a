r"""The MQA-rate question's sweep file (mqa_rate_statement.md): configs/sweeps/attention_kinds.py's
point `mqa` at each peak rate of RATES, the floor at a tenth of it (the recipe's ratio); points
are named mqa_lr<rate>.

  python scripts/sweep.py --config=docs/studies/kv_contrast/mqa_rate_sweep.py \
      --sweep_dir=runs/mqa_rate_grid --points=mqa_lr0.002 --seeds=5 --ensemble
"""

import os

from lm.config import load_config_file

# Peak rates and their floors, written out (lr / 10 for each): the grid and two rungs past
# each edge of it.
RATES = {
    1.25e-4: 1.25e-5,
    2.5e-4: 2.5e-5,
    5e-4: 5e-5,
    1e-3: 1e-4,
    2e-3: 2e-4,
    4e-3: 4e-4,
    8e-3: 8e-4,
    1.6e-2: 1.6e-3,
}


def point_name(lr: float) -> str:
    """MQA's sweep point at peak rate `lr`, e.g. 'mqa_lr0.002'."""
    return f'mqa_lr{lr:g}'


def get_config():
    """configs/sweeps/attention_kinds.py's config, unchanged."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3)
    return load_config_file(os.path.join(root, 'configs', 'sweeps', 'attention_kinds.py'))


def get_points():
    return [
        {'name': point_name(lr), 'model.attention': 'mqa', 'train.lr': lr, 'train.min_lr': floor}
        for lr, floor in RATES.items()
    ]
