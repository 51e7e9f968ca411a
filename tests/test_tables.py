"""Doc tables from committed CSVs (lm/experiments/tables.py, scripts/make_tables.py): every
marked table in docs/ regenerates to exactly what is committed, and each kind of table against
hand-computed values."""

import dataclasses
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from conftest import ROOT, run_entry

from lm.experiments import ablation_doc_tables, recall_tables, stats, summary, tables


def seed_rows(values: dict[str, list[float]], column: str, key: str = 'arm', **fixed) -> list[dict]:
    """A per-seed CSV's rows: {arm: [value of seed 0, 1, ...]} under `column`, `fixed` columns
    alike in every row."""
    return [
        {key: arm, 'seed': str(seed), **fixed, column: str(v)}
        for arm, arm_values in values.items()
        for seed, v in enumerate(arm_values)
    ]


# Recall accuracy of three arms over five seeds: learned (>= 0.8) 5, 4 and 0 times.
LEARNED_ACCURACY = {
    'a': [0.95, 0.97, 0.91, 0.99, 0.90],
    'b': [0.95, 0.4, 0.93, 0.96, 0.92],
    'c': [0.4, 0.41, 0.39, 0.79, 0.6],
}


@pytest.mark.slow
def test_every_doc_table_matches_its_csv():
    """Regenerate every marked table of the studies; a study whose table differs from its CSV is
    stale (fix: python scripts/make_tables.py)."""
    out = run_entry('scripts/make_tables.py', '--check')
    assert out.returncode == 0, f'stale tables: {out.stdout} (run python scripts/make_tables.py)'
    studies = ROOT / 'docs' / 'studies'
    marked = [p for p in studies.glob('*/README.md') if '<!-- table: ' in p.read_text()]
    assert len(marked) >= 4  # sweeps, uptraining, recall, kv_layouts
    assert not [
        p
        for p in (ROOT / 'docs').rglob('*.md')
        if p.parent.parent != studies and re.search('^<!-- table: ', p.read_text(), re.M)
    ], 'a generated table outside docs/studies/'


def test_docs_name_every_table_kind():
    """docs/experiments.md lists the kinds of generated table: every one of KINDS, no other."""
    doc = (ROOT / 'docs' / 'experiments.md').read_text()
    listed = re.search(r'`lm/experiments/tables\.py` lists them: (.*?)\) made from', doc, re.S)
    assert listed, 'docs/experiments.md no longer lists the table kinds'
    assert set(re.findall(r'`(\w+)`', listed.group(1))) == set(tables.KINDS)


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    docs, results = tmp_path / 'docs', tmp_path / 'results'
    docs.mkdir(), results.mkdir()
    (results / 'x.csv').write_text(
        'arm,seed,loss\na,0,1.10\na,1,1.25\na,2,1.00\nb,0,1.00\nb,1,1.20\nb,2,0.90\n'
    )
    doc = docs / 'x.md'
    doc.write_text('intro\n<!-- table: seeds x -->\nold numbers\n<!-- /table -->\nend\n')
    assert tables.update_docs(str(docs), str(results), write=False) == [str(doc)]
    assert 'old numbers' in doc.read_text()  # --check writes nothing
    tables.update_docs(str(docs), str(results))
    text = doc.read_text()
    assert tables.update_docs(str(docs), str(results), write=False) == []
    assert text.startswith('intro\n<!-- table: seeds x -->\n') and text.endswith(
        '<!-- /table -->\nend\n'
    )
    # a − b = 0.10, 0.05, 0.10: mean 0.0833, interval [0.0116, 0.1550], t = 5 with 2 df:
    # p = 1 - 5 / sqrt(27) = 0.0377; one comparison, so Holm leaves it.
    # sign-flip: 3 differences of one sign, 2 of the 2^3 patterns: 0.25
    assert '| a | b | +0.0833 [0.0116, 0.1550] p=0.0377 ✓ (sign-flip 0.25) | a > b |' in text
    assert 'at 3 paired seeds its smallest p is 2/2^3 = 0.25, above 0.05' in text
    assert 'Holm-corrected over the 1 comparison ' in text
    doc.write_text('<!-- table: nope x -->\n<!-- /table -->\n')
    with pytest.raises(ValueError, match='kind must be one of'):
        tables.update_docs(str(docs), str(results))


SEEDS_CSV = 'arm,seed,loss\na,0,1.10\na,1,1.25\nb,0,1.00\nb,1,1.20\n'
TWO_TABLES = (
    'intro\n<!-- table: seeds x -->\nold\n<!-- /table -->\nprose between\n'
    '<!-- table: seeds x -->\nold\n<!-- /table -->\nend\n'
)


def damaged_study(tmp_path, doc: str, csv: str | bytes = SEEDS_CSV):
    """(docs dir, results dir, the doc's path, the CSV's path) of a study with one doc."""
    docs, results = tmp_path / 'docs', tmp_path / 'results'
    docs.mkdir(), results.mkdir()
    (docs / 'x.md').write_text(doc)
    path = results / 'x.csv'
    path.write_bytes(csv if isinstance(csv, bytes) else csv.encode())
    return docs, results, docs / 'x.md', path


def test_a_marker_with_a_seed_range_tables_those_seeds_alone(tmp_path):
    """`<!-- table: KIND NAME seeds A-B -->` makes the table of the rows of seeds A..B: the
    same as a CSV of those rows; a CSV with no seed column, or no row in the range, is named."""
    results = tmp_path / 'results'
    results.mkdir()
    rows = 'arm,seed,loss\n' + ''.join(
        f'{arm},{k},{1 + 0.1 * k + (0.05 if arm == "b" else 0) + 0.01 * (k % 3)}\n'
        for arm in 'ab'
        for k in range(6)
    )
    (results / 'x.csv').write_text(rows)
    lines = rows.splitlines()
    kept = [lines[0], *(r for r in lines[1:] if int(r.split(',')[1]) >= 2)]
    (results / 'y.csv').write_text('\n'.join(kept) + '\n')
    some = tables.render('<!-- table: seeds x seeds 2-5 -->\n<!-- /table -->\n', str(results))
    whole = tables.render('<!-- table: seeds y -->\n<!-- /table -->\n', str(results))
    assert some.split('\n', 1)[1] == whole.split('\n', 1)[1] and '| 4 |' in some
    (results / 'r.csv').write_text('arm,loss\na,1\n')
    for marker, message in [
        ('seeds r seeds 0-1', r'r\.csv: a table of seeds 0-1 needs a seed column'),
        ('seeds x seeds 7-9', r'x\.csv: no row of seeds 7-9'),
    ]:
        with pytest.raises(ValueError, match=message):
            tables.render(f'<!-- table: {marker} -->\n<!-- /table -->\n', str(results))


