r"""The attention variants on MQAR at a second d_model: configs/recall/mqar.py at d_model 64
(4 heads of 16, SwiGLU 192 wide, 2 layers; MLA with d_c = 4 d_h = 64 and a RoPE key of
d_h / 2 = 8, as at d_model 128), beside configs/sweeps/recall.py's d_model 128. The same task,
schedule and held-out rows.

  python scripts/sweep.py --config=configs/sweeps/recall_d64.py --sweep_dir=runs/recall_d64 \
      --seeds=5 --grid seed=5 --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))
    config.model.d_model = 64
    config.model.mla.update(kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    return config


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
