r"""The attention variants on MQAR with 8 query heads: MHA, GQA with 4 and 2 KV heads of 8, MQA
and MLA at equal width (configs/recall/mqar.py with 8 heads of 32: d_model 128, q 256 wide, 2
layers), beside configs/sweeps/recall.py's 4 heads of 32 (a second attention width; the KV
cache per token is twice the 4-head sweep's for MHA, the same for MQA).

  python scripts/sweep.py --config=configs/sweeps/recall_h8.py --sweep_dir=runs/recall_h8 \
      --seeds=5 --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))
    # calibrated as `h8x32` (docs/studies/recall/README.md)
    config.model.update(num_heads=8, head_dim=32)
    return config


def get_points():
    return variant_points(['mha', 'gqa4', 'gqa2', 'mqa', 'mla'])
