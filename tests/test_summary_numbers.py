"""Prose that cannot drift: every number of a study's answer table is found in its sources (the
CSVs and the tables generated from them, or, for single runs, the page's dated record and the
files it names; tests/summary_numbers.py says how), and the findings index repeats each study's
answer rows word for word. Pure file reading: the tables are rendered from the CSVs here, by the
same code as scripts/make_tables.py."""

import pytest
import summary_numbers as sn
from conftest import ROOT

STUDIES = ROOT / 'docs' / 'studies'


@pytest.mark.parametrize('readme', sorted(STUDIES.glob('*/README.md')), ids=lambda p: p.parent.name)
def test_every_answer_number_is_found_in_its_sources(readme):
    page = readme.read_text()
    assert sn.SOURCES.search(page), (
        f'{readme.relative_to(ROOT)}: name the sources of its answers above the answer table, '
        'e.g. <!-- summary sources: csv --> (tests/summary_numbers.py)'
    )
    default, overrides = sn.row_sources(page)
    cache: dict[tuple, sn.Sources] = {}
    wrong = []
    for question, result, _ in sn.answer_rows(page):
        # the longest prefix that matches ("X, each at its own" before "X")
        matching = [q for q in overrides if question.startswith(q)]
        kinds = overrides[max(matching, key=len)] if matching else default
        if tuple(kinds) not in cache:
            cache[tuple(kinds)] = sn.Sources(sn.source_lines(readme, kinds))
        if missing := sn.unmatched(result, question, cache[tuple(kinds)]):
            wrong.append(f'{question[:60]!r} ({", ".join(kinds)}): {missing}')
    unused = [q for q in overrides if not any(r[0].startswith(q) for r in sn.answer_rows(page))]
    assert not unused, f'{readme.relative_to(ROOT)}: overrides naming no question: {unused}'
    assert not wrong, f'{readme.relative_to(ROOT)}: numbers no source gives:\n' + '\n'.join(wrong)


def test_the_findings_index_repeats_every_answer_row():
    rows = index_rows((STUDIES / 'README.md').read_text())
    differ = []
    for readme in sorted(STUDIES.glob('*/README.md')):
        for question, result, date in sn.answer_rows(readme.read_text()):
            if rows.get(question) != (result, date):
                differ.append(f'{readme.parent.name}: {question[:60]!r}')
    assert not differ, 'findings index rows that differ from the study (copy them):\n' + '\n'.join(
        differ
    )


def index_rows(text: str) -> dict[str, tuple[str, str]]:
    """{question: (answer, date)} of a findings table's rows (study | question | answer | date)."""
    rows = {}
    for line in text.split('\n'):
        cells = line.strip().strip('|').split(' | ')
        if len(cells) == 4 and '/README.md)' in cells[0]:
            rows[cells[1].strip()] = (cells[2].strip(), cells[3].strip())
    return rows


def test_the_readme_brief_repeats_study_answer_rows():
    """The README's brief table of findings copies study answer rows word for word."""
    readme = (ROOT / 'README.md').read_text()
    brief = readme.split('### What sharing KV heads costs and saves, in brief', 1)[1]
    rows = index_rows(brief.split('\n## ', 1)[0])
    assert len(rows) >= 5, 'README: the brief table of findings moved'
    study = {}
    for page in STUDIES.glob('*/README.md'):
        study.update({q: (r, d) for q, r, d in sn.answer_rows(page.read_text())})
    assert not [q for q, row in rows.items() if study.get(q) != row], 'copy them from the study'


def test_the_number_matcher_can_fail():
    """A drifted number, a triple on no one line, a count no table gives: each is reported."""
    lines = sn.Sources(
        ['| mha | mqa | +0.0105 [0.0078, 0.0288] p=0.186 |', '| mha | 4 of 5 |', '0.52']
    )
    assert sn.unmatched('+0.0105 [0.0078, 0.0288], p = 0.19; 4/5', 'q', lines) == []
    assert sn.unmatched('+0.00003 nats', 'q', lines) == ['+0.00003']
    assert sn.unmatched('+0.0105 [0.0078, 0.0288], p = 0.52', 'q', lines) == [
        '+0.0105 0.0078 0.0288 0.52',
        'p = 0.52',  # 0.52 is in the sources, but not as a p
    ]
    assert sn.unmatched('p ≤ 0.19; p ≤ 0.18', 'q', lines) == ['p ≤ 0.18']
    assert sn.unmatched('3/5 learned; 52%', 'q', lines) == ['3/5']
    assert sn.agrees('2.4e-05', 2.43e-5) and not sn.agrees('2.4e-05', 2.46e-5)
