r"""The attention variants on MQAR at another d_model: configs/recall/mqar.py with d_model set by
the argument (default 64), still 4 heads (d_h = d_model / 4) and 2 layers, SwiGLU at its
default width, MLA with d_c = 4 d_h and a RoPE key d_h / 2 wide (the d_model 128 ratios); the
same task, schedule and held-out rows as configs/sweeps/recall.py.

  python scripts/sweep.py --config=configs/sweeps/recall_width.py:64 \
      --sweep_dir=runs/recall_d64 --seeds=5 --grid seed=5 --config.mesh.cpu_devices=1 \
      --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config(d_model: str = '64'):
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))
    width = int(d_model)
    if width % 8:
        raise ValueError(
            f'configs/sweeps/recall_width.py: d_model must be a multiple of 8, got {width}'
        )
    d_h = width // 4
    config.model.d_model = width
    config.model.mla.update(
        kv_lora_rank=4 * d_h, qk_nope_head_dim=d_h, qk_rope_head_dim=d_h // 2, v_head_dim=d_h
    )
    return config


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
