r"""The MLA contrast's power analysis and per-seed CSV (mla_statement.md).

  python docs/studies/mla/mla_csv.py --power_only
  python docs/studies/mla/mla_csv.py --mla_sweep=runs/mla_contrast \
      --more_sweep=runs/mla_contrast_more

The power analysis reads ../kv_layouts/results/kv_layouts_seeds.csv (the same model at 1,000 steps,
seeds 0-4). The CSV, results/mla_contrast_seeds.csv (arm, seed, eval_loss), joins by seed MLA's runs
(`--mla_sweep`, seeds 5-28), MHA's and MQA's seeds 5-19 from
../kv_contrast/results/kv_contrast_seeds.csv (the kv_contrast sweep's runs of the same config) and
their seeds 20-28 (`--more_sweep`), for the page's 'seeds' table.
"""

import numpy as np
from absl import flags
from study_rows import committed, read, swept, write_seeds

from lm.cli import run_app
from lm.experiments import seeds_needed

ARMS = ('mha', 'mla', 'mqa')
SEEDS = range(5, 29)  # seeds 0-4 sized the study
REUSED = range(5, 20)  # MHA's and MQA's from the kv_contrast sweep

_MLA = flags.DEFINE_string('mla_sweep', 'runs/mla_contrast', 'The MLA sweep (seeds 5-28).')
_MORE = flags.DEFINE_string(
    'more_sweep', 'runs/mla_contrast_more', "MHA's and MQA's sweep of seeds 20-28."
)
_POWER_ONLY = flags.DEFINE_bool('power_only', False, 'Print the power analysis only.')


def power_analysis() -> None:
    """The statement's seed count: Holm over the 3 pairs (first step at 0.05 / 3), 80% power
    for 2/3 of each 5-seed estimate (a winner's-curse margin)."""
    rows = read('../kv_layouts/results/kv_layouts_seeds.csv')
    loss = {(r['arm'], int(r['seed'])): float(r['eval_loss']) for r in rows}
    for a, b in (('mla', 'mha'), ('mla', 'mqa'), ('mha', 'mqa')):
        diff = np.array([loss[a, s] - loss[b, s] for s in range(5)])
        effect, sd = diff.mean(), diff.std(ddof=1)
        print(
            f'{a} - {b}: {effect:+.4f}, sd {sd:.4f}; seeds for 80% power at alpha 0.05/3: '
            f'{seeds_needed(abs(effect), sd, 0.05 / 3)} at the estimate, '
            f'{seeds_needed(abs(effect) * 2 / 3, sd, 0.05 / 3)} at 2/3 of it'
        )


def run() -> int:
    power_analysis()
    if _POWER_ONLY.value:
        return 0
    found = committed(
        '../kv_contrast/results/kv_contrast_seeds.csv', {'mha': 'mha', 'mqa': 'mqa'}, REUSED
    )
    found |= swept(_MLA.value) | swept(_MORE.value)
    write_seeds('mla_contrast_seeds', found, ARMS, SEEDS)
    return 0


if __name__ == '__main__':
    run_app(run)
