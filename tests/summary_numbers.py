"""Where each number of a study's answer table comes from (tests/test_summary_numbers.py).

A study page (docs/studies/<study>/README.md) opens with an answer table; above it a comment names
the sources its numbers are checked against:

    <!-- summary sources: csv -->          its results/*.csv and the tables generated from them
                                           (rendered here by scripts/make_tables.py's code)
    <!-- summary sources: page -->         the page below the answer table: its dated record of
                                           single runs, where the log or output was not committed
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

import csv
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


def bounds(printed: str, v: float) -> bool:
    """'≤ printed' is |v| rounded up to its printed precision (a bound must hold)."""
    x = abs(value(printed))
    return 0 <= x - abs(v) < ulp(printed) * (1 + 1e-9)


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


def source_lines(readme: pathlib.Path, kinds: list[str]) -> list[str]:
    """The lines numbers may come from, per the page's `summary sources` comment."""
    page = readme.read_text()
    out: list[str] = []
    for kind in kinds:
        if kind == 'csv':
            results = readme.parent / 'results'
            generated = tables.render(page, str(results))
            for match in tables.MARKER.finditer(generated):
                out += match[4].split('\n')
            for path in sorted(results.glob('*.csv')):
                with open(path, newline='') as f:
                    out += [' '.join(row) for row in csv.reader(f)]
        elif kind == 'page':
            body = page[page.index(ANSWER_HEADER) :].split('\n')
            body = body[2 + len(answer_rows(page)) :]
            out += body
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


def _has(wanted: list[str], line: str) -> bool:
    values = numbers(line)
    return all(any(agrees(t, v) for v in values) for t in wanted)


def _triple_found(wanted: list[str], lines: list[str]) -> bool:
    """The effect, its interval (and p) on one line; or the interval's line under the effect's."""
    if any(_has(wanted, line) for line in lines):
        return True
    mean, interval = wanted[:1], wanted[1:3]
    pairs = zip(lines[:-1], lines[1:], strict=True)
    return len(wanted) == 3 and any(_has(interval, b) and _has(mean, a) for a, b in pairs)


def unmatched(result: str, question: str, lines: list[str]) -> list[str]:
    """The numbers of a result cell that no source line gives (see the module docstring)."""
    text, missing = _strip(result), []
    pool = [v for line in lines for v in numbers(line) if math.isfinite(v)]
    joined = '\n'.join(lines)
    for m in TRIPLE.finditer(text):
        after = P_AFTER.match(text[m.end() :])
        wanted = [*m.groups(), after[1]] if after else list(m.groups())
        if not _triple_found(wanted, lines):
            missing.append(' '.join(wanted))
    text = TRIPLE.sub(' ', text)
    for k, n in COUNT.findall(text):
        if f'{k} of {n}' not in joined and f'{k}/{n}' not in joined:
            missing.append(f'{k}/{n}')
    text = COUNT.sub(' ', text)
    p_pool = p_values(lines)
    for bound, token in P_VALUE.findall(text):
        check = bounds if bound in '≤<' and bound else agrees
        if not any(check(token, v) or agrees(token, v) for v in p_pool):
            missing.append(f'p {bound or "="} {token}')
    text = P_VALUE.sub(' ', text)
    for token in BOUND.findall(text):
        if not any(bounds(token, v) or agrees(token, v) for v in pool):
            missing.append(f'≤ {token}')
    text = BOUND.sub(' ', text)
    setup = set(TOKEN.findall(question))
    for token in TOKEN.findall(text):
        if token in setup or re.fullmatch(r'\d{1,2}', token.lstrip('+')):
            continue  # the question's own settings; small whole numbers (counts, layers, p = 1)
        if not any(agrees(token, v) for v in pool):
            missing.append(token)
    return missing
