r"""The per-arm-rate question's sweep file (rate_statement.md): MHA and MLA-64 of
configs/sweeps/attention_kinds.py at each rate of the grid and its edge extensions, the floor
scaled with the peak (min_lr = lr / 10, the recipe's ratio). Points are named <arm>_lr<rate>.

  python scripts/sweep.py --config=docs/studies/kv_contrast/rate_sweep.py \
      --sweep_dir=runs/rate_grid --points=mha_lr0.0005,mla64_lr0.0005 --seeds=5 --ensemble
"""

import os

from lm.config import load_config_file

# Peak rates and their floors, written out (lr / 10 for each).
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
ARMS = {'mha': 'mha', 'mla64': 'mla'}  # arm -> model.attention


def point_name(arm: str, lr: float) -> str:
    """The sweep point of `arm` at peak rate `lr`, e.g. 'mla64_lr0.002'."""
    return f'{arm}_lr{lr:g}'


def get_config():
    here = os.path.dirname(os.path.abspath(__file__))
    kinds = os.path.join(here, '..', '..', '..', 'configs', 'sweeps', 'attention_kinds.py')
    config = load_config_file(kinds)
    config.data.path = os.path.join(here, '..', '..', '..', 'data', 'tinyshakespeare.txt')
    return config


def get_points():
    return [
        {
            'name': point_name(arm, lr),
            'model.attention': attention,
            'train.lr': lr,
            'train.min_lr': floor,
        }
        for arm, attention in ARMS.items()
        for lr, floor in RATES.items()
    ]
