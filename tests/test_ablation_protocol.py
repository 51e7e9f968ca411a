"""The uptraining ablation's protocol (lm/experiments/ablation.py, lr_grid.py): its arms, the
corpus parts each run trains on, and the learning-rate rule. No training here."""

import math
import os

import pytest

from lm.experiments import lr_grid
from lm.experiments.ablation import check_configs, plan
from lm.experiments.ablation_arms import Ablation, arms, base_config
from lm.experiments.ablation_tables import compare_table

CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'configs', 'shakespeare_char.py')


def ablation(**overrides):
    settings = dict(
        config_file=CONFIG,
        data_path='text.txt',
        steps=100,
        seeds=2,
        fractions=(0.0, 0.1),
        scratch_fractions=(0.0, 0.1),
        targets=(2, 1),
        methods=('mean', 'aligned'),
        mla_ranks=(16,),
        schedules=('continue', 'rewarm'),
        lrs=(3e-4, 1e-3, 3e-3),
    )
    return Ablation(**{**settings, **overrides})


def test_choose_takes_the_lowest_mean_validation_loss():
    by_lr = {1e-3: {0: 2.0, 1: 2.2}, 3e-3: {0: 1.9, 1: 2.2}, 1e-2: {0: 1.0}}  # 1e-2: one seed
    assert lr_grid.choose(by_lr) == 3e-3  # 2.05 < 2.1; 1e-2 lacks seed 1, not compared
    assert lr_grid.choose({1e-3: {0: 2.0}, 3e-4: {0: 2.0}}) == 3e-4  # a tie: the smaller rate
    assert lr_grid.choose({1e-2: {0: math.nan}, 1e-3: {0: 9.0}}) == 1e-3  # diverged loses
    with pytest.raises(ValueError, match='no learning rate'):
        lr_grid.choose({})


def test_select_reports_the_held_out_values_at_the_chosen_rate():
    validation = {
        ('GQA-2', 'mean', 0.1, 1e-3): {0: 1.5, 1: 1.7},
        ('GQA-2', 'mean', 0.1, 3e-3): {0: 1.6, 1: 1.7},
        ('MQA', 'scratch', 110, 1e-3): {0: 1.9, 1: 1.9},
        ('MQA', 'scratch', 110, 3e-3): {0: 1.8, 1: 1.85},
    }
    held = {
        key: {s: v + 10 * key[-1] + 0.01 for s, v in vals.items()}
        for key, vals in validation.items()
    }
    values, chosen = lr_grid.select(validation, held)
    assert chosen == {('GQA-2', 'mean', 0.1): 1e-3, ('MQA', 'scratch', 110): 3e-3}
    assert values[('GQA-2', 'mean', 0.1)] == pytest.approx({0: 1.52, 1: 1.72})
    assert values[('MQA', 'scratch', 110)] == pytest.approx({0: 1.84, 1: 1.89})


def test_the_grid_has_rewarm_aligned_and_a_scratch_baseline_per_target_and_budget():
    ab = ablation()
    by_label = arms(ab)
    assert set(by_label) == {'GQA-2', 'MQA', 'MLA-16'}
    for label in ('GQA-2', 'MQA'):
        options = by_label[label][1]['rewarm-aligned']
        assert (options.schedule, options.method) == ('rewarm', 'aligned')
        assert by_label[label][1]['aligned'].schedule == 'continue'
    source = base_config(ab, 0, ab.steps)
    names = {s.name for s in plan(ab, 'out')}
    for label, (make, _) in by_label.items():
        for alpha in ab.fractions:  # the same tokens: steps x batch x seq_len
            total = ab.steps + round(alpha * ab.steps)
            scratch = make(0, total, 3e-3)
            assert scratch.train.steps == total and scratch.train.lr == 3e-3
            assert scratch.train.batch_size == source.train.batch_size
            assert scratch.data.seq_len == source.data.seq_len
            assert all(f'{label}_scratch_{total}_lr{lr:g}_s1' in names for lr in ab.lrs)
    assert 'MQA_rewarm-aligned_a0.1_lr0.003_s0' in names
    assert 'MQA_rewarm-aligned_a0_lr0.0003_s0' not in names  # alpha 0: no schedule, run once


