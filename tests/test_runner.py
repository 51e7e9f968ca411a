"""The experiment runner with tiny fake runs: the cache, fingerprint refusals and re-runs, resume
after a partial plan, dependencies, reuse of an earlier out_dir, and the summary's numbers against
a reference computed here."""

import dataclasses
import json
import math
import os
import shutil

import numpy as np
import pytest

from lm.experiments import runner, stats, summary
from lm.experiments.runner import RunFailed, RunStopped, Spec


class Fake:
    """Runs that record their calls and return loss = `losses[(arm, seed)]`; `stop` names runs
    that stop half-way (RunStopped) and `fail` runs that fail alone (RunFailed)."""

    def __init__(self, losses):
        self.losses, self.calls, self.stop, self.fail = losses, [], set(), set()

    def spec(self, arm, seed, lr=0.1, steps=10, **kw):
        name = f'{arm}_s{seed}'

        def run(workdir):
            self.calls.append(name)
            with open(os.path.join(workdir, 'partial'), 'a') as f:
                f.write('x')  # what a resumed run finds
            if name in self.stop:
                raise RunStopped(f'{name}: stopped')
            if name in self.fail:
                raise RunFailed('exit 3')
            return {'eval': {'loss': self.losses[(arm, seed)]}, 'partial_seen': _read(workdir)}

        fingerprint = {'lr': lr, 'steps': steps}
        return Spec(name, fingerprint, run, arm, seed, resumable=lambda k: k == 'steps', **kw)


def _read(workdir):
    with open(os.path.join(workdir, 'partial')) as f:
        return len(f.read())


LOSSES = {('a', 0): 1.10, ('a', 1): 1.25, ('a', 2): 1.00, ('b', 0): 1.20, ('b', 1): 1.30}
LOSSES[('b', 2)] = 1.10


def plan(fake, **kw):
    return [fake.spec(arm, s, **kw) for arm in 'ab' for s in range(3)]


def test_cache_hit_skips_and_a_resumable_change_reruns(tmp_path, capsys):
    fake = Fake(LOSSES)
    found = runner.run(plan(fake), str(tmp_path))
    assert len(fake.calls) == 6 and found['b_s2']['eval']['loss'] == 1.10
    saved = json.loads((tmp_path / 'a_s1' / 'result.json').read_text())
    assert saved['fingerprint'] == {'lr': 0.1, 'steps': 10}
    capsys.readouterr()
    again = runner.run(plan(fake), str(tmp_path))
    assert len(fake.calls) == 6 and again == found
    assert capsys.readouterr().out.count('finished earlier, skipped') == 6
    longer = runner.run(plan(fake, steps=20), str(tmp_path))  # resumable: re-run, not refused
    assert fake.calls[6:] == [f'{arm}_s{s}' for arm in 'ab' for s in range(3)]
    assert longer['a_s0']['partial_seen'] == 2  # the re-run went on in its workdir
    assert longer['a_s0']['fingerprint']['steps'] == 20


def test_changed_fingerprint_is_refused_in_one_line(tmp_path):
    fake = Fake(LOSSES)
    runner.run(plan(fake)[:2], str(tmp_path))
    with pytest.raises(ValueError) as e:
        runner.run(plan(fake, lr=0.3), str(tmp_path), flag='--sweep_dir')
    assert str(e.value) == (
        f'--sweep_dir: {tmp_path / "a_s0"} (and 1 more runs) was made with other settings: '
        'lr: 0.1 -> 0.3; use another --sweep_dir, or delete those runs to redo them'
    )
    assert len(fake.calls) == 2 and (tmp_path / 'a_s0' / 'result.json').exists()
    (tmp_path / 'a_s0' / 'result.json').write_text('{"eval": {"loss": 1.0}}')  # no fingerprint
    with pytest.raises(ValueError, match=r'a_s0 was made with other settings: no fingerprint'):
        runner.run(plan(fake)[:1], str(tmp_path))


def test_resume_after_a_partial_plan(tmp_path):
    fake = Fake(LOSSES)
    fake.stop = {'a_s1'}
    with pytest.raises(RunStopped):
        runner.run(plan(fake), str(tmp_path))
    assert fake.calls == ['a_s0', 'a_s1'] and not (tmp_path / 'a_s1' / 'result.json').exists()
    fake.stop = set()
    found = runner.run(plan(fake), str(tmp_path))
    assert fake.calls[2:] == ['a_s1', 'a_s2', 'b_s0', 'b_s1', 'b_s2'] and len(found) == 6
    assert found['a_s1']['partial_seen'] == 2  # resume=True: went on in its workdir
    # resume=False: an unfinished run starts clean, and its other settings are no refusal.
    fake.stop = {'a_s0'}
    with pytest.raises(RunStopped):
        runner.run([fake.spec('a', 0, resume=False)], str(tmp_path / 'fresh'))
    fake.stop = set()
    spec = fake.spec('a', 0, lr=0.5, resume=False)
    assert runner.run([spec], str(tmp_path / 'fresh'))['a_s0']['partial_seen'] == 1


