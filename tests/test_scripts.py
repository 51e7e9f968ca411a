"""Benchmark scripts run end to end at tiny size (timings are not checked, only the output)."""

import importlib.util
import json
import math

import pytest
from conftest import ROOT, run_entry, stdlib_text

from lm.train import cpu_model

pytestmark = pytest.mark.slow  # each test starts a benchmark script


def run(script, *args):
    return run_entry(f'scripts/{script}', *args, check=True).stdout


# bench_decode.py at a size that runs in seconds (the flags each test adds come after these)
TINY_DECODE = (
    '--contexts=32',
    '--repeats=1',
    '--new_tokens=2',
    '--d_model=64',
    '--bandwidth_gib=0.01',
)


def test_bench_decode_smoke(tmp_path):
    stdout = run(
        'bench_decode.py',
        *TINY_DECODE,
        '--num_layers=2',
        '--variants=mha,gqa2,mqa,mla,mqa_cla2',
        '--batch=2,1',
        f'--json={tmp_path / "d.json"}',
        '--bandwidth_gib=1e-7',  # a copy of 104 bytes: its rate, a few MB/s, is below any row's
    )
    rows = json.loads((tmp_path / 'd.json').read_text())
    assert [(r['variant'], r['batch']) for r in rows] == [
        (v, b) for b in (2, 1) for v in ('mha', 'gqa2', 'mqa', 'mla', 'mqa_cla2')
    ]
    mqa = {r['cache_bytes_per_token_measured'] for r in rows if r['variant'] == 'mqa'}
    assert {2 * r['cache_bytes_per_token_measured'] for r in rows if 'cla' in r['variant']} == mqa
    params = {r['variant']: r['params'] for r in rows}
    for r in rows:
        assert r['cache_bytes_per_token_measured'] == r['cache_bytes_per_token_formula']
        assert r['decode_tokens_per_sec'] > 0
        # weights (float32) + the cache filled to 32 + 2 / 2 tokens, read by both layers (MQA-CLA2:
        # one cache, read by its producer and its consumer)
        reads = 2 if 'cla' in r['variant'] else 1
        cache = r['cache_bytes_per_token_measured'] * r['batch'] * 33
        want = 4 * params[r['variant']] + reads * cache
        assert math.isclose(r['bytes_per_step'], want)
        assert math.isclose(r['achieved_GBps'], want / r['ms_per_step'] / 1e6)
        assert math.isclose(r['fraction_of_bandwidth'], r['achieved_GBps'] / r['bandwidth_GBps'])
        mha = next(m for m in rows if m['variant'] == 'mha' and m['batch'] == r['batch'])
        assert math.isclose(r['predicted_speedup'], mha['bytes_per_step'] / r['bytes_per_step'])
        assert math.isclose(r['speedup_vs_mha'], mha['ms_per_step'] / r['ms_per_step'])
        assert r['fraction_of_bandwidth'] <= 1
        assert math.isclose(
            r['fraction_of_predicted'], r['speedup_vs_mha'] / r['predicted_speedup']
        )
    assert stdout.count('\n| ') == 12  # per batch: header + 5 rows
    assert stdout.count('reference bandwidth') == 1
    # the reference is raised to the fastest row's rate: that row reads at 100% of it
    assert 'which read faster than both' in stdout
    assert math.isclose(max(r['fraction_of_bandwidth'] for r in rows), 1)
    out = tmp_path / 'roofline.png'
    run('plot_roofline.py', f'--json={tmp_path / "d.json"}', f'--out={out}')
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_bench_decode_profiles_each_row_by_op(tmp_path):
    stdout = run(
        'bench_decode.py',
        *TINY_DECODE,
        '--num_layers=1',
        '--variants=gqa2',
        '--num_heads=4',
        '--batch=1',
        '--profile_top=30',
        f'--profile_dir={tmp_path}',
    )
    assert 'profile of gqa2, context 32, batch 1:' in stdout and ', 4 heads (' in stdout
    assert '| matmul |' in stdout
    assert 'while/body/' in stdout  # ops traced to their source in the decode loop


