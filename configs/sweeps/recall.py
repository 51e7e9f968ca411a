r"""The attention variants on MQAR (configs/recall/mqar.py, calibrated: MHA reaches >= 90%):
MHA, GQA-2 (2 KV heads of 4), MQA and MLA at equal width (d_model 128, 4 heads of 32, 2
layers), the held-out recall accuracy and answer loss per point with Holm-marked orderings.

  python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall --seeds=5
"""

import os

from lm.config import load_config_file


def get_config():
    return load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))


def get_points():
    return [
        {'name': 'mha', 'model.attention': 'mha'},
        {'name': 'gqa2', 'model.attention': 'gqa', 'model.num_kv_heads': 2},
        {'name': 'mqa', 'model.attention': 'mqa'},
        {'name': 'mla', 'model.attention': 'mla'},
    ]
