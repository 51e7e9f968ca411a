"""Sweeps end to end at tiny size: runs, TensorBoard contents, summary, resumption, errors."""

import csv
import json
import math
import os
import re

import pytest
from conftest import ROOT, run_entry, sweep_file, tiered, tiny_config, tiny_train_config

from lm.experiments import runner
from lm.experiments.fairness import match_parameters, reference_config
from lm.experiments.runner import Spec
from lm.experiments.sweep import (
    check_overrides,
    combine,
    file_points,
    load_sweep_file,
    plan,
)
from lm.experiments.sweep_points import parse_grid, point_config, run_name
from lm.experiments.sweep_status import progress
from lm.experiments.sweep_summary import summarise
from lm.model.accounting import param_counts
from lm.model.transformer import model_config


def read_experiment(acc):
    """The experiment summary of a run's HParams, as TensorBoard reads it."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent('hparams')['_hparams_/experiment']
    return plugin_data_pb2.HParamsPluginData.FromString(content).experiment


def sweep(*args):
    return run_entry('scripts/sweep.py', *args, timeout=900)


@pytest.mark.slow
def test_tiny_sweep_end_to_end(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 4, 'eval_every': 4, 'checkpoint_every': 4, 'log_every': 2},
    )
    points = [
        {'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0, 'seeds': 2},
        {'model.attention': 'mqa', 'model.num_kv_heads': 0},
        {'name': 'mla', 'model.attention': 'mla', 'model.num_kv_heads': 0},
        {'name': 'bad', 'model.attention': 'gqa', 'model.num_kv_heads': 3},
    ]
    cfg = sweep_file(tmp_path, config, points)
    tb = tmp_path / 'shared_tb'
    out = sweep(
        f'--config={cfg}',
        f'--sweep_dir={tmp_path / "sw"}',
        '--parallel=2',
        '--match=params',
        f'--tb_dir={tb}',
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert 'skipping bad: config.model.num_heads=4 must be divisible by num_kv_heads=3' in (
        out.stdout
    )
    with open(tmp_path / 'sw' / 'summary.csv') as f:
        rows = {r['point']: r for r in csv.DictReader(f)}
    assert set(rows) == {'mha', 'mqa_h4', 'mla'}
    assert rows['mha']['seeds'] == '2' and rows['mqa_h4']['seeds'] == '1'
    assert int(rows['mha']['kv_cache_bytes_per_token']) == 4 * int(
        rows['mqa_h4']['kv_cache_bytes_per_token']
    )
    assert float(rows['mqa_h4']['eval_perplexity']) > 1
    assert (tmp_path / 'sw' / 'summary.png').stat().st_size > 10_000
    assert rows['mla']['kv_heads'] == 'latent 16+4'  # what MLA's cache holds, not H
    md = (tmp_path / 'sw' / 'summary.md').read_text()
    assert '| mha | mha | 4 | 4 | 64 |' in md and md.startswith('Fairness: equal parameters')
    for row in rows.values():  # equal parameters: every point within 1% of MHA's
        assert abs(int(row['params']) / int(rows['mha']['params']) - 1) <= 0.01, row
    assert int(rows['mqa_h4']['mlp_dim']) > int(rows['mha']['mlp_dim']) == 64
    assert 'mha ~ mqa_h4 (unresolved)' in md  # one seed of mqa: nothing is resolved
    assert 'nan' not in md and '(n = 1) | n/a (1 seed) |' in md  # one seed: no '± nan'

    from tensorboard.backend.event_processing import event_accumulator

    runs = sorted(r for r in os.listdir(tb) if not r.startswith('.'))  # --tb_dir: all there
    assert runs == ['mha_s0', 'mha_s1', 'mla', 'mqa_h4', 'pareto']
    assert not (tmp_path / 'sw' / 'tb').exists()
    check_pareto_figure(tmp_path / 'sw', tb / runs.pop())
    differs = set()
    for run in runs:
        acc = event_accumulator.EventAccumulator(str(tb / run))
        acc.Reload()
        assert [e.step for e in acc.Scalars('eval/perplexity')] == [4]
        assert [e.step for e in acc.Scalars('eval_init/perplexity')] == [0]
        experiment = read_experiment(acc)
        differs.add(frozenset(h.name for h in experiment.hparam_infos if h.differs))
    # one experiment summary in every run, with what differs between the runs marked
    assert differs == {  # not num_heads, lr, steps, nor the one MLA run's dims
        frozenset({'attention', 'num_kv_heads', 'kv_cache_bytes_per_token', 'params', 'seed'})
    }

    again = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}', '--match=params')
    assert again.returncode == 0 and again.stdout.count('finished earlier, skipped') == 4
    status = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}', '--match=params',
                   '--status').stdout.strip().splitlines()  # fmt: skip
    assert status[0].startswith('skipping bad: ')  # the plan's own note, then a line per run
    assert status[1].startswith('mha_s0: finished at step 4: eval loss ')
    assert status[-1] == (
        f'4 runs in {tmp_path / "sw"}: 4 finished, 0 to resume, 0 with other settings, '
        '0 started, 0 not started'
    )
    unwritable = '/proc/lm_sweep'  # --status writes nothing: a directory it cannot write is fine
    status = sweep(f'--config={cfg}', f'--sweep_dir={unwritable}', '--match=params', '--status')
    assert status.returncode == 0 and status.stdout.strip().splitlines()[-1] == (
        f'4 runs in {unwritable}: 0 finished, 0 to resume, 0 with other settings, 0 started, '
        '4 not started'
    ), status.stderr[-2000:]
    other = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}')  # width by default
    assert other.returncode == 1 and other.stderr.strip().splitlines()[-1] == (
        f'error: --match=width: {tmp_path / "sw"} holds a --match=params sweep; use another '
        '--sweep_dir'
    )


def check_pareto_figure(sweep_dir, logdir):
    """The sweep's Pareto figure: a PNG in the sweep_dir, an image in TensorBoard (loss only:
    no run has a recall accuracy), and scripts/plot_pareto.py draws it again from the runs."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    assert acc.Tags()['images'] == ['pareto/eval/loss']
    (image,) = acc.Images('pareto/eval/loss')
    assert image.encoded_image_string[:4] == b'\x89PNG' and image.width > 400
    assert (sweep_dir / 'pareto_eval_loss.png').stat().st_size > 10_000
    assert not (sweep_dir / 'pareto_eval_recall_accuracy.png').exists()
    out = sweep_dir / 'again.png'
    plot = run_entry('scripts/plot_pareto.py', f'--run_dir={sweep_dir}', f'--out={out}', check=True)
    assert f'wrote {out}: 3 arms' in plot.stdout  # mha (2 seeds), mqa_h4, mla
    assert out.read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_grid_errors_before_any_run(tmp_path, small_text):
    cfg = sweep_file(tmp_path, tiny_train_config(tmp_path, small_text), [{}])
    for grid, message in [
        (
            'model.num_hedas=4,8',
            "error: --grid: unknown config key 'model.num_hedas' (did you mean 'model.num_heads'?)",
        ),
        ('model.num_heads=4,eight', "error: --grid model.num_heads: 'eight' is not an int"),
        ('model.num_heads', "error: --grid 'model.num_heads': expected key=value1,value2,..."),
        ('model=1', "error: --grid: 'model' is a section, not a value"),
        (  # a value no point can run with: refused, not skipped
            'model.attention=gqa,weird',
            "error: --grid model.attention='weird': no point can run with it (config.model."
            'attention must be one of',
        ),
    ]:
        out = sweep(f'--config={cfg}', f'--sweep_dir={tmp_path / "sw"}', f'--grid={grid}')
        assert out.returncode == 1, out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith(message)
        assert not (tmp_path / 'sw').exists()