def test_a_described_marker_drops_the_marks_of_resolution_and_says_why(tmp_path):
    """`... described -->` (a result no stated test answers): the same table with no ✓ and its
    family note's key to ✓ replaced; the p values stay. Also after `seeds A-B`."""
    results = tmp_path / 'results'
    results.mkdir()
    rows = seed_rows({'a': [1.0, 1.1, 1.2, 1.05, 1.15], 'b': [1.5, 1.62, 1.71, 1.55, 1.66]}, 'v')
    (results / 'x.csv').write_text(
        'arm,seed,v\n' + ''.join(f'{r["arm"]},{r["seed"]},{r["v"]}\n' for r in rows)
    )
    for where in ('', ' seeds 0-4'):
        stated = tables.render(f'<!-- table: seeds x{where} -->\n<!-- /table -->\n', str(results))
        shown = tables.render(
            f'<!-- table: seeds x{where} described -->\n<!-- /table -->\n', str(results)
        )
        assert ' ✓ (sign-flip' in stated and tables.RESOLVED_NOTE in stated  # resolved as stated
        assert tables.DESCRIBED_NOTE in shown and tables.RESOLVED_NOTE not in shown
        assert shown.count('✓') == tables.DESCRIBED_NOTE.count('✓')
        body = [line for line in stated.split('\n')[1:] if tables.RESOLVED_NOTE not in line]
        assert [line.replace(' ✓', '') for line in body] == [
            line for line in shown.split('\n')[1:] if tables.DESCRIBED_NOTE not in line
        ]


def test_a_marker_with_pairs_tests_those_pairs_alone_in_their_direction(tmp_path):
    """`... pairs c:a,b:c -->` tests c − a and b − c alone, Holm over those 2 (a hand Holm of
    scipy's paired t-tests); a pair not written a:b, an arm the CSV lacks, or pairs on a kind
    other than 'seeds' is refused in one line."""
    rng = np.random.default_rng(3)
    data = {
        arm: list(1 + shift + rng.normal(0, 0.02, 6))
        for arm, shift in zip('abc', (0, 0.03, 0.05), strict=True)
    }
    results = tmp_path / 'results'
    results.mkdir()
    rows = seed_rows(data, 'loss')
    (results / 'x.csv').write_text(
        'arm,seed,loss\n' + ''.join(f'{r["arm"]},{r["seed"]},{r["loss"]}\n' for r in rows)
    )
    text = tables.render('<!-- table: seeds x pairs c:a,b:c -->\n<!-- /table -->\n', str(results))
    assert 'Holm-corrected over the 2 comparisons' in text
    cells = [line.strip('| ').split(' | ') for line in text.splitlines()]
    compared = [c[:2] for c in cells if len(c) == 4 and c[1] in 'abc' and c[2][0] in '+-']
    assert compared == [['c', 'a'], ['b', 'c']]
    p = [scipy.stats.ttest_rel(data[x], data[y]).pvalue for x, y in ('ca', 'bc')]
    low, high = sorted(p)
    holm = {low: min(1.0, 2 * low), high: min(1.0, max(2 * low, high))}
    for (x, y), pg in zip(('ca', 'bc'), p, strict=True):
        row = next(c for c in cells if c[:2] == [x, y])
        diff = np.mean(np.array(data[x]) - np.array(data[y]))
        assert row[2].startswith(f'{diff:+.4f}') and f'p={holm[pg]:.3g}' in row[2], row
    for marker, message in [
        ('seeds x pairs a:b,c', r"x\.csv: pairs \['c'\] must each be written a:b"),
        ('seeds x pairs a:a', r"x\.csv: pairs \['a:a'\] must each be written a:b \(two different"),
        ('seeds x pairs a:b,b:a', r'x\.csv: pairs a:b,b:a compare two arms twice'),
        ('seeds x pairs a:d', r"x\.csv: pairs name arm\(s\) \['d'\] it lacks"),
        ('within x pairs a:b', 'pairs work with the seeds kind only'),
    ]:
        with pytest.raises(ValueError, match=message):
            tables.render(f'<!-- table: {marker} -->\n<!-- /table -->\n', str(results))


def test_a_csv_a_kind_cannot_table_is_refused_in_one_line_naming_it(tmp_path):
    """A column the kind needs that the CSV lacks (it was a KeyError traceback), a seed that is
    not a whole number (named with its line), and two arms with no seed in common (it tabled a
    'nan' difference)."""
    results = tmp_path / 'results'
    results.mkdir()
    (results / 'z.csv').write_text('arm,loss\na,1.0\nb,2.0\n')
    (results / 's.csv').write_text('arm,seed,loss\na,0,1.0\na,x,1.1\n')
    (results / 'y.csv').write_text('arm,seed,loss\na,0,1.0\na,1,1.1\nb,2,1.2\nb,3,1.3\n')
    for marker, message in [
        ('seeds z', r"z\.csv: lacks the column 'seed' that a 'seeds' table needs$"),
        ('trend z', r"z\.csv: lacks the column '.*' that a 'trend' table needs$"),
        ('seeds s', r"s\.csv line 3: seed 'x' is not a whole number$"),
        ('seeds y', r'y\.csv: two arms it compares share no seed'),
    ]:
        with pytest.raises(ValueError, match=message):
            tables.render(f'<!-- table: {marker} -->\n<!-- /table -->\n', str(results))


@pytest.mark.parametrize(
    'doc, line, message',
    [
        (TWO_TABLES.replace('old\n<!-- /table -->\nprose', 'old\nprose'), 2, 'no <!-- /table -->'),
        (TWO_TABLES.replace('<!-- /table -->\nend', 'end'), 6, 'no <!-- /table -->'),
        (TWO_TABLES.replace('intro\n<!-- table: seeds x -->', 'intro\n'), 4, 'closes no table'),
        (
            TWO_TABLES.replace('<!-- table: seeds x -->\nold', '<!-- table: seeds -->\nold', 1),
            2,
            'is not a table marker',
        ),
    ],
    ids=['first-end-deleted', 'last-end-deleted', 'opener-deleted', 'opener-without-name'],
)
def test_a_missing_or_broken_table_marker_is_refused_and_nothing_is_written(
    tmp_path, doc, line, message
):
    """A deleted end marker used to make the rewrite delete everything up to the next table's
    end, prose included; now the doc is refused naming the line, by --check too."""
    docs, results, path, _ = damaged_study(tmp_path, doc)
    for write in (False, True):
        with pytest.raises(ValueError) as refused:
            tables.update_docs(str(docs), str(results), write=write)
        assert str(refused.value).startswith(f'{path} line {line}: ')
        assert message in str(refused.value) and '\n' not in str(refused.value)
    assert path.read_text() == doc


