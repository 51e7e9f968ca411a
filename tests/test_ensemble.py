"""Seed ensembles (config.train.ensemble): member i is the single run of seed + i, trained with
the others as one program; checkpoints, resume, TensorBoard, results and split-out per member.

Tolerance: a member's losses and parameters equal its single run's to float32 rounding, not
bitwise. The ensemble's step is the single step vmapped, so XLA compiles batched matmuls and
reductions whose summation order may differ from the unbatched ones by an ulp; over a few AdamW
steps this stays ~1e-7 (measured 1.6e-7 on parameters after 3 steps). The bounds are the ones the
project uses for other re-fusions of one computation (steps per call): rtol 1e-5 on losses, atol
1e-5 on parameters (of size ~0.02 to 1).
"""

import csv
import itertools
import json
import logging
import math
import os
import pathlib
import re
import signal
import subprocess
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    ENV,
    ROOT,
    entry_command,
    read_scalars,
    run_entry,
    sweep_file,
    tiny_train_config,
    write_config_file,
)
from test_recall import recall_config

from lm.config import with_values
from lm.convert import ConversionOptions, convert_checkpoint, convert_ensemble
from lm.experiments import plan_sweep, progress, run_specs, seed_runs, summarise_sweep
from lm.experiments import sweep as experiments_sweep
from lm.experiments.sweep_ensemble import to_split
from lm.train import Interrupted, ensemble
from lm.train.checkpoint import read_step_meta
from lm.train.ensemble import check_members_divide, member_config, member_tree, state_bytes
from lm.train.ensemble_run import split_member, split_members, split_request
from lm.train.loop import call_batch, train
from lm.train.provenance import SESSIONS
from lm.train.run import assemble, check_config
from lm.train.step import device_call_batch, make_train_step
from lm.train.stored import finished_step
from lm.train.workdir import RunError

RTOL, ATOL = 1e-5, 1e-5


