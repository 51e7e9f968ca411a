"""Data loss, hangs and silently wrong results: workdir ownership, seeds and
background-thread errors, uptrain flag checks, sweep seeds and stale runs, config changes on
resume, checkpoint checksums, failed asynchronous saves, and the loss-spike guard."""

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    ENV,
    ROOT,
    read_scalars,
    run_entry,
    sweep_file,
    tiny_train_config,
    write_config_file,
)

from lm.convert.uptrain import ConversionOptions, convert_checkpoint
from lm.train.checkpoint import Checkpointer, read_latest_meta
from lm.train.identity import config_changes, config_fingerprint
from lm.train.interrupt import Interrupted
from lm.train.loop import train
from lm.train.run import assemble, check_loop_config
from lm.train.stored import checkpoint_meta
from lm.train.workdir import (
    BEFORE_FIRST_CHECKPOINT,
    LOCK_NAME,
    RunError,
    WorkdirLock,
    check_new_run_dir,
)


@pytest.fixture
def text(tmp_path):
    """60 kB of this Python's own argparse source, as a text file."""
    path = tmp_path / 'text.txt'
    path.write_text(pathlib.Path(argparse.__file__).read_text()[:60_000])
    return path


def cli(*args, timeout=300):
    """`python ARGS...` from the repository root: an entry point through `run_entry` (the fork
    server), `-c CODE` in a fresh Python."""
    if args[0] != '-c':
        return run_entry(args[0], *args[1:], timeout=timeout)
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(proc) -> str:
    """The error line of a command that must fail with a one-line error and no traceback."""
    assert proc.returncode not in (0, None), proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith('error: '), proc.stderr[-3000:]
    return line


def listing(path) -> dict:
    """{relative path: (size, mtime)} of every file under `path` ({} if it does not exist)."""
    path = pathlib.Path(path)
    return {
        str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(path.rglob('*'))
        if f.is_file()
    }


