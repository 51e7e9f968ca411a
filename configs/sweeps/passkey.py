r"""The attention variants on passkey retrieval (configs/recall/passkey.py: MQAR's model, d_model
128, 4 heads of 32, 2 layers; a 5-digit key in filler text of 128-257 bytes at depths 0-1):
MHA, GQA-2 (2 KV heads of 4), MQA and MLA at equal width, the held-out key-digit accuracy (by
depth and length) and answer loss per point with Holm-marked orderings.

  python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey --seeds=5 \
      --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    return load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'passkey.py'))


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