def assert_close_trees(a, b, atol=ATOL):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def assert_equal_trees(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# Both programs run in the full suite (the fast tier trains an ensemble through train() in
# test_a_diverging_member_stops_the_ensemble_naming_its_seed).
@pytest.mark.slow
@pytest.mark.parametrize('loop', [False, True], ids=['vmapped', 'looped'])
def test_an_ensemble_step_is_its_members_single_steps(tmp_path, small_text, loop):
    """Member i is the single run of seed 5 + i and, with train.ensemble_lr and
    ensemble_min_lr, of its own peak rate and floor (member 1: a constant rate after warmup)."""
    config = tiny_train_config(tmp_path, small_text, seed=5)
    settings = {
        'train.ensemble': 2,
        'train.ensemble_loop': loop,
        'train.ensemble_lr': '3e-3,2e-2',
        'train.ensemble_min_lr': '1e-4,2e-2',
    }
    ens = assemble(with_values(config, settings), state='init', data=True)
    singles = [assemble(member_config(ens.config, i), state='init', data=True) for i in (0, 1)]
    for i, single in enumerate(singles):  # the same initialisation, bitwise
        assert single.config.seed == 5 + i
        assert single.config.train.lr == (3e-3, 2e-2)[i]
        assert single.config.train.min_lr == (1e-4, 2e-2)[i]
        assert_equal_trees(single.state, member_tree(ens.state, i))
    assert jax.tree.leaves(ens.state['params'])[0].shape[0] == 2
    step = make_train_step(ens.ctx, 1)
    state = ens.state
    single_states = [s.state for s in singles]
    single_steps = [make_train_step(single.ctx, 1) for single in singles]
    for s in range(3):
        batch = call_batch(ens, s, 1)
        assert batch.shape == (2, 4, 17)
        state, metrics = step(state, device_call_batch(ens.ctx, batch))
        for i, single in enumerate(singles):
            np.testing.assert_array_equal(batch[i], call_batch(single, s, 1))  # own data order
            single_states[i], m = single_steps[i](
                single_states[i], device_call_batch(single.ctx, batch[i])
            )
            np.testing.assert_allclose(metrics['loss'][i], m['loss'], rtol=RTOL)
            np.testing.assert_allclose(metrics['lr'][i], m['lr'], rtol=RTOL)
        assert s == 0 or metrics['lr'][1] > 6 * metrics['lr'][0]  # each member its own rate
    for i in (0, 1):
        assert_close_trees(member_tree(state['params'], i), single_states[i]['params'])
    # the whole schedule, floor included (3 steps end near the peak): member i's is its single's
    for i, single in enumerate(singles):
        rates = jnp.asarray(((3e-3, 1e-4), (2e-2, 2e-2))[i])
        member = ens.ctx.member_optimizer(rates)[1]
        counts = np.arange(single.config.train.steps + 1)
        np.testing.assert_allclose(
            [member(c) for c in counts], [single.ctx.lr_schedule(c) for c in counts], rtol=RTOL
        )
        assert single.ctx.lr_schedule(counts[-1]) == pytest.approx((1e-4, 2e-2)[i], rel=1e-5)


def test_bad_member_counts_are_refused_in_one_line(tmp_path, small_text, monkeypatch):
    config = tiny_train_config(tmp_path, small_text)
    for bad in (-1, -8):
        with pytest.raises(ValueError, match=r'^config.train.ensemble must be 0 \(off\)'):
            check_config(with_values(config, {'train.ensemble': bad}))
    with pytest.raises(ValueError, match='below 2\\*\\*32'):
        check_config(with_values(config, {'train.ensemble': 3, 'seed': 2**32 - 2}))
    for k, lrs in ((3, '1e-3,2e-3'), (2, '1e-3,x'), (2, '1e-3,-1'), (0, '1e-3')):
        with pytest.raises(ValueError, match=r'^config.train.ensemble_lr=.*(must be|needs)'):
            check_config(with_values(config, {'train.ensemble': k, 'train.ensemble_lr': lrs}))
    for k, lrs in ((3, '0,2e-3'), (2, '1e-3,-1'), (0, '0')):
        with pytest.raises(ValueError, match=r'^config.train.ensemble_min_lr=.*(must be|needs)'):
            check_config(with_values(config, {'train.ensemble': k, 'train.ensemble_min_lr': lrs}))
    check_config(with_values(config, {'train.ensemble': 2, 'train.ensemble_min_lr': '0,1e-3'}))
    own = {'train.ensemble': 2, 'train.ensemble_lr': '1e-5,1e-5', 'train.ensemble_min_lr': '0,0'}
    check_config(with_values(config, {**own, 'train.lr': 1e-5}))  # lr and min_lr unread
    with pytest.raises(ValueError, match=r'^config.train.ensemble_loop=True needs an ensemble'):
        check_config(with_values(config, {'train.ensemble_loop': True}))  # would loop nothing
    check_config(with_values(config, {'train.ensemble': 2, 'train.ensemble_loop': True}))
    with monkeypatch.context() as m:
        m.setattr(jax, 'process_count', lambda: 2)
        with pytest.raises(ValueError, match='ensembles train in one process only'):
            check_config(with_values(config, {'train.ensemble': 2}))
    mesh = types.SimpleNamespace(shape={'data': 4, 'fsdp': 1, 'tensor': 1})
    rules = {'member': ('data',), 'batch': ('data', 'fsdp')}
    k6 = with_values(config, {'train.ensemble': 6})
    with pytest.raises(
        ValueError, match=r"ensemble=6 members do not divide .*\('data',\) of size 4"
    ):
        check_members_divide(k6, mesh, rules)
    check_members_divide(with_values(config, {'train.ensemble': 8}), mesh, rules)


@pytest.mark.slow
def test_an_ensemble_trains_its_members_single_runs(tmp_path, small_text, caplog):
    config = tiny_train_config(tmp_path, small_text, seed=3, **{'train.ensemble': 3})
    with caplog.at_level(logging.INFO):
        result = train(config, str(tmp_path / 'ens'))
    said = [r.getMessage() for r in caplog.records]  # the model once, then what the members are
    assert len([m for m in said if m.startswith('model: ')]) == 1, said
    assert 'ensemble of 3 members (seeds [3, 4, 5]), each the model above' in said, said
    steps = [m for m in said if m.startswith('step ')]  # the first member's, and it says so
    assert steps and all('| seed 3 (member 1 of 3; tok/s its own) | loss' in m for m in steps)
    tb = tmp_path / 'ens' / 'tb'
    assert sorted(p.name for p in tb.iterdir() if p.is_dir()) == ['seed_3', 'seed_4', 'seed_5']
    results = json.loads((tmp_path / 'ens' / 'results.json').read_text())
    assert [m['seed'] for m in results['members']] == [3, 4, 5]
    for i in range(3):
        single_config = member_config(config, i)
        single = train(single_config, str(tmp_path / f'single{i}'))
        want = read_scalars(tmp_path / f'single{i}' / 'tb', 'train/loss')
        got = read_scalars(tb / f'seed_{3 + i}', 'train/loss')
        assert sorted(got) == sorted(want) == list(range(1, 9))
        np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=RTOL)
        evals = read_scalars(tb / f'seed_{3 + i}', 'eval/loss')
        assert sorted(evals) == [4, 8]
        np.testing.assert_allclose(evals[8], single['eval']['loss'], rtol=RTOL)
        np.testing.assert_allclose(results['members'][i]['eval']['loss'], evals[8], rtol=1e-6)
        assert_close_trees(member_tree(result['state']['params'], i), single['state']['params'])
        # split out, the member is an ordinary run: the single run's config, its state
        out = split_member(str(tmp_path / 'ens'), i, str(tmp_path / f'split{i}'))
        assert finished_step(single_config, out) == 8
        with assemble(out, state='restore') as split:
            assert split.config.train.ensemble == 0 and split.config.seed == 3 + i
            assert_equal_trees(split.state, member_tree(result['state'], i))
        # what trained the member is what trained the ensemble
        split_results = json.loads((tmp_path / f'split{i}' / 'results.json').read_text())
        assert split_results['trained_by'] == results['trained_by']
        sessions = read_step_meta(out, 8)[SESSIONS]
        assert sessions == read_step_meta(str(tmp_path / 'ens'), 8)[SESSIONS]
        assert sessions == [{'steps': [0, 8], **results['trained_by']}]
    # several members at once from an earlier checkpoint (the ensemble restored once)
    outs = {0: str(tmp_path / 'early0'), 2: str(tmp_path / 'early2')}
    assert split_members(str(tmp_path / 'ens'), outs, step=4) == list(outs.values())
    for i, out in outs.items():
        with assemble(out, state='restore') as split:
            assert split.step == 4 and split.config.seed == 3 + i
    with pytest.raises(RunError, match='already holds a run'):
        split_members(str(tmp_path / 'ens'), {1: str(tmp_path / 'fresh'), 2: outs[2]})
    assert not (tmp_path / 'fresh').exists()  # refused before anything was written
    # a stop between members: those before it are split whole and reported, none after it
    calls, done = [], []

    def stop_at_second() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted(signal.SIGTERM)

    stopped = {1: str(tmp_path / 'early1'), 2: str(tmp_path / 'never')}
    with pytest.raises(Interrupted):
        split_members(
            str(tmp_path / 'ens'), stopped, 4, stop_at_second, lambda m, o: done.append(m)
        )
    assert done == [1] and not (tmp_path / 'never').exists()
    # run again after a stop: the members already split stay, the missing one is written
    again = {0: outs[0], 1: str(tmp_path / 'early1')}
    assert split_members(str(tmp_path / 'ens'), again, step=4) == list(again.values())
    with assemble(again[1], state='restore') as split:
        assert split.step == 4 and split.config.seed == 4
    # uptraining converts the whole ensemble: each member as its split-out run converts
    options = ConversionOptions(num_kv_heads=1, method='mean', steps=2)
    written = convert_ensemble(str(tmp_path / 'ens'), options, str(tmp_path / 'up'))
    assert [w for w, _ in written] == [str(tmp_path / f'up_s{s}') for s in (3, 4, 5)]
    convert_checkpoint(str(tmp_path / 'split2'), options, str(tmp_path / 'up_split2'))
    with assemble(written[2][0], state='restore') as a:
        with assemble(str(tmp_path / 'up_split2'), state='restore') as b:
            assert_equal_trees(a.state, b.state)
            assert a.config.model.num_kv_heads == 1 and a.config.seed == 5
            mine, theirs = a.config.to_dict(), b.config.to_dict()
            assert mine['uptrain'].pop('source_workdir') == str(tmp_path / 'ens')
            theirs['uptrain'].pop('source_workdir')
            assert mine == theirs
    # ... and resumes as that single run: 4 more steps of each, the same losses
    longer = with_values(member_config(config, 0), {'train.steps': 12})
    for workdir in ('split0', 'single0'):
        assert train(longer, str(tmp_path / workdir))['step'] == 12
    want = read_scalars(tmp_path / 'single0' / 'tb', 'train/loss')
    got = read_scalars(tmp_path / 'split0' / 'tb', 'train/loss')
    assert sorted(got) == [9, 10, 11, 12]
    np.testing.assert_allclose([got[s] for s in got], [want[s] for s in got], rtol=RTOL)


