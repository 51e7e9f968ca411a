r"""Seed-ensemble speed: ms per train step of K members as one program, and the throughput gain
K · t(1) / t(K) over one model trained alone, for the device at hand, in one process.

Rows: the single run's step (K = 1), the ensemble's vmapped step (config.train.ensemble = K)
and, with --loop (default on a CPU), the members looped inside one program
(config.train.ensemble_loop). Each row's median over --steps timed calls (each waited for),
taken in --rounds rounds that visit every row in turn, so a load that comes and goes on a shared
machine reaches every row alike. Batches are random tokens of the config's shape (a step's time
does not depend on the text, so none is read); a vocabulary taken from the tokenizer
(model.vocab_size = 0) is --vocab_size.

  python scripts/bench_ensemble.py                              # configs/shakespeare_char.py
  python scripts/bench_ensemble.py --k64                        # also K = 64
  python scripts/bench_ensemble.py --config=configs/recall/mqar.py --config.train.batch_size=16
"""

import os
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from lm.cli import bootstrap, run_app
from lm.config import with_values
from lm.train import assemble, device_call_batch, device_description, make_train_step, state_bytes

_CONFIG = config_flags.DEFINE_config_file(
    'config',
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


def rows(config) -> list[Row]:
    """The programs to time: the single run, then each K vmapped (and looped)."""
    ks = [4, 16] + ([64] if _K64.value else [])
    loop = jax.default_backend() == 'cpu' if _LOOP.value is None else _LOOP.value
    out = [Row(config, 0, False)]
    for k in ks:
        out.append(Row(config, k, False))
        if loop:
            out.append(Row(config, k, True))
    return out


def run() -> int:
    config = _CONFIG.value
    bootstrap(config)
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
    return 0


if __name__ == '__main__':
    run_app(run)