@pytest.mark.parametrize(
    'csv, message',
    [
        (SEEDS_CSV + 'b,2,nan\n', " line 6: loss='nan' is not a finite number"),
        (SEEDS_CSV + 'b,2,-inf\n', " line 6: loss='-inf' is not a finite number"),
        (SEEDS_CSV + 'a,1,1.30\n', ' line 6: repeats the row of line 3 (arm=a, seed=1)'),
        (SEEDS_CSV + 'a,1,1.25\n', ' line 6: repeats the row of line 3 (arm=a, seed=1)'),
        (SEEDS_CSV + 'b,2\n', ' line 6: 2 fields, but the header has 3'),
        (SEEDS_CSV + 'b,2,1.0,9\n', ' line 6: 4 fields, but the header has 3'),
        (b'\x89PNG\r\n\x1a\n\x00\x00', ' line 1: not UTF-8 text (byte 0); a CSV was expected'),
        (
            SEEDS_CSV.encode() + b'b,2,1.\xff\n',
            ' line 6: not UTF-8 text (byte 56); a CSV was expected',
        ),
        (SEEDS_CSV + 'b,2,1.O5\n', " line 6: loss='1.O5' is not a number, as the column's other"),
        (
            SEEDS_CSV.encode() + b'b,2,1\x00\n',
            ' line 6: a NUL byte (a binary file?); a CSV was expected',
        ),
        ('', ': empty; a CSV with a header line was expected'),
        ('arm,seed,loss\n', ': no rows under its header'),
    ],
    ids=['nan', 'inf', 'conflicting-duplicate', 'equal-duplicate', 'short-row', 'long-row']
    + ['binary', 'not-utf8-row', 'word-among-numbers', 'nul-byte', 'empty', 'header-only'],
)
def test_a_damaged_csv_is_refused_naming_the_file_and_line_before_anything_is_written(
    tmp_path, csv, message
):
    """A nan used to be written as 'nan ± nan' and shrink the Holm family; a duplicate row
    silently replaced the first; short rows and binary files gave tracebacks."""
    docs, results, path, csv_path = damaged_study(tmp_path, TWO_TABLES, csv)
    for write in (False, True):
        with pytest.raises(ValueError) as refused:
            tables.update_docs(str(docs), str(results), write=write)
        assert str(refused.value).startswith(f'{path}: {csv_path}{message}')
    assert path.read_text() == TWO_TABLES


def test_a_csv_that_is_a_directory_or_a_page_that_is_not_utf8_is_named_in_one_line(tmp_path):
    docs, results, path, csv_path = damaged_study(tmp_path, TWO_TABLES)
    csv_path.unlink()
    csv_path.mkdir()
    with pytest.raises(ValueError) as refused:
        tables.update_docs(str(docs), str(results))
    assert str(refused.value) == f'{path}: {csv_path}: a directory; a CSV was expected'
    csv_path.rmdir()
    csv_path.write_text(SEEDS_CSV)
    path.write_bytes(TWO_TABLES.encode() + b'caf\xe9\n')  # Latin-1, line 10
    with pytest.raises(ValueError) as refused:
        tables.update_docs(str(docs), str(results))
    assert str(refused.value) == (
        f'{path} line 10: not UTF-8 text (byte {len(TWO_TABLES) + 3}); a Markdown page was expected'
    )


@pytest.mark.slow
def test_make_tables_check_reports_the_damage_not_stale_and_writes_nothing(tmp_path):
    """--check says what is damaged, in one line, not just 'stale'."""
    study = tmp_path / 'studies' / 'a'
    (study / 'results').mkdir(parents=True)
    (study / 'results' / 'x.csv').write_text(SEEDS_CSV)
    (study / 'README.md').write_text(TWO_TABLES)
    damaged = tmp_path / 'studies' / 'b'
    (damaged / 'results').mkdir(parents=True)
    (damaged / 'results' / 'x.csv').write_text(SEEDS_CSV + 'b,2,nan\n')
    (damaged / 'README.md').write_text(TWO_TABLES)
    out = run_entry('scripts/make_tables.py', f'--studies={tmp_path / "studies"}', '--check')
    assert out.returncode == 1 and 'stale' not in out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f'error: {damaged / "README.md"}: {damaged / "results" / "x.csv"} line 6: '
        "loss='nan' is not a finite number"
    )
    assert (study / 'README.md').read_text() == TWO_TABLES  # the rewrite: tests above


def test_a_sweeps_seed_csv_gives_one_table_per_value():
    rows = [
        {'point': a, 'seed': str(s), 'eval_loss': str(loss), 'eval_recall_accuracy': str(acc)}
        for a, s, loss, acc in [
            ('mha', 0, 1.10, 0.90),
            ('mha', 1, 1.25, 0.95),
            ('mha', 2, 1.00, 0.97),
            ('mqa', 0, 1.00, 0.80),
            ('mqa', 1, 1.20, 0.88),
            ('mqa', 2, 0.90, 0.91),
        ]
    ]
    text = summary.seeds_table(rows)
    loss, acc = text.split('eval_recall_accuracy:')
    # one Holm family over the question's metrics: loss p = 1 − 5/√27 = 0.0377; accuracy
    # mha − mqa = 0.10, 0.07, 0.06: mean 0.0767, t = 6.379, p = 0.0237 (2 df); the runs that
    # learned, 3 of 3 each: Fisher p = 1. Holm: 3 × 0.0237 = 0.0711, 2 × 0.0377 = 0.0755, 1;
    # the sign-flip p's (0.25 each, over the two t-tests): 0.5
    assert loss.startswith('eval_loss:') and 'over the 3 comparisons' in loss
    assert '| mha | mqa | +0.0833 [0.0116, 0.1550] p=0.0755 (sign-flip 0.5) |' in loss
    assert '| mha | mqa | +0.0767 [0.0250, 0.1284] p=0.0711 (sign-flip 0.5) | mha ~ mqa' in acc
    assert '| mha | 0.9400 ± 0.0361 |' in acc


def test_within_table_compares_only_the_arms_of_a_group_with_holm_over_those_pairs():
    data = {
        'mqa/width': [0.90, 0.40, 0.95, 0.39],
        'mqa/params': [0.80, 0.41, 0.70, 0.38],
        'mla/width': [0.40, 0.39, 0.41, 0.90],
        'mla/params': [0.41, 0.92, 0.40, 0.93],
    }
    rows = seed_rows(data, 'eval_recall_accuracy')
    text = tables.KINDS['within'](rows)
    assert 'Holm-corrected over the 2 comparisons' in text
    cells = [line.strip('| ').split(' | ') for line in text.splitlines()]
    compared = [c[:2] for c in cells if len(c) == 4 and '/' in c[0] and '/' in c[1]]
    assert compared == [['mqa/width', 'mqa/params'], ['mla/width', 'mla/params']]
    p = [
        scipy.stats.ttest_rel(data[f'{g}/width'], data[f'{g}/params']).pvalue
        for g in ('mqa', 'mla')
    ]
    low, high = sorted(p)
    holm = {low: min(1.0, 2 * low), high: min(1.0, max(2 * low, high))}
    for g, pg in zip(('mqa', 'mla'), p, strict=True):
        row = next(c for c in cells if c[:2] == [f'{g}/width', f'{g}/params'])
        assert f'p={holm[pg]:.3g}' in row[2], (row, holm[pg])


