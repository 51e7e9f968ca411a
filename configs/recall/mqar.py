"""Multi-query associative recall (Zoology's MQAR, lm/data/recall.py) for a 2-layer model; the
loss and `eval/recall_accuracy` count the answer tokens only:

  python train.py --config=configs/recall/mqar.py:mha --workdir=runs/mqar_mha

The optional argument picks the attention variant: mha (default), gqa<g> (e.g. gqa2), mqa, mla.
Not calibrated yet: MHA reached 27% held-out accuracy after 1000 of these steps (lr 3e-3, the
better of the two rates tried); docs/recall.md has the curves and the search so far.
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
        raise ValueError(f'configs/recall/mqar.py: {e}') from None
    # MLA at this width: d_c = 4·d_h and d_h^R = d_h / 2 as in DeepSeek-V2, with d_h = 32.
    config.model.mla.update(
        kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
    )
    config.data.update(
        source='mqar', seq_len=64, recall_pairs=8, recall_vocab=256, recall_eval_examples=1000
    )
    config.train.update(
        batch_size=64,
        steps=3000,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=200,
        b2=0.99,
    )
    config.update(eval_every=250, log_every=50, checkpoint_every=1000, eval_batch_size=200)
    config.train.steps_per_call = 10
    return config
