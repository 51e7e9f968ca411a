r"""The MQAR capacity sweep (docs/studies/mqar_capacity/README.md): at d_model 64 and 4 query
heads (configs/recall/mqar_zoology.py), the KV state per token per layer (KV heads x head_dim)
against the number of pairs, rows of 4 x pairs tokens; each point's seeds as one ensemble.

  python scripts/sweep.py --config=configs/sweeps/mqar_capacity.py \
      --sweep_dir=runs/mqar_capacity --seeds=8 --ensemble --parallel=3 \
      --config.mesh.cpu_devices=1 --config.train.ensemble_loop=True
"""

import os

from lm.config import load_config_file

# KV dims per token per layer (K and V each): (attention, KV heads, head_dim).
ARMS = {64: ('mha', 4, 16), 16: ('mqa', 1, 16), 8: ('mqa', 1, 8)}
PAIRS = (4, 8, 16)


def get_config():
    path = os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar_zoology.py')
    return load_config_file(path)


def get_points():
    return [
        {
            'name': f'kv{dims}_p{pairs}',
            'model.attention': attention,
            'model.num_kv_heads': kv_heads if attention == 'gqa' else 0,
            'model.head_dim': head_dim,
            'data.recall_pairs': pairs,
            'data.seq_len': 4 * pairs,
        }
        for pairs in PAIRS
        for dims, (attention, kv_heads, head_dim) in ARMS.items()
    ]