def test_within_table_refuses_an_arm_with_no_group_to_compare_in():
    rows = [
        {'arm': arm, 'seed': str(seed), 'acc': str(0.1 * seed)}
        for arm in ('mqa/width', 'mqa/params', 'mla/width', 'mha')
        for seed in range(3)
    ]
    with pytest.raises(ValueError, match=r"arms \['mla/width', 'mha'\]: each must be"):
        tables.KINDS['within'](rows)


def test_a_pair_without_a_p_value_is_not_counted_in_the_holm_family():
    values = {'x': [1.0, 1.2, 0.9], 'y': [1.1, 1.0, 1.3], 'z': [0.5]}  # z: one seed, no interval
    rows = [
        {'arm': arm, 'seed': str(seed), 'loss': str(v)}
        for arm, vs in values.items()
        for seed, v in enumerate(vs)
    ]
    text = summary.seeds_table(rows)
    assert 'Holm-corrected over the 1 comparison ' in text
    p = scipy.stats.ttest_rel(values['x'], values['y']).pvalue  # m = 1: Holm leaves it
    assert f'p={p:.3g}' in next(line for line in text.splitlines() if line.startswith('| x | y |'))


def test_seed_curve_table_averages_each_arm_over_its_seeds():
    rows = [
        {'run': run, 'step': str(step), 'metric': 'recall_accuracy', 'value': str(v)}
        for run, step, v in [
            ('mha_s0', 100, 0.2),
            ('mha_s1', 100, 0.4),
            ('mha_s0', 200, 0.9),
            ('mha_s1', 200, 0.8),
            ('gqa2_s0', 100, 0.5),
            ('mla', 100, 0.25),  # a one-seed sweep's run has no _s<k>
        ]
    ]
    text = tables.seed_curve_table(rows)
    assert text.startswith('recall_accuracy by step (mean ± std over seeds):')
    # mha at 100: mean 0.3, sample std 0.1414; gqa2 has one seed there and none at 200
    assert '| 100 | 0.300 ± 0.141 | 0.500 (n = 1) | 0.250 (n = 1) |' in text
    assert '| 200 | 0.850 ± 0.071 |  |  |' in text
    # a second metric in the CSV gets a table of its own (it once overwrote the first's cells)
    loss = [{**r, 'metric': 'loss', 'value': str(10 * float(r['value']))} for r in rows]
    both = tables.seed_curve_table(rows + loss)
    first, second = both.split('\n\nloss by step (mean ± std over seeds):\n\n')
    assert first == text
    assert '| 100 | 3.000 ± 1.414 | 5.000 (n = 1) | 2.500 (n = 1) |' in second


def test_intervals_table_recovers_p_and_applies_holm():
    # Two comparisons of 5 seeds whose intervals give t = 4 and t = 2 (half-width = t_{.975,4} x
    # se with se = 0.01): p = 0.016130 and 0.116117 (t distribution, 4 df); Holm: 2 x 0.016130
    # = 0.03226 (resolved), max(0.03226, 0.116117) = 0.116117 (not).
    half = 2.7764451 * 0.01
    rows = [
        {
            'family': 'f',
            'a': 'x',
            'b': 'y',
            'diff': '0.04',
            'seeds': '5',
            'ci_lo': str(0.04 - half),
            'ci_hi': str(0.04 + half),
        },
        {
            'family': 'f',
            'a': 'x',
            'b': 'z',
            'diff': '-0.02',
            'seeds': '5',
            'ci_lo': str(-0.02 - half),
            'ci_hi': str(-0.02 + half),
        },
    ]
    text = tables.intervals_table(rows)
    assert '| f (2) | x | y | +0.0400 | [0.0122, 0.0678] | 0.0161 | 0.0323 | x > y ✓ |' in text
    assert (
        '| f (2) | x | z | -0.0200 | [-0.0478, 0.0078] | 0.116 | 0.116 | x ~ z (unresolved) |'
        in text
    )
    assert math.isclose(2 * 0.016130, 0.03226, abs_tol=1e-5)


def test_ablation_table_keeps_each_targets_trained_arms():
    rows = [
        {'model': m, 'conversion': c, 'alpha_or_steps': a, 'seed': str(k), 'loss': str(v)}
        for m, c, a, vs in [
            ('MHA', 'scratch', '0.0', (1.0, 1.1, 1.2)),  # the source
            ('CLA2', 'mean', '0.0', (3.0, 3.1, 3.2)),  # converted, not trained
            ('CLA2', 'mean', '0.1', (1.10, 1.25, 1.00)),
            ('CLA2', 'scratch', '110', (1.00, 1.20, 0.90)),
            ('MQA', 'mean', '0.1', (2.0, 2.1, 2.2)),
        ]
        for k, v in enumerate(vs)
    ]
    text = ablation_doc_tables.ablation_table(rows)
    cla, mqa = text.split('\n\nMQA:\n\n')
    assert cla.startswith('CLA2:\n\n| arm | loss (mean ± std) |')
    assert '| mean, α = 0.1 | 1.1167 ± 0.1258 |' in cla
    assert '| from scratch, 110 steps | 1.0333 ± 0.1528 |' in cla
    # paired differences 0.10, 0.05, 0.10 (as in the seeds test above): one comparison
    pair = (
        '| mean, α = 0.1 | from scratch, 110 steps | +0.0833 [0.0116, 0.1550] p=0.0377 ✓ '
        '(sign-flip 0.25) |'
    )
    assert pair in cla
    assert 'α = 0.0' not in text and '3.1000' not in text  # the untrained arm is left out
    assert 'MHA' not in text  # and so is the source
    from lm.experiments.ablation_arms import SOURCE

    # the ablation's label of its source
    assert ablation_doc_tables.ablation_table.__defaults__ == (SOURCE,)
    assert '| mean, α = 0.1 | 2.1000 ± 0.1000 |' in mqa
    # An ablation at α = 0 alone: its untrained conversions against the from-scratch baseline.
    untrained = [r for r in rows if r['alpha_or_steps'] in ('0.0', '100')]
    untrained += [{**r, 'alpha_or_steps': '100'} for r in rows if r['alpha_or_steps'] == '110']
    text = ablation_doc_tables.ablation_table(untrained)
    assert text.startswith('CLA2:\n\n') and 'MQA' not in text
    assert '| mean, α = 0.0 | 3.1000 ± 0.1000 |' in text
    # differences 2.0, 1.9, 2.3: mean 2.0667, sd 0.2082, t(2) half-width 0.5171, p 0.00336
    pair = (
        '| mean, α = 0.0 | from scratch, 100 steps | +2.0667 [1.5496, 2.5838] p=0.00336 ✓ '
        '(sign-flip 0.25) |'
    )
    assert pair in text, text
    # MHA trained from scratch at a budget joins every target's table and Holm family.
    mha = [
        {
            'model': 'MHA',
            'conversion': 'scratch',
            'alpha_or_steps': '110',
            'seed': str(k),
            'loss': v,
        }
        for k, v in enumerate(('1.05', '1.15', '1.0'))
    ]
    text = ablation_doc_tables.ablation_table(rows + mha)
    cla, mqa = text.split('\n\nMQA:\n\n')
    assert '| MHA from scratch, 110 steps | 1.0667 ± 0.0764 |' in cla
    assert 'Holm-corrected over the 3 comparisons' in cla
    assert '| mean, α = 0.1 | MHA from scratch, 110 steps | +1.0333' in mqa


