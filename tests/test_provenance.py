"""What trained a run (lm/train/provenance.py): the checkout's commit and code, the toolchain,
and which steps each session trained when a run is resumed under another version."""

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, tiny_train_config

from lm.train import provenance
from lm.train.checkpoint import read_step_meta
from lm.train.loop import train
from lm.train.provenance import (
    SESSIONS,
    differences,
    results_record,
    resumed_note,
    sessions_through,
    source_code,
    source_commit,
    toolchain,
    version,
)

BY = {'commit': 'a' * 40, 'code': 'c' * 12, 'jax': '0.10.2', 'cpu': 'Xeon', 'devices': '1 x'}


def test_sessions_join_while_one_version_trains_and_split_when_another_resumes():
    first = sessions_through([], 0, 4, BY)
    assert first == [{'steps': [0, 4], **BY}]
    assert sessions_through(first, 4, 8, BY) == [{'steps': [0, 8], **BY}]  # resumed, same
    other = {**BY, 'jax': '0.10.3'}
    assert sessions_through(first, 4, 8, other) == [
        {'steps': [0, 4], **BY},
        {'steps': [4, 8], **other},
    ]
    assert sessions_through(first, 4, 4, other) == first  # trained no step: not a session
    # a checkpoint that records none (saved before checkpoints held it): its steps, unknown
    assert sessions_through(None, 4, 8, BY) == [{'steps': [0, 4]}, {'steps': [4, 8], **BY}]
    assert first == [{'steps': [0, 4], **BY}]  # the prior list is not changed


def test_version_is_the_code_and_toolchain_and_the_note_names_what_differs():
    assert version({**BY, 'steps': [0, 4]}) == {'code': 'c' * 12, 'jax': '0.10.2', 'cpu': 'Xeon'}
    no_code = {k: v for k, v in BY.items() if k != 'code'}  # the commit where no code digest
    assert version(no_code) == {'commit': 'a' * 40, 'jax': '0.10.2', 'cpu': 'Xeon'}
    assert differences({'a': 1, 'b': 2}, {'a': 1, 'c': 3}) == (
        'b: 2 there, None here; c: None there, 3 here'
    )
    prior = [{'steps': [0, 4], **BY}]
    assert resumed_note(prior, 0, 8, BY) == ''  # a new run
    assert resumed_note(prior, 4, 8, {**BY, 'commit': 'e' * 40, 'devices': '2 x'}) == ''  # same
    assert resumed_note(prior, 4, 8, {**BY, 'jax': '0.10.3'}) == (
        'continuing at step 4, trained so far by another version of the code or toolchain (jax: '
        "'0.10.2' there, '0.10.3' here): results.json will list each (trained_by_sessions)"
    )
    assert resumed_note(prior, 4, 4, {**BY, 'jax': '0.10.3'}).startswith(
        'evaluating step 4, trained by another version'
    )
    assert resumed_note(None, 4, 8, BY).startswith('continuing at step 4: its checkpoint (or')
    assert resumed_note([{'steps': [0, 4]}], 4, 8, BY).endswith(
        'does not record what trained steps 1-4 (saved before checkpoints held it, or from a '
        'list that ends early)'
    )
    assert 'trained steps 3-4 ' in resumed_note([{'steps': [0, 2], **BY}], 4, 8, BY)  # ends early
    assert resumed_note([{'steps': [0, 6], **BY}], 4, 8, BY) == ''  # past 4: read as it stood


def test_a_list_read_at_the_step_resumed_from_is_clipped_there_and_its_gaps_are_kept():
    prior = [{'steps': [0, 2], **BY}, {'steps': [2, 6], **BY, 'jax': '0.10.3'}]
    # a list that runs past the step resumed from (steps 5-6 were never kept): read at step 4
    assert sessions_through(prior, 4, 8, BY) == [
        {'steps': [0, 2], **BY},
        {'steps': [2, 4], **BY, 'jax': '0.10.3'},
        {'steps': [4, 8], **BY},
    ]
    assert sessions_through(prior, 2, 3, BY) == [{'steps': [0, 3], **BY}]
    # a list that ends before it: the steps between, unknown, and never joined over
    assert sessions_through(prior[:1], 4, 8, BY) == [
        {'steps': [0, 2], **BY},
        {'steps': [2, 4]},
        {'steps': [4, 8], **BY},
    ]
    assert sessions_through([], 4, 4, BY) == [{'steps': [0, 4]}]


def test_results_name_the_trainer_of_the_last_steps_and_the_evaluator_apart():
    one = [{'steps': [0, 8], **BY}]
    assert results_record(one, 8, BY) == {'trained_by': BY}  # one record trained every step
    other = {**BY, 'jax': '0.10.3'}
    two = [{'steps': [0, 4], **BY}, {'steps': [4, 8], **other}]
    assert results_record(two, 8, other) == {'trained_by': other, SESSIONS: two}
    # a session that only ran the evaluation owed: it trained nothing
    assert results_record(one, 8, other) == {'trained_by': BY, 'evaluated_by': other}
    unknown = [{'steps': [0, 4]}, {'steps': [4, 8], **BY}]  # an older checkpoint's steps
    assert results_record(unknown, 8, BY) == {'trained_by': BY, SESSIONS: unknown}
    assert results_record([{'steps': [0, 8]}], 8, BY) == {'evaluated_by': BY}  # trainer unknown


