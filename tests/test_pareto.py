"""The Pareto figure's numbers: the front on hand-made points (ties, dominated points, both
directions), error bars against hand-computed t-intervals, points read from run directories and
tables, and the figure written as a PNG and as a TensorBoard image."""

import csv
import json
import math

import pytest
from conftest import ROOT
from test_sweep import fake_run

from lm.experiments import pareto, pareto_plot, stats


def point(label, kv, mean, panel=''):
    return pareto.Point(label, kv, stats.Estimate(1, mean, math.nan, math.nan, math.nan), '', panel)


HAND = [  # (label, bytes, value)
    ('a', 256, 1.60),
    ('b', 512, 1.55),
    ('c', 512, 1.55),  # ties b: same bytes, same mean; neither dominates the other
    ('d', 512, 1.58),  # b is better at the same bytes
    ('e', 1024, 1.55),  # b has as good a value with fewer bytes
    ('f', 2048, 1.50),
    ('g', 256, 1.70),  # a: same bytes, better (lower) value
    ('h', 1024, 1.60),
]


def test_front_of_hand_made_points_lower_is_better():
    points = [point(*p) for p in HAND]
    assert [p.label for p in pareto.front(points, higher=False)] == ['a', 'b', 'c', 'f']
    assert pareto.dominates(points[1], points[4], False)  # fewer bytes, equal value
    assert not pareto.dominates(points[1], points[2], False)  # identical: no domination


def test_front_of_hand_made_points_higher_is_better():
    points = [point(*p) for p in [*HAND, ('i', 4096, 1.80)]]
    # as accuracies: g (256 B, 1.70) is at least as good as everything up to 2048 B
    assert [p.label for p in pareto.front(points, higher=True)] == ['g', 'i']
    assert pareto.higher_is_better('eval/recall_accuracy')
    assert not pareto.higher_is_better('eval/loss')


def test_error_bar_is_the_t_interval_from_a_summary():
    # docs/studies/sweeps/README.md, mha: 1.6379 ± 0.0082 over 5 seeds, 95% CI [1.6276, 1.6481];
    # t_{0.975, 4} = 2.776445, half-width 2.776445 * 0.0082 / sqrt(5) = 0.0101817
    est = pareto.summary_estimate(1.6379, 0.0082, 5)
    assert est.hi - est.mean == pytest.approx(0.0101817, abs=1e-7)
    assert (round(est.lo, 4), round(est.hi, 4)) == pytest.approx((1.6277, 1.6481), abs=1.1e-4)
    one = pareto.Point('x', 1, pareto.summary_estimate(1.5, 0.0, 1))
    assert one.error == 0.0  # one seed: no interval, no bar


def write_table(path, rows):
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_table_per_seed_rows_and_summary_rows(tmp_path):
    common = {'panel': 'p', 'family': 'f', 'kv_cache_bytes_per_token': 512}
    rows = [
        {**common, 'label': 'mha', 'metric': 'eval/loss', 'seed': s, 'value': v}
        for s, v in enumerate([1.10, 1.25, 1.00])
    ]
    rows.append({**common, 'label': 'mha', 'metric': 'eval/other', 'seed': 0, 'value': 9.0})
    write_table(tmp_path / 'seeds.csv', rows)
    (p,) = pareto.read_table(str(tmp_path / 'seeds.csv'), 'eval/loss')
    # mean 1.116667, sample std 0.125831, half-width 4.302653 * 0.125831 / sqrt(3) = 0.312581
    assert (p.label, p.kv_bytes, p.panel, p.quality.n) == ('mha', 512, 'p', 3)
    assert p.quality.mean == pytest.approx(1.116667, abs=1e-6)
    assert p.error == pytest.approx(0.312581, abs=1e-6)
    with pytest.raises(
        ValueError, match=r"no rows of metric 'eval/recall_accuracy' \(it has eval/loss, eval/o"
    ):
        pareto.read_table(str(tmp_path / 'seeds.csv'), 'eval/recall_accuracy')