def test_needs_a_failed_run_and_plan_errors(tmp_path, capsys):
    fake = Fake(LOSSES)
    fake.fail = {'a_s0'}
    src = fake.spec('a', 0, lane='x')
    arm = fake.spec('b', 0, lane='x', needs=('a_s0',))
    found = runner.run([src, arm, fake.spec('a', 1)], str(tmp_path))
    out = capsys.readouterr().out
    assert 'a_s0: FAILED (exit 3) in 0 s' in out and 'b_s0: not run: a_s0 did not finish' in out
    assert set(found) == {'a_s1'} and 'b_s0' not in fake.calls
    other_lane = fake.spec('b', 0, lane='y', needs=('a_s0',))
    with pytest.raises(ValueError, match=r'^run b_s0 needs a_s0, not an earlier run of its lane'):
        runner.check([src, other_lane], str(tmp_path))
    with pytest.raises(ValueError, match=r'^the plan has two runs named a_s0$'):
        runner.check([src, src], str(tmp_path))


def test_reuse_copies_runs_with_the_same_fingerprint(tmp_path, capsys):
    fake = Fake(LOSSES)
    runner.run(plan(fake)[:2], str(tmp_path / 'first'))
    capsys.readouterr()
    specs = [fake.spec('a', 0), fake.spec('a', 1, lr=0.2)]
    found = runner.run(specs, str(tmp_path / 'second'), reuse=str(tmp_path / 'first'))
    assert f'a_s0: copied from {tmp_path / "first" / "a_s0"}' in capsys.readouterr().out
    assert fake.calls == ['a_s0', 'a_s1', 'a_s1'] and len(found) == 2  # a_s1 changed: trained


def test_a_reuse_copy_cut_short_leaves_no_run_that_looks_finished(tmp_path, monkeypatch):
    """A copy from --reuse that fails half-way (disk full, a kill) must not leave a run whose
    result.json arrived before its checkpoints: the next command would skip it as finished."""
    fake = Fake(LOSSES)
    first, second = tmp_path / 'first', tmp_path / 'second'
    runner.run(plan(fake)[:1], str(first))
    copytree = shutil.copytree

    def cut_short(src, dst):
        copytree(src, dst)
        raise OSError('No space left on device')

    monkeypatch.setattr(runner.shutil, 'copytree', cut_short)
    with pytest.raises(OSError):
        runner.run([fake.spec('a', 0)], str(second), reuse=str(first))
    assert runner.read_result(str(second / 'a_s0')) is None
    monkeypatch.undo()
    runner.run([fake.spec('a', 0)], str(second), reuse=str(first))
    assert runner.read_result(str(second / 'a_s0')) is not None
    assert not [p.name for p in second.iterdir() if p.name.startswith('.a_s0')]


def test_parallel_lanes_keep_their_order(tmp_path):
    fake = Fake(LOSSES)
    specs = [fake.spec(arm, s, lane=f'seed{s}') for s in range(3) for arm in 'ab']
    found = runner.run(specs, str(tmp_path), parallel=3)
    assert len(found) == 6
    for s in range(3):
        lane = [c for c in fake.calls if c.endswith(f'_s{s}')]
        assert lane == [f'a_s{s}', f'b_s{s}']


def test_summary_numbers_against_a_reference(tmp_path):
    fake = Fake(LOSSES)
    specs = plan(fake)
    found = runner.run(specs, str(tmp_path))
    del found['b_s2']  # b has seeds 0 and 1 only: pairs over the seeds both ran
    values = summary.by_arm(specs, found, summary.loss)
    assert values == {'a': {0: 1.10, 1: 1.25, 2: 1.00}, 'b': {0: 1.20, 1: 1.30}}
    a = np.array([1.10, 1.25, 1.00], np.float64)
    t2, t1 = 4.302653, 12.706205  # t_{0.975} at 2 and 1 degrees of freedom (printed tables)
    mean, std = a.mean(), a.std(ddof=1)
    half = t2 * std / math.sqrt(3)
    assert summary.cell(values['a']) == (
        f'{mean:.4f} ± {std:.4f} | [{mean - half:.4f}, {mean + half:.4f}]'
    )
    assert summary.cell({7: 1.5}) == '1.5000 (n = 1) | n/a (1 seed)'  # no '± nan'
    cols = summary.estimate_columns('loss', values['a'])
    assert cols['loss'] == pytest.approx(mean, abs=1e-12)
    assert cols['loss_std'] == pytest.approx(std, abs=1e-12)
    assert cols['loss_ci_lo'] == pytest.approx(mean - half, abs=1e-6)
    d = np.array([1.10 - 1.20, 1.25 - 1.30])  # a − b at seeds 0 and 1
    d_half = t1 * d.std(ddof=1) / math.sqrt(2)
    (row,) = summary.all_pairs(values)  # one comparison: Holm changes nothing
    assert row['seeds'] == 2 and row['loss_diff'] == pytest.approx(d.mean(), abs=1e-12)
    assert row['ci_lo'] == pytest.approx(d.mean() - d_half, abs=1e-5)
    assert row['ci_hi'] == pytest.approx(d.mean() + d_half, abs=1e-5)
    resolved = d.mean() + d_half < 0 or d.mean() - d_half > 0
    assert row['resolved'] == resolved and row['ordering'] == 'a ~ b (unresolved)'
    assert row['comparisons'] == 1 and row['p_holm'] == row['p']
    assert row['p_sign_flip_holm'] == 0.5  # both differences negative: 2 of the 2^2 patterns
    diff = stats.paired_difference(values['a'], values['b'])
    assert summary.diff_cell(diff, row['p_holm']) == (
        f'{d.mean():+.4f} [{d.mean() - d_half:.4f}, {d.mean() + d_half:.4f}] p={row["p"]:.3g}'
    )


