"""Where each number of a study's answer table comes from (tests/test_summary_numbers.py).

A study page (docs/studies/<study>/README.md) opens with an answer table; above it a comment names
the sources its numbers are checked against:

    <!-- summary sources: csv -->          its results/*.csv and the tables generated from them
                                           (on any of the study's pages)
                                           (rendered here by scripts/make_tables.py's code)
    <!-- summary sources: page -->         the page below the answer table and its chronology.md:
                                           the dated record of single runs, where the log or
                                           output was not committed
    <!-- summary sources: page, x.json --> also files of the study folder, read as text
    <!-- summary sources for "Decode speed": page -->  the rows whose question starts so

Rules for each number of a result cell (sign aside; a percentage or 'points' may be a fraction
×100; "agrees" = the source value rounded to the printed precision):
- an effect with its interval, 'Δ [lo, hi]' (a unit or a word or two between), agrees with one
  source line, with the p that follows it in the same clause ('..., p = x'); or the effect with
  the line above the interval's (a table of 'mean ± sd' and '95% interval' rows);
- a p named as such ('p = x', 'p (Holm) = x', 'p ≤ x') agrees with a p of a source: a generated
  'p=x', or a cell of a 'p' / 'p (Holm)' column; a bound '≤ x' may be rounded up;
- a count 'k/n' is a generated 'k of n' (or appears as is);
- any other number agrees with some number of a source, except numbers the question itself
  states (its settings) and whole numbers below 100 (seeds, layers, heads).
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import pathlib
import re

from lm.experiments import tables

ANSWER_HEADER = '| question | result | date | reproduce |'
SOURCES = re.compile(r'<!-- summary sources(?: for "([^"]+)")?: ([^>]*?) -->')
NUMBER = r'[−+-]?\d[\d,]*(?:\.\d+)?(?:e[−-]?\d+)?'
# a number: not inside a name (GQA-2, MLA-32-k4, int8, L1H1, 8k, 125M)
TOKEN = re.compile(rf'(?<![\w.\-])({NUMBER})(?![\w.]|-\w)')
# an effect and its interval, a unit or a word or two between them ('+0.313 accuracy [...]')
TRIPLE = re.compile(rf'({NUMBER})(?:\s+[^\s\d\[\](),;:]+){{0,2}}\s*\[({NUMBER}),\s*({NUMBER})\]')
BOUND = re.compile(rf'[≤<]\s*({NUMBER})')
# a p-value as the prose names it: 'p = 0.0064', 'p (Holm) = 1', 'p ≤ 0.010', 'smallest p 0.73'
P_VALUE = re.compile(rf'\bp(?: \(Holm\))?\s*([=≤<]?)\s*({NUMBER})')
P_AFTER = re.compile(rf'^\s*(?:\([^)]*\))?,?\s*p(?: \(Holm\))?\s*=\s*({NUMBER})')
COUNT = re.compile(r'(?<![\w.])(\d+)/(\d+)(?![\w.])')


def value(text: str) -> float:
    return float(text.replace('−', '-').replace(',', ''))


def ulp(text: str) -> float:
    """The last printed digit's unit: '0.0064' -> 1e-4, '2.4e-05' -> 1e-6, '1,728' -> 1."""
    text = text.replace('−', '-').lstrip('+-').replace(',', '')
    mantissa, _, exp = text.partition('e')
    decimals = len(mantissa.partition('.')[2])
    return 10.0 ** (-decimals + (int(exp) if exp else 0))


def agrees(printed: str, v: float) -> bool:
    """`printed` is |v| (or |v| × 100) rounded to its printed precision."""
    x, half = abs(value(printed)), ulp(printed) / 2 * (1 + 1e-9) + 1e-12
    return any(abs(abs(v) * scale - x) <= half for scale in (1, 100))


def numbers(text: str) -> list[float]:
    return [value(t) for t in TOKEN.findall(text)]


def p_values(lines: list[str]) -> list[float]:
    """The p-values of source lines: each 'p=x' of a generated cell, and the cells of the 'p' and
    'p (Holm)' columns of a table (the Fisher and recovered-interval tables)."""
    found, columns = [], []
    for line in lines:
        found += [value(x) for x in re.findall(rf'\bp=({NUMBER})', line)]
        if not line.startswith('|'):
            columns = []
            continue
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if 'p (Holm)' in cells:
            columns = [i for i, c in enumerate(cells) if c in ('p', 'p (Holm)')]
        elif columns and len(cells) > max(columns):
            found += [v for i in columns for v in numbers(cells[i])]
    return found