class Alarm:
    """Fails a test that would otherwise hang (SIGALRM interrupts a blocked queue.get)."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        def fail(signum, frame):
            raise TimeoutError(f'hung for {self.seconds} s')

        self.previous = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


# 1. One run at a time owns a workdir.


@pytest.mark.slow
def test_a_second_process_is_refused_naming_the_owner(tmp_path, text):
    config = tiny_train_config(tmp_path, text, **{'train.steps': 4})
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    work = tmp_path / 'run'
    train(config, str(work))
    before = listing(work)
    assert not (work / LOCK_NAME).exists()  # released and removed after the run
    owner = f'pid {os.getpid()} on host {socket.gethostname()}'
    with WorkdirLock(str(work)):
        assert owner in (work / LOCK_NAME).read_text()
        line = one_line_error(
            cli(
                ROOT / 'train.py',
                f'--config={cfg_file}',
                f'--workdir={work}',
                '--config.train.steps=8',
            )
        )
        assert line.startswith(f'error: --workdir: {work} is in use by another run ({owner}')
        with pytest.raises(RunError, match='is in use by another run'):
            train(config, str(work))  # a second owner in the same process is refused too
        with WorkdirLock(str(work), owner=False):  # other hosts of a multi-host run share it
            pass
        dst = tmp_path / 'dst'
        with WorkdirLock(str(dst)):
            line = one_line_error(
                cli(
                    ROOT / 'scripts' / 'uptrain.py',
                    f'--src={work}',
                    f'--dst={dst}',
                    '--num_kv_heads=1',
                    '--steps=2',  # the default fraction of 4 steps rounds to none: refused first
                )
            )
            assert line.startswith(f'error: --dst: {dst} is in use by another run ({owner}')
    assert listing(work) == before  # nothing written by the refused runs
    assert not dst.exists()  # the lock's own directory is removed when left empty


@pytest.mark.slow
def test_a_killed_owner_does_not_block_the_next_run(tmp_path, text):
    work = tmp_path / 'run'
    killed = cli(
        '-c',
        'import os, signal\n'
        'from lm.train.workdir import WorkdirLock\n'
        f'WorkdirLock({str(work)!r}).__enter__()\n'
        'os.kill(os.getpid(), signal.SIGKILL)\n',
    )
    assert killed.returncode == -signal.SIGKILL
    assert 'pid' in (work / LOCK_NAME).read_text()  # a stale lock file of a dead process
    config = tiny_train_config(tmp_path, text, **{'train.steps': 4})
    assert train(config, str(work))['step'] == 4
    assert Checkpointer(str(work)).steps() == [4]


def test_a_lock_on_a_file_or_an_unwritable_place_is_one_line(tmp_path):
    (tmp_path / 'f').write_text('')
    with pytest.raises(ValueError, match=r'--workdir: .*/f is a file, not a directory'):
        WorkdirLock(str(tmp_path / 'f')).__enter__()
    with pytest.raises(ValueError, match=r'--dst: cannot take ownership of .*/f/sub'):
        WorkdirLock(str(tmp_path / 'f' / 'sub'), '--dst').__enter__()


# 2. Seeds are checked up front; a failing background thread ends the run.


@pytest.mark.slow
def test_a_negative_seed_is_refused_before_anything_is_written(tmp_path, text):
    config = tiny_train_config(tmp_path, text)
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    line = one_line_error(
        cli(
            ROOT / 'train.py',
            f'--config={cfg_file}',
            f'--workdir={tmp_path / "run"}',
            '--config.seed=-1',
            timeout=120,
        )
    )
    assert line == 'error: config.seed must be an integer in [0, 2**32), got -1'
    assert not (tmp_path / 'run').exists()
    config.seed = 2**32  # jax.random.key would silently read it as seed 0
    with pytest.raises(ValueError, match=r'config.seed must be .*, got 4294967296'):
        check_loop_config(config)


@pytest.mark.slow
def test_an_error_in_the_batch_thread_ends_the_run(tmp_path, text, monkeypatch):
    import lm.data.corpus

    real = lm.data.corpus.call_batch

    def failing(*args, step, **kwargs):
        if step >= 2:
            raise OSError(5, 'Input/output error')
        return real(*args, step=step, **kwargs)

    monkeypatch.setattr(lm.data.corpus, 'call_batch', failing)
    config = tiny_train_config(tmp_path, text)
    with Alarm(120), pytest.raises(RunError) as e:
        train(config, str(tmp_path / 'run'))
    assert (
        str(e.value) == 'making the batch of step 3 failed: OSError: [Errno 5] Input/output error'
    )
    assert max(read_scalars(tmp_path / 'run' / 'tb', 'train/loss')) <= 2


# 3. uptrain checks every flag before writing and never leaves a half-made destination.


@pytest.fixture
def mha_run(tmp_path, text):
    config = tiny_train_config(
        tmp_path, text, **{'model.attention': 'mha', 'model.num_kv_heads': 0, 'train.steps': 8}
    )
    train(config, str(tmp_path / 'mha'))
    return tmp_path / 'mha'


@pytest.mark.slow
def test_uptrain_flags_are_checked_before_writing(tmp_path, mha_run, monkeypatch):
    dst = tmp_path / 'dst'
    line = one_line_error(
        cli(
            ROOT / 'scripts' / 'uptrain.py',
            f'--src={mha_run}',
            f'--dst={dst}',
            '--num_kv_heads=2',
            '--fraction=-0.5',
        )
    )
    assert line == 'error: --fraction must be a finite number >= 0, got -0.5'
    assert not dst.exists()
    line = one_line_error(
        cli(
            ROOT / 'scripts' / 'uptrain.py',
            f'--src={mha_run}',
            f'--dst={dst}',
            '--num_kv_heads=2',
            '--schedule=restart',
        )
    )
    assert line == "error: --schedule must be one of ('continue', 'rewarm'), got 'restart'"
    assert not dst.exists()
    # The library names the options' config keys.
    for options, message in [
        (dict(fraction=float('nan')), r'^config.uptrain.fraction must be a finite number >= 0'),
        (dict(source_step=-1), r'^config.uptrain.source_step must be >= 0, got -1$'),
        (
            dict(source_step=5),
            r'^config.uptrain.source_workdir: no checkpoint for step 5 in .*; available: \[4, 8\]',
        ),
        (dict(seed=-1), r'^ConversionOptions.seed must be in \[0, 2\*\*32\), got -1$'),
        (dict(warmup_steps=-2), r'^config.uptrain.warmup_steps must be >= -1 \(-1: the default\)'),
        (dict(lr=0.0), r'^config.train.lr must be a finite number > 0, got 0.0$'),
        (dict(method='median'), r'^config.uptrain.method must be one of'),
        (dict(optimizer_state='keep'), r"^config.uptrain.optimizer_state must be one of \('conv"),
    ]:
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            convert_checkpoint(str(mha_run), ConversionOptions(num_kv_heads=2, **options), str(dst))
        assert not dst.exists()
    # A write that fails half-way leaves the destination as it was.
    import lm.convert.uptrain

    def full_disk(self, step, state, meta):
        os.makedirs(os.path.join(self.directory, str(step)))
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(lm.convert.uptrain.Checkpointer, 'save', full_disk)
    with pytest.raises(OSError, match='No space left'):
        convert_checkpoint(str(mha_run), ConversionOptions(num_kv_heads=2), str(dst))
    assert not dst.exists()
    dst.mkdir()
    with pytest.raises(OSError, match='No space left'):
        convert_checkpoint(str(mha_run), ConversionOptions(num_kv_heads=2), str(dst))
    assert list(dst.iterdir()) == []  # an existing (empty) destination stays as it was
    monkeypatch.undo()
    # What a conversion killed (-9) while writing leaves: a staging directory holding a
    # checkpoints/ (it made dst look like a folder of runs, refused); the next one removes it.
    (dst / f'{lm.convert.uptrain.PARTIAL}k1ll3d' / 'checkpoints' / '8').mkdir(parents=True)
    config = convert_checkpoint(
        str(mha_run), ConversionOptions(num_kv_heads=2, fraction=0.5), str(dst)
    )
    # it continues the source's step 8 for 0.5 x 8 steps more
    assert config.train.steps == 12 and sorted(p.name for p in dst.iterdir()) == ['checkpoints']
    assert Checkpointer(str(dst)).steps() == [8]


# SIGTERM to scripts/uptrain.py as its conversion starts to be written.
SIGTERM_WHILE_WRITING = """
import os, runpy, signal, sys
from lm.convert import uptrain