def test_each_run_prints_its_start(tmp_path, capsys):
    fake = Fake(LOSSES)
    runner.run(plan(fake)[:2], str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f'a_s0: started in {tmp_path / "a_s0"}'
    assert lines[1].startswith('a_s0: done in ') and lines[2].startswith('a_s1: started in ')


def test_runs_recorded_before_a_key_was_added_are_cached_and_not_refused(tmp_path, capsys):
    """Code that adds a fingerprint key mid-experiment: runs recorded without it count as having
    the key's recorded value, so they stay cached and the plan is not refused; another value of
    the new key is still a change."""
    fake = Fake(LOSSES)
    runner.run(plan(fake), str(tmp_path))  # fingerprints {'lr', 'steps'}
    newer = [
        dataclasses.replace(s, fingerprint={**s.fingerprint, 'mask': False}, added={'mask': False})
        for s in plan(fake)
    ]
    capsys.readouterr()
    runner.run(newer, str(tmp_path))
    assert len(fake.calls) == 6  # nothing re-ran
    assert capsys.readouterr().out.count('finished earlier, skipped') == 6
    other = [dataclasses.replace(s, fingerprint={**s.fingerprint, 'mask': True}) for s in newer]
    with pytest.raises(ValueError, match=r'mask: False -> True'):
        runner.check(other, str(tmp_path))
    unrecorded = [dataclasses.replace(s, added={}) for s in newer]
    with pytest.raises(ValueError, match=r"mask: '\(absent\)' -> False"):
        runner.check(unrecorded, str(tmp_path))


def test_a_run_resumed_with_other_settings_is_not_finished_until_it_ends(tmp_path):
    """Resumed for longer (a resumable change), a finished run stops counting as finished while
    it trains on: its old result is moved aside (kept as result.superseded.json), so a stop
    part-way leaves a started run, never the old result beside newer checkpoints."""
    fake = Fake(LOSSES)
    runner.run([fake.spec('a', 0)], str(tmp_path))
    fake.stop.add('a_s0')
    with pytest.raises(RunStopped):
        runner.run([fake.spec('a', 0, steps=20)], str(tmp_path))
    wd = tmp_path / 'a_s0'
    assert runner.read_result(str(wd)) is None
    assert json.loads((wd / runner.SUPERSEDED).read_text())['fingerprint']['steps'] == 10
    assert runner.results([fake.spec('a', 0)], str(tmp_path)) == {}  # neither plan's result
    fake.stop.clear()
    done = runner.run([fake.spec('a', 0, steps=20)], str(tmp_path))
    assert done['a_s0']['fingerprint']['steps'] == 20


def test_an_output_file_never_replaces_a_runs_or_any_sweeps_own_files(tmp_path):
    """Output files of the scripts: refused inside any sweep directory above them (its summary
    files, its runs), or as a run's record file or in its subdirectories; a file of the user's
    beside a run's record is fine, and nothing is written."""
    from lm.experiments.outputs import check_not_record_file, check_output_file
    from lm.train.workdir import SWEEP_MARK

    sweep, run = tmp_path / 'sweep', tmp_path / 'runs' / 'gqa2'
    (sweep / 'mha_s0' / 'checkpoints').mkdir(parents=True)
    (sweep / SWEEP_MARK).write_text('{}')
    (run / 'checkpoints').mkdir(parents=True)
    refused = {
        sweep / 'summary.csv': r"is the sweep's own summary\.csv",
        sweep / 'pareto_kv.png': r"is the sweep's own pareto_kv\.png",
        sweep / 'mha_s0' / 'q.csv': r'is inside .*sweep/mha_s0, a directory of the sweep',
        run / 'results.json': r"would replace the run .*gqa2's own results\.json",
        run / 'tb' / 'x.png': r"would replace the run .*gqa2's own tb;",
    }
    for path, pattern in refused.items():
        with pytest.raises(ValueError, match=rf'^--out={path} {pattern}'):
            check_not_record_file(str(path), '--out', sweep_dir=str(tmp_path / 'another'))
    (run / 'tb').mkdir()
    with pytest.raises(ValueError, match=r'^--out=.*tb/x\.png would replace the run'):
        check_output_file(str(run / 'tb' / 'x.png'), '--out', '.png')
    for path in (sweep / 'mine.csv', run / 'mine.csv', tmp_path / 'summary.csv'):
        check_output_file(str(path), '--out')
    assert sorted(p.name for p in tmp_path.rglob('*') if p.is_file()) == [SWEEP_MARK]
