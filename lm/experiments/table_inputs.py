"""The inputs of generated doc tables (lm.experiments.tables), checked before any doc is written:
the table markers of a doc and the results CSVs. Damage is refused in one line naming the file and
line, so a rewrite never deletes text and never tabulates a row it should not."""

from __future__ import annotations

import csv
import io
import math
import os
import re

OPENER = re.compile(
    r'<!-- table: \w+ [\w.-]+(?: seeds \d+-\d+)?(?: pairs [\w.:,-]+)?(?: described)? -->\n'
)
CLOSER = '<!-- /table -->'
ANY_MARKER = re.compile(r'<!--\s*/?\s*table\b')
# The columns that say which measurement a row is (the rest are its values): no two rows of a
# CSV may agree on all those it has.
KEY_COLUMNS = (
    *('panel', 'family', 'label', 'model', 'conversion', 'alpha_or_steps', 'arm', 'point'),
    *('run', 'a', 'b', 'metric', 'step', 'lr', 'seed'),
)


def check_markers(text: str, path: str) -> None:
    """One-line errors naming `path` and the line for a table marker that is malformed, an
    opener without its `<!-- /table -->` before the next opener or the end, or a closer that
    closes nothing (rewriting then would delete the text between)."""
    opened = None  # line of the opener not yet closed
    for match in ANY_MARKER.finditer(text):
        at = match.start()
        line = text.count('\n', 0, at) + 1
        if OPENER.match(text, at):
            if opened is not None:
                raise ValueError(
                    f'{path} line {opened}: its table has no {CLOSER} before the next table '
                    f'marker (line {line}); add it, or the rewrite would delete the text between'
                )
            opened = line
        elif text.startswith(CLOSER, at):
            if opened is None:
                raise ValueError(f'{path} line {line}: {CLOSER} closes no table')
            opened = None
        else:
            shown = text[at:].split('\n', 1)[0]
            raise ValueError(
                f'{path} line {line}: {shown!r} is not a table marker: '
                f'<!-- table: KIND NAME --> (optionally seeds A-B, then pairs a:b,c:d, then '
                f'described) on a '
                f'line of its own, or {CLOSER}'
            )
    if opened is not None:
        raise ValueError(f'{path} line {opened}: its table has no {CLOSER}')


def _non_finite(value: str) -> bool:
    try:
        return not math.isfinite(float(value))
    except ValueError:
        return False


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def read_text(path: str, expected: str) -> str:
    """The UTF-8 text of `path`; a one-line error naming it (and the line of a byte that is not
    UTF-8) for a directory, a file that cannot be read, or one that is not UTF-8 text."""
    if os.path.isdir(path):
        raise ValueError(f'{path}: a directory; {expected} was expected')
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise ValueError(
            f'{path}: cannot be read ({e.strerror}); {expected} was expected'
        ) from None
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        raise ValueError(
            f'{path} line {line}: not UTF-8 text (byte {e.start}); {expected} was expected'
        ) from None


def _check_numeric_columns(path: str, header: list[str], rows: list[dict], lines: list[int]):
    """A value column (not a `KEY_COLUMNS` one) whose other cells are numbers must hold a
    number in every filled cell: 'abc' among losses is damage, refused naming its line."""
    for column in header:
        if column in KEY_COLUMNS:
            continue
        filled = [
            (row[column], line) for row, line in zip(rows, lines, strict=True) if row[column] != ''
        ]
        words = [(v, line) for v, line in filled if not _is_number(v)]
        if words and len(words) < len(filled):
            value, line = words[0]
            raise ValueError(
                f"{path} line {line}: {column}={value!r} is not a number, as the column's other "
                'cells are'
            )


def read_csv(path: str) -> list[dict]:
    """The rows of a results CSV as {column: text}. Refused in one line naming `path` and the
    line: a directory or not UTF-8 text, no header or no rows, a row with more or fewer fields
    than the header, a number that is not finite (nan, inf), a word in a column of numbers, or
    a row whose key (its `KEY_COLUMNS`, e.g. arm and seed) repeats an earlier row's, equal or
    not."""
    text = read_text(path, 'a CSV')
    if '\0' in text:
        line = text.count('\n', 0, text.index('\0')) + 1
        raise ValueError(f'{path} line {line}: a NUL byte (a binary file?); a CSV was expected')
    reader = csv.reader(io.StringIO(text))
    header = next(reader, [])
    if not header:
        raise ValueError(f'{path}: empty; a CSV with a header line was expected')
    keys = [c for c in KEY_COLUMNS if c in header]
    rows, lines, seen = [], [], {}
    for fields in reader:
        if not fields:
            continue  # a blank line
        where = f'{path} line {reader.line_num}'
        if len(fields) != len(header):
            raise ValueError(f'{where}: {len(fields)} fields, but the header has {len(header)}')
        row = dict(zip(header, fields, strict=True))
        if bad := [c for c in header if _non_finite(row[c])]:
            raise ValueError(f'{where}: {bad[0]}={row[bad[0]]!r} is not a finite number')
        key = tuple(row[c] for c in keys)
        if keys and key in seen:
            named = ', '.join(f'{c}={row[c]}' for c in keys)
            raise ValueError(f'{where}: repeats the row of line {seen[key]} ({named})')
        seen[key] = reader.line_num
        rows.append(row)
        lines.append(reader.line_num)
    if not rows:
        raise ValueError(f'{path}: no rows under its header')
    _check_numeric_columns(path, header, rows, lines)
    return rows