@pytest.mark.slow
def test_kill9_then_resume_of_an_ensemble_is_bitwise_identical(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{
            'train.ensemble': 2,
            'train.steps': 200,
            'checkpoint_every': 25,
            'eval_every': 100,
            'log_every': 50,
        },
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    run_entry('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "ref"}', check=True)
    cmd = entry_command('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "run"}')
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 180
    while not (tmp_path / 'run' / 'checkpoints' / '25').exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.kill()  # SIGKILL, mid-way
    proc.wait()
    assert not (tmp_path / 'run' / 'checkpoints' / '200').exists(), 'run finished before kill'
    resumed = run_entry('train.py', *cmd[2:], timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert 'resumed from' in resumed.stderr
    for seed in (0, 1):
        want = read_scalars(tmp_path / 'ref' / 'tb' / f'seed_{seed}', 'train/loss')
        got = read_scalars(tmp_path / 'run' / 'tb' / f'seed_{seed}', 'train/loss')
        assert sorted(got) == sorted(want) == list(range(1, 201))
        assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise
    ref, run = (json.loads((tmp_path / d / 'results.json').read_text()) for d in ('ref', 'run'))
    assert ref['members'] == run['members']  # bitwise: the same final evaluations
    assert os.listdir(tmp_path / 'run' / 'tb') == os.listdir(tmp_path / 'ref' / 'tb')


@pytest.mark.slow
def test_members_spread_over_two_devices_and_a_split_member_evaluates(tmp_path, small_text):
    """Two CPU devices: the members of K = 4 lie two per device ('member' -> 'data') and train,
    vmapped or looped on each device, as on one device; K = 3 is refused before compiling;
    eval.py scores a split-out member as its training did."""
    config = tiny_train_config(
        tmp_path, small_text, **{'mesh.cpu_devices': 2, 'train.steps': 4, 'train.ensemble': 3}
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    out = run_entry('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "k3"}')
    assert out.returncode != 0
    assert 'config.train.ensemble=3 members do not divide' in out.stderr
    assert 'compiled the train step' not in out.stderr
    two = run_entry('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "two"}',
                    '--config.train.ensemble=4', check=True)  # fmt: skip
    looped = run_entry(
        'train.py',
        f'--config={cfg_file}',
        f'--workdir={tmp_path / "loop"}',
        '--config.train.ensemble=4',
        '--config.train.ensemble_loop=true',
        check=True,
    )  # 2 members looped on each device
    assert 'on 2 devices' in two.stderr
    assert 'on 2 devices' in looped.stderr
    one = with_values(config, {'mesh.cpu_devices': 0, 'train.ensemble': 4})
    train(one, str(tmp_path / 'one'))
    for seed, run in itertools.product(range(4), ('two', 'loop')):
        want = read_scalars(tmp_path / 'one' / 'tb' / f'seed_{seed}', 'train/loss')
        got = read_scalars(tmp_path / run / 'tb' / f'seed_{seed}', 'train/loss')
        np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=RTOL)
    out = run_entry('scripts/split_ensemble.py', f'--workdir={tmp_path / "two"}',
                    f'--out_dir={tmp_path / "members"}', check=True)  # fmt: skip
    assert sorted(os.listdir(tmp_path / 'members')) == [f'seed_{s}' for s in range(4)]
    refused = run_entry('eval.py', f'--workdir={tmp_path / "two"}')
    assert refused.returncode != 0 and 'scripts/split_ensemble.py' in refused.stderr
    refused = run_entry(  # before the first run is analysed, not after
        'scripts/analyze_heads.py',
        f'--workdir={tmp_path / "members" / "seed_0"}',
        f'--compare={tmp_path / "two"}',
        f'--out={tmp_path / "heads"}',
    )
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f'error: --compare={tmp_path / "two"}: {tmp_path / "two"} is an ensemble of 4 members'
        )
    )
    assert not (tmp_path / 'heads').exists()
    out = run_entry('eval.py', f'--workdir={tmp_path / "members" / "seed_1"}', check=True)
    member = json.loads((tmp_path / 'two' / 'results.json').read_text())['members'][1]
    loss = json.loads(out.stdout.strip().splitlines()[-1])['loss']
    np.testing.assert_allclose(loss, member['eval']['loss'], rtol=RTOL)


