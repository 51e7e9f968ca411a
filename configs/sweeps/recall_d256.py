r"""The attention variants on MQAR at a second d_model: configs/recall/mqar.py at d_model 256
(4 heads of 64, SwiGLU 704 wide, 2 layers; MLA with d_c = 4 d_h = 256 and a RoPE key of
d_h / 2 = 32, as at d_model 128), beside configs/sweeps/recall.py's d_model 128. The same task,
schedule and held-out rows.

  python scripts/sweep.py --config=configs/sweeps/recall_d256.py --sweep_dir=runs/recall_d256 \
      --seeds=5 --grid seed=5 --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))
    config.model.d_model = 256
    config.model.mla.update(
        kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64
    )
    return config


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
