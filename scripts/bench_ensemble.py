r"""Seed-ensemble speed: ms per train step of K members as one program, and the throughput gain
K · t(1) / t(K) over one model trained alone, for the device at hand, in one process.

Rows: the single run's step (K = 1), the ensemble's vmapped step (config.train.ensemble = K),
with --loop (default on a CPU) the members looped inside one program
(config.train.ensemble_loop), and with --processes=P (default on a CPU: one per core) the K
members as P processes at once, each pinned to its own core with one XLA thread and one CPU
device, training K / P members looped in one program (a single run when K = P); a step of that
row is the slowest process's. Each row's median over --steps timed calls (each waited for),
taken in --rounds rounds that visit every row in turn, so a load that comes and goes on a shared
machine reaches every row alike. Batches are random tokens of the config's shape (a step's time
does not depend on the text, so none is read); a vocabulary taken from the tokenizer
(model.vocab_size = 0) is --vocab_size.

  python scripts/bench_ensemble.py                              # configs/shakespeare_char.py
  python scripts/bench_ensemble.py --k64                        # also K = 64
  python scripts/bench_ensemble.py --processes=4                # 4 processes, 2 per core
  python scripts/bench_ensemble.py --config=configs/recall/mqar.py --config.train.batch_size=16
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
from absl import flags

from lm.cli import bootstrap, define_config_file, run_app
from lm.config import with_values, write_config_file
from lm.train import assemble, device_call_batch, device_description, make_train_step, state_bytes

_CONFIG = define_config_file(
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        'configs',
        'shakespeare_char.py',
    ),  # fmt: skip
    'Config file to time (its model, batch and context).',
)
_K64 = flags.DEFINE_bool('k64', False, 'Also time K = 64.')
_LOOP = flags.DEFINE_bool(
    'loop', None, 'Also time members looped in one program (lax.map); default: on a CPU only.'
)
_STEPS = flags.DEFINE_integer('steps', 20, 'Timed calls per row (median reported).')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Rounds visiting every row in turn.')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed calls per row after compiling.')
_PROCESSES = flags.DEFINE_integer(
    'processes',
    None,
    'Also time the members as this many pinned processes at once (each K / P members looped); '
    'default: one per core on a CPU, none elsewhere; 0 = none.',
)
_WORKER = flags.DEFINE_integer(
    'worker', 0, 'Internal (--processes): be one process of that row, training this many members.'
)
_CORE = flags.DEFINE_integer('core', 0, 'Internal (--processes): the core a worker is pinned to.')
_VOCAB = flags.DEFINE_integer(
    'vocab_size', 258, 'Vocabulary when the config takes it from the tokenizer (byte: 258).'
)


class Row:
    """One timed program: K members (0 = the single run), vmapped or looped."""

    def __init__(self, config, k: int, loop: bool):
        self.k, self.loop, self.times = k, loop, []
        # no text is read: random batches, so any source does (one that needs no file)
        settings = {
            'train.ensemble': k,
            'train.ensemble_loop': loop,
            'data.source': 'stdlib',
            'data.path': '',
        }
        if not config.model.vocab_size:
            settings['model.vocab_size'] = _VOCAB.value
        run = assemble(with_values(config, settings), state='init')
        self.ctx, self.state = run.ctx, run.state
        self.bytes = state_bytes(run.ctx)
        c = run.config
        t = time.perf_counter()
        self.step = make_train_step(self.ctx, c.train.grad_accum_steps)
        shape = (c.train.batch_size, c.data.seq_len + 1)
        rng = np.random.default_rng(0)
        local = rng.integers(0, c.model.vocab_size, (k, *shape) if k else shape, dtype=np.int32)
        self.batch = device_call_batch(self.ctx, local)
        self._call()
        self.compile_s = time.perf_counter() - t
        for _ in range(_WARMUP.value):
            self._call()

    @property
    def name(self) -> str:
        return 'single' if not self.k else ('looped' if self.loop else 'vmapped')

    def _call(self) -> float:
        t = time.perf_counter()
        self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics['loss'])
        return time.perf_counter() - t

    def time(self, calls: int) -> None:
        self.times += [self._call() for _ in range(calls)]

    def ms(self) -> float:
        return 1e3 * float(np.median(self.times))


class Processes:
    """K members as P worker processes of this script at once (`--worker`), each on one core:
    a call is each worker's, and its time the slowest worker's."""

    def __init__(self, config_file: str, k: int, processes: int):
        self.k, self.per, self.times, self.bytes, self.compile_s = k, k // processes, [], 0, 0.0
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    f'--config={config_file}',
                    f'--worker={self.per}',
                    f'--core={i % os.cpu_count()}',
                    f'--warmup={_WARMUP.value}',
                    f'--vocab_size={_VOCAB.value}',
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(processes)
        ]
        for reply in self._ask('0'):  # each worker has compiled and warmed up
            self.bytes += reply['bytes']
            self.compile_s = max(self.compile_s, reply['compile_s'])

    @property
    def name(self) -> str:
        inner = f'{self.per} looped' if self.per > 1 else 'single'
        return f'{len(self.procs)} processes x {inner}'

    def _ask(self, line: str) -> list[dict]:
        for p in self.procs:
            p.stdin.write(line + '\n')
            p.stdin.flush()
        replies = [p.stdout.readline() for p in self.procs]
        if not all(replies):
            raise RuntimeError(f'a --processes worker of K = {self.k} stopped (see its stderr)')
        return [json.loads(r) for r in replies]

    def time(self, calls: int) -> None:
        per_worker = [r['times'] for r in self._ask(str(calls))]
        self.times += [max(ts) for ts in zip(*per_worker, strict=True)]

    def ms(self) -> float:
        return 1e3 * float(np.median(self.times))

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
            p.wait()


def worker(config) -> int:
    """A --processes worker: pinned to --core, it builds its row, then for each line N on stdin
    times N calls and prints their seconds (N = 0: its size and compile time) as one JSON line."""
    os.sched_setaffinity(0, {_CORE.value})
    k = _WORKER.value
    row = Row(config, k if k > 1 else 0, k > 1)
    for line in sys.stdin:
        n = int(line)
        row.times = []
        row.time(n)
        reply = {'times': row.times, 'bytes': row.bytes, 'compile_s': row.compile_s}
        print(json.dumps(reply), flush=True)
    return 0


def rows(config) -> list:
    """The programs to time: the single run, then each K vmapped (and looped, and as
    processes)."""
    ks = [4, 16] + ([64] if _K64.value else [])
    cpu = jax.default_backend() == 'cpu'
    loop = cpu if _LOOP.value is None else _LOOP.value
    processes = (os.cpu_count() if cpu else 0) if _PROCESSES.value is None else _PROCESSES.value
    one_core = {'mesh.cpu_devices': 1, 'train.xla_options': 'xla_cpu_multi_thread_eigen=false'}
    config_file = write_config_file(
        with_values(config, one_core), os.path.join(tempfile.mkdtemp(), 'bench_config.py')
    )
    out = [Row(config, 0, False)]
    for k in ks:
        out.append(Row(config, k, False))
        if loop:
            out.append(Row(config, k, True))
        if processes and k % processes == 0:
            out.append(Processes(config_file, k, processes))
    return out


def run() -> int:
    for flag, least in ((_STEPS, 1), (_ROUNDS, 1), (_WARMUP, 0), (_PROCESSES, 0)):
        if flag.value is not None and flag.value < least:
            raise ValueError(f'--{flag.name} must be >= {least}, got {flag.value}')
    config = _CONFIG.value
    bootstrap(config)
    if _WORKER.value:
        return worker(config)
    c = config
    print(
        f'# {device_description()}; {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}; '
        f'd_model {c.model.d_model}, {c.model.num_layers} layers, batch '
        f'{c.train.batch_size} x {c.data.seq_len}; medians of {_STEPS.value} calls'
    )
    timed = rows(config)
    per_round = max(1, _STEPS.value // _ROUNDS.value)
    for _ in range(_ROUNDS.value):
        for row in timed:
            row.time(per_round)
    t1 = timed[0].ms()
    print('| K | program | ms/step | gain K·t(1)/t(K) | state MB | compile s |')
    print('|---|---|---|---|---|---|')
    for row in timed:
        k = max(row.k, 1)
        print(
            f'| {k} | {row.name} | {row.ms():.2f} | {k * t1 / row.ms():.2f}x | '
            f'{row.bytes / 2**20:.1f} | {row.compile_s:.1f} |'
        )
        if isinstance(row, Processes):
            row.close()
    return 0


if __name__ == '__main__':
    run_app(run)