def answer_rows(page: str) -> list[tuple[str, str, str]]:
    """(question, result, date) of each row of a page's answer table."""
    lines = page.split('\n')
    start = lines.index(ANSWER_HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith('| '):
            break
        cells = line.strip().strip('|').split(' | ')
        rows.append((cells[0].strip(), cells[1].strip(), cells[2].strip()))
    return rows


@functools.cache
def csv_lines(study: pathlib.Path) -> tuple[str, ...]:
    """The tables generated on a study's pages (README, chronology, ...) and its CSVs' rows, as
    lines: rendered once per study folder, however many of its rows name 'csv' (a 41-seed
    table's sign-flip samples 2^20 patterns)."""
    out: list[str] = []
    results = study / 'results'
    for doc in sorted(study.glob('*.md')):
        generated = tables.render(doc.read_text(), str(results))
        for match in tables.MARKER.finditer(generated):
            out += match['body'].split('\n')
    for path in sorted(results.glob('*.csv')):
        with open(path, newline='') as f:
            out += [' '.join(row) for row in csv.reader(f)]
    return tuple(out)


def source_lines(readme: pathlib.Path, kinds: list[str]) -> list[str]:
    """The lines numbers may come from, per the page's `summary sources` comment."""
    page = readme.read_text()
    out: list[str] = []
    for kind in kinds:
        if kind == 'csv':
            out += csv_lines(readme.parent)
        elif kind == 'page':
            body = page[page.index(ANSWER_HEADER) :].split('\n')
            body = body[2 + len(answer_rows(page)) :]
            out += body
            record = readme.parent / 'chronology.md'  # a study's record, split from its page
            if record.exists():
                out += record.read_text().split('\n')
        else:
            out += (readme.parent / kind).read_text().split('\n')
    return out


def _strip(result: str) -> str:
    """A result cell without code spans and link targets (names, not numbers)."""
    result = re.sub(r'`[^`]*`', '', result)
    return re.sub(r'\]\([^)]*\)', ']', result)


def row_sources(page: str) -> tuple[list[str], dict[str, list[str]]]:
    """The page's default sources and its per-question overrides {question prefix: sources}."""
    default, rows = None, {}
    for prefix, kinds in SOURCES.findall(page):
        names = [k.strip() for k in kinds.split(',') if k.strip()]
        if prefix:
            rows[prefix] = names
        else:
            default = names
    if default is None:
        raise ValueError('no <!-- summary sources: ... --> comment')
    return default, rows


class Sources:
    """Source lines with their numbers indexed: which lines hold a value that agrees with a
    printed token (|v| or 100·|v| within half its last digit), found by bisection."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        entries = sorted(
            (scale * abs(v), i)
            for i, line in enumerate(lines)
            for v in numbers(line)
            if math.isfinite(v)
            for scale in (1, 100)
        )
        self.values = [v for v, _ in entries]
        self.where = [i for _, i in entries]
        self.p = sorted(abs(v) for v in p_values(lines))
        self.joined = '\n'.join(lines)

    def lines_agreeing(self, printed: str) -> set[int]:
        x, half = abs(value(printed)), ulp(printed) / 2 * (1 + 1e-9) + 1e-12
        lo, hi = (
            bisect.bisect_left(self.values, x - half),
            bisect.bisect_right(self.values, x + half),
        )
        return set(self.where[lo:hi])

    def any_agrees(self, printed: str, bound: bool = False, pool: list[float] | None = None):
        """Some value agrees with `printed` (or, for a bound, lies within one last digit below
        it); `pool` (sorted |values|) defaults to every number of the sources."""
        pool = self.values if pool is None else pool
        x, step = abs(value(printed)), ulp(printed) * (1 + 1e-9)
        lo = x - (step if bound else step / 2) - 1e-12
        i = bisect.bisect_left(pool, lo)
        return i < len(pool) and pool[i] <= x + step / 2 + 1e-12


def _triple_found(wanted: list[str], src: Sources) -> bool:
    """The effect, its interval (and p) on one line; or the interval's line under the effect's."""
    sets = [src.lines_agreeing(t) for t in wanted]
    if set.intersection(*sets):
        return True
    if len(wanted) != 3:
        return False
    below_mean = {i + 1 for i in sets[0]}
    return bool(below_mean & sets[1] & sets[2])


def unmatched(result: str, question: str, src: Sources) -> list[str]:
    """The numbers of a result cell that no source line gives (see the module docstring)."""
    text, missing = _strip(result), []
    for m in TRIPLE.finditer(text):
        after = P_AFTER.match(text[m.end() :])
        wanted = [*m.groups(), after[1]] if after else list(m.groups())
        if not _triple_found(wanted, src):
            missing.append(' '.join(wanted))
    text = TRIPLE.sub(' ', text)
    for k, n in COUNT.findall(text):
        if f'{k} of {n}' not in src.joined and f'{k}/{n}' not in src.joined:
            missing.append(f'{k}/{n}')
    text = COUNT.sub(' ', text)
    for bound, token in P_VALUE.findall(text):
        if not src.any_agrees(token, bound in ('≤', '<'), src.p):
            missing.append(f'p {bound or "="} {token}')
    text = P_VALUE.sub(' ', text)
    for token in BOUND.findall(text):
        if not src.any_agrees(token, bound=True):
            missing.append(f'≤ {token}')
    text = BOUND.sub(' ', text)
    setup = set(TOKEN.findall(question))
    for token in TOKEN.findall(text):
        if token in setup or re.fullmatch(r'\d{1,2}', token.lstrip('+')):
            continue  # the question's own settings; small whole numbers (counts, layers, p = 1)
        if not src.any_agrees(token):
            missing.append(token)
    return missing
