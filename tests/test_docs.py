"""The shape of the docs: a README of a few screens, reference pages a reader can use (each at
most 400 lines), and studies that open with their answer, every question in the findings index;
every relative link resolves."""

import re

import pytest
from conftest import ROOT
from doc_commands import ANSWER_HEADER

STUDIES = ROOT / 'docs' / 'studies'


def study_readmes():
    return sorted(STUDIES.glob('*/README.md'))


def answer_rows(readme) -> list[str]:
    """The questions of a study's answer table, found within its first 40 lines."""
    head = readme.read_text().split('\n')[:40]
    assert ANSWER_HEADER in head, (
        f'{readme.relative_to(ROOT)}: no answer table in its first 40 lines'
    )
    start = head.index(ANSWER_HEADER) + 2
    rows = []
    for line in head[start:]:
        if not line.startswith('| '):
            break
        rows.append(line.split(' | ')[0].removeprefix('| '))
    assert start + len(rows) < len(head), (
        f'{readme.relative_to(ROOT)}: its answer table runs past line 40'
    )
    return rows


def test_readme_fits_on_a_few_screens():
    assert len((ROOT / 'README.md').read_text().splitlines()) <= 250


def test_reference_pages_are_at_most_400_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / 'docs').rglob('*.md')
        if STUDIES not in p.parents and (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f'reference pages over 400 lines (move measurements to docs/studies/): {long}'


def test_every_study_folder_has_a_report():
    folders = [p for p in STUDIES.iterdir() if p.is_dir()]
    assert folders and all((p / 'README.md').exists() for p in folders), folders


@pytest.mark.parametrize('readme', study_readmes(), ids=lambda p: p.parent.name)
def test_a_study_opens_with_its_answer(readme):
    """Within its first 40 lines: a table of the questions, each with its result, date and the
    command that reproduces it."""
    rows = answer_rows(readme)
    assert rows, f'{readme.relative_to(ROOT)}: an answer table with no question'
    head = readme.read_text().split('\n')[:40]
    for line in head[head.index(ANSWER_HEADER) + 2 :][: len(rows)]:
        cells = line.strip('|').split(' | ')
        assert len(cells) == 4 and all(c.strip() for c in cells), line
        assert re.search(r'\d{4}-\d\d-\d\d', cells[2]), f'no date: {line}'


def test_the_findings_index_has_every_question_and_links_every_study():
    index = (STUDIES / 'README.md').read_text()
    for readme in study_readmes():
        link = f'({readme.parent.name}/README.md)'
        assert link in index, f'docs/studies/README.md does not link {link}'
        for question in answer_rows(readme):
            assert f'| {question} |' in index, f'findings index lacks: {question}'


def anchors(page) -> set[str]:
    """The heading anchors GitHub makes for a markdown page (lower case, punctuation dropped,
    spaces to hyphens; a repeated heading gets -1, -2, ...)."""
    found: dict[str, int] = {}
    text = re.sub(r'```.*?```', '', page.read_text(), flags=re.S)
    for heading in re.findall(r'^#+ (.+)$', text, flags=re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
        found[slug] = found.get(slug, -1) + 1
        if found[slug]:
            found[f'{slug}-{found[slug]}'] = 0
    return set(found)


def test_relative_links_and_their_anchors_resolve():
    broken = []
    for page in [ROOT / 'README.md', *(ROOT / 'docs').rglob('*.md')]:
        for target in re.findall(r'\]\(([^)\s]+)\)', page.read_text()):
            path, _, anchor = target.partition('#')
            if re.match(r'\w+:', path):
                continue
            linked = page.parent / path if path else page
            if not linked.exists():
                broken.append(f'{page.relative_to(ROOT)}: {target}')
            elif anchor and linked.suffix == '.md' and anchor not in anchors(linked):
                broken.append(f'{page.relative_to(ROOT)}: {target} (no such heading)')
    assert not broken, broken
