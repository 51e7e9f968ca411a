r"""The calibrated MQAR capacity sweep (docs/studies/mqar_capacity/README.md): MHA (4 KV heads of
16) and MQA (1 KV head of 16) at d_model 64, 4 query heads, on configs/recall/mqar_zoology.py
(the calibrated recipe), against 4 and 8 pairs in rows of 4 x pairs tokens.

The learning-rate grid first: points 'mha' and 'mqa' (4 pairs), 2 seeds each, one sweep per
rate, 3000 steps, the rate chosen per variant on validation accuracy at step 3000:

  python scripts/sweep.py --config=configs/sweeps/mqar_capacity.py --sweep_dir=runs/mqc/lr1e-3 \
      --points=mha,mqa --seeds=2 --ensemble --ensemble_program=looped \
      --config.mesh.cpu_devices=1 --config.train.steps=3000 \
      --config.train.lr=1e-3 --config.train.min_lr=1e-3

Then the four cells <variant>_p<pairs> at the chosen rates (LR), 8 seeds each, one looped
ensemble per cell, one sweep per pairs count (scripts/eval_sweep.py replaces a run's whole data
config, so each sweep is scored on a second held-out set with its own pairs and row length):

  python scripts/sweep.py --config=configs/sweeps/mqar_capacity.py --sweep_dir=runs/mqc/p4 \
      --points=mha_p4,mqa_p4 --seeds=8 --ensemble --ensemble_program=looped \
      --config.mesh.cpu_devices=1
  python scripts/eval_sweep.py --sweep_dir=runs/mqc/p4 --config=configs/sweeps/mqar_capacity.py \
      --config.data.recall_seed=1 --config.data.recall_pairs=4 --config.data.seq_len=16 \
      --out=runs/mqc/p4_test.csv

and the same with p8 (--config.data.recall_pairs=8 --config.data.seq_len=32).

The second round (the study's second statement) at 8 pairs, lr 3e-3: the calibration gate again
on fresh seeds, MHA at seeds 8-15 ('mha_p8_gate'), and two arms of 32 KV dims per token per
layer, seeds 0-7, paired with the first round's 8-pair cells: GQA-2 (2 KV heads of 16,
'gqa2_p8') and one KV head of 32 with 4 query heads of 32 ('mqa_hd32_p8'):

  python scripts/sweep.py --config=configs/sweeps/mqar_capacity.py --sweep_dir=runs/mqc/r2 \
      --points=mha_p8_gate,gqa2_p8,mqa_hd32_p8 --seeds=8 --ensemble --ensemble_program=looped \
      --config.mesh.cpu_devices=1

The third round (docs/studies/mqar_capacity/own_rate_statement.md): GQA-2 and MQA at 8 pairs,
each at the rates of OWN_RATES on seeds 0-1, points '<arm>_p8_lr<rate>' (e.g. gqa2_p8_lr0.002);
then each arm at the rate its grid chose on seeds 8-15 (MHA's gate seeds):

  python scripts/sweep.py --config=configs/sweeps/mqar_capacity.py --sweep_dir=runs/mqc/r3_grid \
      --points=gqa2_p8_lr0.001,gqa2_p8_lr0.002 --seeds=2 --ensemble --ensemble_program=looped \
      --config.mesh.cpu_devices=1

The fifth round (docs/studies/mqar_capacity/above_edge_statement.md): GQA-2 at ABOVE_RATES,
points 'gqa2_p8_lr0.008' and 'gqa2_p8_lr0.013', on the grid's seeds 0-1.
"""

import os

from lm.config import load_config_file
from lm.experiments.sweep import variant_points

VARIANTS = ('mha', 'mqa')
PAIRS = (4, 8)
# The rate of each variant's cells, chosen on the grid (the study's amendment records it).
LR = {'mha': 3e-3, 'mqa': 3e-3}
OWN_RATES = (1e-3, 2e-3, 3e-3, 5e-3)  # the third round's grid for GQA-2 and MQA at 8 pairs
# The fifth round's rates for GQA-2, past its grid choice at the grid's upper edge (5e-3): the
# grid's steps of about 1.6x continued (docs/studies/mqar_capacity/above_edge_statement.md).
ABOVE_RATES = (8e-3, 1.3e-2)


def get_config():
    return load_config_file(
        os.path.join(os.path.dirname(__file__), '..', 'recall', 'mqar_zoology.py')
    )


def get_points():
    grid = variant_points(list(VARIANTS))  # 4 pairs, the config's rate: the lr grid's points
    cells = [
        {
            **point,
            'name': f'{point["name"]}_p{pairs}',
            'data.recall_pairs': pairs,
            'data.seq_len': 4 * pairs,
            'train.lr': LR[point['name']],
            'train.min_lr': LR[point['name']],
        }
        for pairs in PAIRS
        for point in grid
    ]
    cell = {point['name']: point for point in cells}
    second = [
        {**cell['mha_p8'], 'name': 'mha_p8_gate', 'seed': 8},  # the gate on seeds no choice saw
        {**cell['mha_p8'], **variant_points(['gqa2'])[0], 'name': 'gqa2_p8'},
        {**cell['mqa_p8'], 'name': 'mqa_hd32_p8', 'model.head_dim': 32},
    ]
    own = [
        {**arm, 'name': own_rate_point(arm['name'], lr), 'train.lr': lr, 'train.min_lr': lr}
        for arm in (second[1], cell['mqa_p8'])
        for lr in OWN_RATES
    ]
    above = [
        {**second[1], 'name': own_rate_point('gqa2_p8', lr), 'train.lr': lr, 'train.min_lr': lr}
        for lr in ABOVE_RATES
    ]
    return grid + cells + second + own + above


def own_rate_point(arm: str, lr: float) -> str:
    """The third round's point of `arm` ('gqa2_p8' or 'mqa_p8') at rate `lr`: 'gqa2_p8_lr0.002'."""
    return f'{arm}_lr{lr:g}'
