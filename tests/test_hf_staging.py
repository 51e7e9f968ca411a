"""HF import and export never mix models or leave partial output: a non-empty export directory
is refused unless overwrite (then replaced whole), the run's own workdir is refused, a failure
or SIGTERM leaves the old contents, and an import killed during its save does not block the
next one."""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from conftest import run_entry, sigterm_while_training
from test_hf import FIXTURES, base_config, write_run

from lm.convert import hf, hf_io
from lm.convert.staging import replace_dir, staged
from lm.train.checkpoint import saved_steps
from lm.train.stored import stored_config


def contents(directory):
    """{name: bytes} of the files in `directory`."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def leftovers(parent):
    return [name for name in os.listdir(parent) if 'partial' in name or name.endswith('-old')]


@pytest.mark.slow
def test_export_into_a_non_empty_dir_is_refused(tmp_path):
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match=r'out_dir=.* holds notes.txt.*overwrite=True') as e:
        hf_io.export_hf(str(tmp_path / 'run'), str(out))
    assert '\n' not in str(e.value)
    assert contents(out) == {'notes.txt': b'mine'}
    # overwrite replaces an earlier export, never a folder of one's own (a mistyped path)
    with pytest.raises(ValueError, match=r'out_dir=.* does not look like a Hugging Face export '
                       r'\(no config\.json and safetensors weights\): overwrite=True'):  # fmt: skip
        hf_io.export_hf(str(tmp_path / 'run'), str(out), overwrite=True)
    hf_io.export_hf(str(tmp_path / 'run'), str(tmp_path / 'project'))
    (tmp_path / 'project' / '.git').mkdir()  # an export inside a git checkout of one's own
    with pytest.raises(ValueError, match=r'export \(the folder \.git\): overwrite=True replaces'):
        hf_io.export_hf(str(tmp_path / 'run'), str(tmp_path / 'project'), overwrite=True)
    assert contents(out) == {'notes.txt': b'mine'}


@pytest.mark.slow
def test_overwrite_never_replaces_a_model_lm_did_not_write(tmp_path):
    """An HF model folder of lm's file names whose config.json lacks lm's field (a download, an
    import's source) is refused by overwrite, naming the field, and left as it was."""
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    out = tmp_path / 'out'
    hf_io.export_hf(str(tmp_path / 'run'), str(out))
    config = json.loads((out / 'config.json').read_text())
    del config[hf.LM_FIELD]
    (out / 'config.json').write_text(json.dumps(config))
    before = contents(out)
    with pytest.raises(ValueError, match=r'out_dir=.* does not look like a Hugging Face export '
                       r'\(its config\.json has no "lm_model" field, which every lm export '
                       r'writes\): overwrite=True replaces only an earlier export'):  # fmt: skip
        hf_io.export_hf(str(tmp_path / 'run'), str(out), overwrite=True)
    assert contents(out) == before
    (out / 'config.json').write_text('not json')
    with pytest.raises(ValueError, match=r'has no "lm_model" field'):
        hf_io.export_hf(str(tmp_path / 'run'), str(out), overwrite=True)


@pytest.mark.slow
def test_overwrite_replaces_the_export_whole(tmp_path):
    """No file of the old export survives: the result equals an export into a new directory."""
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    out, fresh = tmp_path / 'out', tmp_path / 'fresh'
    hf_io.export_hf(str(tmp_path / 'run'), str(out), max_shard_bytes=20_000)  # sharded, indexed
    (out / 'special_tokens_map.json').write_text('{}')  # a tokenizer file the new one lacks
    hf_io.export_hf(str(tmp_path / 'run'), str(out), overwrite=True)
    hf_io.export_hf(str(tmp_path / 'run'), str(fresh))
    assert contents(out) == contents(fresh)
    assert not leftovers(tmp_path)


@pytest.mark.slow
def test_a_failed_overwrite_keeps_the_old_export(tmp_path, monkeypatch):
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    out = tmp_path / 'out'
    hf_io.export_hf(str(tmp_path / 'run'), str(out), max_shard_bytes=20_000)
    before = contents(out)
    to_hf, calls = hf_io.hf.to_hf, []

    def failing(t, x):  # the writer dies after a few tensors, shards half written
        calls.append(t.hf)
        if len(calls) > 3:
            raise OSError('disk full')
        return to_hf(t, x)

    monkeypatch.setattr(hf_io.hf, 'to_hf', failing)
    with pytest.raises(OSError, match='disk full'):
        hf_io.export_hf(str(tmp_path / 'run'), str(out), overwrite=True)
    assert len(calls) == 4
    assert contents(out) == before
    assert not leftovers(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize('inside', ['', 'hf_out'])
def test_export_into_the_workdir_is_refused(tmp_path, inside):
    write_run(tmp_path / 'run', attention='gqa', num_kv_heads=2)
    before = sorted(os.listdir(tmp_path / 'run'))
    with pytest.raises(ValueError, match="is( inside)? the run's workdir"):
        hf_io.export_hf(str(tmp_path / 'run'), str(tmp_path / 'run' / inside))
    with pytest.raises(ValueError, match="holds the run's workdir"):
        hf_io.export_hf(str(tmp_path / 'run'), str(tmp_path), overwrite=True)
    assert sorted(os.listdir(tmp_path / 'run')) == before


def test_import_ignores_an_unfinished_checkpoint(tmp_path):
    """A save killed mid-way leaves orbax's temporary directory; it blocks nothing."""
    workdir = tmp_path / 'w'
    unfinished = workdir / 'checkpoints' / '0.orbax-checkpoint-tmp'
    unfinished.mkdir(parents=True)
    (unfinished / 'junk').write_text('half a save')
    assert saved_steps(str(workdir)) == []
    hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(workdir), base_config())
    assert saved_steps(str(workdir)) == [0]
    assert os.listdir(workdir / 'checkpoints') == ['0']
    assert stored_config(str(workdir)).data.tokenizer == str(workdir / 'hf' / 'tokenizer.json')
    assert not leftovers(tmp_path)


def test_import_into_a_non_empty_workdir_is_refused_unless_overwrite(tmp_path):
    """A --workdir holding anything (an hf/ folder the import would replace) is refused in one
    line, naming it, and kept; --overwrite replaces it whole, but never a directory holding
    the HF directory it reads."""
    workdir = tmp_path / 'w'
    (workdir / 'hf').mkdir(parents=True)
    (workdir / 'hf' / 'other.txt').write_text('keep')
    with pytest.raises(FileExistsError, match=r'workdir=.* holds hf\); pass overwrite=True') as e:
        hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(workdir), base_config())
    assert '\n' not in str(e.value)
    assert contents(workdir / 'hf') == {'other.txt': b'keep'}
    (workdir / 'notes.md').write_text('mine')  # a name no run writes: never replaced
    with pytest.raises(ValueError, match=r'workdir=.* holds notes\.md, which no run or import '):
        hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(workdir), base_config(), overwrite=True)
    (workdir / 'notes.md').unlink()
    hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(workdir), base_config(), overwrite=True)
    assert not (workdir / 'hf' / 'other.txt').exists() and saved_steps(str(workdir)) == [0]
    shutil.copytree(FIXTURES / 'llama_mha', tmp_path / 'holder' / 'model')
    with pytest.raises(ValueError, match='holds the HF directory'):
        hf_io.import_hf(
            str(tmp_path / 'holder' / 'model'),
            str(tmp_path / 'holder'),
            base_config(),
            overwrite=True,
        )
    assert sorted(os.listdir(tmp_path / 'holder' / 'model')) == sorted(
        os.listdir(FIXTURES / 'llama_mha')
    )
    assert not leftovers(tmp_path)