def test_targets_table_pairs_targets_within_each_shared_arm_in_one_holm_family():
    rows = [
        {'model': m, 'conversion': c, 'alpha_or_steps': a, 'seed': str(k), 'loss': str(v)}
        for m, c, a, vs in [
            ('MHA', 'scratch', '0.0', (1.0, 1.1, 1.2)),  # the source: left out
            ('MLA-32', 'joint_svd', '0.0', (3.0, 3.2, 3.1)),
            ('MLA-32-k4', 'joint_svd', '0.0', (2.9, 3.0, 3.0)),
            ('MLA-32', 'rewarm-joint_svd', '0.05', (2.0, 2.1, 2.2)),
            ('MLA-32-k4', 'rewarm-joint_svd', '0.05', (1.9, 2.05, 2.1)),
            ('MLA-32', 'scratch', '1050', (1.8, 1.9, 1.85)),  # one target only: left out
        ]
        for k, v in enumerate(vs)
    ]
    text = ablation_doc_tables.targets_table(rows)
    assert 'MHA' not in text and 'from scratch' not in text
    assert '| joint_svd, α = 0.0 | MLA-32 | 3.1000 ± 0.1000 |' in text
    assert '| rewarm-joint_svd, α = 0.05 | MLA-32-k4 | 2.0167 ± 0.1041 |' in text
    assert 'Holm-corrected over the 2 comparisons' in text
    # independent: scipy's paired t-test per arm, Holm over the two by hand
    p0 = scipy.stats.ttest_rel([3.0, 3.2, 3.1], [2.9, 3.0, 3.0]).pvalue
    p1 = scipy.stats.ttest_rel([2.0, 2.1, 2.2], [1.9, 2.05, 2.1]).pvalue
    lo, hi = sorted([p0, p1])
    holm = {lo: min(1, 2 * lo), hi: min(1, max(2 * lo, hi))}
    for arm, p, diff in (
        ('joint_svd, α = 0.0', p0, 0.1333),
        ('rewarm-joint_svd, α = 0.05', p1, 0.0833),
    ):
        line = next(x for x in text.splitlines() if x.startswith(f'| {arm} | MLA-32 | MLA-32-k4 |'))
        assert f'+{diff:.4f} [' in line and f'p={holm[p]:.3g}' in line, (line, holm[p])


def test_lr_grid_table_marks_the_rate_chosen_on_validation_and_reports_held_out_there():
    grid = {  # (model, conversion, alpha_or_steps, lr): per seed (validation, held-out)
        ('MQA', 'mean', '0.05', '0.001'): ((2.0, 2.5), (2.2, 2.7)),
        ('MQA', 'mean', '0.05', '0.003'): ((1.9, 3.0), (2.0, 3.1)),  # mean 2.45 > 2.25
        ('MQA', 'mean', '0.05', '0.0003'): ((2.4, 2.6), (2.5, 2.5)),
        ('MQA', 'scratch', '105', '0.003'): ((1.5, 1.7), (1.6, 1.8)),  # lowest, largest rate
        ('MQA', 'scratch', '105', '0.001'): ((1.8, 1.8), (1.9, 1.9)),
        ('MQA', 'scratch', '105', '0.0003'): ((2.0, 2.0), (2.1, 2.1)),
    }
    rows = [
        {
            'model': m,
            'conversion': c,
            'alpha_or_steps': a,
            'lr': lr,
            'seed': str(k),
            'validation_loss': str(v),
            'heldout_loss': str(h),
        }
        for (m, c, a, lr), (vs, hs) in grid.items()
        for k, (v, h) in enumerate(zip(vs, hs, strict=True))
    ]
    lines = ablation_doc_tables.lr_grid_table(rows).splitlines()
    assert lines[0] == (
        '| model | arm | validation, lr 0.0003 | validation, lr 0.001 | validation, lr 0.003 | '
        'chosen lr | held-out there |'
    )
    mean, scratch = lines[2], lines[3]
    # mean validation 2.5 / 2.25 / 2.45: 1e-3 chosen, held-out there (2.2 + 2.7) / 2
    assert mean.startswith('| MQA | mean, α = 0.05 | 2.5000 ± 0.1414 | **2.2500 ± 0.3536** |')
    assert mean.endswith('| 0.001 | 2.4500 ± 0.3536 |')
    assert scratch.startswith('| MQA | from scratch, 105 steps |')
    assert scratch.endswith('| **1.6000 ± 0.1414** | 0.003 (edge) | 1.7000 ± 0.1414 |')


