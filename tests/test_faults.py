"""What each command promises under faults (docs/train.md, "Reliability"): output paths checked
before any work, SIGTERM honoured by head analysis and sweeps, a full disk stopping a run in one
line, evaluation progress, kill -9 and SIGTERM during export, import and evaluation."""

import ast
import logging
import os
import re
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    ENV,
    ROOT,
    run_entry,
    start_entry,
    stdlib_text,
    sweep_file,
    tiny_train_config,
    write_config_file,
)
from test_hf import base_config, write_run

from lm.convert import hf_io
from lm.train import evaluation
from lm.train.checkpoint import Checkpointer, saved_steps
from lm.train.run import assemble
from lm.train.stored import checkpoint_meta
from lm.train.workdir import remembered_tb_dir

QUICKSTART = 'configs/quickstart.py'

# (script, arguments, the output flag that is a file): every entry point that writes a
# directory. The inputs do not exist, so an output checked after them would fail on them first.
OUTPUTS = [
    ('train.py', ['--workdir={file}', f'--config={QUICKSTART}'], '--workdir'),
    ('train.py', ['--workdir={tmp}/w', '--tb_dir={file}', f'--config={QUICKSTART}'], '--tb_dir'),
    ('eval.py', ['--workdir={tmp}/nowhere', '--tb_dir={file}'], '--tb_dir'),
    (
        'scripts/convert_hf.py',
        ['import', '--hf_dir={tmp}/nowhere', '--workdir={file}'],
        '--workdir',
    ),
    ('scripts/convert_hf.py', ['export', '--workdir={tmp}/nowhere', '--hf_dir={file}'], '--hf_dir'),
    ('scripts/uptrain.py', ['--src={tmp}/nowhere', '--dst={file}', '--num_kv_heads=2'], '--dst'),
    ('scripts/sweep.py', ['--sweep_dir={file}', f'--config={QUICKSTART}'], '--sweep_dir'),
    (
        'scripts/uptrain_ablation.py',
        ['--out_dir={file}', '--data_path={tmp}/nowhere.txt', '--seeds=1'],
        '--out_dir',
    ),
    ('scripts/analyze_heads.py', ['--workdir={tmp}/nowhere', '--out={file}'], '--out'),
    (
        'scripts/analyze_heads.py',
        ['--workdir={tmp}/nowhere', '--out={tmp}/o', '--tb_dir={file}'],
        '--tb_dir',
    ),
    (
        'scripts/get_data.py',
        ['tinyshakespeare', '--from={tmp}/nowhere', '--out_dir={file}'],
        '--out_dir',
    ),
    ('scripts/bench_data.py', ['--workdir={file}', '--text={tmp}/nowhere.txt'], '--workdir'),
    (
        'scripts/profile_train.py',
        ['--trace_dir={file}', '--data_path={tmp}/nowhere'],
        '--trace_dir',
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    'script, args, flag', OUTPUTS, ids=[f'{s.split("/")[-1]}{f}' for s, _, f in OUTPUTS]
)
def test_an_output_path_that_is_a_file_is_refused_first(tmp_path, script, args, flag):
    """One line naming the flag, before any checkpoint, data or model is loaded."""
    file = tmp_path / 'a_file'
    file.write_text('mine')
    out = run_entry(script, *[a.format(file=file, tmp=tmp_path) for a in args], timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    assert 'Traceback' not in out.stderr, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f'error: {flag}='), line
    assert f"{file}' is a file" in line, line
    assert file.read_text() == 'mine'


@pytest.mark.parametrize('text', ['{x', '[1]'])
def test_damaged_bookkeeping_json_is_refused_naming_its_file(tmp_path, text):
    """A run's bookkeeping file that no longer holds the JSON object lm wrote (tensorboard.json,
    pinned.json, a TensorBoard run's workdir.json, hparams.json, a sweep run's results) is named
    in the one-line error (was: the JSON parser's message alone, or a traceback)."""
    path = tmp_path / 'tensorboard.json'
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        remembered_tb_dir(str(tmp_path))
    assert (
        str(refused.value)
        == {
            '{x': f'{path} is not the JSON lm wrote (Expecting property name enclosed in double '
            'quotes: line 1 column 2); it was changed or cut short since',
            '[1]': f'{path} holds a JSON list, not the object lm wrote',
        }[text]
    )
    assert path.read_text() == text


@pytest.mark.slow
def test_a_run_whose_own_tensorboard_directory_is_a_file_is_refused_first(tmp_path):
    """train.py checks <workdir>/tb, where it logs without --tb_dir, as it checks --tb_dir:
    one line before any data or checkpoint is read (was: a traceback after the restore)."""
    (tmp_path / 'w').mkdir()
    (tmp_path / 'w' / 'tb').write_text('mine')
    out = run_entry('train.py', f'--workdir={tmp_path / "w"}', f'--config={QUICKSTART}')
    assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: --workdir='{tmp_path / 'w' / 'tb'}' is a file, not a directory"
    )
    assert sorted(p.name for p in (tmp_path / 'w').iterdir()) == ['tb']