def test_an_ensemble_that_cannot_fit_is_refused_with_the_bytes_it_needs(
    tmp_path, small_text, monkeypatch
):
    config = tiny_train_config(tmp_path, small_text, **{'train.ensemble': 4})
    with assemble(config, data=True) as run:  # fits: the state of 4 tiny models
        per_member = state_bytes(run.ctx) / 4  # params, two Adam moments, step, rng
    monkeypatch.setattr(ensemble, 'device_memory', lambda: int(2.5 * per_member * 4 / 3))
    with pytest.raises(ValueError) as e:
        assemble(config, data=True)
    # per member: its state plus its gradients (a params-sized tree, a third of the state)
    assert 'config.train.ensemble=4 needs' in str(e.value) and 'at most 2 members fit' in str(
        e.value
    )


NUMBER = r'-?\d+(?:\.\d*)?(?:e[-+]?\d+)?'


def same_cell(got: str, want: str) -> bool:
    """The same text around numbers that are equal to float32 rounding (losses, their
    differences, intervals and p-values of runs equal to that tolerance)."""
    if re.sub(NUMBER, '#', got) != re.sub(NUMBER, '#', want):
        return False
    pairs = zip(re.findall(NUMBER, got), re.findall(NUMBER, want), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-3, abs_tol=1e-5) for a, b in pairs)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def in_process_trainer(config, command, tb_dir):
    """The sweep's run of `config` (train.py's `train`), in this process: the separate-run
    path without a process per run."""

    def run(workdir: str) -> dict:
        train(config, workdir, tb_dir)
        return json.loads((pathlib.Path(workdir) / 'results.json').read_text())

    return run


