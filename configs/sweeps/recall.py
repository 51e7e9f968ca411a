r"""The attention variants on MQAR (configs/recall/mqar.py, calibrated: MHA reaches >= 90%):
MHA, GQA-2 (2 KV heads of 4), MQA and MLA at equal width (d_model 128, 4 heads of 32, 2
layers), the held-out recall accuracy and answer loss per point with Holm-marked orderings.

  python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall --seeds=5
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    return load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
