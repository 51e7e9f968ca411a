r"""Why MLA learns MQAR least (docs/studies/recall/README.md): configs/recall/mqar.py's MLA (4 heads
of 32, latent 128 + a 16-wide RoPE key) with a RoPE key as wide as a head (32, so q·k 32 + 32
wide), and with a latent twice as wide (256, as many elements as MHA's K and V), 5 seeds each,
beside the 4-head sweep's MLA runs (configs/sweeps/recall.py, seeds 0-9).

  python scripts/sweep.py --config=configs/sweeps/recall_mla.py --sweep_dir=runs/recall_mla \
      --seeds=5 --config.mesh.cpu_devices=1 --parallel=2
"""

import os

from lm.config import load_config_file


def get_config():
    return load_config_file(os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar.py'))


def get_points():
    return [
        {'name': 'mla_rope32', 'model.attention': 'mla', 'model.mla.qk_rope_head_dim': 32},
        {'name': 'mla_c256', 'model.attention': 'mla', 'model.mla.kv_lora_rank': 256},
    ]