def test_mla_arms_per_rope_key_count_convert_and_train_from_scratch_with_it():
    """--mla_rope_heads 1,4 (the shakespeare recipe's 4 KV heads): an arm per count, its
    conversions and its from-scratch baseline with that many RoPE keys, the cache bytes apart
    by (4 - 1) keys of P = 8 dims per layer."""
    from lm.experiments.ablation import kv_bytes

    ab = ablation(mla_rope_heads=(1, 4), lrs=())
    by_label = arms(ab)
    assert {'MLA-16', 'MLA-16-k4'} <= set(by_label)
    for label, r in (('MLA-16', 1), ('MLA-16-k4', 4)):
        make, methods = by_label[label]
        assert {o.rope_heads for o in methods.values()} == {r}
        assert make(0, 10).model.mla.rope_heads == r
    layers = base_config(ab, 0, 1).model.num_layers
    assert kv_bytes(ab)['MLA-16-k4'] - kv_bytes(ab)['MLA-16'] == layers * 3 * 8 * 2  # bfloat16
    flags = '--mla_ranks/--mla_rope_heads/--mla_rope_dim'
    with pytest.raises(
        ValueError, match=rf'^{flags}: arm MLA-\d+-k3: config.model.mla.rope_heads=3 must'
    ):
        plan(ablation(mla_rope_heads=(3,)), 'out')  # before any run
    with pytest.raises(
        ValueError, match=rf'^{flags}: arm MLA-512: config.model.mla.kv_lora_rank=512 is'
    ):
        plan(ablation(mla_ranks=(512,)), 'out')
    with pytest.raises(ValueError, match=r'^--targets: arm GQA-3: config.model.num_heads=4 must'):
        plan(ablation(targets=(3,)), 'out')
    with pytest.raises(ValueError, match=r'^--cla: arm gqa3_cla2: config.model.num_heads=4 must'):
        plan(ablation(targets=(), cla=('gqa3_cla2',)), 'out')
    with pytest.raises(ValueError, match=r'^--mla_rope_heads: expected one or more'):
        ablation(mla_rope_heads=())
    with pytest.raises(ValueError, match=r'^--mla_rope_heads: a count is repeated'):
        ablation(mla_rope_heads=(1, 1))


def test_lr_grid_rows_keep_every_trained_run_but_the_source_and_untrained_conversions():
    from lm.experiments.ablation_tables import lr_grid_rows

    ab = ablation(seeds=1)
    specs = plan(ab, 'out')
    found = {
        s.name: {'eval': {'loss': 2.0 + i}, 'heldout': {'loss': 3.0 + i}}
        for i, s in enumerate(specs)
    }
    rows = lr_grid_rows(specs, found)
    trained = [s for s in specs if s.arm[0] != 'MHA' and (s.arm[1] == 'scratch' or s.arm[2])]
    # per rate: GQA-2 and MQA 4 arms (2 methods x 2 schedules), MLA 2, 3 targets x 2 baselines
    assert len(rows) == len(trained) == len(ab.lrs) * (4 + 4 + 2 + 3 * 2)
    by_name = dict(zip([s.name for s in trained], rows, strict=True))
    i = [s.name for s in specs].index('MQA_rewarm-aligned_a0.1_lr0.003_s0')
    assert by_name['MQA_rewarm-aligned_a0.1_lr0.003_s0'] == {
        'model': 'MQA',
        'conversion': 'rewarm-aligned',
        'alpha_or_steps': 0.1,
        'lr': 3e-3,
        'seed': 0,
        'validation_loss': 2.0 + i,
        'heldout_loss': 3.0 + i,
    }
    assert lr_grid_rows(specs, {}) == []  # runs not finished: no rows


def test_the_pareto_figure_takes_each_arm_at_its_chosen_rate_only():
    from lm.experiments.ablation_tables import chosen_runs, report
    from lm.experiments.runner import workdir

    ab = ablation()
    specs = plan(ab, 'out')

    def val(s):  # validation loss lowest at 1e-3, for MQA at 3e-3
        best = 3e-3 if s.arm[0] == 'MQA' else 1e-3
        return 2.0 + abs(math.log(s.arm[-1] / best)) + 0.01 * s.seed

    found = {s.name: {'eval': {'loss': val(s)}, 'heldout': {'loss': val(s) + 1}} for s in specs}
    _, chosen = report(specs, found)
    runs = chosen_runs(specs, found, chosen, 'out')
    assert len(runs) == len({s.arm[:-1] for s in specs}) * ab.seeds  # not one per rate
    by_dir = {workdir('out', s): s for s in specs}
    assert all(by_dir[r.workdir].arm == (*r.arm, chosen[r.arm]) for r in runs)
    tuned = {a: lr for a, lr in chosen.items() if a[0] != 'MHA' and (a[1] == 'scratch' or a[2])}
    assert tuned and all(lr == (3e-3 if a[0] == 'MQA' else 1e-3) for a, lr in tuned.items())
    assert chosen_runs(specs, {}, chosen, 'out') == []