@pytest.mark.slow
def test_a_sweep_of_ensembles_summarises_as_separate_runs_do(tmp_path, small_text, monkeypatch):
    """scripts/sweep.py --ensemble, 2 variants x 2 seeds: each point's seeds trained as one
    ensemble, split into the runs separate training makes, so the summary, per-seed CSV and plot
    are those of the same plan trained run by run (here in this process; losses to the
    tolerance above)."""
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 2, 'eval_every': 2, 'checkpoint_every': 2, 'eval_tokens': 256},
    )
    points = [
        {'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0},
        {'name': 'mqa', 'model.attention': 'mqa', 'model.num_kv_heads': 0},
    ]
    cfg = sweep_file(tmp_path, config, points)
    ens, sep = tmp_path / 'ensembles', tmp_path / 'separate'
    # vmapped: the looped program's members are checked against single runs above; on two CPU
    # devices, as the recipe's sweeps run (the members are split out in the sweep's process)
    out = run_entry('scripts/sweep.py', f'--config={cfg}', f'--sweep_dir={ens}', '--seeds=2',
                    '--ensemble', '--ensemble_program=vmapped', '--config.mesh.cpu_devices=2',
                    timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    monkeypatch.setattr(experiments_sweep, '_trainer', in_process_trainer)
    specs = plan_sweep(config, points, str(sep), [], 2)
    summarise_sweep(str(sep), specs, run_specs(specs, str(sep)))
    assert sorted(os.listdir(ens / 'ensembles')) == ['mha', 'mqa']
    runs = [f'{p}_s{s}' for p in ('mha', 'mqa') for s in range(2)]
    assert [r for r in runs if (ens / r / 'result.json').exists()] == runs
    members = sorted(p.name for p in (ens / 'tb' / 'mha').iterdir() if p.is_dir())
    assert members == [f'seed_{s}' for s in range(2)]
    for name in ('summary.csv', 'summary_seeds.csv', 'summary_pairs.csv'):
        got, want = read_csv(ens / name), read_csv(sep / name)
        assert len(got) == len(want) and list(got[0]) == list(want[0]), name
        for g, w in zip(got, want, strict=True):
            for key, value in w.items():
                if key == 'tokens_per_sec':  # a timing
                    continue
                assert same_cell(g[key], value), (name, key, g[key], value)
    assert len(read_csv(ens / 'summary_seeds.csv')) == 4
    assert (ens / 'summary.png').stat().st_size > 10_000
    # each ensemble's members split by one process of their own (a GPU's memory stays the runs')
    assert sorted(p.parent.name for p in ens.glob('*/split.log')) == ['mha_s0', 'mqa_s0']
    two = with_values(config, {'mesh.cpu_devices': 2})
    ensembled = plan_sweep(two, points, str(ens), [], 2, ensemble=True)
    assert progress(ensembled, str(ens))[-1].endswith(
        '6 finished, 0 to resume, 0 with other settings, 0 started, 0 not started'
    )


def test_a_sweep_refuses_ensemble_settings_its_runs_would_refuse_when_it_plans(
    tmp_path, small_text
):
    config = tiny_train_config(tmp_path, small_text, **{'train.ensemble_lr': '1e-3,2e-3,3e-3'})
    points = [{'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}]
    plan_sweep(config, points, str(tmp_path), [], 3, ensemble=True)  # 3 rates, 3 members
    with pytest.raises(ValueError, match=r"^sweep point mha: config.train.ensemble_lr='1e-3,2e-3,"
                       r"3e-3' must be 2 comma-separated"):  # fmt: skip
        plan_sweep(config, points, str(tmp_path), [], 2, ensemble=True)
    with pytest.raises(ValueError, match=r'^sweep point mha: config.train.ensemble_lr=.* needs an'):
        plan_sweep(config, points, str(tmp_path), [], 3)  # separate runs: no ensemble
    assert not list(tmp_path.glob('mha*'))


def test_a_sweep_splits_a_points_seeds_over_ensemble_groups(tmp_path, small_text):
    """--ensemble_groups=3 of 8 seeds: ensembles of seeds 0-2, 3-5 and 6-7, each a lane of
    its own with its members' runs after it; --ensemble_program sets their program."""
    config = tiny_train_config(tmp_path, small_text, seed=10)
    points = [{'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}]
    specs = plan_sweep(config, points, str(tmp_path), [], 8, ensemble=True, ensemble_groups=3,
                       ensemble_loop=True)  # fmt: skip
    groups = [s for s in specs if s.name.startswith('ensembles/')]
    assert [(s.name, s.seed, s.fingerprint['train.ensemble']) for s in groups] == [
        ('ensembles/mha_g0', 10, 3), ('ensembles/mha_g1', 13, 3), ('ensembles/mha_g2', 16, 2)
    ]  # fmt: skip
    assert all(s.fingerprint['train.ensemble_loop'] for s in groups)
    members = [(s.name, s.lane, s.needs) for s in specs if s not in groups]
    assert members == [
        (f'mha_s{10 + k}', f'mha_g{k // 3}', (f'ensembles/mha_g{k // 3}',)) for k in range(8)
    ]
    assert seed_runs(specs) == [s for s in specs if s not in groups]


def test_an_ensemble_whose_members_finished_under_other_groups_is_not_trained(tmp_path, small_text):
    """A sweep re-run with other --ensemble_groups: the members' runs finished (their
    fingerprints hold no grouping), so the new grouping's ensemble is not needed: skipped, and
    --status counts it finished; with one member missing it trains."""
    from lm.experiments.runner import fingerprint, run_one

    config = tiny_train_config(tmp_path, small_text)
    points = [{'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}]
    before = plan_sweep(config, points, str(tmp_path), [], 4, ensemble=True, ensemble_groups=2)
    for spec in before[1:3] + before[4:6]:  # the members' runs of both groups, finished
        (tmp_path / spec.name).mkdir()
        result = {'step': 8, 'eval': {'loss': 3.0}, 'fingerprint': fingerprint(spec)}
        (tmp_path / spec.name / 'result.json').write_text(json.dumps(result))
    after = plan_sweep(config, points, str(tmp_path), [], 4, ensemble=True)
    assert after[0].name == 'ensembles/mha' and after[0].served(str(tmp_path))
    assert run_one(after[0], str(tmp_path)).endswith(
        'not needed (the runs it makes finished earlier), skipped'
    )
    assert 'ensembles/mha: not needed' in progress(after, str(tmp_path))[0]
    (tmp_path / 'mha_s3' / 'result.json').unlink()
    assert not after[0].served(str(tmp_path))


def test_seeds_added_to_a_point_keep_its_ensemble_and_train_the_rest(tmp_path, small_text):
    """A sweep of 2 seeds as one ensemble, re-run with 5: the finished ensemble is planned as
    it was (finished: nothing redone, no refusal for its member count) and seeds 2-4 train as
    an ensemble of their own, ensembles/mha_seeds2-4 (or its groups); runs keep their names."""
    from lm.experiments.runner import check, fingerprint

    config = tiny_train_config(tmp_path, small_text)
    points = [{'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}]
    before = plan_sweep(config, points, str(tmp_path), [], 2, ensemble=True)
    for spec in before:
        (tmp_path / spec.name).mkdir(parents=True)
        result = {'step': 8, 'eval': {'loss': 3.0}, 'fingerprint': fingerprint(spec)}
        (tmp_path / spec.name / 'result.json').write_text(json.dumps(result))
    after = plan_sweep(config, points, str(tmp_path), [], 5, ensemble=True)
    check(after, str(tmp_path))  # the earlier ensemble is not "made with other settings"
    assert [(s.name, s.fingerprint.get('train.ensemble')) for s in after] == [
        ('ensembles/mha', 2), ('mha_s0', 0), ('mha_s1', 0),
        ('ensembles/mha_seeds2-4', 3), ('mha_s2', 0), ('mha_s3', 0), ('mha_s4', 0),
    ]  # fmt: skip
    for spec in after[3:]:  # seeds 2-4 trained: then seeds 5-6 added follow on from them
        (tmp_path / spec.name).mkdir(parents=True)
        result = {'step': 8, 'eval': {'loss': 3.0}, 'fingerprint': fingerprint(spec)}
        (tmp_path / spec.name / 'result.json').write_text(json.dumps(result))
    seven = plan_sweep(config, points, str(tmp_path), [], 7, ensemble=True)
    check(seven, str(tmp_path))
    assert [s.name for s in seven if s.name.startswith('ensembles/')] == [
        'ensembles/mha',
        'ensembles/mha_seeds2-4',
        'ensembles/mha_seeds5-6',
    ]
    assert [s.name for s in seven if not s.name.startswith('ensembles/')] == [
        f'mha_s{k}' for k in range(7)
    ]
    grouped = plan_sweep(config, points, str(tmp_path), [], 5, ensemble=True, ensemble_groups=2)
    assert [s.name for s in grouped if s.name.startswith('ensembles/')] == [
        'ensembles/mha_g0',
        'ensembles/mha_g1',
    ]  # groups asked for: as before (the finished members serve their ensemble)


def test_after_an_extended_sweep_one_split_serves_every_later_member(tmp_path):
    """A sweep extended to more steps: the first member's split also takes each later member
    whose result is of the old step (not one process per member); a member already finished at
    the ensemble's step, or not started, is handled as before."""
    outs = {m: str(tmp_path / f'p_s{m}') for m in range(4)}
    for m, step in ((1, 4), (2, 8)):  # member 1 finished before the extension, 2 after it
        os.makedirs(outs[m])
        (tmp_path / f'p_s{m}' / 'result.json').write_text(json.dumps({'step': step}))
    assert to_split(outs, [0, 1, 2, 3], 0, 8) == [0, 1, 3]
    assert to_split(outs, [0, 1, 2, 3], 2, 8) == [2, 3]  # its own split: always made
    assert to_split(outs, [0, 1, 2, 3], 0, 4) == [0, 2, 3]


@pytest.mark.slow
def test_a_recall_ensemble_scores_each_member_as_its_single_run(tmp_path):
    """An MQAR ensemble: each member's loss counts its answers only, and its held-out recall
    accuracy per member equals its single run's."""
    config = recall_config(tmp_path, **{'train.ensemble': 2})
    result = train(config, str(tmp_path / 'ens'))
    for i in range(2):
        single = train(member_config(config, i), str(tmp_path / f'single{i}'))
        want = read_scalars(tmp_path / f'single{i}' / 'tb', 'train/loss')
        got = read_scalars(tmp_path / 'ens' / 'tb' / f'seed_{i}', 'train/loss')
        np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=RTOL)
        mine, theirs = result['eval'][i], single['eval']
        assert sorted(mine) == sorted(theirs) and 'recall_accuracy' in mine
        for key, value in theirs.items():
            np.testing.assert_allclose(mine[key], value, rtol=RTOL, atol=1e-6, err_msg=key)


def test_a_diverging_member_stops_the_ensemble_naming_its_seed(tmp_path, small_text):
    settings = {'train.ensemble': 2, 'train.lr': 1e30, 'train.grad_clip': 0.0, 'seed': 7}
    config = tiny_train_config(tmp_path, small_text, **settings)
    with pytest.raises(FloatingPointError, match=r'^member seed 7: non-finite .* at step \d+'):
        train(config, str(tmp_path / 'run'))


def test_a_split_request_is_checked_in_one_line(tmp_path):
    """scripts/split_ensemble.py's --members and --out_dir, before anything is read."""
    run, out, seeds = str(tmp_path / 'ens'), str(tmp_path / 'out'), [5, 6, 7]
    assert split_request(run, out, [], seeds) == {m: f'{out}/seed_{5 + m}' for m in range(3)}
    assert split_request(run, out, ['2', '0'], seeds) == {2: f'{out}/seed_7', 0: f'{out}/seed_5'}
    # beside the ensemble, as a sweep splits its members: <sweep_dir>/<point>_s<seed>
    beside = split_request(run, str(tmp_path), ['1'], seeds, 'ens_s{seed}')
    assert beside == {1: f'{tmp_path}/ens_s6'}
    # one member asked for: a fixed name is its own (it was refused as naming two)
    assert split_request(run, out, ['1'], seeds, 'mine') == {1: f'{out}/mine'}
    for given, message in (
        (['a'], r"--members: \['a'\] are not member indices 0..2"),
        (['3'], r"--members: \['3'\] are not member indices"),
        (['1', '01'], r'--members: 1,01 names a member twice'),
    ):
        with pytest.raises(ValueError, match=message):
            split_request(run, out, given, seeds)
    for workdir, out_dir in ((run, f'{run}/checkpoints'), (f'{tmp_path}/seed_5', str(tmp_path))):
        apart = r"^--out_dir: member 0='.*' (is|is inside|holds) the ensemble --workdir '"
        with pytest.raises(ValueError, match=apart):
            split_request(workdir, out_dir, [], seeds)
    for name, message in (
        ('seed', r"--name: 'seed' gives two members one name: use \{seed\} or \{member\}"),
        ('s_{step}', r"--name: 's_\{step\}' may hold only \{seed\} and \{member\}"),
        ('{seed}/x', r"--name: '5/x' cannot name a directory"),
        ('.{member}', r"--name: '.0' cannot name a directory"),
    ):
        with pytest.raises(ValueError, match=message):
            split_request(run, out, [], seeds, name)
    # Nothing a split would write over or into: a directory of the user's own files (its
    # results.json replaced), another run (a member inside it), another run's checkpoints/.
    other = tmp_path / 'other'
    (other / 'checkpoints' / '4').mkdir(parents=True)
    notes = tmp_path / 'notes0'
    notes.mkdir()
    (notes / 'results.json').write_text('{"mine": 1}')
    for out_dir, name, message in (
        (
            str(tmp_path),
            'notes{member}',
            r"^member 0's directory='.*notes0' is not a run \(no "
            r'checkpoints/\) but holds results\.json',
        ),
        (str(other), 'seed_{seed}', r"^member 0's directory='.*other/seed_5' is inside the run "),
        (f'{other}/checkpoints', '9{seed}', r'is inside the checkpoints directory of the run '),
    ):
        with pytest.raises(ValueError, match=message):
            split_request(run, out_dir, ['0'], seeds, name)
    assert (notes / 'results.json').read_text() == '{"mine": 1}'