real = uptrain.Checkpointer.save

def save(self, *args):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self, *args)

uptrain.Checkpointer.save = save
sys.argv = ['scripts/uptrain.py'] + sys.argv[1:]
runpy.run_path('scripts/uptrain.py', run_name='__main__')
"""


@pytest.mark.slow
def test_sigterm_while_uptrain_writes_lets_it_finish_then_exits_143(tmp_path, mha_run):
    """The writing, brief, is let finish; the signal is then said, exit 143 (was: exit 0)."""
    dst = tmp_path / 'dst'
    argv = [f'--src={mha_run}', f'--dst={dst}', '--num_kv_heads=2', '--fraction=0.5']
    out = subprocess.run(
        [sys.executable, '-c', SIGTERM_WHILE_WRITING, *argv],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 143, out.stderr[-3000:]
    assert 'stopped by SIGTERM once written' in out.stderr.splitlines(), out.stderr[-3000:]
    assert out.stdout.startswith(f'wrote {dst}: gqa')
    assert Checkpointer(str(dst)).steps() == [8]


# 4 and 5. Sweep seeds; configs that changed since a run's checkpoint.


def test_config_fingerprint_and_changes(tmp_path, text):
    config = tiny_train_config(tmp_path, text)
    saved = json.loads(config.to_json())
    later = tiny_train_config(
        tmp_path,
        text,
        **{
            'train.steps': 99,
            'eval_every': 3,
            'mesh.cpu_devices': 2,
            'train.xla_options': 'xla_cpu_multi_thread_eigen=false',  # how XLA compiles it
        },
    )
    assert config_fingerprint(later) == config_fingerprint(config)
    assert config_changes(saved, later) == []
    other = tiny_train_config(tmp_path, text, **{'train.lr': 1e-2, 'model.num_heads': 8})
    assert config_fingerprint(other) != config_fingerprint(config)
    assert config_changes(saved, other) == [
        'model.num_heads: 4 -> 8',
        'train.lr: 0.003 -> 0.01',
    ]
    saved['model']['vocab_size'] = 61  # resolved in the checkpoint; 0 = from the tokenizer
    assert config_changes(saved, config) == []
    del saved['train']['max_loss_ratio']  # a key added later reads as its old behaviour
    assert config_changes(saved, config) == []


def test_a_data_path_given_relative_then_absolute_is_no_change(tmp_path, text, monkeypatch):
    monkeypatch.chdir(text.parent)
    saved = json.loads(tiny_train_config(tmp_path, text.name).to_json())
    assert config_changes(saved, tiny_train_config(tmp_path, text.resolve())) == []
    other = text.with_name('other.txt')
    other.write_text(text.read_text())  # the same bytes, but another file
    changed = config_changes(saved, tiny_train_config(tmp_path, other))
    assert changed == [f"data.path: '{text.name}' -> '{other}'"]
    both = f'{text.name},{other.name}'
    saved = json.loads(tiny_train_config(tmp_path, both).to_json())
    assert config_changes(saved, tiny_train_config(tmp_path, f'{text},{other}')) == []
    assert config_changes(saved, tiny_train_config(tmp_path, f'{other},{text}')) != []


@pytest.mark.slow
def test_resume_under_a_changed_config_is_refused_unless_allowed(tmp_path, text):
    config = tiny_train_config(tmp_path, text)
    work = tmp_path / 'run'
    result = train(config, str(work))
    meta = read_latest_meta(str(work))
    fingerprint = config_fingerprint(assemble(config, data=True).config)
    assert meta['config_fingerprint'] == fingerprint
    assert json.loads((work / 'results.json').read_text())['config_fingerprint'] == fingerprint
    before = listing(work)
    changed = tiny_train_config(tmp_path, text, **{'train.lr': 1e-3, 'train.b2': 0.99})
    cfg_file = write_config_file(changed, tmp_path / 'changed.py')
    line = one_line_error(cli(ROOT / 'train.py', f'--config={cfg_file}', f'--workdir={work}'))
    assert line.startswith(f'error: the checkpoint in {work / "checkpoints"} was trained with a ')
    assert 'train.b2: 0.95 -> 0.99; train.lr: 0.003 -> 0.001; resume with the same' in line
    assert listing(work) == before
    # train.steps (and intervals, caches, mesh) may change: the run goes on.
    longer = tiny_train_config(tmp_path, text, **{'train.steps': 10, 'log_every': 5})
    assert train(longer, str(work))['step'] == 10
    out = cli(
        ROOT / 'train.py',
        f'--config={cfg_file}',
        f'--workdir={work}',
        '--allow_config_change',
        '--config.train.steps=12',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'resuming under a changed config: train.b2: 0.95 -> 0.99; train.lr' in out.stderr
    assert read_latest_meta(str(work))['config']['train']['lr'] == 1e-3
    assert result['step'] == 8


@pytest.mark.slow
def test_sweep_honours_a_seed_grid_and_refuses_stale_runs(tmp_path, text):
    config = tiny_train_config(
        tmp_path, text, **{'train.steps': 2, 'eval_every': 2, 'checkpoint_every': 2}
    )
    cfg = sweep_file(tmp_path, config, [{}])
    sw = tmp_path / 'sw'
    out = cli(
        ROOT / 'scripts' / 'sweep.py',
        f'--config={cfg}',
        f'--sweep_dir={sw}',
        '--grid=seed=1,2',
        '--parallel=2',
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seeds = {
        name: read_latest_meta(str(sw / name))['config']['seed']
        for name in ('gqa_h4_kv2_s1', 'gqa_h4_kv2_s2')
    }
    assert seeds == {'gqa_h4_kv2_s1': 1, 'gqa_h4_kv2_s2': 2}
    loss = {n: read_scalars(sw / 'tb' / n, 'train/loss')[1] for n in seeds}
    assert loss['gqa_h4_kv2_s1'] != loss['gqa_h4_kv2_s2']  # different data order and init
    before = listing(sw)
    stale = cli(
        ROOT / 'scripts' / 'sweep.py',
        f'--config={cfg}',
        f'--sweep_dir={sw}',
        '--grid=seed=1,2',
        '--config.train.lr=0.001',
    )
    line = one_line_error(stale)
    assert line == (
        f'error: --sweep_dir: {sw / "gqa_h4_kv2_s1"} (and 1 more runs) was made with other '
        'settings: train.lr: 0.003 -> 0.001; use another --sweep_dir, or delete those runs to '
        'redo them'
    )
    assert listing(sw) == before
    with WorkdirLock(str(sw)):  # another sweep on the same sweep_dir is refused
        busy = cli(ROOT / 'scripts' / 'sweep.py', f'--config={cfg}', f'--sweep_dir={sw}')
        assert one_line_error(busy).startswith(f'error: --sweep_dir: {sw} is in use by another')
    assert listing(sw) == before
    negative = cli(
        ROOT / 'scripts' / 'sweep.py', f'--config={cfg}', f'--sweep_dir={sw}', '--grid=seed=-3'
    )
    assert one_line_error(negative) == (
        'error: sweep point gqa_h4_kv2_s-3: config.seed must be an integer in [0, 2**32), got -3'
    )
    more = cli(
        ROOT / 'scripts' / 'sweep.py',
        f'--config={cfg}',
        f'--sweep_dir={sw}',
        '--grid=seed=1,2',
        '--config.train.steps=4',
        '--parallel=2',
        timeout=600,
    )
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert 'finished earlier' not in more.stdout  # more steps: the runs go on
    assert all(json.loads((sw / n / 'results.json').read_text())['step'] == 4 for n in seeds)


# 6. Checkpoint checksums.


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16', 'float16', 'int32', 'int8', 'bool'])
def test_host_checksums_are_the_device_checksums(dtype):
    """A small array's checksum is summed on the host, a large one's on device: the two give
    the same (a, b) bit for bit (random values; shapes with 0-3 axes and a key array)."""
    import jax
    import jax.numpy as jnp

    from lm.train import checksum

    rng = np.random.default_rng(0)
    for shape in [(), (7,), (3, 5, 2), (513, 33)]:
        x = jnp.asarray(rng.normal(size=shape) * 100).astype(dtype)
        device = tuple(int(v) for v in np.asarray(checksum._leaf_sums(x)))
        assert checksum.host_leaf_sums(np.asarray(x)) == device, shape
    big = jnp.ones(checksum.HOST_ELEMENTS + 1, dtype).at[5].set(jnp.zeros((), dtype))
    tree = {'big': big, 'small': big[:64], 'key': jax.random.key(3)}
    data = {**tree, 'key': jax.random.key_data(tree['key'])}  # a key array's words: its data
    sums = {k: tuple(int(v) for v in np.asarray(checksum._leaf_sums(x))) for k, x in data.items()}
    want = {f"['{k}']": f'{a:08x}{b:08x}' for k, (a, b) in sums.items()}
    assert checksum.array_checksums(tree) == want


def flip_bytes(step_dir: pathlib.Path) -> None:
    """Inverts 8 bytes in the middle of the largest array file of a checkpoint."""
    files = [f for f in (step_dir / 'state').rglob('*') if f.is_file()]
    big = max(files, key=lambda f: f.stat().st_size)
    data = bytearray(big.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    big.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_checkpoint_with_flipped_bytes_is_detected_and_kept_aside(tmp_path, text, caplog):
    config = tiny_train_config(tmp_path, text)
    work = tmp_path / 'run'
    first = train(config, str(work))
    ckpts = work / 'checkpoints'
    flip_bytes(ckpts / '8')
    abstract = assemble(config, data=True).ctx.abstract_state
    with pytest.raises(ValueError, match=r"checksum mismatch in \['.+'\].* at step 8"):
        Checkpointer(str(work)).restore(abstract, step=8)
    # Without its checksums, the damaged checkpoint would restore without a word.
    import shutil

    shutil.copytree(ckpts, tmp_path / 'copy' / 'checkpoints')
    meta_file = tmp_path / 'copy' / 'checkpoints' / '8' / 'meta' / 'metadata'
    meta = json.loads(meta_file.read_text())
    del meta['checksums'], meta['meta_checksum']  # as saved before either existed
    meta_file.write_text(json.dumps(meta))
    step, damaged, _ = Checkpointer(str(tmp_path / 'copy')).restore(abstract)
    assert step == 8
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax_leaves(damaged), jax_leaves(first['state']), strict=True)
    )
    step, _, _ = Checkpointer(str(work)).restore(abstract)
    assert step == 4 and 'checksum mismatch' in caplog.text
    assert sorted(p.name for p in ckpts.iterdir()) == ['4', '8.unreadable']
    # The resumed run writes step 8 again; damaged once more, it is kept under a new name.
    again = train(config, str(work))
    for a, b in zip(
        jax_leaves(first['state']['params']), jax_leaves(again['state']['params']), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    flip_bytes(ckpts / '8')
    assert Checkpointer(str(work)).restore(abstract)[0] == 4
    assert sorted(p.name for p in ckpts.iterdir()) == ['4', '8.unreadable', '8.unreadable.2']


def test_a_changed_side_car_is_refused_naming_its_file_and_the_step_that_works(tmp_path, text):
    """One flipped bit in rope_theta of a checkpoint's side-car (its config) is refused by
    eval/generate/export (`stored_config`) and by restores, naming the file and the `--step` that
    works; training moves it aside; a side-car saved before side-cars had a checksum still reads."""
    import jax.numpy as jnp

    from lm.train import stored_config
    from lm.train.checkpoint import META_CHECKSUM

    config = tiny_train_config(tmp_path, text)
    work, state = tmp_path / 'run', {'params': {'w': jnp.arange(4.0)}}
    ckpt = Checkpointer(str(work), async_save=False)
    for step in (4, 8):
        ckpt.save(step, state, {'config': json.loads(config.to_json()), 'data_step': step})
    ckpt.close()
    meta_file = work / 'checkpoints' / '8' / 'meta' / 'metadata'
    data = bytearray(meta_file.read_bytes())
    at = data.index(b'"rope_theta"')
    at = data.index(b'10000.0', at) + 1
    data[at] ^= 0x01  # 10000.0 -> 11000.0, still valid JSON
    meta_file.write_bytes(bytes(data))
    assert json.loads(meta_file.read_text())['config']['model']['rope_theta'] == 11000.0
    with pytest.raises(ValueError) as refused:
        stored_config(str(work))
    assert str(refused.value) == (
        f'the checkpoint at step 8 is unreadable ({meta_file} does not match its checksum: the '
        'side-car (config, data position, shapes, array checksums) changed after it was saved); '
        'choose step 4, the newest readable one (--step=4)'
    )
    assert stored_config(str(work), step=4).model.rope_theta == 10000.0
    meta_file.write_bytes(bytes(data[: len(data) // 2]))  # truncated: not JSON at all
    with pytest.raises(
        ValueError,
        match=r'^the checkpoint at step 8 in .* is unreadable \(.*'
        r'\); choose step 4, the newest readable one \(--step=4\)$',
    ):
        stored_config(str(work))
    meta_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r'choose step 4, the newest readable one \(--step=4\)'):
        Checkpointer(str(work), read_only=True).restore(state)
    with pytest.raises(ValueError, match=f'^{meta_file} does not match its checksum'):
        Checkpointer(str(work), read_only=True).restore(state, step=8)
    assert sorted(p.name for p in (work / 'checkpoints').iterdir()) == ['4', '8']
    assert Checkpointer(str(work)).restore(state)[0] == 4  # training: kept aside
    assert sorted(p.name for p in (work / 'checkpoints').iterdir()) == ['4', '8.unreadable']
    old = work / 'checkpoints' / '4' / 'meta' / 'metadata'
    meta = json.loads(old.read_text())
    del meta[META_CHECKSUM]
    old.write_text(json.dumps(meta))
    assert Checkpointer(str(work), read_only=True).restore(state)[0] == 4


@pytest.mark.slow
def test_a_resume_without_config_passes_over_a_damaged_latest_side_car(tmp_path, text):
    """train.py --workdir alone, whose newest checkpoint's side-car is gone, reads the config of
    the newest sound one and resumes from it, moving the damaged one aside as a resume with
    --config does (it used to stop on the raw file error); uptrain.py --step=8 on such a source
    converts step 8 (it used to read the newest and name --step=8 as the cure)."""
    config = tiny_train_config(tmp_path, text)
    train(config, str(tmp_path / 'run'))
    ckpts = tmp_path / 'run' / 'checkpoints'
    (ckpts / '8' / 'meta' / 'metadata').unlink()
    out = run_entry('train.py', f'--workdir={tmp_path / "run"}', '--config.train.steps=12')
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in ckpts.iterdir()) == ['12', '4', '8', '8.unreadable']
    (ckpts / '12' / 'meta' / 'metadata').unlink()
    up = run_entry(
        'scripts/uptrain.py',
        f'--src={tmp_path / "run"}',
        f'--dst={tmp_path / "up"}',
        '--num_kv_heads=1',
        '--step=8',
        '--steps=1',
    )
    assert up.returncode == 0, up.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / 'up' / 'checkpoints').iterdir()) == ['8']


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


# 7. A failed asynchronous save.

FULL_DISK = """
import runpy, sys
import orbax.checkpoint as ocp

