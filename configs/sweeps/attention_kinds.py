r"""The first sweep to run: MHA, GQA-4, GQA-2, MQA and MLA at equal depth and width on Tiny
Shakespeare (8 heads of 16, d_model 128, 4 layers, the shakespeare_char recipe).

  python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds \
      --seeds=3
"""

import os

from lm.config import load_config_file


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'shakespeare_char.py'))
    config.model.update(num_heads=8, head_dim=16, num_kv_heads=0)
    # MLA: d_c = 4·d_h, d_h^R = d_h / 2 (DeepSeek-V2's ratios) with d_h = 16.
    config.model.mla.update(kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    # Fetched by `python scripts/get_data.py tinyshakespeare`.
    config.data.path = os.path.join(
        os.path.dirname(__file__), '..', '..', 'data', 'tinyshakespeare.txt'
    )
    return config


def get_points():
    return [
        {'name': 'mha', 'model.attention': 'mha'},
        {'name': 'gqa4', 'model.attention': 'gqa', 'model.num_kv_heads': 4},
        {'name': 'gqa2', 'model.attention': 'gqa', 'model.num_kv_heads': 2},
        {'name': 'mqa', 'model.attention': 'mqa'},
        {'name': 'mla', 'model.attention': 'mla'},
    ]
