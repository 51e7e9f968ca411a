r"""The attention variants on MQAR trained on a mixture of 2, 4 and 8 pairs per row
(`data.recall_train_pairs`, as Zoology trains on a mixture), scored on the same held-out rows
of 8 pairs as configs/sweeps/recall.py: MHA, GQA-2, MQA and MLA at equal width (d_model 128, 4
heads of 32, 2 layers). Asks whether easier rows let every seed leave the no-recall plateau.

  python scripts/sweep.py --config=configs/sweeps/recall_mix.py --sweep_dir=runs/recall_mix \
      --seeds=5 --grid seed=5 --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))
    config.data.recall_train_pairs = '2,4,8'
    return config


def get_points():
    return variant_points(['mha', 'gqa2', 'mqa', 'mla'])