@pytest.fixture
def text_file(tmp_path):
    """The benchmarks' --data_path (their default, data/tinyshakespeare.txt, is fetched by
    scripts/get_data.py and absent from a fresh clone)."""
    path = tmp_path / 'text.txt'
    path.write_text(stdlib_text(40_000), encoding='utf-8')
    return path


def shakespeare_mha_flops(seq_len: int) -> tuple[int, int]:
    """(N, training FLOPs per token) of configs/shakespeare_char.py's MHA model, counted by hand:
    E = 128, L = 4, H = 4 heads of Q = 32, SwiGLU width F = 384 (8/3 · 128 rounded up to 64),
    V = 258 (the byte tokenizer), tied embedding. FLOPs per token: 6N + 12·L·H·Q·T (PaLM App. B;
    the tied embedding counts once, as the output head)."""
    e, layers, heads, q, f, v = 128, 4, 4, 32, 384, 258
    per_layer = 4 * e * e + 3 * e * f + 2 * e  # q/k/v/o, gate/up/down, two RMSNorm scales
    n = layers * per_layer + e + v * e  # + final RMSNorm + embedding
    return n, 6 * n + 12 * layers * heads * q * seq_len


def table_row(stdout: str, variant: str) -> dict[str, str]:
    """The printed table's row of `variant`, keyed by the header's column names."""
    lines = stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith('| variant |'))
    row = next(ln for ln in lines if ln.startswith(f'| {variant} |'))
    names = [c.strip() for c in header.strip('|').split('|')]
    return dict(zip(names, (c.strip() for c in row.strip('|').split('|')), strict=True))


def test_bench_train_flops_and_mfu_match_a_hand_count(tmp_path, text_file):
    """Parameters, FLOPs per token, tokens/s and MFU of the MHA row against a hand count of the
    model (not accounting.py) and the tokens of a step (batch 4 × context 16)."""
    stdout = run(
        'bench_train.py',
        f'--data_path={text_file}',
        '--variants=mha',
        '--steps=2',
        '--warmup=1',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
        '--torch_baseline=false',
        '--peak_flops=5e14',
        f'--json={tmp_path / "t.json"}',
    )
    (r,) = json.loads((tmp_path / 't.json').read_text())
    n, flops = shakespeare_mha_flops(seq_len=16)
    assert 'peak' in stdout and 'stated 5e+14 FLOP/s per device x ' in stdout.splitlines()[0]
    assert (r['params'], r['model_flops_per_token']) == (n, flops)
    tokens_per_sec = 4 * 16 / (r['step_time_ms'] / 1e3)
    assert r['tokens_per_sec'] == pytest.approx(tokens_per_sec, rel=1e-9)
    assert r['mfu'] == pytest.approx(tokens_per_sec * flops / r['peak_flops'], rel=1e-9)
    printed = table_row(stdout, 'mha')
    assert printed['params'] == f'{n:,}' and printed['MFLOPs/token'] == f'{flops / 1e6:.2f}'
    assert printed['MFU'] == f'{tokens_per_sec * flops / r["peak_flops"]:.1%}'
    assert printed['steps/call'] == '2' and printed['cuDNN attention'] == 'no'
    assert f'on {cpu_model()},' in stdout.splitlines()[0]  # the header names the CPU
    assert 'PyTorch baseline: off' in stdout and 'torch ms' not in stdout


def test_bench_train_times_the_torch_baseline_when_importable(tmp_path, text_file):
    """With PyTorch importable the baseline is timed in the same process with the threads asked
    for, and the printed ratio is the printed PyTorch ms/step over ours."""
    torch = pytest.importorskip('torch')  # optional: the baseline needs PyTorch, lm does not
    stdout = run(
        'bench_train.py',
        f'--data_path={text_file}',
        '--variants=mha',
        '--steps=4',
        '--warmup=1',
        '--rounds=2',
        '--torch_threads=1',
        '--set=model.num_layers=1',
        '--set=model.d_model=32',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
    )
    lines = stdout.splitlines()
    assert lines[1].startswith(f'eager PyTorch {torch.__version__} nanoGPT baseline (1 threads)')
    printed = table_row(stdout, 'mha')
    torch_ms, ours_ms = float(printed['torch ms']), float(printed['step ms'])
    assert torch_ms > 0
    ratio = float(printed['torch ÷ ours'].removesuffix('x'))
    # each printed number is rounded: ms to 0.1, the ratio to 0.01
    bound = 0.05 / ours_ms * (1 + torch_ms / ours_ms) + 0.005
    assert abs(ratio - torch_ms / ours_ms) <= bound