def test_a_grid_value_no_point_can_run_with_is_refused_a_combination_skipped(
    tmp_path, small_text, capsys
):
    """Skipping is for values that do not fit together (8 KV heads of 4 query heads); a value
    that fits no point of the grid is a mistake, refused before any run."""
    config = tiny_train_config(tmp_path, small_text)
    grid = parse_grid(config, ['model.num_heads=4,8', 'model.num_kv_heads=2,8'])
    specs = plan(config, grid, str(tmp_path), ['train.py'], grid_keys=list(grid[0]))
    assert [s.name for s in specs] == ['gqa_h4_kv2', 'gqa_h8_kv2', 'gqa_h8_kv8']
    assert 'skipping ' in capsys.readouterr().out
    grid = parse_grid(config, ['model.num_heads=4,8', 'model.num_kv_heads=2,3'])
    with pytest.raises(
        ValueError,
        match=r'^--grid model\.num_kv_heads=3: no point can run with it \(config\.model\.num_'
        r'heads=4 must be divisible by num_kv_heads=3',
    ):
        plan(config, grid, str(tmp_path), ['train.py'], grid_keys=list(grid[0]))
    plan(config, grid, str(tmp_path), ['train.py'])  # a sweep file's points: skipped


def test_a_data_setting_a_point_never_reads_is_dropped_reset_or_refused(
    tmp_path, small_text, capsys
):
    """A data setting a point's run would not read (check_idle_data): given by the point (the
    grid), it is dropped from the point, whose run another point may then be (left out, with a
    note); a grid key dropped from every point is refused. Given by the base config, it is reset
    to configs/base.py's in the points that do not read it, with a note, and refused when no
    point reads it. train.py then accepts every run's config."""
    from lm.config import default_values
    from lm.data.checks import check_idle_data

    config = tiny_train_config(tmp_path, small_text)
    grid = parse_grid(config, ['data.split=,pretrain', 'data.uptrain_fraction=0.1,0.2'])
    specs = plan(config, grid, str(tmp_path), ['train.py'], grid_keys=list(grid[0]))
    assert [s.name for s in specs] == [
        'gqa_h4_kv2_split',
        'gqa_h4_kv2_splitpretrain_uptrain_fraction0.1',
        'gqa_h4_kv2_splitpretrain_uptrain_fraction0.2',
    ], [s.name for s in specs]
    assert 'the run of gqa_h4_kv2_split (data.uptrain_fraction would do nothing)' in (
        capsys.readouterr().out
    )
    grid = parse_grid(config, ['data.tokenizer=byte,bpe', 'data.bpe_vocab_size=512,1024'])
    names = [s.name for s in plan(config, grid, str(tmp_path), ['x'], grid_keys=list(grid[0]))]
    assert names == [
        'gqa_h4_kv2_tokenizerbyte',
        'gqa_h4_kv2_tokenizerbpe_bpe_vocab_size512',
        'gqa_h4_kv2_tokenizerbpe_bpe_vocab_size1024',
    ], names
    grid = parse_grid(config, ['data.bpe_vocab_size=512,1024'])  # the byte tokenizer everywhere
    with pytest.raises(ValueError, match=r'^--grid data\.bpe_vocab_size: does nothing in any '):
        plan(config, grid, str(tmp_path), ['x'], grid_keys=list(grid[0]))
    config.data.uptrain_fraction = 0.3  # the base's: the '' point reads none of it
    specs = plan(config, parse_grid(config, ['data.split=,pretrain']), str(tmp_path), ['x'])
    assert "data.uptrain_fraction=0.3 does nothing in gqa_h4_kv2_split (with split=''" in (
        capsys.readouterr().out
    )
    fractions = [s.fingerprint['data.uptrain_fraction'] for s in specs]
    assert fractions == [0.1, 0.3], fractions
    for spec in specs:
        data = tiny_config().data
        data.update({k[5:]: v for k, v in spec.fingerprint.items() if k.startswith('data.')})
        check_idle_data(data, default_values('data'))
    config.data.bpe_vocab_size = 8192  # no point reads it: the byte tokenizer
    with pytest.raises(ValueError, match=r'^config\.data\.bpe_vocab_size=8192 does nothing in any'):
        plan(config, parse_grid(config, ['data.split=,pretrain']), str(tmp_path), ['x'])


