r"""The per-arm-rate questions' sweep file (rate_statement.md, tuned_statement.md): MHA, MLA-64
and MLA-64-P16 of configs/sweeps/attention_kinds.py at each rate of the grid and its edge
extensions, the floor scaled with the peak (min_lr = lr / 10, the recipe's ratio). Points are
named <arm>_lr<rate>; `choose` is the statements' rate rule.

  python scripts/sweep.py --config=docs/studies/mla/rate_sweep.py \
      --sweep_dir=runs/rate_grid --points=mha_lr0.0005,mla64_lr0.0005 --seeds=5 --ensemble
"""

import os

from lm.config import load_config_file
from lm.experiments import lr_grid

# Peak rates and their floors, written out (lr / 10 for each).
RATES = {
    1.25e-4: 1.25e-5,
    2.5e-4: 2.5e-5,
    5e-4: 5e-5,
    1e-3: 1e-4,
    2e-3: 2e-4,
    4e-3: 4e-4,
    8e-3: 8e-4,
    1.6e-2: 1.6e-3,
}
POINTS = {  # arm -> its settings: attention_kinds' points mha and mla, and MLA-64-P16
    'mha': {'model.attention': 'mha'},
    'mla64': {'model.attention': 'mla'},
    'mla64p16': {'model.attention': 'mla', 'model.mla.qk_rope_head_dim': 16},
}
ARMS = ('mha', 'mla64')  # the per-arm-rate question's arms (tuned_statement.md adds mla64p16)
GRID = (5e-4, 1e-3, 2e-3, 4e-3)  # the rates every arm runs; RATES holds the edge extensions
RECIPE = 1e-3  # the recipe's rate: that of every run of the earlier questions
EXTENSIONS = 2  # at most this many rates past each edge of GRID


def point_name(arm: str, lr: float) -> str:
    """The sweep point of `arm` at peak rate `lr`, e.g. 'mla64_lr0.002'."""
    return f'{arm}_lr{lr:g}'


def choose(arm: str, pilot: dict[tuple[str, int], str], seeds: range) -> tuple[float, str | None]:
    """`arm`'s rate by lr_grid.choose over its rates run on `seeds` ({(point, seed): eval_loss}),
    and the point to train next when the choice lies at an edge of the rates run with an
    extension left (at most EXTENSIONS past each edge of GRID), else None."""
    by_lr = {
        lr: {s: float(pilot[point_name(arm, lr), s]) for s in seeds}
        for lr in RATES
        if all((point_name(arm, lr), s) in pilot for s in seeds)
    }
    span = f'seeds {seeds.start}-{seeds.stop - 1}'
    missing = [lr for lr in GRID if lr not in by_lr]
    if missing:
        raise SystemExit(f'incomplete: {arm} has no {span} at {missing}')
    lr = lr_grid.choose(by_lr)
    means = ', '.join(f'{r:g}: {sum(v.values()) / len(v):.4f}' for r, v in sorted(by_lr.items()))
    print(f'{arm}: mean loss of {span} by rate {means}; chosen {lr:g}')
    nxt = lr_grid.next_rate(lr, list(by_lr), list(RATES), GRID, EXTENSIONS)
    return lr, point_name(arm, nxt) if nxt else None


def get_config():
    """configs/sweeps/attention_kinds.py's config, its data path spelled from this folder (the
    repository's data/, as every run of these questions recorded it)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3)
    config = load_config_file(os.path.join(root, 'configs', 'sweeps', 'attention_kinds.py'))
    config.data.path = os.path.join(root, 'data', 'tinyshakespeare.txt')
    return config


def get_points():
    return [
        {'name': point_name(arm, lr), **settings, 'train.lr': lr, 'train.min_lr': floor}
        for arm, settings in POINTS.items()
        for lr, floor in RATES.items()
    ]