@pytest.mark.parametrize('umask', [0o022, 0o027])
def test_directories_moved_into_place_follow_the_umask(tmp_path, umask):
    """A staged directory moved in gets os.makedirs' mode, not tempfile.mkdtemp's 0o700."""
    old = os.umask(umask)
    try:
        with staged(str(tmp_path / 'out'), 'export') as build:
            replace_dir(build, str(tmp_path / 'out'))
        if umask == 0o022:  # and a whole import, its run directory and what it holds
            hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())
            for path in (tmp_path / 'w', tmp_path / 'w' / 'hf', tmp_path / 'w' / 'checkpoints'):
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, path
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / 'out').st_mode) == 0o777 & ~umask


def test_a_failed_import_leaves_nothing(tmp_path, monkeypatch):
    def failing(*args):
        raise OSError('disk full')

    monkeypatch.setattr(hf_io, '_save_step0', failing)
    with pytest.raises(OSError, match='disk full'):
        hf_io.import_hf(str(FIXTURES / 'llama_mha'), str(tmp_path / 'w'), base_config())
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    'command, flag, setup, message',
    [
        ('import', '--workdir', 'file', "--workdir='{path}' is a file, not a directory"),
        ('export', '--hf_dir', 'file', "--hf_dir='{path}' is a file, not a directory"),
        ('export', '--hf_dir', 'full', "--hf_dir='{path}' is not empty (it holds x.txt); pass "),
        ('import', '--workdir', 'full', "--workdir='{path}' is not empty (it holds x.txt); pass "),
    ],
)
def test_command_checks_its_output_first(tmp_path, command, flag, setup, message):
    """One line naming the flag, before any input is read (the other path does not exist)."""
    path = tmp_path / 'out'
    if setup == 'file':
        path.write_text('a file')
    else:
        path.mkdir()
        (path / 'x.txt').write_text('x')
    other = '--hf_dir' if flag == '--workdir' else '--workdir'
    out = run_entry(
        'scripts/convert_hf.py', command, f'{flag}={path}', f'{other}={tmp_path / "nowhere"}'
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(f'error: {message.format(path=path)}')
    assert 'Traceback' not in out.stderr


@pytest.mark.slow
def test_sigterm_during_export_leaves_nothing(tmp_path):
    """SIGTERM while shards are written: exit 143, one line, no partial directory beside."""
    write_run(
        tmp_path / 'run', attention='gqa', num_kv_heads=2, d_model=512, num_heads=8,
        num_layers=8, mlp_dim=2048,
    )  # fmt: skip
    out = tmp_path / 'out'
    code, stderr = sigterm_while_training(
        'scripts/convert_hf.py',
        'export',
        f'--workdir={tmp_path / "run"}',
        f'--hf_dir={out}',
        marker='tensors to',
        delay=0.05,
    )
    assert code == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == 'stopped by SIGTERM; nothing written'
    assert sorted(os.listdir(tmp_path)) == ['run']


def test_the_next_import_or_export_removes_what_a_killed_one_left(tmp_path):
    """kill -9 during an import or export leaves its staging directory; the next one into the
    same target removes it (any format, '-old' copies included), but not one whose process
    still runs (another export in progress) nor another target's."""
    gone = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(gone.stdout)
    litter = [
        f'.w.import-partial-{dead}-k3j2',
        '.w.import-partial-x8fz1q0c',  # named before the pid was in the name
        f'.out.export-partial-{dead}-a1b2-old',
    ]
    kept = [f'.out.export-partial-{os.getppid()}-zz9', '.other.import-partial-x8fz1q0c']
    for name in litter + kept:
        (tmp_path / name / 'checkpoints').mkdir(parents=True)
    with staged(str(tmp_path / 'w'), 'import') as build:
        assert os.path.basename(build).startswith(f'.w.import-partial-{os.getpid()}-')
    with pytest.raises(KeyError), staged(str(tmp_path / 'out'), 'export'):
        raise KeyError('a failed export')
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, os.path.basename(build)])
