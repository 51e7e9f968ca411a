r"""Regenerate every marked table of docs/*.md from its CSV in docs/results/
(`lm.experiments.tables`); --check only reports docs that differ (exit 1), for CI.

  python scripts/make_tables.py            # rewrite the tables
  python scripts/make_tables.py --check    # exit 1 if any doc is stale
"""

import os

from absl import flags

from lm.cli import run_app
from lm.experiments import update_docs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = flags.DEFINE_string('docs', os.path.join(ROOT, 'docs'), 'Directory of the .md docs.')
_RESULTS = flags.DEFINE_string('results', '', "Directory of the CSVs; '' = <docs>/results.")
_CHECK = flags.DEFINE_bool('check', False, 'Write nothing; exit 1 if a doc would change.')


def run() -> int:
    results = _RESULTS.value or os.path.join(_DOCS.value, 'results')
    changed = update_docs(_DOCS.value, results, write=not _CHECK.value)
    for path in changed:
        print(f'{"stale" if _CHECK.value else "rewrote"}: {path}')
    return 1 if changed and _CHECK.value else 0


if __name__ == '__main__':
    run_app(run)