class FullDisk:
    def result(self, timeout=None):
        raise OSError(28, 'No space left on device')

real = ocp.StandardCheckpointHandler.async_save
saves = []

async def async_save(self, directory, *args, **kwargs):
    futures = await real(self, directory, *args, **kwargs)
    saves.append(directory)
    return list(futures or []) + ([FullDisk()] if len(saves) == 2 else [])

ocp.StandardCheckpointHandler.async_save = async_save
sys.argv = ['train.py'] + sys.argv[1:]
runpy.run_path('train.py', run_name='__main__')
"""


@pytest.mark.slow
def test_a_failed_asynchronous_save_stops_the_run_in_one_line(tmp_path, text):
    config = tiny_train_config(
        tmp_path,
        text,
        **{
            'train.steps': 200,
            'checkpoint_every': 4,
            'eval_every': 1000,
            'log_every': 1000,
            'async_checkpointing': True,
        },
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    work = tmp_path / 'run'
    out = cli('-c', FULL_DISK, f'--config={cfg_file}', f'--workdir={work}')
    line = one_line_error(out)
    assert line.startswith(f'error: the checkpoint of step 8 could not be written to {work}')
    assert 'OSError: [Errno 28] No space left on device' in line
    assert line.endswith('stopping (checkpoints kept: [4])')
    assert Checkpointer(str(work)).steps() == [4]
    # Known at the latest when the next save begins: the run stops there, not at the end.
    assert max(read_scalars(work / 'tb', 'train/loss')) <= 12


# 8. The loss-spike guard.


@pytest.mark.slow
def test_loss_spike_stops_the_run_and_keeps_the_checkpoint_before_it(tmp_path, text):
    diverging = {
        'train.steps': 150,
        'train.lr': 20.0,  # warmup to lr 20 over 1000 steps: lr ~1 after 50 steps
        'train.warmup_steps': 1000,
        'train.grad_clip': 0.0,
        'train.max_loss_ratio': 2.0,
        'checkpoint_every': 5,
        'keep_checkpoints': 1,
        'eval_every': 1000,
        'log_every': 1000,
    }
    config = tiny_train_config(tmp_path, text, **diverging)
    work = tmp_path / 'run'
    with pytest.raises(FloatingPointError, match=r'loss spike at step (\d+): ') as e:
        train(config, str(work))
    spike = int(str(e.value).split('at step ')[1].split(':')[0])
    losses = read_scalars(work / 'tb', 'train/loss')
    assert max(losses) == spike - 1  # the spiking step is not logged or saved
    (kept,) = Checkpointer(str(work)).steps()
    assert kept < spike and f'checkpoint {kept} (the last before the spike) is kept' in str(e.value)
    assert Checkpointer(str(work)).pinned()[kept].startswith(f'loss spike at step {spike}')
    # Resumed with a sane learning rate, newer saves do not rotate it away (keep = 1).
    calm = tiny_train_config(
        tmp_path,
        text,
        **{**diverging, 'train.lr': 1e-3, 'train.max_loss_ratio': 0.0, 'train.steps': kept + 12},
    )
    assert train(calm, str(work), allow_config_change=True)['step'] == kept + 12
    assert Checkpointer(str(work)).steps() == [kept, kept + 12]


@pytest.mark.slow
def test_a_read_only_restore_refuses_a_damaged_latest_checkpoint_and_changes_nothing(
    tmp_path, text
):
    """eval.py, generate.py, export and analysis restore read-only: a damaged latest checkpoint
    is refused in one line naming it and the step that would work, and is not moved aside."""
    train(tiny_train_config(tmp_path, text), str(tmp_path / 'run'))
    ckpts = tmp_path / 'run' / 'checkpoints'
    flip_bytes(ckpts / '8')
    before = sorted(p.name for p in ckpts.iterdir())
    with pytest.raises(ValueError) as refused:
        assemble(str(tmp_path / 'run'), state='restore')
    assert str(refused.value) == (
        f'the checkpoint at step 8 in {ckpts} is unreadable (see the warning above); a read-only '
        'command changes nothing: choose step 4, the newest readable one (--step=4); training '
        'moves it aside when it resumes (a finished run: under a larger config.train.steps)'
    )
    assert sorted(p.name for p in ckpts.iterdir()) == before == ['4', '8']
    assert assemble(str(tmp_path / 'run'), state='restore', step=4).step == 4
    # A read that fails inside TensorStore (a byte of its data file changed near its end): the
    # reads still in flight report 'Event loop is closed' with a traceback each (35 of them
    # before eval.py's refusal); none reaches stderr.
    data = next((ckpts / '8' / 'state' / 'd').iterdir())
    damaged = bytearray(data.read_bytes())
    damaged[-20] ^= 0xFF
    data.write_bytes(bytes(damaged))
    out = run_entry('eval.py', f'--workdir={tmp_path / "run"}')
    assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr[-3000:]
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(f'error: the checkpoint at step 8 in {ckpts} is unreadable')
    )


@pytest.mark.parametrize('fails', [True, False])
def test_a_stop_signal_during_a_restore_stops_it_and_moves_nothing(tmp_path, text, fails):
    """Ctrl-C during a restore: orbax and TensorStore report the KeyboardInterrupt raised in
    their wait as an unreadable checkpoint, which training then moved aside. A stop is held
    until the read ends, then raised as `Interrupted`; the checkpoint stays where it is."""
    run = assemble(tiny_train_config(tmp_path, text), state='init', data=True)
    ckpt = Checkpointer(str(tmp_path / 'run'), async_save=False)
    meta = checkpoint_meta(run.config, run.corpus.fingerprint, 4, run.ctx.abstract_state['params'])
    ckpt.save(4, run.state, meta)
    ckpt.close()
    ckpt = Checkpointer(str(tmp_path / 'run'))
    read = ckpt.manager.restore

    def interrupted_read(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        if fails:  # what TensorStore's wait makes of it
            raise Exception('Encountered error while reading array index: (slice(0, 8, 1),)')  # noqa: TRY002
        return read(*args, **kwargs)

    ckpt.manager.restore = interrupted_read
    with pytest.raises(Interrupted, match=r'^stopped by SIGINT$'):
        ckpt.restore(run.ctx.abstract_state)
    assert sorted(p.name for p in (tmp_path / 'run' / 'checkpoints').iterdir()) == ['4']
    ckpt.manager.restore = read
    assert ckpt.restore(run.ctx.abstract_state)[0] == 4  # no signal: read as before


def test_a_new_run_starts_only_where_nothing_would_be_written_over(tmp_path):
    """A new run's directory may be missing, empty, or hold what a run leaves before its first
    checkpoint and what a sweep writes for its run (and hidden locks); anything else is refused
    in one line naming it, and a run (checkpoints/) is resumed wherever it is."""
    check_new_run_dir(str(tmp_path / 'missing'))
    started = tmp_path / 'started'
    started.mkdir()
    for name in (*BEFORE_FIRST_CHECKPOINT, LOCK_NAME):
        (started / name).write_text('')
    check_new_run_dir(str(started))
    for name in ('results.json', 'config.json', 'model.safetensors', 'notes'):
        (started / name).mkdir() if name == 'notes' else (started / name).write_text('')
    with pytest.raises(ValueError) as e:
        check_new_run_dir(str(started), '--dst')
    assert str(e.value) == (
        f"--dst='{started}' is not a run (no checkpoints/) but holds config.json and 3 more; a "
        'new run starts in an empty directory, so that nothing there is written over: choose '
        f'another (e.g. {started / "run"})'
    )
    (started / 'checkpoints').mkdir()  # a run, with the user's files beside it: resumed
    check_new_run_dir(str(started))