def test_with_ensemble_what_the_sweep_sets_is_refused_wherever_it_is_given():
    """--ensemble sets train.ensemble and train.ensemble_loop in every run (from --seeds,
    --ensemble_groups and --ensemble_program): an override, a grid key or a point setting either
    would be replaced silently, so each is refused; without --ensemble they are the run's own."""
    points, grid = [{'name': 'mha'}], [{}]
    check_overrides(['train.ensemble_loop'], points, grid)  # separate runs: the override holds
    cases = [
        (['train.ensemble_loop'], points, grid, r'^--config\.train\.ensemble_loop sets'),
        ([], points, [{'train.ensemble_loop': True}], r'^--grid train\.ensemble_loop sets'),
        ([], [{'name': 'mha', 'train.ensemble': 4}], grid, r'^sweep point mha sets train\.ens'),
    ]
    for overridden, named, values, message in cases:
        with pytest.raises(ValueError, match=message + '.* with --ensemble the sweep sets it'):
            check_overrides(overridden, named, values, ensemble=True)


def test_points_picks_named_points_in_file_order():
    import types

    module = types.SimpleNamespace(get_points=lambda: [{'name': n} for n in ('a', 'b', 'c')])
    assert file_points(module, ['c', 'a']) == [{'name': 'a'}, {'name': 'c'}]
    assert file_points(module) == [{'name': 'a'}, {'name': 'b'}, {'name': 'c'}]
    with pytest.raises(ValueError, match=r"^--points: \['d'\] not among the sweep file's points"):
        file_points(module, ['a', 'd'])
    with pytest.raises(ValueError, match=r"^--points: \['a'\] named twice$"):
        file_points(module, ['a', 'b', 'a'])
    unnamed = types.SimpleNamespace()  # no get_points: one unnamed point
    with pytest.raises(ValueError, match=r"^--points: \['a'\]: this sweep file defines no named"):
        file_points(unnamed, ['a'])