@pytest.mark.slow
def test_lr_screen_table_bolds_the_rate_chosen_by_accuracy_and_stacks_per_seed_csvs(tmp_path):
    per_rate = {  # lr: the per-seed CSV of that rate's sweep: point, seed, loss, accuracy
        '3e-3': [('mha', 0, 0.1, 0.96), ('mha', 1, 0.2, 0.94), ('mha', 2, 0.3, 0.5)],
        '1e-3': [('mha', 0, 0.01, 1.0), ('mha', 1, 0.03, 0.98)]
        + [('mqa', 0, 0.02, 0.99), ('mqa', 1, 0.02, 0.99)],
        '3e-4': [('mha', 0, 0.02, 1.0), ('mha', 1, 0.03, 0.993)]
        + [('mqa', 0, 0.01, 0.991), ('mqa', 1, 0.01, 0.991)],
    }
    for lr, rows in per_rate.items():
        lines = [','.join(map(str, r)) for r in rows]
        text = '\n'.join(['point,seed,eval_loss,eval_recall_accuracy', *lines])
        (tmp_path / f'{lr}.csv').write_text(text + '\n')
    out = tmp_path / 'screen.csv'
    rates = ','.join(f'{lr}={tmp_path / lr}.csv' for lr in per_rate)
    script = os.path.join(ROOT, 'docs', 'studies', 'recall', 'lr_screen_csv.py')
    run = [sys.executable, script, f'--rates={rates}', f'--out={out}']
    subprocess.run([*run, '--seeds=0,1'], check=True, capture_output=True)
    rows = tables.read_csv(str(out))
    assert [(r['point'], r['lr'], r['seed']) for r in rows][:3] == [
        ('mha', '3e-3', '0'),
        ('mha', '3e-3', '1'),
        ('mha', '1e-3', '0'),
    ]  # seed 2 cut
    lines = recall_tables.lr_screen_table(rows).splitlines()
    assert lines[0] == (
        '| arm | lr 0.003: accuracy, loss | lr 0.001: accuracy, loss | lr 0.0003: accuracy, loss '
        '| chosen lr |'
    )
    # MHA: 95.00 / 99.00 / 99.65%: 3e-4 over the 0.5-point band; MQA (no 3e-3 run): 99.0 and
    # 99.1%, tied: 3e-4's lower loss
    assert lines[2] == '| mha | 95.00%, 0.1500 | 99.00%, 0.0200 | **99.65%, 0.0250** | 0.0003 |'
    assert lines[3] == '| mqa |  | 99.00%, 0.0200 | **99.10%, 0.0100** | 0.0003 |'
    # --choose_on: each point's rows at the rate its screen chose (here the same CSVs)
    chosen = tmp_path / 'chosen.csv'
    pick = [script, f'--rates={rates}', f'--out={chosen}', f'--choose_on={out}', '--seeds=0,1']
    subprocess.run([sys.executable, *pick], check=True, capture_output=True)
    assert chosen.read_text().splitlines() == [
        'point,seed,eval_loss,eval_recall_accuracy',
        'mha at lr 3e-4,0,0.02,1.0',
        'mha at lr 3e-4,1,0.03,0.993',
        'mqa at lr 3e-4,0,0.01,0.991',
        'mqa at lr 3e-4,1,0.01,0.991',
    ]
    (tmp_path / 'curve.csv').write_text('run,step,metric,value\nmha_s0,100,acc,0.5\n')
    bad = subprocess.run(
        [*run, f'--rates=1e-3={tmp_path / "curve.csv"}'], capture_output=True, text=True
    )
    assert bad.stderr.strip().splitlines()[-1] == (
        f'error: --rates: {tmp_path / "curve.csv"} is not a per-seed CSV (point, seed, values...)'
    )


def test_a_choice_at_the_edge_of_the_rates_run_names_the_next_rate_until_extensions_run_out():
    """lr_grid.next_rate: a choice at the largest (smallest) rate run names the next rung up
    (down) while fewer than `past` rates lie beyond the grid that way; an inner choice, a choice
    with the extensions used up or at the ladder's end names none."""
    from lm.experiments import lr_grid

    ladder, grid = [1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], [5e-4, 1e-3, 2e-3, 4e-3]
    assert lr_grid.next_rate(2e-3, grid, ladder, grid, 2) is None
    assert lr_grid.next_rate(4e-3, grid, ladder, grid, 2) == 8e-3
    assert lr_grid.next_rate(8e-3, [*grid, 8e-3], ladder, grid, 2) == 1.6e-2
    assert lr_grid.next_rate(1.6e-2, [*grid, 8e-3, 1.6e-2], ladder, grid, 2) is None
    assert lr_grid.next_rate(1.6e-2, [*grid, 8e-3, 1.6e-2], ladder, grid, 3) is None  # ladder end
    assert lr_grid.next_rate(5e-4, grid, ladder, grid, 2) == 2.5e-4
    assert lr_grid.next_rate(2.5e-4, [2.5e-4, *grid], ladder, grid, 1) is None
    assert lr_grid.next_rate(1.25e-4, [1.25e-4, 2.5e-4, *grid], ladder, grid, 3) is None  # end
    assert lr_grid.next_rate(4e-3, [*grid, 8e-3], ladder, grid, 2) is None  # 8e-3 was worse


def test_a_screens_seeds_are_checked_for_the_rows_that_are_used():
    """lr_grid.check_seeds / at_chosen_rates: stacking every rate needs every seed of every
    point; picking each point's chosen rate needs them at that rate only."""
    from lm.experiments import lr_grid

    def row(point, seed, acc):
        return {'point': point, 'seed': str(seed), 'eval_loss': '0.1', 'eval_recall_accuracy': acc}

    by_rate = {
        '1e-3': [row('mha', 0, '0.9'), row('mha', 1, '0.9'), row('mha', 2, '0.9')],
        '3e-4': [row('mha', 0, '1.0'), row('mha', 1, '1.0')],
    }
    screen = lr_grid.stack(by_rate, [0, 1])  # 3e-4 chosen: 100% against 90%
    assert [(r['point'], r['lr'], r['seed']) for r in screen][:2] == [
        ('mha', '1e-3', '0'),
        ('mha', '1e-3', '1'),
    ]
    lr_grid.check_seeds(screen, [0, 1])
    with pytest.raises(ValueError, match=r'^mha at lr 3e-4: seeds \[0, 1\] lack \[0, 1, 2\]$'):
        lr_grid.check_seeds(lr_grid.stack(by_rate, [0, 1, 2]), [0, 1, 2])
    picked = lr_grid.at_chosen_rates(lr_grid.stack(by_rate, [0, 1]), screen, [0, 1])
    assert [(r['point'], r['seed']) for r in picked] == [
        ('mha at lr 3e-4', '0'),
        ('mha at lr 3e-4', '1'),
    ]
    with pytest.raises(ValueError, match=r'^mha at lr 3e-4: seeds \[0, 1\] lack \[0, 1, 2\]$'):
        lr_grid.at_chosen_rates(lr_grid.stack(by_rate, [0, 1, 2]), screen, [0, 1, 2])
    with pytest.raises(ValueError, match=r'^no rows of mha at its chosen lr 0.0003$'):
        lr_grid.at_chosen_rates(lr_grid.stack({'1e-3': by_rate['1e-3']}, [0, 1]), screen, [0, 1])


def test_rows_table_shows_a_csv_as_written():
    rows = [{'layout': 'contiguous', 'share': '0.0'}, {'layout': 'interleaved', 'share': '0.97'}]
    expected = '| layout | share |\n|---|---|\n| contiguous | 0.0 |\n| interleaved | 0.97 |'
    assert tables.KINDS['rows'](rows) == expected


def test_curve_table():
    rows = [
        {'run': 'lr1e-3', 'step': '100', 'metric': 'recall_accuracy', 'value': '0.5'},
        {'run': 'lr3e-3', 'step': '100', 'metric': 'recall_accuracy', 'value': '0.25'},
        {'run': 'lr3e-3', 'step': '200', 'metric': 'recall_accuracy', 'value': '0.9'},
    ]
    assert tables.curve_table(rows) == (
        'recall_accuracy by step:\n\n| step | lr1e-3 | lr3e-3 |\n|---|---|---|\n'
        '| 100 | 0.500 | 0.250 |\n| 200 |  | 0.900 |'
    )