def test_a_damaged_table_is_refused_naming_the_flag_and_the_file(tmp_path):
    """--table's errors name the flag and the file (and the line, where there is one)."""
    path = tmp_path / 'points.csv'
    row = {'label': 'mha', 'kv_cache_bytes_per_token': 512, 'metric': 'eval/loss'}
    cases = [
        (None, rf'^--table={path}: no such file$'),
        (b'\x89PNG\r\n\x1a\n', rf'^--table: {path} line 1: not UTF-8 text \(byte 0\)'),
        ([{**row, 'seed': 0}], rf'^--table: {path} lacks the column\(s\) value: expected label, '),
        ([row], rf'^--table: {path} lacks the column\(s\) mean, std, seeds: expected'),
        (
            [{**row, 'seed': 0, 'value': 1.0}, {**row, 'seed': 1, 'value': 'x'}],
            rf"^--table: {path} line 3: value='x' is not a number",
        ),
        (
            [{**row, 'kv_cache_bytes_per_token': 'many', 'seed': 0, 'value': 1.0}],
            rf"^--table: {path}: arm mha: kv_cache_bytes_per_token='many' is not a number$",
        ),
    ]
    for content, message in cases:
        path.unlink(missing_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            write_table(path, content)
        with pytest.raises(ValueError, match=message):
            pareto.read_table(str(path), 'eval/loss')


def finished_runs(tmp_path):
    """Finished runs in one out_dir: mha over three seeds, mqa over two, each with a loss and a
    recall accuracy."""
    runs = [fake_run(tmp_path, 'mha', s, x) for s, x in enumerate([1.10, 1.25, 1.00])]
    runs += [fake_run(tmp_path, 'mqa', s, x, 'mqa') for s, x in enumerate([1.20, 1.30])]
    for i, (spec, result) in enumerate(runs):
        result['eval']['recall_accuracy'] = 0.5 + 0.1 * i
        (tmp_path / spec.name / 'result.json').write_text(json.dumps(result))
    return runs


def test_points_from_an_out_dir(tmp_path):
    runs = finished_runs(tmp_path)
    found = pareto.runs_in(str(tmp_path))
    assert [(r.arm, r.seed) for r in found] == [('mha', 0), ('mha', 1), ('mha', 2)] + [
        ('mqa', 0),
        ('mqa', 1),
    ]
    mha, mqa = pareto.points(found, 'eval/loss')
    assert (mha.family, mqa.family) == ('mha', 'mqa')
    assert mha.kv_bytes == 4 * mqa.kv_bytes  # 4 KV heads against 1
    assert mha.error == pytest.approx(0.312581, abs=1e-6)
    # mqa: 1.20, 1.30: mean 1.25, std 0.0707107, half-width 12.706205 * 0.0707107 / sqrt(2)
    assert mqa.error == pytest.approx(0.635310, abs=1e-6)
    acc = pareto.points(found, 'eval/recall_accuracy')
    assert [p.quality.mean for p in acc] == pytest.approx([0.6, 0.85])
    # higher is better: mqa has fewer bytes and more accuracy, so it alone is the front
    assert [p.label for p in pareto.front(acc, True)] == ['mqa']
    same = pareto.runs_of([s for s, _ in runs], {s.name: r for s, r in runs}, str(tmp_path))
    assert [(r.arm, r.seed) for r in same] == [(r.arm, r.seed) for r in found]
    with pytest.raises(
        ValueError, match="^metric 'eval/bleu': not in the run's result .*eval/loss"
    ):
        pareto.points(found, 'eval/bleu')
    with pytest.raises(ValueError, match=r"^metric 'loss': not in the run's result \(it has eval/"):
        pareto.points(found, 'loss')  # no section: the metrics it has are listed all the same


def test_figure_written_and_logged_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    finished_runs(tmp_path / 'sweep')
    runs = pareto.runs_in(str(tmp_path / 'sweep'))
    tb = tmp_path / 'tb'
    pareto_plot.summarise(runs, str(tmp_path / 'sweep'), str(tb), pareto.METRICS)
    for name in ('pareto_eval_loss.png', 'pareto_eval_recall_accuracy.png'):
        assert (tmp_path / 'sweep' / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    acc = event_accumulator.EventAccumulator(str(tb / 'pareto'))
    acc.Reload()
    assert sorted(acc.Tags()['images']) == ['pareto/eval/loss', 'pareto/eval/recall_accuracy']
    (image,) = acc.Images('pareto/eval/loss')
    assert image.width > 400 and image.height > 300


def test_docs_picture_front_is_what_the_docs_say():
    table = ROOT / 'docs' / 'studies' / 'sweeps' / 'results' / 'pareto_reported.csv'
    points = pareto.read_table(str(table), 'eval/loss')
    panels = {}
    for p in points:
        panels.setdefault(p.panel, []).append(p)
    fronts = [[p.label for p in pareto.front(group, False)] for group in panels.values()]
    assert fronts == [
        ['mqa (eq. params)', 'gqa2 (eq. params)'],
        ['MLA-32 joint_svd', 'MQA scratch', 'GQA-2 scratch'],
    ]
    doc = (ROOT / 'docs' / 'studies' / 'sweeps' / 'README.md').read_text()
    assert 'scripts/plot_pareto.py --table=docs/studies/sweeps/results/pareto_reported.csv' in doc