def test_each_run_trains_on_its_own_part_and_continue_carries_the_optimizer_state():
    ab = ablation()
    assert base_config(ab, 0, ab.steps).data.split == 'pretrain'
    for make, methods in arms(ab).values():
        assert make(0, ab.steps).data.split == 'pretrain+uptrain'
        for options in methods.values():
            assert options.data_split == 'uptrain'
            if options.schedule == 'continue':
                assert options.optimizer_state == 'convert'
    splits = {}
    for spec in plan(ab, 'out'):
        splits.setdefault(spec.arm[1] == 'scratch' and spec.arm[0] != 'MHA', set()).add(
            (spec.arm[0] == 'MHA', spec.fingerprint['split'])
        )
    assert splits == {
        True: {(False, 'pretrain+uptrain')},
        False: {(True, 'pretrain'), (False, 'uptrain')},
    }


def test_without_a_grid_runs_keep_their_names_and_the_recipe_rate():
    ab = ablation(lrs=(), schedules=('continue',), mla_ranks=())
    specs = plan(ab, 'out')
    assert {s.arm[-1] for s in specs} == {base_config(ab, 0, 1).train.lr}
    assert 'GQA-2_mean_a0.1_s0' in {s.name for s in specs}


def test_mha_scratch_trains_the_source_model_on_both_parts_for_every_budget():
    ab = ablation(lrs=(), schedules=('continue',), mla_ranks=(), mha_scratch=True)
    specs = {s.name: s for s in plan(ab, 'out')}
    for total in (100, 110):  # alpha 0 and 0.1: the scratch targets' budgets
        spec = specs[f'mha_scratch_{total}_s1']
        assert spec.arm[:3] == ('MHA', 'scratch', total) and spec.seed == 1
        assert spec.fingerprint['split'] == 'pretrain+uptrain'
        assert spec.fingerprint == specs[f'MQA_scratch_{total}_s1'].fingerprint
    assert specs['mha_s0'].fingerprint['split'] == 'pretrain'  # the source is kept as it was
    assert not any(n.startswith('mha_scratch') for n in {s.name for s in plan(ablation(), 'o')})


