"""The kv_contrast rate questions' runs at peak rates other than the recipe's: MHA's at 2e-3 (the
MLA study's) and MQA's at 1e-3 (this study's and the MLA study's), read from their per-seed CSVs."""

import csv
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MLA = os.path.join(HERE, os.pardir, 'mla', 'results')
MHA_AT_2E3 = (  # MHA's runs at 2e-3 in the MLA study: (CSV, its arm name, seeds)
    ('rate_pilot_seeds.csv', 'mha_lr0.002', range(0, 5)),
    ('rate_contrast_seeds.csv', 'mha', range(5, 9)),
    ('tuned_contrast_seeds.csv', 'mha', range(9, 29)),
    ('retest_contrast_seeds.csv', 'mha', range(29, 30)),
)
MQA_AT_1E3 = (  # MQA's runs at 1e-3: this study's seeds 0-19, the MLA study's 20-28
    (os.path.join(HERE, 'results', 'kv_contrast_seeds.csv'), range(0, 20)),
    (os.path.join(MLA, 'mla_contrast_seeds.csv'), range(20, 29)),
)


def read(path: str, arm: str, seeds: range, name: str) -> dict[tuple[str, int], str]:
    """{(name, seed): eval_loss} of `arm`'s rows at `seeds` in a per-seed CSV (its arm or point
    column)."""
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    return {
        (name, int(r['seed'])): r['eval_loss']
        for r in rows
        if r.get('arm', r.get('point')) == arm and int(r['seed']) in seeds
    }


def mha(seeds: range) -> dict[tuple[str, int], str]:
    """{('mha', seed): eval_loss} of MHA's runs at 2e-3 (the MLA study's) at `seeds`."""
    found = {}
    for name, arm, have in MHA_AT_2E3:
        found |= read(
            os.path.join(MLA, name),
            arm,
            range(max(have.start, seeds.start), min(have.stop, seeds.stop)),
            'mha',
        )
    return found