def test_last_step_table_and_the_curve_of_a_csv_of_several_metrics():
    rows = [
        {'run': 's0', 'step': '100', 'metric': 'acc', 'value': '0.5'},
        {'run': 's0', 'step': '100', 'metric': 'acc/depth0', 'value': '0.4'},
        {'run': 's0', 'step': '200', 'metric': 'acc', 'value': '0.75'},
        {'run': 's0', 'step': '200', 'metric': 'acc/depth0', 'value': '0.625'},
        {'run': 's1', 'step': '100', 'metric': 'acc', 'value': '0.25'},
    ]
    assert tables.last_step_table(rows) == (
        '| run | step | acc | acc/depth0 |\n|---|---|---|---|\n'
        '| s0 | 200 | 0.750 | 0.625 |\n| s1 | 100 | 0.250 |  |'
    )
    assert tables.curve_table(rows) == (  # the first metric only
        'acc by step:\n\n| step | s0 | s1 |\n|---|---|---|\n| 100 | 0.500 | 0.250 |\n'
        '| 200 | 0.750 |  |'
    )


def test_ablation_tables_correct_over_the_whole_report():
    """The uptraining report's Δ-vs-scratch cells and method comparisons are one Holm family,
    whose size the report states; a difference resolved alone can be unresolved within it."""
    from lm.experiments.ablation_arms import SOURCE, Ablation
    from lm.experiments.ablation_tables import tables

    ab = Ablation(
        config_file=str(ROOT / 'configs' / 'shakespeare_char.py'),
        data_path='unused.txt',
        steps=100,
        seeds=3,
        fractions=(0.1,),
        scratch_fractions=(0.1,),
        targets=(1,),
        methods=('mean', 'first'),
    )
    values = {
        (SOURCE, 'scratch', 0.0): {0: 1.0, 1: 1.1, 2: 1.2},
        ('MQA', 'mean', 0.1): {0: 1.10, 1: 1.25, 2: 1.00},
        ('MQA', 'first', 0.1): {0: 1.20, 1: 1.30, 2: 1.10},
        ('MQA', 'scratch', 110): {0: 1.00, 1: 1.20, 2: 0.90},
    }
    text = tables(ab, values, chosen={})
    # mean - scratch = 0.10, 0.05, 0.10: t = 5, p = 0.03775 (resolved alone); first - scratch =
    # 0.20, 0.10, 0.20: t = 5, p = 0.03775; mean - first = -0.10, -0.05, -0.10: p = 0.03775.
    # Holm over the 3: 3 x 0.03775 = 0.113 for each, none resolved.
    assert 'Holm-corrected over the 3 comparisons' in text
    # The exact sign-flip p of 3 differences of one sign: 2/2^3 = 0.25, x 3 (Holm) = 0.75.
    assert '+0.0833 [0.0116, 0.1550] p=0.113 (sign-flip 0.75) |' in text and ' ✓ (' not in text
    row = '| MQA | 0.1 | mean | first | -0.0833 [-0.1550, -0.0116] p=0.113 (sign-flip 0.75) |'
    assert row in text
    # MHA from scratch at the same budget joins the family: each arm and the target against it
    values[(SOURCE, 'scratch', 110)] = {0: 0.95, 1: 1.10, 2: 0.90}
    text = tables(dataclasses.replace(ab, mha_scratch=True), values, chosen={})
    assert 'Holm-corrected over the 6 comparisons' in text
    assert '| MHA | from scratch | — | 110 | 0.9833 ± 0.1041 |' in text
    mqa = '| MQA | — | MQA from scratch (110 steps) | MHA from scratch (110 steps) | +0.0500'
    assert mqa in text
    assert '| MQA | 0.1 | first | MHA from scratch (110 steps) | +0.2167' in text


def test_learned_table_counts_runs_and_corrects_the_fisher_tests():
    """Three arms of five seeds: learned (accuracy >= 0.8) 5, 4 and 0 times. Fisher's exact
    p (by hand, hypergeometric over margins 5 and 5): 5 vs 4 -> 1; 5 vs 0 -> 2/252; 4 vs 0 ->
    (1 + 5 + 5 + 1)/252 = 12/252 (k = 0, 1, 4, 5 in arm b as or less likely). They are
    corrected in one Holm family with the paired t-tests of the CSV's values (scipy's
    ttest_rel; a loss equal in every run gives p = 1): Holm written out here."""
    acc = LEARNED_ACCURACY
    rows = seed_rows(acc, 'eval_recall_accuracy', key='point', eval_loss='1.0')
    text = recall_tables.learned_table(rows)
    assert '| a | 5 of 5 | [0.48, 1.00] |' in text
    assert '| c | 0 of 5 | [0.00, 0.52] |' in text
    assert 'Holm-corrected over the 9 comparisons' in text
    pairs = [('a', 'b'), ('a', 'c'), ('b', 'c')]
    fisher = [1.0, 2 / 252, 12 / 252]
    t = [scipy.stats.ttest_rel(acc[x], acc[y]).pvalue for x, y in pairs]
    raw = fisher + t + [1.0, 1.0, 1.0]
    order = sorted(range(9), key=lambda i: raw[i])
    holm, running = [0.0] * 9, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (9 - rank) * raw[i]))
        holm[i] = running
    for (x, y), p, adj in zip(pairs, fisher, holm[:3], strict=True):
        assert f'| {x} | {y} | {p:.3g} | {adj:.3g} |' in text
    assert ('| a | c | ' in text) and ('a > c |' in text) == (holm[1] < 0.05)


def test_recall_pairs_table_corrects_counts_and_accuracy_each_over_the_pairs_alone():
    """The same three arms as above (learned 5, 4 and 0 times), tested as a statement that
    named two families: Fisher's p's (1, 2/252, 12/252) Holm over the 3 pairs alone, and the
    accuracy t-tests (scipy's ttest_rel) Holm over the 3 pairs alone; the loss is not tested."""
    acc = LEARNED_ACCURACY
    rows = seed_rows(acc, 'eval_recall_accuracy', key='point', eval_loss='1.0')
    text = tables.KINDS['recall_pairs'](rows)
    counts, accuracy = text.split('eval_recall_accuracy per seed:')
    assert '| b | 4 of 5 | [0.28, 0.99] |' in counts and 'eval_loss' not in text
    assert counts.count('Holm-corrected over the 3 comparisons') == 1
    assert accuracy.count('Holm-corrected over the 3 comparisons') == 1

    def holm3(raw):
        order, out, running = sorted(range(3), key=lambda i: raw[i]), [0.0] * 3, 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (3 - rank) * raw[i]))
            out[i] = running
        return out

    pairs = [('a', 'b'), ('a', 'c'), ('b', 'c')]
    fisher = [1.0, 2 / 252, 12 / 252]
    for (x, y), p, adj in zip(pairs, fisher, holm3(fisher), strict=True):
        assert f'| {x} | {y} | {p:.3g} | {adj:.3g} |' in counts
    assert '| a | c | 0.00794 | 0.0238 | a > c |' in counts  # 3 × 2/252: resolved alone
    t = [scipy.stats.ttest_rel(acc[x], acc[y]).pvalue for x, y in pairs]
    for (x, y), adj in zip(pairs, holm3(t), strict=True):
        row = next(
            ln for ln in accuracy.splitlines() if ln.startswith(f'| {x} | {y} | ') and '[' in ln
        )
        assert f'p={adj:.3g}' in row, (row, adj)


