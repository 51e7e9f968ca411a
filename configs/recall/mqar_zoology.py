r"""MQAR as Zoology builds it (`source='mqar_zoology'`, lm/data/recall.py): the answers are
labels only, never in the input, and no policy that skips the key-value lookup beats 1/pairs
(tests/test_recall_zoology.py). A 2-layer model, d_model 64, 4 query heads of 16, tied
embeddings; the loss and `eval/recall_accuracy` count the answers only:

  python train.py --config=configs/recall/mqar_zoology.py:mha --workdir=runs/mqz_mha \
      --config.train.ensemble=8 --config.train.ensemble_loop=True --config.mesh.cpu_devices=1

The optional argument picks the attention variant: mha (default), gqa2, mqa, mla.

4 pairs over 1,024 symbols in rows of 16 tokens (4 x pairs: every query slot holds a query),
the calibrated recipe of the capacity study (docs/studies/mqar_capacity/README.md, 2026-11-29):
batch 64, AdamW with a linear warmup over 100 steps and the rate held constant after it
(min_lr = lr), beta2 0.99, weight decay 0, tied embeddings, 4000 steps. lr 3e-3 is the default;
the study chooses the rate per variant from {1e-3, 3e-3} on validation accuracy at step 3000
(MQAR is learned in a phase transition: a choice at step 500 picked a rate that never left
chance) and its sweep file, configs/sweeps/mqar_capacity.py, sets the chosen rates.
"""

import os

from lm.config import load_config_file
from lm.model.attention import parse_variant


def get_config(variant: str = 'mha'):
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'base.py'))
    config.model.update(
        d_model=64, num_layers=2, num_heads=4, head_dim=16, vocab_size=0, tie_embeddings=True
    )
    try:
        config.model.update(parse_variant(variant))
    except ValueError as e:
        raise ValueError(f'configs/recall/mqar_zoology.py: {e}') from None
    config.model.mla.update(kv_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    config.data.update(
        source='mqar_zoology',
        seq_len=16,
        recall_pairs=4,
        recall_vocab=1024,
        recall_eval_examples=1000,
    )
    config.train.update(
        batch_size=64,
        steps=4000,
        lr=3e-3,
        min_lr=3e-3,
        warmup_steps=100,
        weight_decay=0.0,
        b2=0.99,
    )
    config.update(eval_every=100, log_every=50, checkpoint_every=500, eval_batch_size=500)
    config.train.steps_per_call = 10
    return config