def test_bench_torch_baseline_smoke():
    pytest.importorskip('torch')  # optional: the baseline needs PyTorch, lm does not
    stdout = run('bench_torch_baseline.py', '--steps=2', '--warmup=1')
    assert '| torch eager |' in stdout and 'ms/step' in stdout


def test_bench_torch_baseline_profile_splits_op_time_by_category():
    """--profile_top prints the baseline's op self time per category, the same categories as
    ours, with the shares summing to the printed total."""
    pytest.importorskip('torch')
    stdout = run('bench_torch_baseline.py', '--steps=2', '--warmup=1', '--profile_top=5')
    total = float(stdout.split('ms/step of op self time')[0].rsplit(', ', 1)[1])
    table = stdout.split('| category |')[1].split('\n\n')[0].splitlines()[2:]
    by_category = {r.split(' | ')[0][2:]: float(r.split(' | ')[1]) for r in table}
    assert 'matmul' in by_category and set(by_category) <= {
        'matmul', 'transcendental', 'layout', 'reduction', 'elementwise', 'framework'
    }  # fmt: skip
    assert sum(by_category.values()) == pytest.approx(total, abs=0.01 * len(by_category))
    assert 'aten::mm' in stdout and 'JAX operations' not in stdout


def test_torch_op_categories_match_ours(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / 'scripts'))  # the benchmarks' peers, beside them
    from baselines.torch_profile import op_category

    for name, category in [
        ('aten::mm', 'matmul'),
        ('aten::_scaled_dot_product_flash_attention_for_cpu_backward', 'matmul'),
        ('aten::gelu_backward', 'transcendental'),
        ('aten::_foreach_sqrt', 'transcendental'),
        ('aten::native_layer_norm', 'reduction'),
        ('aten::copy_', 'layout'),
        ('aten::add_', 'elementwise'),
        ('aten::_foreach_lerp_', 'elementwise'),
        ('Optimizer.step#AdamW.step', 'framework'),
    ]:
        assert op_category(name) == category, name


def test_bench_torch_baseline_time_to_loss(text_file):
    """--target_loss trains the baseline on the recipe's data and evaluates every N steps until
    the target (here never reached: every evaluation up to the last step is printed)."""
    pytest.importorskip('torch')
    stdout = run(
        'bench_torch_baseline.py',
        f'--data_path={text_file}',
        '--target_loss=0.001',
        '--eval_every=2',
        '--set=train.steps=4',
        '--set=train.warmup_steps=1',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=eval_batch_size=8',
    )
    rows = [ln.split(' | ') for ln in stdout.splitlines() if ln[:3] in ('| 0', '| 2', '| 4')]
    assert [r[0] for r in rows] == ['| 0', '| 2', '| 4']
    losses = [float(r[1]) for r in rows]
    assert losses[0] == pytest.approx(math.log(258), rel=0.05)  # nanoGPT init: near uniform
    assert losses[-1] < losses[0]


def test_bench_xla_options_smoke(text_file):
    more = text_file.with_name('more.txt')  # an arm's value with a comma: two files
    more.write_text(text_file.read_text(encoding='utf-8')[:20_000], encoding='utf-8')
    stdout = run(
        'bench_xla_options.py',
        f'--data_path={text_file}',
        '--option=eigen1:xla_cpu_multi_thread_eigen=false;xla_cpu_use_xnnpack=false',
        f'--config_arm=logits16:model.logits_dtype=compute;data.path={text_file},{more}',
        '--rounds=1',
        '--calls=1',
        '--set=model.dtype=bfloat16',
        '--set=model.num_layers=1',
        '--set=model.d_model=32',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        '--set=train.steps_per_call=2',
    )
    assert '2 steps per call' in stdout
    rows = [ln for ln in stdout.splitlines() if ln.startswith('| ') and 'ms' not in ln]
    assert [r.split(' | ')[0] for r in rows] == ['| base', '| eigen1', '| logits16']
    assert rows[0].endswith('| 1.00x | - |')  # no stated peak on a CPU: no MFU