def test_against_base_table_tests_each_option_against_its_base_in_its_own_holm_family():
    """Two bases and two options: each '<base>+<option>' arm is compared with its own base only
    (4 tests, none across bases or options), Holm over the 2 tests of each option (scipy's
    ttest_rel, Holm written out); an arm whose base is missing is refused."""
    data = {
        'mha': [1.00, 1.10, 0.90, 1.05],
        'mqa': [1.20, 1.25, 1.10, 1.30],
        'mha+int8': [1.01, 1.10, 0.91, 1.06],
        'mqa+int8': [1.20, 1.27, 1.10, 1.31],
        'mha+kivi4': [1.05, 1.16, 0.94, 1.09],
        'mqa+kivi4': [1.26, 1.30, 1.17, 1.34],
    }
    rows = seed_rows(data, 'eval_loss')
    text = tables.KINDS['against_base'](rows)
    int8, kivi4 = text.split('\nint8:\n')[1].split('\nkivi4:\n')
    assert 'over the 2 comparisons of int8' in int8 and 'over the 2 comparisons of kivi4' in kivi4
    compared = [ln.split(' | ')[:2] for ln in text.splitlines() if ' p=' in ln]
    assert [(a.strip('| '), b) for a, b in compared] == [
        ('mha+int8', 'mha'),
        ('mqa+int8', 'mqa'),
        ('mha+kivi4', 'mha'),
        ('mqa+kivi4', 'mqa'),
    ]
    for option, section in (('int8', int8), ('kivi4', kivi4)):
        p = [scipy.stats.ttest_rel(data[f'{b}+{option}'], data[b]).pvalue for b in ('mha', 'mqa')]
        low, high = sorted(p)
        holm = {low: min(1.0, 2 * low), high: min(1.0, max(2 * low, high))}
        for b, pb in zip(('mha', 'mqa'), p, strict=True):
            row = next(
                ln for ln in section.splitlines() if ln.startswith(f'| {b}+{option} | {b} |')
            )
            assert f'p={holm[pb]:.3g}' in row, (row, holm[pb])
    with pytest.raises(ValueError, match=r"arm 'gqa\+int8' has no base arm 'gqa'"):
        tables.KINDS['against_base'](rows + [{'arm': 'gqa+int8', 'seed': '0', 'eval_loss': '1'}])


def test_steps_to_table_pairs_first_steps_and_skips_runs_that_never_reached():
    """mha's seeds first reach 0.9 at steps 300, 500, 400 (seed 1 touches exactly 0.9, then
    dips: the first step counts), mqa's at 500, 600, 600; mla's one run never does. Paired
    mha − mqa = −200, −100, −200: mean −166.67, sample std 57.735, t = −5 with 2 df, two-sided
    p = 1 − 5/√27 = 0.0377 (df 2 has a closed form), the one pair tested (Holm over 1); 95% CI
    −166.67 ± 4.3027 · 33.333 = [−310, −23]."""
    curves = {
        'mha_s0': [0.5, 0.95, 0.97],
        'mha_s1': [0.5, 0.6, 0.7, 0.9, 0.85],
        'mha_s2': [0.5, 0.6, 0.91],
        'mqa_s0': [0.5, 0.6, 0.7, 0.92],
        'mqa_s1': [0.5, 0.6, 0.7, 0.8, 0.93],
        'mqa_s2': [0.5, 0.6, 0.7, 0.8, 0.90],
        'mla_s0': [0.5, 0.6, 0.89],
    }
    rows = [
        {'run': run, 'step': str(200 + 100 * i), 'metric': 'recall_accuracy', 'value': str(v)}
        for run, values in reversed(curves.items())  # arms in the CSV's order: mla, mqa, mha
        for i, v in reversed(list(enumerate(values)))  # steps in any order
    ]
    rows.append({'run': 'mha_s0', 'step': '100', 'metric': 'loss', 'value': '0.95'})  # other metric
    text = recall_tables.steps_to_table(rows)
    assert '| mha | 400 ± 100 | [152, 648] | 3 | 0 |' in text  # t_{.975,2} · 100/√3 = 248
    assert '| mqa | 567 ± 58 | [423, 710] | 3 | 0 |' in text
    assert '| mla | n/a | n/a | 0 | 1 |' in text
    assert 'Holm-corrected over the 1 comparison ' in text
    want = f'| mqa | mha | +167 [23, 310] p={1 - 5 / 27**0.5:.3g} ✓ (sign-flip 0.25) | mqa > mha |'
    assert want in text
    assert '| mla | mqa | not tested | 1 run(s) never reached 0.9 |' in text


def test_family_note_says_whether_the_sign_flip_test_can_pass_after_holm():
    """The floor 2/2^n passes only if Holm's first step, the floor times the family size, is
    below 0.05: 8 seeds pass in a family of 2 (0.0156) and not in one of 10 (0.078)."""
    family_note = summary.family_note
    assert family_note(10, 3).endswith('2/2^3 = 0.25, above 0.05: no comparison here can pass it.')
    assert family_note(10, 8).endswith(
        '2/2^8 = 0.00781, and Holm over 10 makes it at least 0.0781: no comparison here can '
        'pass it.'
    )
    assert family_note(2, 8).endswith(
        '2/2^8 = 0.00781, 0.0156 after Holm over 2, below 0.05: it can pass.'
    )
    # above stats.EXACT_SIGN_FLIP_N seeds the test samples sign patterns: its floor is theirs
    assert 'exact' in family_note(2, 40) and '2/2^40' in family_note(2, 40)
    many = family_note(2, 41)
    assert 'exact' not in many and 'over 2^20 seeded random sign patterns' in many
    assert many.endswith(
        '1/(2^20 + 1) = 9.54e-07, 1.91e-06 after Holm over 2, below 0.05: it can pass.'
    )
    assert stats.sign_flip_floor(41) == 1 / (stats.SIGN_FLIP_DRAWS + 1)
