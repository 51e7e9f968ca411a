"""What a user of a fresh clone meets: the data command, --help of every entry point, the
README's commands, and tests that need nothing outside the repository."""

import hashlib
import importlib.util
import os
import re
import stat
import subprocess
import sys

import pytest
from conftest import ROOT, USER_XLA_FLAGS, stdlib_text
from flag_parse import in_one_python

ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': USER_XLA_FLAGS}
ENTRY_POINTS = ['train.py', 'eval.py'] + sorted(
    f'scripts/{p.name}' for p in (ROOT / 'scripts').glob('*.py')
)


def run(*args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def get_data_module():
    spec = importlib.util.spec_from_file_location('get_data', ROOT / 'scripts' / 'get_data.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_get_data_verifies_the_checksum_and_says_when_offline(tmp_path, monkeypatch):
    get_data = get_data_module()
    assert get_data.DATASETS['tinyshakespeare'][1] == (
        '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed'
    )
    text = stdlib_text(5_000).encode()
    (tmp_path / 'local.txt').write_bytes(text)
    digest = hashlib.sha256(text).hexdigest()
    dead_url = 'http://127.0.0.1:9/input.txt'  # nothing listens on the discard port
    monkeypatch.setitem(get_data.DATASETS, 'toy', (dead_url, digest, 'toy.txt'))
    out = tmp_path / 'data'
    with pytest.raises(
        ValueError,
        match=r'cannot download http://127\.0\.0\.1:9/input\.txt .*'
        r'offline\? .* --from=FILE',
    ):
        get_data.fetch('toy', '', str(out), timeout=5)
    assert not list(out.iterdir())  # no partial file
    umask = os.umask(0o022)
    try:
        path = get_data.fetch('toy', str(tmp_path / 'local.txt'), str(out), timeout=5)
    finally:
        os.umask(umask)
    assert path == str(out / 'toy.txt') and (out / 'toy.txt').read_bytes() == text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # as the umask says, not 0600
    assert get_data.fetch('toy', '', str(out), timeout=5) == path  # in place: no download
    with pytest.raises(ValueError, match=r"^--from='.*nothing.txt' is not a file$"):
        get_data.fetch('toy', str(tmp_path / 'nothing.txt'), str(out), timeout=5)  # even so
    (tmp_path / 'other.txt').write_bytes(b'other')
    with pytest.raises(ValueError, match=r"^--from='.*other.txt' has SHA-256 \w+, not the"):
        get_data.fetch('toy', str(tmp_path / 'other.txt'), str(out), timeout=5)  # and a wrong one
    (out / 'toy.txt').write_bytes(b'changed')
    with pytest.raises(
        ValueError,
        match=rf"--from='.*other.txt' has SHA-256 \w+, not the "
        rf'expected {digest}',
    ):
        get_data.fetch('toy', str(tmp_path / 'other.txt'), str(out), timeout=5)
    assert (out / 'toy.txt').read_bytes() == b'changed' and len(list(out.iterdir())) == 1


@pytest.mark.slow
def test_get_data_command_refuses_a_wrong_file_in_one_line(tmp_path):
    (tmp_path / 'wrong.txt').write_text('not Shakespeare\n')
    out = run(
        'scripts/get_data.py',
        'tinyshakespeare',
        f'--from={tmp_path / "wrong.txt"}',
        f'--out_dir={tmp_path / "data"}',
    )
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: --from='{tmp_path}")
    assert 'not the tinyshakespeare file' in out.stderr
    assert not (tmp_path / 'data' / 'tinyshakespeare.txt').exists()


def test_data_dir_is_ignored_and_nothing_points_outside_the_repository():
    assert '/data/' in (ROOT / '.gitignore').read_text().split()
    files = [
        *ROOT.glob('*.md'),
        *ROOT.glob('*.py'),
        *(ROOT / 'docs').rglob('*.md'),
        *(ROOT / 'docs').rglob('*.py'),
        *(ROOT / 'configs').rglob('*.py'),
        *(ROOT / 'scripts').glob('*.py'),
        *(ROOT / 'lm').glob('*.py'),
        *(p for p in (ROOT / 'tests').glob('*.py') if p.name != os.path.basename(__file__)),
    ]
    outside = re.compile(r"\.\./shared|'shared', 'data'|\.\.', '\.\.', '\.\.'")
    offenders = [str(f.relative_to(ROOT)) for f in files if outside.search(f.read_text())]
    assert offenders == []


@pytest.fixture(scope='module')
def helps() -> dict[str, dict]:
    """Every entry point's `--help` run as `python` runs it, each in a forked child of one
    Python that imported `lm` once (tests/flag_parse.py, "run"): the script's own imports and
    absl's help and exit, not a JAX import per script."""
    calls = [{'cwd': str(ROOT), 'argv': [script, '--help'], 'run': True} for script in ENTRY_POINTS]
    return dict(zip(ENTRY_POINTS, in_one_python(calls, ROOT, ENV), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize('script', ENTRY_POINTS)
def test_help_exits_0_and_lists_the_flags(helps, script):
    code, out = helps[script]['code'], helps[script]['out']
    assert code == 0, out[-2000:]
    assert 'Traceback' not in out
    own = re.findall(r'^  --(?:\[no\])?(\w+)', out, flags=re.M)
    assert own, out  # the entry point's own flags, not only absl's
    if script in ('train.py', 'eval.py'):
        assert {'workdir', 'config', 'distributed', 'process_id'} <= set(own)


@pytest.mark.slow
def test_a_required_flag_left_out_is_named_with_its_help():
    """An entry point run without a flag it requires says which, with the flag's help, in one
    line (not absl's 'flag --workdir=None: Flag --workdir must have a value other than None.')."""
    required = [s for s in ENTRY_POINTS if 'required=True' in (ROOT / s).read_text()]
    assert {'train.py', 'eval.py', 'scripts/uptrain.py', 'scripts/generate.py'} <= set(required)
    calls = [{'cwd': str(ROOT), 'argv': [script], 'run': True} for script in required]
    outs = dict(zip(required, in_one_python(calls, ROOT, ENV), strict=True))
    last = {script: out['out'].strip().splitlines()[-1] for script, out in outs.items()}
    for script, out in outs.items():
        assert out['code'] == 1, (script, out['out'][-1000:])
        said = r'error: --\w+ (is required: |and --\w+ are required \()\S.*'
        assert re.fullmatch(said, last[script]), (script, last)
    assert last['eval.py'] == 'error: --workdir is required: Run directory holding checkpoints/.'
    assert last['scripts/eval_sweep.py'] == (
        'error: --sweep_dir and --out are required (--sweep_dir: A sweep with finished runs.; '
        '--out: CSV to write (point, seed, eval_loss, ...).)'
    )


@pytest.mark.slow
def test_readme_lists_config_values_as_documented():
    readme = (ROOT / 'README.md').read_text()
    (command,) = re.findall(r'^python -c "(from lm\.config import .*)"$', readme, flags=re.M)
    out = run('-c', command, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'num_kv_heads: 2' in out.stdout and 'cpu_devices: 2' in out.stdout


@pytest.mark.slow
def test_eight_simulated_devices_command_runs(tmp_path):
    """docs/train.md's 8-CPU-device command as written (the recipe sets cpu_devices=2 and the
    command's --config.mesh.cpu_devices=8 wins), with a tiny model and 2 steps."""
    from doc_commands import doc_commands

    page = (ROOT / 'docs' / 'train.md').read_text()
    (command,) = [c for c, _ in doc_commands(page) if '--workdir=runs/cpu8' in c]
    args = command.split()[1:]
    text = tmp_path / 'text.txt'
    text.write_text(stdlib_text(40_000), encoding='utf-8')
    args = [a.replace('data/tinyshakespeare.txt', str(text)) for a in args]
    args = [a.replace('runs/cpu8', str(tmp_path / 'cpu8')) for a in args]
    tiny = [
        '--config.model.d_model=32',
        '--config.model.num_layers=1',
        '--config.data.seq_len=16',
        '--config.train.steps=2',
        '--config.train.steps_per_call=1',
        '--config.eval_every=2',
        '--config.eval_tokens=64',
        '--config.checkpoint_every=2',
        '--config.compilation_cache_dir=',
        f'--config.data.cache_dir={tmp_path / "cache"}',
    ]
    out = run(*args, *tiny, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'on 8 devices, mesh data=2 x fsdp=2 x tensor=2;' in out.stderr  # the mesh in use
    # The embedding lookup under data x fsdp x tensor reshards without XLA's fallback.
    assert 'Involuntary full rematerialization' not in out.stderr
    assert (tmp_path / 'cpu8' / 'checkpoints' / '2').is_dir()
    # XLA_FLAGS alone does not beat the recipe's cpu_devices: that is said, not silent.
    flagged = {**ENV, 'XLA_FLAGS': '--xla_force_host_platform_device_count=8'}
    out = run(
        'train.py',
        '--config=configs/shakespeare_char.py',
        f'--workdir={tmp_path / "x"}',
        f'--config.data.path={text}',
        '--config.train.batch_size=16',
        '--config.mesh.data=2',
        '--config.mesh.fsdp=2',
        '--config.mesh.tensor=2',
        *tiny,
        env=flagged,
        timeout=300,
    )
    assert out.returncode != 0
    assert 'config.mesh.cpu_devices=2 wins over XLA_FLAGS' in out.stderr
    assert 'set --config.mesh.cpu_devices=8' in out.stderr