def test_profile_train_lists_a_steps_ops_by_category(tmp_path, text_file):
    stdout = run(
        'profile_train.py',
        f'--data_path={text_file}',
        '--steps=2',
        '--top=40',
        '--set=train.batch_size=4',
        '--set=data.seq_len=16',
        f'--trace_dir={tmp_path}',
    )
    assert 'ms/step wall' in stdout and '| matmul |' in stdout
    assert 'transpose(jvp())' in stdout  # the backward pass, traced to its source


def bench_xla_options_module():
    path = ROOT / 'scripts' / 'bench_xla_options.py'
    spec = importlib.util.spec_from_file_location('bench_xla_options', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_xla_options_splits_pairs_on_commas_or_semicolons():
    bench = bench_xla_options_module()
    assert bench.parse_arm('a:model.dtype=bfloat16,train.lr=0.1') == (
        'a',
        ['model.dtype=bfloat16', 'train.lr=0.1'],
    )
    assert bench.parse_arm('a:data.passkey_lengths=64,128;train.lr=0.1') == (
        'a',
        ['data.passkey_lengths=64,128', 'train.lr=0.1'],
    )
    assert bench.parse_arm('a:data.passkey_lengths=64,128;') == (
        'a',
        ['data.passkey_lengths=64,128'],
    )
    with pytest.raises(ValueError, match='a pair holds a second key=value'):
        bench.parse_arm('a:data.path=x,train.lr=0.1;model.dtype=bfloat16')
    assert bench.parse_option('o:xla_a=1,xla_b=true') == ('o', {'xla_a': '1', 'xla_b': True})
    assert bench.parse_option('o:xla_a=1,2;xla_b=false') == ('o', {'xla_a': '1,2', 'xla_b': False})


def test_bench_xla_options_rejects_a_malformed_option():
    out = run_entry('scripts/bench_xla_options.py', '--option=a:x', timeout=120)
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: --option='a:x': 'x' is not key=value"


@pytest.mark.parametrize(
    'flags,expected',
    [
        (['--config_arm=a:model.nope=1'], "error: --config_arm=a: unknown config key 'model.nope'"),
        (
            ['--config_arm=a:model.logits_dtype=bogus'],
            'error: --config_arm=a: config.model.logits_dtype must be one of',
        ),
        (['--config_arm=a:mesh.cpu_devices=1'], "error: --config_arm='a:mesh.cpu_devices=1': arms"),
        (
            ['--option=a:x=1', '--config_arm=a:train.lr=1'],
            "error: --config_arm='a:train.lr=1': the",
        ),
        (['--config_arm=a:train.batch_size=5'], 'error: --config_arm=a: config.train.batch_size=5'),
    ],
)
def test_bench_xla_options_refuses_a_bad_config_arm_before_compiling(flags, expected, text_file):
    """Each arm's config is checked (its overrides applied) before anything is compiled."""
    out = run_entry('scripts/bench_xla_options.py', f'--data_path={text_file}', *flags, timeout=120)
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(expected), out.stderr[-500:]


def test_bench_data_smoke(tmp_path, text_file):
    stdout = run(
        'bench_data.py',
        f'--text={text_file}',
        f'--workdir={tmp_path / "work"}',
        '--tokenizers=byte',
        '--num_proc=1,2',
        '--batches=2',
        '--repeats=1',
        f'--json={tmp_path / "d.json"}',
    )
    rows = json.loads((tmp_path / 'd.json').read_text())
    tokenise, loader = rows[:2], rows[2:]
    assert [(r['tokenizer'], r['processes']) for r in tokenise] == [('byte', 1), ('byte', 2)]
    assert all(r['same_as_first'] and r['mb_per_s'] > 0 for r in tokenise)
    assert tokenise[0]['tokens'] == 40_002  # every byte and two EOS
    assert [r['sampling'] for r in loader] == ['random', 'epochs']
    assert all(r['batches_per_s'] > 0 and r['steps_per_s_needed'] > 0 for r in loader)
    assert stdout.count('\n| ') == 6  # two tables: a header and two rows each