@pytest.mark.slow
def test_a_run_resumed_under_another_version_records_which_steps_each_trained(
    tmp_path, small_text, monkeypatch, caplog
):
    """Checkpoints carry which steps each session trained: a resumption under the same version
    joins the first session's entry (results.json then holds trained_by alone); one under
    another toolchain is logged and listed in results.json, trained_by then the last session's;
    a session that only runs the evaluation owed is named apart (evaluated_by)."""
    config = tiny_train_config(tmp_path, small_text, **{'train.steps': 10})
    run = tmp_path / 'run'
    with caplog.at_level(logging.INFO):
        train(config, str(run))
    here = provenance.trained_by()
    assert f'code: {here["commit"] or "not a git checkout"}; JAX {here["jax"]}' in caplog.text
    assert read_step_meta(str(run), 8)[SESSIONS] == [{'steps': [0, 8], **here}]
    shutil.rmtree(run / 'checkpoints' / '10')  # killed after step 10's save began
    train(config, str(run))  # resumed at 8 by the same version: one entry
    assert read_step_meta(str(run), 10)[SESSIONS] == [{'steps': [0, 10], **here}]
    results = json.loads((run / 'results.json').read_text())
    assert results['trained_by'] == here and SESSIONS not in results

    shutil.rmtree(run / 'checkpoints' / '10')
    other = {**here, 'jax': '0.0.1'}  # as if JAX were upgraded between the sessions
    monkeypatch.setattr(provenance, 'trained_by', lambda: other)
    with caplog.at_level(logging.WARNING):
        train(config, str(run))
    assert f"jax: '{here['jax']}' there, '0.0.1' here" in caplog.text
    results = json.loads((run / 'results.json').read_text())
    assert results['trained_by'] == other
    assert results[SESSIONS] == [{'steps': [0, 8], **here}, {'steps': [8, 10], **other}]
    assert read_step_meta(str(run), 10)[SESSIONS] == results[SESSIONS]

    # killed before results.json was written: a third version runs the evaluation owed only
    (run / 'results.json').unlink()
    third = {**here, 'jax': '0.0.2'}
    monkeypatch.setattr(provenance, 'trained_by', lambda: third)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train(config, str(run))
    assert (
        "evaluating step 10, trained by another version of the code or toolchain (jax: '0.0.1'"
        in caplog.text
    )
    results = json.loads((run / 'results.json').read_text())
    assert (results['trained_by'], results['evaluated_by']) == (other, third)
    assert results[SESSIONS] == read_step_meta(str(run), 10)[SESSIONS]  # no step trained


def test_toolchain_keeps_the_xla_flags_that_can_change_cpu_numerics(monkeypatch):
    flags = '--xla_gpu_deterministic_ops=true --xla_force_host_platform_device_count=8'
    monkeypatch.setenv('XLA_FLAGS', f'{flags} --xla_cpu_use_thunk_runtime=false')
    assert toolchain()['xla_flags'] == '--xla_cpu_use_thunk_runtime=false'
    monkeypatch.setenv('XLA_FLAGS', flags)
    assert toolchain()['xla_flags'] == ''


