"""What each command promises under faults (README, "Reliability"): output paths checked before
any work, SIGTERM honoured by head analysis and sweeps, a full disk stopping a run in one line,
evaluation progress, kill -9 and SIGTERM during export, import and evaluation."""

import pytest
from conftest import run_entry

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