# A full disk. RLIMIT_FSIZE makes every write past 300 bytes fail in the OS (EFBIG, as ENOSPC
# would), in orbax's Python and C++ writer threads alike; set once the first checkpoint is on disk.
FULL_DISK = """
import resource, runpy, signal, sys
from lm.train import checkpoint

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
real, calls = checkpoint.Checkpointer.save, []

def save(self, step, state, meta):
    calls.append(step)
    if len(calls) == 2:
        self.check(wait=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))
    return real(self, step, state, meta)

checkpoint.Checkpointer.save = save
sys.argv = ['train.py'] + sys.argv[1:]
runpy.run_path('train.py', run_name='__main__')
"""


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line(tmp_path):
    """The asynchronous save's writer threads fail while others still write: the run waits for
    them, so no thread prints a traceback as the process exits, and orbax's own error lines
    are left to the one line that names the step, the cause and what was kept."""
    text = tmp_path / 'text.txt'
    text.write_text(stdlib_text(60_000))
    config = tiny_train_config(
        tmp_path,
        text,
        **{
            'train.steps': 40,
            'checkpoint_every': 4,
            'eval_every': 1000,
            'log_every': 1000,
            'async_checkpointing': True,
            'model.d_model': 128,  # ~6 MB of arrays: the writers are busy when one fails
            'model.mlp_dim': 512,
        },
    )
    cfg = write_config_file(config, tmp_path / 'cfg.py')
    work = tmp_path / 'run'
    out = subprocess.run(
        [sys.executable, '-c', FULL_DISK, f'--config={cfg}', f'--workdir={work}'],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert 'Traceback' not in out.stderr and 'Event loop' not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if re.match(r'(E\d{4}|error:)', line)]
    assert errors == [out.stderr.strip().splitlines()[-1]], errors
    assert errors[0].startswith(f'error: the checkpoint of step 8 could not be written to {work}')
    assert errors[0].endswith('File too large); stopping (checkpoints kept: [4])')
    assert Checkpointer(str(work)).steps() == [4]


class FakeCorpus:
    task = None  # a text corpus, not a recall task

    def __init__(self, n: int):
        self.tokens = {'validation': np.arange(n, dtype=np.int32) % 7}

    def bytes_per_token(self, split):
        return 1.0


def test_a_long_evaluation_says_how_long_it_takes_and_shows_progress(monkeypatch, caplog):
    """The clock advances 4 s per batch (the first: 20 s, its compile): the expected duration
    once 10 s have passed, then a line every 10 s, with batches done and time left."""
    clock = iter([0.0, 20.0, *(20.0 + 4 * k for k in range(1, 200))])
    monkeypatch.setattr(evaluation, 'time', types.SimpleNamespace(monotonic=lambda: next(clock)))
    mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
    caplog.set_level(logging.INFO)
    metrics = evaluation.evaluate(
        lambda params, batch, weights: jnp.sum(weights, axis=1),
        {},
        FakeCorpus(8 * 10 * 16 + 1),  # 80 windows of 16 targets: 10 batches of 8
        'validation',
        batch_size=8,
        seq_len=16,
        eval_tokens=0,
        batch_sharding=sharding,
    )
    assert metrics['tokens'] == 80 * 16
    lines = [r.getMessage() for r in caplog.records if 'about' in r.getMessage()]
    # After batch 1 (t = 20 s): 9 batches left at the rate seen so far (20 s) = 180 s; then the
    # rate excludes the first batch: 4 s per batch, lines at t = 32 (batch 4), 44 (7), and the
    # last batch logs nothing.
    assert lines == [
        'evaluating the validation split takes about 180 s more (10 batches); set '
        'config.eval_tokens > 0 to score fewer tokens than the whole split',
        'eval: 4/10 batches, about 24 s left',
        'eval: 7/10 batches, about 12 s left',
    ], lines


