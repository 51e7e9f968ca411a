r"""MLA-64-P16 beside MQA and GQA-4 on the seeds all three trained (described, not a stated test).

  python docs/studies/mla/p16_kv_csv.py

No new run: MLA-64-P16 at 1e-3 (results/rotation_contrast_seeds.csv), MQA (mla_contrast_seeds)
and GQA-4 (latent_contrast_seeds), with MHA for reference, all at the recipe's rate 1e-3 on seeds
5-28 of the 2-core AMD EPYC; a run that two CSVs hold must be the same bit for bit (MHA's seeds
are in all three). Writes results/p16_kv_seeds.csv (arm, seed, eval_loss), whose described
table the page shows; this question was asked after every run was made.
"""

from study_rows import committed, write_seeds

from lm.cli import run_app

SEEDS = range(5, 29)  # where MLA-64-P16, MQA and GQA-4 all trained at 1e-3
SOURCES = (  # (CSV, {its arm: ours})
    ('results/rotation_contrast_seeds.csv', {'mha': 'mha', 'mla64p16': 'mla64p16'}),
    ('results/mla_contrast_seeds.csv', {'mha': 'mha', 'mqa': 'mqa'}),
    ('results/latent_contrast_seeds.csv', {'mha': 'mha', 'gqa4': 'gqa4'}),
)
ARMS = ('mha', 'gqa4', 'mqa', 'mla64p16')


def run() -> int:
    found: dict[tuple[str, int], str] = {}
    for path, rename in SOURCES:
        rows = committed(path, rename, SEEDS)
        differ = [k for k, v in rows.items() if k in found and float(found[k]) != float(v)]
        if differ:
            raise SystemExit(f'{path}: {differ[0]} differs from the run another CSV holds')
        found |= rows
    write_seeds('p16_kv_seeds', found, ARMS, SEEDS)
    return 0


if __name__ == '__main__':
    run_app(run)
