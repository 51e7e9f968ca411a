r"""Data order and document boundaries at equal budgets: 'random' windows (with replacement),
'epochs' (each window once per epoch) and 'epochs' with document masks, on the quickstart
recipe trained 600 steps (this Python's standard library: every file is a document; no
download).

  python scripts/sweep.py --config=configs/sweeps/data_sampling.py --sweep_dir=runs/sampling \
      --seeds=5
"""

import os

from lm.config import load_config_file


def get_config():
    config = load_config_file(os.path.join(os.path.dirname(__file__), '..', 'quickstart.py'))
    config.train.steps = 600  # the budget the study measured (docs/studies/data)
    config.eval_tokens = 0  # the whole validation split, each target once
    config.eval_every = config.train.steps  # evaluated once, at the end (and at step 0)
    return config


def get_points():
    return [
        {'name': 'random', 'data.sampling': 'random'},
        {'name': 'epochs', 'data.sampling': 'epochs'},
        {'name': 'epochs_docmask', 'data.sampling': 'epochs', 'data.document_mask': True},
    ]