def wait_for(condition, proc, lines, timeout=240) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline and proc.poll() is None, ''.join(lines)[-3000:]
        time.sleep(0.1)


def sigterm_and_wait(proc, lines) -> tuple[int, float, list[str]]:
    """SIGTERM now; (exit status, seconds it took to exit, stderr lines)."""
    assert proc.poll() is None, 'the phase ended before the signal: make it longer'
    t = time.time()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    took = time.time() - t
    time.sleep(0.5)  # the reader thread drains stderr
    return code, took, ''.join(lines).strip().splitlines()


@pytest.mark.slow
def test_sigterm_during_head_analysis_stops_it_writing_nothing(tmp_path):
    """A run whose validation split takes the analysis well over a few seconds; SIGTERM once
    it is scoring: exit 143 within a few seconds, one line, no output directory."""
    text = tmp_path / 'text.txt'
    text.write_text(stdlib_text(3_000_000))
    config = tiny_train_config(tmp_path, text)
    run = assemble(config, state='init', data=True)
    ckpt = Checkpointer(str(tmp_path / 'run'), async_save=False)
    meta = checkpoint_meta(run.config, run.corpus.fingerprint, 0, run.ctx.abstract_state['params'])
    ckpt.save(0, run.state, meta)
    ckpt.close()
    out = tmp_path / 'heads'
    proc, lines = start_entry(
        'scripts/analyze_heads.py', f'--workdir={tmp_path / "run"}', f'--out={out}', '--batch=8'
    )
    # the first progress line (a tenth of the batches): compiled, most of the scoring ahead
    wait_for(lambda: any('validation batch' in line for line in lines), proc, lines)
    code, took, err = sigterm_and_wait(proc, lines)
    assert code == 143, err[-20:]
    assert took < 10, took
    assert err[-1] == 'stopped by SIGTERM; nothing written', err[-20:]
    assert not out.exists()


@pytest.mark.slow
def test_sigterm_to_a_sweep_saves_its_current_run_and_starts_no_other(tmp_path):
    """SIGTERM to the sweep's process alone, while its first run trains: the run (its own
    process) saves its latest step, the sweep says so in one line, exit 143, the second run
    never starts; repeating the command resumes the first from that step."""
    text = tmp_path / 'text.txt'
    text.write_text(stdlib_text(60_000))
    config = tiny_train_config(
        tmp_path,
        text,
        **{'train.steps': 100_000, 'checkpoint_every': 50_000, 'eval_every': 50_000},
    )
    cfg = sweep_file(tmp_path, config, [{}])
    sw = tmp_path / 'sw'
    proc, lines = start_entry(
        'scripts/sweep.py', f'--config={cfg}', f'--sweep_dir={sw}', '--seeds=2'
    )
    log = sw / 'gqa_h4_kv2_s0' / 'train.log'

    def training():
        return log.exists() and 'compiled the train step' in log.read_text()

    wait_for(training, proc, lines)
    time.sleep(2.0)
    code, took, err = sigterm_and_wait(proc, lines)
    assert code == 143, err[-20:]
    assert took < 30, took
    steps = saved_steps(str(sw / 'gqa_h4_kv2_s0'))
    assert len(steps) == 1 and 0 < steps[0] < 100_000, steps
    assert err[-1] == (
        f'gqa_h4_kv2_s0 stopped by SIGTERM: its checkpoint of step {steps[0]} kept; repeating the '
        'command resumes it; no further runs started'
    ), err[-20:]
    assert not (sw / 'gqa_h4_kv2_s1').exists()


