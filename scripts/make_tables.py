r"""Regenerate every marked table of the studies (docs/studies/<study>/README.md) from the CSVs
in its results/ folder (`lm.experiments.tables`); --check only reports studies that differ
(exit 1), for CI. A damaged marker or CSV (missing end marker, short row, nan, duplicate row,
binary file) is refused in one line naming the file and line, by both, before anything is
written.

  python scripts/make_tables.py            # rewrite the tables
  python scripts/make_tables.py --check    # exit 1 if any study is stale
"""

import os

from absl import flags

from lm.cli import run_app
from lm.experiments import rendered_docs, write_docs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STUDIES = flags.DEFINE_string(
    'studies', os.path.join(ROOT, 'docs', 'studies'), 'Directory of the study folders.'
)
_CHECK = flags.DEFINE_bool('check', False, 'Write nothing; exit 1 if a study would change.')


def stale_studies(studies: str, write: bool) -> list[str]:
    """The study READMEs whose tables differ from their CSVs (rewritten when `write`, once
    every study rendered: a damaged marker or CSV anywhere is refused before anything is
    written)."""
    changed = {}
    for name in sorted(os.listdir(studies)):
        study = os.path.join(studies, name)
        if os.path.isdir(os.path.join(study, 'results')):
            changed.update(rendered_docs(study, os.path.join(study, 'results')))
    if write:
        write_docs(changed)
    return list(changed)


def run() -> int:
    if not os.path.isdir(_STUDIES.value):
        raise ValueError(f'--studies={_STUDIES.value} is not a directory (of study folders)')
    changed = stale_studies(_STUDIES.value, write=not _CHECK.value)
    for path in changed:
        print(f'{"stale" if _CHECK.value else "rewrote"}: {path}')
    return 1 if changed and _CHECK.value else 0


if __name__ == '__main__':
    run_app(run)
