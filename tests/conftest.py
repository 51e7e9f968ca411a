"""Shared fixtures: tiny configs built from configs/base.py, entry points run as `python` runs
them (`run_entry`: children of a fork server, tests/fork_server.py), and text the tests make
themselves (nothing outside the repository is read: the tests run in a fresh clone)."""

import atexit
import compileall
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx
from fork_server import ForkServer

from lm.config import load_config_file, with_values
from lm.config import write_config_file as lm_write_config_file
from lm.model.attention import AttentionWeights

# Broadcasting must be explicit in lm/ (a silent [E] * [B, T, E] hides shape bugs).
jax.config.update('jax_numpy_rank_promotion', 'raise')
# The tests check float32 math against float32/float64 references: on a GPU, JAX's default
# float32 matmul is TF32 (a 10-bit mantissa, errors ~1e-3), so ask for full float32 there too
# (no change on the CPU). tests/test_gpu.py checks the bfloat16/cuDNN path at its own tolerance.
jax.config.update('jax_default_matmul_precision', 'highest')
# Bitwise-equal resumes on a GPU need deterministic reductions (scatter-add gradients use
# atomics otherwise); the flag is read when the GPU backend starts and is ignored on the CPU. Once:
# a pytest-xdist worker inherits the controller's XLA_FLAGS, which already hold it.
_words = os.environ.get('XLA_FLAGS', '').split()
_words += [w for w in ('--xla_gpu_deterministic_ops=true',) if w not in _words]
os.environ['XLA_FLAGS'] = ' '.join(_words)
# On the CPU, XLA's loop emitters instead of its fusion emitters: this process and the runs it
# starts compile each program in about half the time (a tiny train.py run's compiles 4.0 s ->
# 2.2 s; test_model.py and an eager decoding test, most of whose time is compiling one small
# program per operation, 46 s -> 27 s), and the tests check maths, not the emitted code's speed.
# Ignored by a GPU's compiles.
CPU_TEST_XLA_FLAG = '--xla_cpu_use_fusion_emitters=false'
# What a user's process has (runs the tests start "as users' runs are" take it: the README's
# quickstart, the fresh-clone commands, the golden runs). Without the test flag: a pytest-xdist
# worker inherits the controller's XLA_FLAGS, which already hold it.
USER_XLA_FLAGS = ' '.join(w for w in os.environ['XLA_FLAGS'].split() if w != CPU_TEST_XLA_FLAG)
os.environ['XLA_FLAGS'] = f'{USER_XLA_FLAGS} {CPU_TEST_XLA_FLAG}'
# On the CPU, this process compiles with JAX's `jax_disable_most_optimizations` (XLA's LLVM at
# -O0): its tests check maths at tiny sizes, where compiling is most of the time (the fast tier:
# 115 s instead of 193-221 s on the 2-core CI machine, 2026-11-28). It is this process's setting,
# and the entry points the tests start inherit it through ENV (JAX reads
# JAX_DISABLE_MOST_OPTIMIZATIONS): a tiny sweep's CPU time 80 s -> 49 s. Helper processes that
# import this file (tests/mesh_worker.py, test_variant_contract's export refusal) compile like
# it. The README's quickstart (tests/test_quickstart.py) and the fresh-clone test run without
# it, compiled as users' runs are. On a GPU nothing changes: tests/test_gpu.py and the fast
# tier there check the kernels users run.
if jax.default_backend() == 'cpu':
    jax.config.update('jax_disable_most_optimizations', True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
# lm's bytecode, written once (compileall writes it even under PYTHONDONTWRITEBYTECODE=1, which
# the machines here set): every entry point the tests start imports lm afresh, and compiling its
# ~100 modules from source cost each one ~0.3 s (tests/test_faults.py and test_generate.py in a
# fresh clone, 2026-11-30: 106 s, then 87-95 s with the bytecode).
compileall.compile_dir(ROOT / 'lm', quiet=1)
# One persistent compilation cache per test worker, new each session: the runs the tests start
# reuse each other's compiled steps (a tiny train.py run: 11 s compiling afresh, 5 s from the
# cache). Per worker, so two workers never write one entry at once; tests of the cache itself
# (tests/test_train.py) give their runs directories of their own.
# Helpers that import this file in a Python of their own (tests/mesh_worker.py) use the cache of
# the worker that started them (ENV below passes it on), not one of their own.
XLA_CACHE = os.environ.get(
    'LM_TESTS_XLA_CACHE',
    os.path.join(
        tempfile.gettempdir(),
        'lm-tests-xla',
        os.environ.get('PYTEST_XDIST_TESTRUNUID', f'pid{os.getpid()}'),
        os.environ.get('PYTEST_XDIST_WORKER', 'main'),
    ),
)
# This process's own compiles go there too, however short (-O0 compiles take ~0.5 s, under JAX's
# 1 s default for writing an entry): the runs a test trains in-process, a sweep's seeds say,
# compile each program once.
jax.config.update('jax_compilation_cache_dir', XLA_CACHE)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
ENV = {
    **os.environ,
    'JAX_PLATFORMS': 'cpu',
    'JAX_NUMPY_RANK_PROMOTION': 'raise',
    'LM_TESTS_XLA_CACHE': XLA_CACHE,
}
if jax.default_backend() == 'cpu':
    ENV['JAX_DISABLE_MOST_OPTIMIZATIONS'] = 'true'


def tiered(values, fast):
    """Parametrize values (tuples for several argnames) with every one not in `fast` marked slow
    (run in the full suite only)."""
    slow = [
        pytest.param(*v if isinstance(v, tuple) else (v,), marks=pytest.mark.slow) for v in values
    ]
    return [v if v in fast else p for v, p in zip(values, slow, strict=True)]


# This worker's fork server (tests/fork_server.py): `run_entry`'s runs without a fresh Python's
# imports each; one more per other environment runs are given (simulated devices), made on its
# first run.
FORK_SERVER = ForkServer(ENV, ROOT)
_SERVERS = {json.dumps(ENV, sort_keys=True): FORK_SERVER}


def fork_server(env: dict[str, str]) -> ForkServer:
    """This worker's fork server for runs in `env`."""
    key = json.dumps(env, sort_keys=True)
    if key not in _SERVERS:
        _SERVERS[key] = ForkServer(env, ROOT)
    return _SERVERS[key]


@atexit.register
def _close_servers() -> None:
    for server in _SERVERS.values():
        server.close()


def pytest_unconfigure(config) -> None:
    """Removes this worker's compilation cache when its session ends (and the session's folder
    of caches once the last worker's is gone): nothing of a session stays in /tmp. A pytest hook,
    not atexit: tests/mesh_worker.py imports this file in a Python of its own, whose exit must
    leave the worker's cache alone."""
    shutil.rmtree(XLA_CACHE, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(XLA_CACHE))


def simulated_devices_env(devices: int) -> dict[str, str]:
    """ENV with `devices` simulated CPU devices (XLA_FLAGS, read when JAX starts)."""
    flags = f'{CPU_TEST_XLA_FLAG} --xla_force_host_platform_device_count={devices}'
    return {**ENV, 'XLA_FLAGS': flags}


def run_entry(script, *args, env=None, timeout=600, check=False, fresh=False):
    """Runs an entry point (`'train.py'`, `'scripts/sweep.py'`, ...) as `python` would on the
    CPU backend from the repository root: a child of the fork server for its environment
    (`env`, default ENV), or with `fresh` a fresh Python; returns the CompletedProcess (text
    output). With
    `check`, a non-zero exit fails the test showing stderr's tail."""
    argv = [str(ROOT / script), *map(str, args)]
    out = None if fresh else fork_server(env or ENV).run(argv, ROOT, env or ENV, timeout)
    if out is None:
        out = subprocess.run(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env or ENV,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if check:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def entry_command(script, *args):
    """The argv `run_entry` would run, for tests that start the process themselves."""
    return [sys.executable, str(ROOT / script), *map(str, args)]


def start_entry(script, *args, sigkill=False) -> tuple[subprocess.Popen, list[str]]:
    """An entry point started with its stderr collected line by line in the returned list: a
    child of the fork server through its client (which passes SIGTERM and SIGINT on to the run
    and exits as it did), else a fresh Python; with `sigkill` (the test kills it with SIGKILL,
    which no client can pass on) always a fresh Python."""
    argv = entry_command(script, *args)
    if not sigkill and FORK_SERVER.start():
        argv = [FORK_SERVER.path + '.python', *argv[1:]]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, lines


def sigterm_while_training(
    script, *args, marker: str = 'compiled the train step', times: int = 1, delay: float = 1.0
) -> tuple[int, str]:
    """Starts an entry point, sends it SIGTERM `delay` seconds after `marker` appeared `times`
    times on its stderr (default: a second after it compiled its train step), and returns
    (exit code, stderr)."""
    proc, lines = start_entry(script, *args)
    deadline = time.time() + 120
    while sum(marker in line for line in lines) < times:
        assert time.time() < deadline and proc.poll() is None, ''.join(lines)[-2000:]
        time.sleep(0.1)
    time.sleep(delay)
    assert proc.poll() is None, 'the phase ended before the signal: make it longer'
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    time.sleep(0.5)  # the reader thread drains stderr
    return proc.returncode, ''.join(lines)


def stdlib_text(num_chars: int) -> str:
    """The first `num_chars` characters of this Python's standard-library .py files, in the
    fixed order of the `stdlib` data source: real, varied text that every machine has."""
    from lm.data.files import stdlib_files

    parts, size = [], 0
    for _, full in stdlib_files():
        parts.append(pathlib.Path(full).read_text(encoding='utf-8'))
        size += len(parts[-1])
        if size >= num_chars:
            break
    return ''.join(parts)[:num_chars]


def tiny_config(**model_overrides):
    """configs/base.py with a tiny model (vocab 61, d_model 32, 2 layers, 4 heads). Keys of
    MLA's section may be given flat (`q_lora_rank=8`): they go to `config.model.mla`."""
    config = load_config_file(os.fspath(ROOT / 'configs' / 'base.py'))
    config.compilation_cache_dir = XLA_CACHE
    config.model.update(vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=0)
    config.model.update(mlp_dim=64)
    config.model.mla.update(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    for key, value in model_overrides.items():
        (config.model.mla if key in config.model.mla else config.model)[key] = value
    return config


def tiny_train_config(tmp_path, text_path, **overrides):
    """A tiny run on a text file: a few ms per step, so tests can train real steps."""
    config = tiny_config(attention='gqa', num_kv_heads=2)
    config.data.update(
        source='text', path=str(text_path), cache_dir=str(tmp_path / 'cache'), seq_len=16
    )
    config.train.update(batch_size=4, steps=8, lr=3e-3, warmup_steps=2)
    config.update(
        eval_every=4, eval_batch_size=32, log_every=2, checkpoint_every=4, async_checkpointing=False
    )
    config.model.vocab_size = 0
    return with_values(config, overrides)


def jitted(model):
    """The model's forward pass as a jitted function of (tokens, positions, segment ids)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(tokens_BT, positions_BT=None, segment_ids_BT=None):
        return nnx.merge(graphdef, state)(tokens_BT, positions_BT, segment_ids_BT=segment_ids_BT)

    return run


def full_forward_rows(model, rows: list[list[int]]) -> list:
    """The full forward's logits of each token sequence in `rows`, [len(row), V] each, from one
    call on the batch right-padded with token 0 (causal: padding after a position leaves its
    logits as they are), not one compile per length."""
    T = max(len(r) for r in rows)
    logits_BTV = np.asarray(model(np.array([r + [0] * (T - len(r)) for r in rows], np.int32)))
    return [logits_BTV[b, : len(r)] for b, r in enumerate(rows)]


def sown_weights(attn, x_BTE, positions_BT, **kwargs):
    """An attention module's call on a copy with `sow_weights` set: ((y, cache), the weights
    [B, H, T, S] it sowed), as lm.analysis.scores.attention_probs reads them from a model."""
    probe = nnx.clone(attn)
    probe.sow_weights = True
    out, sown = nnx.capture(probe, AttentionWeights)(x_BTE, positions_BT, **kwargs)
    (weights,) = sown['weights'].get_value()
    return out, weights


def write_config_file(config, path):
    return lm_write_config_file(config, str(path))


def read_scalars(logdir, tag):
    """{step: value} for `tag`, as TensorBoard shows it (later writes for a step win)."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={'scalars': 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


@pytest.fixture
def small_text(tmp_path):
    """60 000 characters of standard-library source, as its own file."""
    path = tmp_path / 'small.txt'
    path.write_text(stdlib_text(60_000), encoding='utf-8')
    return path


def sweep_file(tmp_path, config, points):
    """A sweep file: `config` as its base and `points` from get_points()."""
    path = tmp_path / 'sweep_cfg.py'
    path.write_text(
        'import json\n\nimport ml_collections\n\n\ndef get_config():\n'
        f'    return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n\n\n'
        f'def get_points():\n    return {points!r}\n'
    )
    return path


# xdist hands out whole files (--dist loadfile) in collection order (--no-loadscope-reorder):
# the files with the longest tests go first, so no long file starts last and leaves a core idle
# at the end (the 2-core CI machine, `pytest --durations=0`, 2026-11-29); the rest keep xdist's
# default order, most tests first. An order only: a file missing here still runs.
LONGEST_FIRST = (
    'test_doc_commands.py',  # the reference pages' command chain, one test of ~3 min
    'test_ensemble.py',
    'test_quickstart.py',
    'test_uptrain.py',
    'test_train.py',
    'test_hf.py',
    'test_faults.py',
    'test_sharding.py',
    'test_decode.py',
    'test_integrity.py',
    'test_scripts.py',
    'test_generate.py',
)
# The fast tier's (`-m "not slow"`) longest files, first: numerics across variants.
FAST_LONGEST_FIRST = (
    'test_flash_decode.py',
    'test_attention.py',
    'test_decode.py',
    'test_uptrain.py',
    'test_kv_layouts.py',
    'test_model.py',
    'test_variant_contract.py',
    'test_hf.py',
    'test_analysis.py',
    'test_train.py',
)


def pytest_collection_modifyitems(config, items):
    files = {}
    for item in items:
        files.setdefault(item.path.name, []).append(item)
    fast = 'not slow' in (config.getoption('markexpr') or '')
    rank = {name: i for i, name in enumerate(FAST_LONGEST_FIRST if fast else LONGEST_FIRST)}
    order = sorted(files, key=lambda name: (rank.get(name, len(rank)), -len(files[name])))
    items[:] = [item for name in order for item in files[name]]
