r"""KV layouts beside head sharing (MHA, GQA-2, MQA) and latent compression (MLA): cross-layer
attention (CLA2: every two layers share one K/V; MQA-CLA2, GQA-2-CLA2), per-layer KV head counts
and local/global layers (three sliding-window layers of W = 16 under one global, 'LLLG'), at the
depth and width of configs/sweeps/attention_kinds.py (8 heads of 16, d_model 128, 4 layers) on
Tiny Shakespeare. With --match=params the MLP widths make every point as large as MHA (CLA's
consumer layers have no K/V projections). KV bytes per token are a training-length (64-token)
sequence's: a local layer holds 16 slots of them.

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
        {'name': 'gqa2', 'model.attention': 'gqa', 'model.num_kv_heads': 2},
        {'name': 'mqa', 'model.attention': 'mqa'},
        {'name': 'mla', 'model.attention': 'mla'},
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
        {
            'name': 'mha_local',
            'model.attention': 'mha',
            'model.sliding_window': 16,
            'model.layer_pattern': 'LLLG',
        },
    ]
