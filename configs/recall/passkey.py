"""Passkey retrieval (lm/data/recall.py): a 5-digit key hidden in filler text at depths 0 to 1
of examples 128, 192 and 257 bytes long; the loss counts the key's digits only, and evaluation
reports `eval/recall_accuracy` with one scalar per depth, per length and per (depth, length):

  python train.py --config=configs/recall/passkey.py:mha --workdir=runs/passkey_mha

The optional argument picks the attention variant: mha (default), gqa<g> (e.g. gqa2), mqa, mla.
Not yet calibrated (docs/recall.md).
"""

import os

from lm.config import load_config_file
from lm.model.attention import parse_variant


def get_config(variant: str = 'mha'):
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'base.py'))
    config.model.update(d_model=128, num_layers=2, num_heads=4, head_dim=0, vocab_size=0)
    try:
        config.model.update(parse_variant(variant))
    except ValueError as e:
        raise ValueError(f'configs/recall/passkey.py: {e}') from None
    # MLA at this width: d_c = 4·d_h and d_h^R = d_h / 2 as in DeepSeek-V2, with d_h = 32.
    config.model.mla.update(
        kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
    )
    config.data.update(
        source='passkey',
        seq_len=256,
        passkey_lengths='128,192,257',
        passkey_depths='0,0.25,0.5,0.75,1',
        recall_eval_examples=600,  # 40 per (depth, length) cell
    )
    config.train.update(batch_size=32, steps=2000, lr=3e-3, min_lr=3e-4, warmup_steps=200, b2=0.99)
    config.update(eval_every=250, log_every=50, checkpoint_every=1000, eval_batch_size=120)
    config.train.steps_per_call = 10
    return config
