"""Passkey retrieval (lm/data/recall.py): a 5-digit key hidden in filler text at depths 0 to 1
of examples 128, 192 and 257 bytes long; the loss counts the key's digits only, and evaluation
reports `eval/recall_accuracy` with one scalar per depth, per length and per (depth, length):

  python train.py --config=configs/recall/passkey.py:mha --workdir=runs/passkey_mha

The optional argument picks the attention variant: mha (default), gqa<g> (e.g. gqa2), mqa, mla.
Calibrated (docs/studies/recall/README.md): MHA passes 90% held-out accuracy between steps 900
and 1700 and ends at 94.5-97.4% in each of 5 seeds (about 21-26 minutes a run on one CPU core).
"""

import os

from lm.config import load_config_file
from lm.model.attention import parse_variant


def get_config(variant: str = 'mha'):
    """MQAR's model (configs/recall/mqar.py) on the passkey task, with its own schedule."""
    try:
        parse_variant(variant)
    except ValueError as e:
        raise ValueError(f'configs/recall/passkey.py: {e}') from None
    config = load_config_file(os.path.join(os.path.dirname(__file__), 'mqar.py'), variant)
    config.data.update(
        source='passkey',
        seq_len=256,
        passkey_lengths='128,192,257',
        passkey_depths='0,0.25,0.5,0.75,1',
        recall_eval_examples=600,  # 40 per (depth, length) cell
    )
    config.train.update(batch_size=32, steps=2000)
    config.eval_batch_size = 120
    return config
