r"""The learning-rate grid of the MQAR sweep (configs/sweeps/recall.py runs lr 3e-3): every
variant at a constant lr of 1e-3 and 6e-3 as well, the rest of configs/recall/mqar.py unchanged.
Is there an lr at which every seed leaves the no-recall plateau within 1500 steps?

  python scripts/sweep.py --config=configs/sweeps/recall_lr.py --sweep_dir=runs/recall_lr \
      --seeds=5 --points=mha_lr1e-3,mha_lr6e-3,mla_lr1e-3 --config.mesh.cpu_devices=1 \
      --parallel=2
"""

import os

from lm.config import load_config_file

VARIANTS = {
    'mha': {'model.attention': 'mha'},
    'gqa2': {'model.attention': 'gqa', 'model.num_kv_heads': 2},
    'mqa': {'model.attention': 'mqa'},
    'mla': {'model.attention': 'mla'},
}
LRS = {'1e-3': 1e-3, '6e-3': 6e-3}


def get_config():
    return load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))


def get_points():
    return [
        {'name': f'{v}_lr{name}', **keys, 'train.lr': lr, 'train.min_lr': lr}
        for v, keys in VARIANTS.items()
        for name, lr in LRS.items()
    ]