BIG = dict(attention='gqa', num_kv_heads=2, d_model=512, num_heads=8, num_layers=8, mlp_dim=2048)


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.slow
def test_kill9_during_export_leaves_the_old_export_or_the_new_one(tmp_path):
    """`--overwrite` of run A's export by run B's, killed while B's tensors are written: the
    target holds A's export or B's, whole (the staging directory beside it may remain)."""
    for seed in (0, 1):
        write_run(tmp_path / f'run{seed}', seed=seed, **BIG)
    out, fresh = tmp_path / 'out', tmp_path / 'fresh'
    hf_io.export_hf(str(tmp_path / 'run0'), str(out))
    hf_io.export_hf(str(tmp_path / 'run1'), str(fresh))
    old, new = files(out), files(fresh)
    assert old != new
    proc, lines = start_entry(
        'scripts/convert_hf.py',
        'export',
        f'--workdir={tmp_path / "run1"}',
        f'--hf_dir={out}',
        '--overwrite',
        sigkill=True,
    )
    wait_for(lambda: any('tensors to' in line for line in lines), proc, lines)
    time.sleep(0.05)
    assert proc.poll() is None, 'the export ended before the kill: make the model larger'
    proc.kill()
    proc.wait(timeout=60)
    assert files(out) in (old, new)


@pytest.mark.slow
def test_kill9_during_import_leaves_no_checkpoint(tmp_path):
    """An import killed once its checkpoint is being written: the workdir holds no checkpoint
    (the save happens in a staging directory beside it), and the import can be repeated,
    removing the staging directory the kill left."""
    proc, lines, hf, work = import_saving(tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    assert saved_steps(str(work)) == []
    assert [n for n in os.listdir(tmp_path) if 'import-partial' in n]  # what the kill left
    hf_io.import_hf(str(hf), str(work), base_config())
    assert saved_steps(str(work)) == [0]
    assert not [n for n in os.listdir(tmp_path) if 'partial' in n]  # removed by the next one


def import_saving(tmp_path) -> tuple[subprocess.Popen, list[str], object, object]:
    """An import of a big exported run, started and waited for until its checkpoint is being
    written (in its staging directory): (process, stderr lines, hf dir, workdir)."""
    write_run(tmp_path / 'run', **BIG)
    hf = tmp_path / 'hf'
    hf_io.export_hf(str(tmp_path / 'run'), str(hf))
    work = tmp_path / 'w'
    proc, lines = start_entry(
        'scripts/convert_hf.py', 'import', f'--hf_dir={hf}', f'--workdir={work}', sigkill=True
    )
    wait_for(lambda: list(tmp_path.glob('.w.import-partial-*/checkpoints/*')), proc, lines)
    return proc, lines, hf, work


def reliability_tests() -> list[str]:
    """The `tests/<file>.py::<test>` the Reliability section of docs/train.md names."""
    page = (ROOT / 'docs' / 'train.md').read_text()
    section = page.split('\n## Reliability\n', 1)[1].split('\n## ', 1)[0]
    return re.findall(r'tests/\w+\.py::\w+', section)


def test_every_test_named_in_the_reliability_section_exists():
    named = reliability_tests()
    assert len(named) >= 20
    defined = {}  # file: the functions it defines, each file parsed once
    for path in {ref.split('::')[0] for ref in named}:
        tree = ast.parse((ROOT / path).read_text()) if (ROOT / path).exists() else ast.Module([])
        defined[path] = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    missing = [ref for ref in named if ref.split('::')[1] not in defined[ref.split('::')[0]]]
    assert not missing, missing


@pytest.mark.slow
def test_sigterm_during_import_save_leaves_nothing(tmp_path):
    """SIGTERM once the import's checkpoint is being written: exit 143, one line, no workdir
    and no staging directory left."""
    proc, lines, hf, work = import_saving(tmp_path)
    code, took, err = sigterm_and_wait(proc, lines)
    assert code == 143, err[-20:]
    assert err[-1] == 'stopped by SIGTERM; nothing written', err[-20:]
    assert sorted(os.listdir(tmp_path)) == ['hf', 'run']
