r"""KV layouts across layers beside head sharing: MHA and MQA, cross-layer attention (CLA2: every
two layers share one K/V; MQA-CLA2, GQA-2-CLA2) and per-layer KV head counts, at the depth and
width of configs/sweeps/attention_kinds.py (8 heads of 16, d_model 128, 4 layers) on Tiny
Shakespeare. With --match=params the MLP widths make every point as large as MHA (CLA's
consumer layers have no K/V projections).

  python scripts/sweep.py --config=configs/sweeps/kv_layouts.py --sweep_dir=runs/kv_layouts \
      --config.data.path=data/tinyshakespeare.txt --seeds=5
"""

import os

from lm.config import load_config_file


def get_config():
    path = os.path.join(os.path.dirname(__file__), 'attention_kinds.py')
    return load_config_file(path)


def get_points():
    return [
        {'name': 'mha', 'model.attention': 'mha'},
        {'name': 'mqa', 'model.attention': 'mqa'},
        {'name': 'cla2', 'model.attention': 'mha', 'model.kv_share_every': 2},
        {
            'name': 'gqa2_cla2',
            'model.attention': 'gqa',
            'model.num_kv_heads': 2,
            'model.kv_share_every': 2,
        },
        {'name': 'mqa_cla2', 'model.attention': 'mqa', 'model.kv_share_every': 2},
        {
            'name': 'kv_8421',
            'model.attention': 'gqa',
            'model.kv_heads_per_layer': (8, 4, 2, 1),
        },
    ]