@pytest.mark.parametrize(
    'overrides, message',
    [
        ({'schedules': ('warm',)}, '--schedule: expected one or more of'),
        ({'lrs': (1e-3, 0.0)}, '--lrs: every learning rate must be > 0'),
        (
            {'steps': 10, 'fractions': (0.0, 0.04, 0.5)},
            r'^--fractions: alpha=0.04 of --steps=10 rounds to 0 uptraining steps',
        ),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        ablation(**overrides)


def test_choose_by_accuracy_takes_the_best_mean_then_the_lower_loss_then_the_higher_rate():
    acc = {3e-3: {0: 0.96, 1: 0.94}, 1e-3: {0: 1.0, 1: 0.98}, 3e-4: {0: 1.0, 1: 0.993}}
    loss = {3e-3: {0: 0.1, 1: 0.2}, 1e-3: {0: 0.01, 1: 0.03}, 3e-4: {0: 0.02, 1: 0.03}}
    assert lr_grid.choose_by_accuracy(acc, loss) == 3e-4  # 99.65% against 99.0%: over the band
    assert lr_grid.choose_by_accuracy(acc, loss, tie=0.01) == 1e-3  # tied: 1e-3's lower loss
    same = {1e-3: {0: 0.02, 1: 0.03}, 3e-4: {0: 0.02, 1: 0.03}}
    tied = {1e-3: {0: 0.99, 1: 0.99}, 3e-4: {0: 0.99, 1: 0.99}}
    assert lr_grid.choose_by_accuracy(tied, same) == 1e-3  # all equal: the higher rate
    with pytest.raises(ValueError, match=r'lr 0.0003: seeds \[0\], expected \[0, 1\]'):
        lr_grid.choose_by_accuracy({1e-3: {0: 1.0, 1: 1.0}, 3e-4: {0: 1.0}}, same)
    with pytest.raises(ValueError, match='no learning rate'):
        lr_grid.choose_by_accuracy({}, {})


def test_screen_choices_name_the_point_whose_seeds_differ():
    row = {'point': 'mqa', 'eval_loss': '0.1', 'eval_recall_accuracy': '0.9'}
    rows = [{**row, 'lr': lr, 'seed': k} for lr, k in [('1e-3', 0), ('1e-3', 1), ('3e-4', 0)]]
    with pytest.raises(ValueError, match=r'^mqa: lr 0.0003: seeds \[0\], expected \[0, 1\]$'):
        lr_grid.screen_choices(rows)
    assert lr_grid.screen_choices(rows[:2]) == {'mqa': 1e-3}


@pytest.mark.parametrize('setting', ['steps', 'seeds'])
def test_no_steps_or_seeds_is_refused(setting):
    """--steps=0 finished a source without a checkpoint; --seeds=0 wrote empty CSVs, then
    failed."""
    with pytest.raises(ValueError, match=f'--{setting}: expected >= 1, got 0'):
        ablation(**{setting: 0})


def test_every_run_config_is_checked_before_any_run(tmp_path):
    """What train.py checks first (settings, data files, evaluation) fails before the first
    run starts, not when the run that needs it starts."""
    text = tmp_path / 'text.txt'
    text.write_text('some text\n' * 100)
    one = ('mesh.cpu_devices=0',)  # this process's devices, as JAX started them
    good = dict(data_path=str(text), overrides=one)
    check_configs(ablation(**good))
    with pytest.raises(FileNotFoundError, match="config.data.path: 'nowhere.txt' does not exist"):
        check_configs(ablation(**{**good, 'data_path': 'nowhere.txt'}))
    with pytest.raises(ValueError, match='config.eval_tokens must be >= 0, got -1'):
        check_configs(ablation(**good, eval_tokens=-1))
    with pytest.raises(ValueError, match='config.train.lr must be > 0'):
        check_configs(ablation(**{**good, 'lrs': (), 'overrides': (*one, 'train.lr=-1')}))


def test_compare_with_an_out_dir_of_other_runs_says_so(tmp_path):
    """--compare_with an out_dir holding none of this ablation's conversion runs is refused
    before any run; one whose runs lack a seed gives a sentence, not an empty table."""
    from lm.experiments.ablation_tables import check_comparable, compare_table

    ab = ablation()
    specs = plan(ab, str(tmp_path / 'out'))
    with pytest.raises(ValueError, match=r'^--compare_with=.*: it holds no result of this abl'):
        check_comparable(specs, str(tmp_path))
    values = {('MQA', 'mean', 0.5): {0: 1.5, 1: 1.6}}
    text = compare_table(ab, specs, {}, values, str(tmp_path / 'out'), str(tmp_path))
    assert text == (
        f'No paired difference with {tmp_path}: no conversion arm has held-out results for all '
        'of its seeds in both out_dirs.'
    )


def test_compare_with_runs_scoring_other_held_out_text_is_not_paired(tmp_path, monkeypatch):
    """--compare_with an out_dir whose runs cut the held-out part otherwise (the interleaved
    layout, another heldout_fraction): the losses are of other text, so no paired difference,
    and the sentence names the settings."""
    from lm.experiments import ablation_tables

    ab = ablation()
    specs = plan(ab, str(tmp_path / 'out'))
    here = base_config(ab, 0, 8)
    here.data.split = 'uptrain'
    there = base_config(ab, 0, 8)
    there.data.update(split='uptrain', split_layout='interleaved', heldout_fraction=0.3)
    configs = {str(tmp_path / 'out'): here, str(tmp_path / 'other'): there}
    saved = {'heldout': {'loss': 1.0}, 'fingerprint': ab.settings()}
    monkeypatch.setattr(ablation_tables, 'read_result', lambda d: saved)
    monkeypatch.setattr(
        ablation_tables,
        'stored_config',
        lambda d: configs[os.path.dirname(d)].copy_and_resolve_references(),
    )
    arm = ('MQA', 'mean', 0.1)
    values, chosen = {arm: {0: 1.5, 1: 1.6}}, {arm: 1e-3}
    monkeypatch.setattr(ablation_tables, 'heldout_loss', lambda saved: 1.4)
    text = compare_table(ab, specs, chosen, values, str(tmp_path / 'out'), str(tmp_path / 'other'))
    assert text == (
        f'No paired difference with {tmp_path / "other"}: its runs score other held-out text '
        '(data.heldout_fraction, data.split_block, data.split_layout, data.uptrain_fraction '
        'differ), so their losses are not paired by seed.'
    ), text