def test_source_commit_and_code_are_the_checkouts_and_empty_outside_one(tmp_path):
    head = subprocess.run(['git', '-C', str(ROOT), 'rev-parse', 'HEAD'], capture_output=True)
    if head.returncode:
        pytest.skip('this copy of lm is not a git checkout')
    assert source_commit().partition('+')[0] == head.stdout.decode().strip()
    trees = subprocess.run(
        ['git', '-C', str(ROOT), 'rev-parse', 'HEAD:lm', 'HEAD:configs'], capture_output=True
    )
    digest = hashlib.sha256(trees.stdout.decode().strip().encode()).hexdigest()[:12]
    assert source_code().partition('+')[0] == digest
    assert source_code().partition('+')[2] == source_commit().partition('+')[2]
    copy = tmp_path / 'lm_copy'
    shutil.copytree(ROOT / 'lm', copy / 'lm', ignore=shutil.ignore_patterns('__pycache__'))
    code = 'from lm.train.provenance import *; print(repr(source_commit() + source_code()))'
    out = subprocess.run(
        [sys.executable, '-c', code],
        cwd=copy,
        env={**os.environ, 'PYTHONPATH': str(copy)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip() == "''", out.stderr[-2000:]


def test_an_edit_is_named_by_a_digest_of_what_it_changed(tmp_path):
    def git(*args):
        subprocess.run(
            ['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-C', str(tmp_path), *args],
            check=True,
            capture_output=True,
        )

    for name in ('lm/a.py', 'configs/b.py', 'docs/c.md'):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text('x = 1\n')
    git('init', '-q')
    git('add', '.')
    git('commit', '-qm', 'c')
    assert provenance._edited(str(tmp_path)) == ''
    (tmp_path / 'docs/c.md').write_text('y')  # outside lm/ and configs/: not an edit of the code
    assert provenance._edited(str(tmp_path)) == ''
    (tmp_path / 'lm/a.py').write_text('x = 2\n')
    one = provenance._edited(str(tmp_path))
    assert len(one) == 9 and one.startswith('+')
    assert provenance._edited(str(tmp_path)) == one  # the same edit: the same name
    (tmp_path / 'lm/a.py').write_text('x = 3\n')
    assert provenance._edited(str(tmp_path)) not in ('', one)
    (tmp_path / 'lm/a.py').write_text('x = 2\n')
    (tmp_path / 'configs/new.py').write_text('z = 1\n')  # a file git does not track
    two = provenance._edited(str(tmp_path))
    assert two not in ('', one)
    (tmp_path / 'configs/new.py').write_text('z = 2\n')  # its bytes count, not only its name
    assert provenance._edited(str(tmp_path)) not in ('', one, two)


def test_an_accelerator_records_its_kind_platform_version_and_plugin_packages(
    monkeypatch, tmp_path
):
    """Off the CPU the toolchain names the device kind, the PJRT client's platform version (the
    CUDA a GPU plugin was built for), the installed plugin and NVIDIA library versions and the
    NVIDIA driver's, and keeps every XLA_FLAGS word; the CPU's record has none of them."""
    import importlib.metadata
    import types

    import jax

    assert 'accelerator' not in toolchain() and 'packages' not in toolchain()
    client = types.SimpleNamespace(platform_version='PJRT C API\ncuda 12080\ncudnn 91000')
    device = types.SimpleNamespace(device_kind='NVIDIA H200', client=client)

    def dist(name, version):
        return types.SimpleNamespace(metadata={'Name': name}, version=version)

    installed = [
        dist('jax_cuda12_plugin', '0.10.2'),
        dist('nvidia-cudnn-cu12', '9.10.0'),
        dist('jax-cuda12-pjrt', '0.10.2'),
        dist('numpy', '2.3.0'),
    ]
    monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
    monkeypatch.setattr(jax, 'devices', lambda: [device])
    monkeypatch.setattr(importlib.metadata, 'distributions', lambda: installed)
    monkeypatch.setenv('XLA_FLAGS', '--xla_gpu_deterministic_ops=true')
    monkeypatch.setattr(provenance, 'NVIDIA_DRIVER', str(tmp_path / 'absent'))
    assert 'driver' not in toolchain()  # no NVIDIA kernel module: nothing to name
    driver = tmp_path / 'version'
    driver.write_text(
        'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n'
        'GCC version:  gcc version 12.2.0\n'
    )
    monkeypatch.setattr(provenance, 'NVIDIA_DRIVER', str(driver))
    tools = toolchain()
    assert tools['driver'] == '550.54.15'
    assert (tools['backend'], tools['xla_flags']) == ('gpu', '--xla_gpu_deterministic_ops=true')
    assert tools['accelerator'] == 'NVIDIA H200'
    assert tools['platform_version'] == 'PJRT C API cuda 12080 cudnn 91000'
    assert tools['packages'] == (
        'jax-cuda12-pjrt 0.10.2, jax-cuda12-plugin 0.10.2, nvidia-cudnn-cu12 9.10.0'
    )


def test_a_split_member_carries_the_ensembles_provenance(tmp_path):
    """A member split out of an ensemble trained by two versions and evaluated by a third
    carries the ensemble's record, not the splitting process's."""
    from conftest import tiny_config

    from lm.train.ensemble_run import _split_results

    other = {**BY, 'jax': '0.10.3'}
    sessions = [{'steps': [0, 4], **BY}, {'steps': [4, 8], **other}]
    origin = {'trained_by': other, 'evaluated_by': {**BY, 'jax': '0.11'}, SESSIONS: sessions}
    members = [{'seed': s, 'eval': {'loss': 1.0 + s}} for s in (0, 1)]
    results = {'step': 8, 'members': members, 'tokens_per_sec': 10.0, **origin}
    (tmp_path / 'ens').mkdir()
    (tmp_path / 'ens' / 'results.json').write_text(json.dumps(results))
    (tmp_path / 'out').mkdir()
    _split_results(str(tmp_path / 'ens'), 1, str(tmp_path / 'out'), 8, tiny_config())
    split = json.loads((tmp_path / 'out' / 'results.json').read_text())
    assert split['eval'] == {'loss': 2.0}
    assert {k: split[k] for k in origin} == origin