def test_grid_product_and_names(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    points = parse_grid(config, ['model.num_heads=4,8', 'model.num_kv_heads=1,2,4,8'])
    assert len(points) == 8 and points[1] == {'model.num_heads': 4, 'model.num_kv_heads': 2}
    assert run_name(points[1], point_config(config, points[1])) == 'gqa_h4_kv2'
    for point, name in [
        ({'model.attention': 'mla', 'model.num_kv_heads': 0, 'train.lr': 0.001}, 'mla_h4_lr0.001'),
        ({'model.attention': 'mha', 'model.num_kv_heads': 0}, 'mha_h4'),
        ({'model.attention': 'mqa', 'model.num_kv_heads': 0}, 'mqa_h4'),
        ({'model.num_heads': 8, 'model.num_kv_heads': 8}, 'gqa_h8_kv8'),
        ({'seed': 1}, 'gqa_h4_kv2_s1'),
    ]:
        assert run_name(point, point_config(config, point)) == name
    assert parse_grid(config, ['model.num_heads=4;8']) == parse_grid(
        config, ['model.num_heads=4,8']
    )
    # ';' separates values that hold commas (a text setting's list)
    assert parse_grid(config, ['data.passkey_lengths=64,128;256']) == [
        {'data.passkey_lengths': '64,128'},
        {'data.passkey_lengths': '256'},
    ]
    # a tuple setting: one tuple per ';'-separated value, named by its items
    grid = parse_grid(config, ['model.kv_heads_per_layer=(2,1);2,2'])
    assert grid == [
        {'model.kv_heads_per_layer': (2, 1)},
        {'model.kv_heads_per_layer': (2, 2)},
    ]
    assert run_name(grid[0], point_config(config, grid[0])).endswith('_kv_heads_per_layer2-1')
    with pytest.raises(ValueError, match=r"'1.5' is not an int"):
        parse_grid(config, ['model.num_heads=1.5'])
    with pytest.raises(ValueError, match=r'--grid: model.num_heads is given twice'):
        parse_grid(config, ['model.num_heads=4', 'model.num_heads=8'])
    with pytest.raises(ValueError, match=r"--grid 'seed=1,1': a value is repeated"):
        parse_grid(config, ['seed=1,1'])
    with pytest.raises(ValueError, match=r'a value is repeated'):
        parse_grid(config, ['train.lr=0.001,1e-3'])


def test_runs_are_named_by_the_seed_they_train_with(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    config.seed = 5  # as `--grid seed=5` sets it: seeds 5 and 6, not 0 and 1
    specs = plan(config, [{'name': 'mha'}], str(tmp_path), ['train.py'], seeds=2)
    assert [(s.name, s.seed, s.fingerprint['seed']) for s in specs] == [
        ('mha_s5', 5, 5),
        ('mha_s6', 6, 6),
    ]


@pytest.mark.parametrize('d_model,heads', tiered([(32, 4), (128, 8)], fast=[(32, 4)]))
def test_equal_parameter_mode_lands_within_one_percent(d_model, heads):
    base = tiny_config(attention='gqa', d_model=d_model, num_heads=heads, num_kv_heads=2)
    points = [
        {'model.attention': 'gqa', 'model.num_kv_heads': 2},
        {'model.attention': 'mqa', 'model.num_kv_heads': 0},
        {'model.attention': 'mla', 'model.num_kv_heads': 0},
        {'model.attention': 'mha', 'model.num_kv_heads': 0},
    ]
    configs = [point_config(base, p) for p in points]
    ref = reference_config(base, configs)
    assert ref is configs[3]
    matched = match_parameters(configs, ref, ['gqa', 'mqa', 'mla', 'mha'])
    target = param_counts(model_config(ref.model))['total']
    for after in matched:
        total = param_counts(model_config(after.model))['total']
        assert abs(total - target) <= 0.01 * target, (after.model.attention, total, target)
        assert after.model.d_model == d_model and after.model.num_layers == base.model.num_layers
    assert matched[1].model.mlp_dim > matched[0].model.mlp_dim > matched[3].model.mlp_dim
    assert matched[3].model.mlp_dim == 64 and configs[1].model.mlp_dim == 64  # inputs untouched
    # No MHA point: the reference is the base config made MHA.
    assert reference_config(base, configs[:2]).model.attention == 'mha'
    shrunk = point_config(
        base, {'model.attention': 'mha', 'model.num_kv_heads': 0, 'model.num_layers': 1}
    )
    with pytest.raises(ValueError, match=r'^--match=params: big cannot come within 1%'):
        match_parameters([point_config(base, {'model.num_layers': 8})], shrunk, ['big'])


def fake_run(tmp_path, point, seed, loss, attention='mha', accuracy=None, **model):
    """A finished run as the summary reads it: its Spec, its result and the config saved with its
    checkpoint (lm.train.checkpoint.read_latest_meta reads the JSON side-car); with `accuracy`, a
    recall run's."""
    name = f'{point}_s{seed}'
    meta = tmp_path / name / 'checkpoints' / '8' / 'meta'
    meta.mkdir(parents=True)
    config = tiny_config(attention=attention, **model)
    config.seed = seed
    (meta / 'metadata').write_text(json.dumps({'config': config.to_dict()}))
    result = {
        'step': 8,
        'eval': {'loss': loss, 'perplexity': math.exp(loss), 'loss_stderr': 0.01, 'tokens': 1234},
        'tokens_per_sec': 100.0,
    }
    if accuracy is not None:
        result['eval']['recall_accuracy'] = accuracy
    return Spec(name, {}, lambda w: result, arm=point, seed=seed), result


def test_a_failed_run_says_why_in_the_sweeps_own_output(tmp_path):
    """A run's train.py that refuses (a copied sweep whose TensorBoard runs belong to the
    original, say) is reported with its one-line error, not only 'see train.log'."""
    import sys

    from lm.experiments.sweep import _trainer

    refuses = [sys.executable, '-c', "import sys; print('error: the reason', file=sys.stderr); 1/0"]
    run = _trainer(tiny_config(), refuses, str(tmp_path / 'tb'))
    with pytest.raises(runner.RunFailed, match=r'^exit 1: error: the reason; see .*train\.log$'):
        run(str(tmp_path))


def test_a_one_seed_summary_counts_its_comparisons_alike(tmp_path):
    """One seed: no pair has a p-value, so Holm counts none, and both the family note and the
    orderings say that no paired test is possible (they once said 0 and 1); one comparison is
    singular."""
    runs = [fake_run(tmp_path, 'mha', 0, 1.1), fake_run(tmp_path, 'mqa', 0, 1.2, 'mqa')]
    summarise(str(tmp_path), [s for s, _ in runs], {s.name: r for s, r in runs}, 'params')
    md = (tmp_path / 'summary.md').read_text()
    assert 'none here: a paired test needs two or more seeds of both arms' in md
    assert 'none can be resolved: a paired test needs two or more seeds' in md
    assert '0 comparisons' not in md
    assert '1 comparisons' not in md
    from lm.experiments.summary import comparisons

    assert [comparisons(m) for m in (0, 1, 2)] == ['0 comparisons', '1 comparison', '2 comparisons']
    # a planned run without a result (it failed) is named first, never left out silently
    failed, _ = fake_run(tmp_path, 'mqa', 1, 1.3, 'mqa')
    summarise(
        str(tmp_path), [s for s, _ in runs] + [failed], {s.name: r for s, r in runs}, 'params'
    )
    md = (tmp_path / 'summary.md').read_text()
    assert md.startswith('**Incomplete: 1 of 3 planned runs have no result (mqa_s1).** The ')


def test_finished_runs_refuses_a_directory_of_ablation_runs(tmp_path):
    """eval_sweep.py / cache_quality.py on an uptrain_ablation.py --out_dir: one line saying what
    it is, not a KeyError."""
    from lm.experiments.cache_quality import finished_runs

    (tmp_path / 'MQA_mean_a0.1_s0').mkdir()
    result = {'fingerprint': {'steps': 10, 'split': 'uptrain'}}
    (tmp_path / 'MQA_mean_a0.1_s0' / 'result.json').write_text(json.dumps(result))
    want = r'not a sweep directory: its run MQA_mean_a0\.1_s0 records no config seed \(it holds'
    with pytest.raises(ValueError, match=want):
        finished_runs(str(tmp_path))


def test_summary_reports_intervals_and_resolved_orderings(tmp_path):
    runs = [fake_run(tmp_path, 'mha', s, x) for s, x in enumerate([1.10, 1.25, 1.00])]
    runs += [fake_run(tmp_path, 'mqa', s, x, 'mqa') for s, x in enumerate([1.20, 1.30, 1.10])]
    runs += [
        fake_run(tmp_path, 'gqa', s, x, 'gqa', num_kv_heads=2)
        for s, x in enumerate([1.00, 1.35, 1.05])
    ]
    rows = summarise(str(tmp_path), [s for s, _ in runs], {s.name: r for s, r in runs}, 'params')
    mha = rows[0]
    # mean 1.11667, sample std 0.125831, half-width 4.302653 * 0.125831 / sqrt(3) = 0.312581
    assert mha['eval_loss'] == pytest.approx(1.116667, abs=1e-6)
    assert mha['eval_loss_std'] == pytest.approx(0.125831, abs=1e-6)
    assert mha['eval_loss_ci_lo'] == pytest.approx(0.804086, abs=1e-6)
    md = (tmp_path / 'summary.md').read_text()
    assert md.startswith('Fairness: equal parameters')
    sizes = {
        a: param_counts(model_config(tiny_config(attention=a, num_kv_heads=g).model))['total']
        for a, g in (('mha', 0), ('mqa', 0), ('gqa', 2))
    }
    gap = max(abs(n - sizes['mha']) / sizes['mha'] for n in sizes.values())
    assert f'(largest parameter gap to mha: {gap:.2%})' in md
    assert '1,234 validation tokens per run' in md
    # mqa - mha = 0.10, 0.05, 0.10: mean 0.0833, 95% CI [0.0116, 0.1550] excludes 0, t = 5
    # (df 2: p = 1 - t / sqrt(t^2 + 2) = 0.03775); mha - gqa: t = -0.27735, p = 0.80755;
    # mqa - gqa: t = 0.91766, p = 0.45567. Holm over the 3: 3 x 0.03775 = 0.113 (unresolved),
    # 2 x 0.45567 = 0.911, max(0.911, 0.80755) = 0.911.
    assert f'| mqa | mqa | 4 | 1 | 64 | {sizes["mqa"]:,} |' in md
    assert '+0.0833 [0.0116, 0.1550] p=0.113 |' in md
    assert 'Holm-corrected over the 3 comparisons' in md
    with open(tmp_path / 'summary_pairs.csv') as f:
        pairs = {(p['a'], p['b']): p for p in csv.DictReader(f)}
    expected = {('mha', 'mqa'): (0.037750, 0.113250), ('mha', 'gqa'): (0.807550, 0.911340)}
    expected[('mqa', 'gqa')] = (0.455670, 0.911340)
    for key, (p, p_holm) in expected.items():
        assert float(pairs[key]['p']) == pytest.approx(p, abs=2e-6)
        assert float(pairs[key]['p_holm']) == pytest.approx(p_holm, abs=5e-6)
        assert pairs[key]['comparisons'] == '3' and pairs[key]['resolved'] == 'False'
    assert pairs[('mha', 'mqa')]['ordering'] == 'mha ~ mqa (unresolved)'
    assert '| mha | gqa | -0.0167 |' in md and 'mha ~ gqa (unresolved) |' in md
    with open(tmp_path / 'summary_seeds.csv') as f:
        seeds = list(csv.DictReader(f))
    assert [(r['point'], r['seed'], float(r['eval_loss'])) for r in seeds[:2]] == [
        ('mha', '0', 1.10),
        ('mha', '1', 1.25),
    ]


def test_recall_summary_reports_accuracy_with_its_own_holm_family(tmp_path):
    accuracy = {'mha': [0.90, 0.95, 0.97], 'mqa': [0.80, 0.88, 0.91]}
    runs = [
        fake_run(tmp_path, point, s, 1.0 + s / 10, attention=point, accuracy=a)
        for point, values in accuracy.items()
        for s, a in enumerate(values)
    ]
    rows = summarise(str(tmp_path), [s for s, _ in runs], {s.name: r for s, r in runs})
    # mha: mean 0.94, sample std sqrt(((-.04)^2 + .01^2 + .03^2) / 2) = 0.036056
    assert rows[0]['eval_recall_accuracy'] == pytest.approx(0.94, abs=1e-9)
    assert rows[0]['eval_recall_accuracy_std'] == pytest.approx(0.0360555, abs=1e-6)
    # mha - mqa = 0.10, 0.07, 0.06: mean 0.07667, std 0.020817, t = 6.3790, df 2:
    # p = 1 - t / sqrt(t^2 + 2) = 0.023704; one comparison, so Holm leaves it
    with open(tmp_path / 'summary_pairs_recall.csv') as f:
        (pair,) = list(csv.DictReader(f))
    assert float(pair['accuracy_diff']) == pytest.approx(0.076667, abs=1e-6)
    assert float(pair['p_holm']) == pytest.approx(0.023704, abs=5e-6)
    assert pair['resolved'] == 'True' and pair['ordering'] == 'mha > mqa'
    md = (tmp_path / 'summary.md').read_text()
    assert '| mha | mqa | +0.0767 |' in md and 'Orderings (recall accuracy' in md
    assert f'| mha | {rows[0]["kv_cache_bytes_per_token"]:,} | 0.9400 ± 0.0361 |' in md
    with open(tmp_path / 'summary_seeds.csv') as f:
        seeds = list(csv.DictReader(f))
    assert [(r['point'], float(r['eval_loss']), float(r['eval_recall_accuracy'])) for r in seeds][
        4
    ] == ('mqa', 1.1, 0.88)


def test_a_run_echoes_its_evaluations_while_it_trains(tmp_path, capsys):
    """A sweep's run logs to its train.log and prints its progress lines, named after the run."""
    import sys

    from lm.experiments.sweep import _train_logged

    lines = [
        'I1125 10:00:00.1 1 loop.py:117] compiled the train step (1 step(s) per call) in 2.0 s',
        'I1125 10:00:01.1 1 loop.py:228] eval at step 4: loss 3.2100 ± 0.0100',
        'I1125 10:00:02.1 1 run.py:268] resumed from /x/checkpoints at step 4',
    ]
    script = f'import sys; print({chr(10).join(lines)!r}); sys.exit(3)'
    workdir = tmp_path / 'gqa_h4_kv1'
    workdir.mkdir()
    assert _train_logged([sys.executable, '-c', script], str(workdir)) == (3, '')
    assert capsys.readouterr().out.splitlines() == [
        'gqa_h4_kv1: eval at step 4: loss 3.2100 ± 0.0100',
        'gqa_h4_kv1: resumed from /x/checkpoints at step 4',
    ]
    assert (workdir / 'train.log').read_text().splitlines() == lines


def test_status_says_where_each_run_stands_from_its_files(tmp_path):
    """sweep.py --status (lm.experiments.sweep_status.progress): finished runs with their final
    evaluation, a result under other settings, a started run's last evaluation from its
    train.log (with the minutes left at the rate between its last two, when they carry times),
    a run started under other settings (which a re-run refuses), runs not started, and the
    count."""
    config = tiny_config()
    config.train.steps = 300
    points = [{'name': 'mha', 'model.attention': 'mha', 'seeds': 6},
              {'name': 'mqa', 'model.attention': 'mqa'}]  # fmt: skip
    specs = plan(config, points, str(tmp_path), ['train.py'])
    assert [s.name for s in specs] == [*(f'mha_s{k}' for k in range(6)), 'mqa']
    done, other, timed, untimed, shorter, started = (tmp_path / s.name for s in specs[:6])
    for wd in (done, other, timed, untimed, shorter, started):
        wd.mkdir()
    fewer = {**runner.fingerprint(specs[4]), 'train.steps': 200}  # a re-run trains it on
    (shorter / 'result.json').write_text(json.dumps({'step': 200, 'fingerprint': fewer}))
    result = {'step': 300, 'eval': {'loss': 1.25, 'perplexity': 3.49, 'recall_accuracy': 0.5}}
    (done / 'result.json').write_text(
        json.dumps({**result, 'fingerprint': runner.fingerprint(specs[0])})
    )
    changed = {**runner.fingerprint(specs[1]), 'train.lr': 1.0}
    (other / 'result.json').write_text(json.dumps({**result, 'fingerprint': changed}))
    for spec, wd in zip(specs[2:4], (timed, untimed), strict=True):
        (wd / 'run.json').write_text(json.dumps({'fingerprint': runner.fingerprint(spec)}))
    started_as = {**runner.fingerprint(specs[5]), 'train.lr': 0.5}
    (started / 'run.json').write_text(json.dumps({'fingerprint': started_as}))
    log = [
        f'I1127 14:0{k // 100}:30.000001 1 loop.py:239] eval at step {k}: loss 2'
        for k in (100, 200)
    ]
    (timed / 'train.log').write_text('\n'.join(log) + '\n')  # 100 steps a minute, 100 to go
    (untimed / 'train.log').write_text('\n'.join([log[0], 'no time] eval at step 150: x']) + '\n')
    assert progress(specs, str(tmp_path)) == [
        'mha_s0: finished at step 300: eval loss 1.2500, recall accuracy 0.5000',
        'mha_s1: finished with other settings: train.lr: 1.0 -> 0.001; a re-run refuses it',
        'mha_s2: started: last eval at step 200 (~1 min left at its last rate), no checkpoint '
        'yet, of 300 steps',
        'mha_s3: started: last eval at step 150, no checkpoint yet, of 300 steps',
        'mha_s4: finished at step 200; a re-run resumes it (train.steps: 200 -> 300)',
        'mha_s5: started with other settings: train.lr: 0.5 -> 0.001; a re-run refuses it',
        'mqa: not started',
        f'7 runs in {tmp_path}: 1 finished, 1 to resume, 2 with other settings, 2 started, '
        '1 not started',
    ]


def test_a_run_past_the_plans_steps_is_refused_before_its_result_is_set_aside(tmp_path):
    """A re-run with fewer train.steps than a run's checkpoint: --status says a re-run refuses
    it, and the runner refuses it up front (train.py would, after its result was set aside)."""
    config = tiny_config()
    config.train.steps = 300
    (spec,) = plan(config, [{'name': 'mha', 'model.attention': 'mha'}], str(tmp_path), ['t.py'])
    wd = tmp_path / spec.name
    (wd / 'checkpoints' / '400').mkdir(parents=True)
    longer = {**runner.fingerprint(spec), 'train.steps': 400}
    (wd / 'result.json').write_text(json.dumps({'step': 400, 'fingerprint': longer}))
    assert progress([spec], str(tmp_path))[0] == (
        "mha: finished at step 400, past the plan's train.steps; a re-run refuses it"
    )
    with pytest.raises(ValueError, match=r"^--sweep_dir: .*mha holds a checkpoint at step 400, "
                       r"past the plan's train\.steps=300: give at least 400 steps"):  # fmt: skip
        runner.check([spec], str(tmp_path), '--sweep_dir')
    assert (wd / 'result.json').exists()


def test_named_points_times_a_grid_keep_distinct_run_names(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    grid = parse_grid(config, ['seed=5', 'model.mlp_dim=64,96'])
    mha = {'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}
    points = combine([mha], grid)
    assert [p['name'] for p in points] == ['mha_mlp_dim64', 'mha_mlp_dim96']
    specs = plan(config, points, str(tmp_path), ['train.py'], seeds=2)
    assert [(s.name, s.fingerprint['model.mlp_dim']) for s in specs] == [
        ('mha_mlp_dim64_s5', 64),
        ('mha_mlp_dim64_s6', 64),
        ('mha_mlp_dim96_s5', 96),
        ('mha_mlp_dim96_s6', 96),
    ]
    # a seed-only grid leaves the name alone (mha_s5, ...), as the committed sweeps have it
    assert [p['name'] for p in combine([{'name': 'mha'}], [{'seed': 5}])] == ['mha']
    # values a directory or CSV name should not hold become '-'
    lengths = combine([{'name': 'mha'}], [{'data.passkey_lengths': '128,256'}])
    assert lengths[0]['name'] == 'mha_passkey_lengths128-256'
    # a grid key a point sets itself: the grid would replace the point's value silently
    gate = {'name': 'gate', 'seed': 8}
    with pytest.raises(ValueError, match=r'^--grid seed: sweep point gate sets seed=8 itself'):
        combine([{'name': 'mha'}, gate], [{'seed': 5}])
    with pytest.raises(ValueError, match=r'^--grid model\.attention: sweep point mha sets'):
        combine([mha], [{'model.attention': 'gqa'}])
    with pytest.raises(ValueError, match="two sweep points share the run name 'mha': give each"):
        plan(config, [mha, {**mha, 'train.lr': 0.01}], str(tmp_path), ['train.py'])


@pytest.mark.parametrize(
    'name, why',
    [
        ('../escape', "start with '.'"),
        ('../../runs/other', "start with '.'"),
        ('/abs/run', "separator or control character ('/')"),
        ('a\\b', "separator or control character ('\\\\')"),
        ('two\nlines', "separator or control character ('\\n')"),
        ('..', "start with '.'"),
    ],
    ids=['parent', 'two-up', 'absolute', 'backslash', 'newline', 'dot-dot'],
)
def test_a_point_whose_name_would_leave_the_sweep_dir_is_refused_before_any_run(
    tmp_path, small_text, name, why
):
    """Names become paths only through `safe_name`: a sweep point, and any run of a runner plan
    (ablation arms, ensembles), is refused naming it, and nothing is written anywhere."""
    config = tiny_train_config(tmp_path, small_text)
    sweep_dir = tmp_path / 'sweep'
    with pytest.raises(ValueError) as refused:
        point = {'name': name, 'model.attention': 'mha', 'model.num_kv_heads': 0}
        plan(config, [point], str(sweep_dir), ['train.py'])
    assert str(refused.value).startswith(f'sweep point: {name!r} cannot name a directory: ')
    assert why in str(refused.value) and '\n' not in str(refused.value)
    spec = Spec(name, {}, lambda w: pytest.fail('a run started'))
    with pytest.raises(ValueError, match=f'^run {re.escape(repr(name))} of the plan: '):
        runner.run([spec], str(sweep_dir))
    assert {p.name for p in tmp_path.iterdir()} <= {'cache', 'small.txt'}


def test_a_sweep_file_with_an_argument_loads_its_points():
    """--config=file.py:arg hands the argument to get_config; the sweep file itself loads."""
    module = load_sweep_file(str(ROOT / 'configs' / 'sweeps' / 'recall_width.py') + ':256')
    assert [p['name'] for p in module.get_points()] == ['mha', 'gqa2', 'mqa', 'mla']
    config = module.get_config('256')
    assert config.model.d_model == 256 and config.model.mla.qk_rope_head_dim == 32


def test_a_one_point_sweep_has_no_orderings_table():
    """With one point there is no pair: one line says so, not an empty table's header."""
    from lm.experiments.sweep_summary import _orderings

    assert _orderings([], 'loss', 'eval loss') == [
        '',
        'Orderings (eval loss): none, no two points to compare.',
    ]


def test_points_scored_on_different_text_are_not_paired(tmp_path, small_text):
    """Another val_fraction, or a part (its held-out text cut from validation), scores other
    text: those points' losses are not paired by seed, and summary.md says which settings
    differ. Parts that train on other text but score the same are paired."""
    from lm.data.checks import eval_text_settings
    from lm.experiments.sweep_summary import _same_text_pairs, _text_note

    config = tiny_train_config(tmp_path, small_text)
    grid = parse_grid(config, ['data.val_fraction=0.1,0.3', 'data.split=,pretrain,uptrain'])
    specs = plan(config, grid, str(tmp_path), ['x'], grid_keys=list(grid[0]))
    texts = {s.arm: eval_text_settings(dict(s.fingerprint)) for s in specs}
    pairs = _same_text_pairs(texts)(list(texts))
    assert pairs == [
        ('gqa_h4_kv2_val_fraction0.1_splitpretrain', 'gqa_h4_kv2_val_fraction0.1_splituptrain'),
        ('gqa_h4_kv2_val_fraction0.3_splitpretrain', 'gqa_h4_kv2_val_fraction0.3_splituptrain'),
    ], pairs
    assert _text_note(texts).startswith(
        '**Points differ in what their evaluation scores (data.heldout_fraction, data.split, '
        'data.val_fraction): only points scored on the same text are compared below.**'
    )
    same = {s.arm: eval_text_settings(dict(s.fingerprint)) for s in specs[:1]}
    assert _text_note(same) == ''


def test_a_one_seed_run_left_by_an_earlier_sweep_is_named_when_its_point_goes_to_several(tmp_path):
    """--seeds=1 names a point's run <point>; --seeds=3 later names them <point>_s<seed>, so
    the first run's seed trains again: the sweep says so, for that point only."""
    from lm.experiments import one_seed_runs_left
    from lm.experiments.runner import Spec

    (tmp_path / 'mha' / 'checkpoints' / '10').mkdir(parents=True)  # mha's one-seed run
    (tmp_path / 'gqa').mkdir()  # started, no checkpoint yet: nothing to reuse
    specs = [
        Spec(name=f'{arm}_s{k}', fingerprint={}, run=dict, arm=arm, seed=k)
        for arm in ('mha', 'gqa')
        for k in range(3)
    ] + [Spec(name='mqa', fingerprint={}, run=dict, arm='mqa')]
    (note,) = one_seed_runs_left(specs, str(tmp_path))
    assert note.startswith('note: mha (this point') and 'mha_s<seed>' in note


def test_runs_trained_by_other_commits_or_toolchains_are_said_in_the_summary(tmp_path):
    """A paired difference across two versions of the code (a sweep resumed after a pull) or
    machines holds their effect too: summary.md names what differs and the points each trained,
    before the tables; a commit that leaves lm/ and configs/ as they were is no other version;
    runs that record nothing are counted apart."""
    by = {'commit': 'a' * 40, 'code': 'c' * 12, 'jax': '0.10.2', 'cpu': 'Xeon', 'devices': '1 x'}
    runs = [fake_run(tmp_path, 'mha', s, 1.1 + s / 10) for s in range(2)]
    runs += [fake_run(tmp_path, 'mqa', s, 1.2 + s / 10, 'mqa') for s in range(2)]
    for _, result in runs:
        result['trained_by'] = dict(by)
    runs[3][1]['trained_by']['devices'] = '2 x'  # the devices alone: not another toolchain
    runs[2][1]['trained_by']['commit'] = 'e' * 40  # a docs-only commit: the same code
    specs, found = [s for s, _ in runs], {s.name: r for s, r in runs}
    summarise(str(tmp_path), specs, found, 'params')
    assert 'trained them' not in (tmp_path / 'summary.md').read_text()
    for _, result in runs[2:]:  # the MQA arm on another commit and CPU: aligned with an arm
        result['trained_by'].update(
            commit='b' * 40 + '+0a1b2c3d', code='d' * 12 + '+0a1b2c3d', cpu='EPYC'
        )
    del runs[0][1]['trained_by']
    summarise(str(tmp_path), specs, found, 'params')
    md = (tmp_path / 'summary.md').read_text()
    assert md.startswith(
        '**Runs trained by more than one version of the code or toolchain: 1 by code '
        'cccccccccc, cpu Xeon (points: mha); 2 by code dddddddddd+0a1b2c3d, cpu EPYC (points: '
        'mqa). A '
        "paired difference between runs of two of them holds the code's or the toolchain's "
        "effect as well as the arms' (docs/train.md, golden runs).**\n\n**Runs without a record "
        'of what trained them (finished before results.json held it): 1 of 4, e.g. mha_s0.**'
    ), md[:600]
    # a run whose JAX changed part-way: its own group, its steps by version
    runs[1][1]['trained_by_sessions'] = [
        {'steps': [0, 4], **by},
        {'steps': [4, 8], **by, 'jax': '0.10.3'},
    ]
    runs[1][1]['trained_by']['jax'] = '0.10.3'  # its last session's
    summarise(str(tmp_path), specs, found, 'params')
    md = (tmp_path / 'summary.md').read_text()
    assert md.startswith(
        '**Runs trained by more than one version of the code or toolchain: 1 by code '
        'cccccccccc, cpu Xeon, jax 0.10.2 then code cccccccccc, cpu Xeon, jax 0.10.3 (points: '
        'mha); 2 by code dddddddddd+0a1b2c3d, cpu EPYC, jax 0.10.2 (points: mqa).'
    ), md[:600]
    assert (
        '**Runs whose code or toolchain changed part-way: 1 of 4 (e.g. mha_s1: steps 1-4 under '
        'code cccccccccc, cpu Xeon, jax 0.10.2, steps 5-8 under code cccccccccc, cpu Xeon, jax '
        '0.10.3; its results.json lists them as trained_by_sessions).**'
    ) in md, md[:900]
