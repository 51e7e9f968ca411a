"""The training loop: resume or init, steps, eval, checkpoints, TensorBoard and progress."""

from __future__ import annotations

import math
import queue
import signal
import threading
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from lm.data.parts import HELDOUT
from lm.train import provenance
from lm.train.ensemble import member_seeds
from lm.train.evaluation import eval_batch_size, evaluate
from lm.train.interrupt import Interrupted, StopRequest
from lm.train.loss_spike import LossSpikeGuard
from lm.train.run import Run, assemble
from lm.train.run_log import Meter, log_model, write_results
from lm.train.step import (
    call_sharding,
    call_steps,
    device_call_batch,
    make_eval_step,
    make_train_step,
)
from lm.train.stored import checkpoint_meta, results_step
from lm.train.summary import Summary, claim_logdir, run_logdir
from lm.train.workdir import RunError, remember_tb_dir, remembered_tb_dir


def call_sizes(start: int, stop: int, steps_per_call: int, every: tuple[int, ...]):
    """Steps per train-step call from `start` to `stop`: `steps_per_call` wherever that many fit
    before the next multiple of any of `every` (log, eval, checkpoint) or `stop`, single steps
    otherwise, so that every such step ends a call. When a smaller size n > 1 divides `start`,
    `stop`, every interval and `steps_per_call`, every call is n steps instead: one compiled
    function (15 steps at 10 per call: 5 + 5 + 5, not 10 + five single steps)."""
    n = math.gcd(steps_per_call, start, stop, *every)
    if n > 1:
        steps_per_call = n
    step = start
    while step < stop:
        boundary = min([stop] + [(step // e + 1) * e for e in every])
        n = steps_per_call if step + steps_per_call <= boundary else 1
        yield n
        step += n


def call_batch(run: Run, step: int, n: int) -> np.ndarray:
    """This process's numpy batch of the call of `n` steps after `step` (`Corpus.train_call`);
    an ensemble's stacks each member's, drawn with its own seed, [K, ...]."""
    c = run.config
    where = {
        'step': step,
        'steps': n,
        'batch_size': c.train.batch_size,
        'process_index': jax.process_index(),
        'process_count': jax.process_count(),
    }
    if not c.train.ensemble:
        return run.corpus.train_call(c.data, seed=c.seed, **where)
    return np.stack([run.corpus.train_call(c.data, seed=s, **where) for s in member_seeds(c)])


def _prefetch(run: Run, start: int, sizes: list[int], depth: int = 2):
    """Yields this process's numpy batch of each call (`call_batch`) from a background
    thread; an exception there is raised here, as a RunError naming the step."""
    q: queue.Queue = queue.Queue(maxsize=depth)

    def produce():
        step = start
        try:
            for n in sizes:
                q.put(call_batch(run, step, n))
                step += n
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            first = str(e).splitlines()[0] if str(e) else ''
            error = RunError(
                f'making the batch of step {step + 1} failed: {type(e).__name__}: {first}'
            )
            error.__cause__ = e
            q.put(error)

    threading.Thread(target=produce, daemon=True).start()
    for _ in sizes:
        batch = q.get()
        if isinstance(batch, RunError):
            raise batch
        yield batch


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    tb_dir: str = '',
    allow_config_change: bool = False,
) -> dict:
    """Trains (or resumes) the run in `workdir`, which it owns meanwhile (`WorkdirLock`); returns
    the last eval metrics (and, for a corpus with a held-out part, `lm.data.parts`, the
    last step's on it as 'heldout') and end state. A run that reaches `train.steps` writes
    `<workdir>/results.json` (`write_results`). Resuming under a config that differs from the
    checkpoint's (`lm.train.identity.config_changes`) needs `allow_config_change`. The process's
    CPU devices must already be set (`lm.cli.bootstrap`)."""
    run = assemble(
        config, state='resume', workdir=workdir, data=True, allow_config_change=allow_config_change
    )
    # From here on, SIGTERM / SIGINT end the run at a step boundary or between eval batches.
    if run.config.train.ensemble:  # its own module builds on this one
        from lm.train.ensemble_run import EnsembleTraining as training
    else:
        training = _Training
    with run, StopRequest() as stop, jax.set_mesh(run.mesh):
        return training(run, workdir, tb_dir, stop).train()


# A checkpoint side-car's key: a signal cut its step's evaluation short (or came before it).
EVAL_CUT = 'eval_cut_short'


class _StepCache:
    """Compiled train steps by steps per call, each compiled ahead of time on first use (its
    compile time is logged and left out of the meter's window)."""

    def __init__(self, run: Run, meter: Meter):
        self.run, self.meter, self.fns = run, meter, {}

    def __call__(self, n: int) -> Callable:
        if n not in self.fns:
            c, ctx = self.run.config, self.run.ctx
            t = time.perf_counter()
            shape = (c.train.batch_size, c.data.seq_len + 1)
            shape = shape if n == 1 else (n, *shape)
            shape = (ctx.members, *shape) if ctx.members else shape
            batch = jax.ShapeDtypeStruct(shape, np.int32, sharding=call_sharding(ctx, n))
            fn = make_train_step(ctx, c.train.grad_accum_steps, n)
            self.fns[n] = fn.lower(ctx.abstract_state, batch).compile()
            dt = time.perf_counter() - t
            logging.info('compiled the train step (%d step(s) per call) in %.1f s', n, dt)
            self.meter.exclude(dt)
        return self.fns[n]


class _Training:
    """One training run: from its assembled state, calls of the train step, with logging, eval and
    checkpoints at their intervals. Holds the state between the pieces."""

    def __init__(self, run: Run, workdir: str, tb_dir: str, stop: StopRequest):
        self.run, self.workdir, self.stop = run, workdir, stop
        self.ckpt = run.checkpointer
        tb_dir = tb_dir or remembered_tb_dir(workdir)  # a resumed run keeps its directory
        if jax.process_index() == 0:
            claim_logdir(workdir, tb_dir)  # two runs of one name in a shared tb_dir: refused
            remember_tb_dir(workdir, tb_dir)
        self.logdir = run_logdir(workdir, tb_dir)
        self.tb_root = tb_dir or self.logdir
        self.eval_fn = make_eval_step(run.ctx)

    def _first_logged(self) -> int:
        """The first step past this session's start: TensorBoard drops what an earlier session
        logged from there on (`Summary`'s `start`). The start step itself is kept: a resumed
        run's was logged by the session that saved it, and step 0 holds the run's hparams
        (lm.train.hparams), which TensorBoard reads before this session's events."""
        return self.start + 1

    def _start_logs(self) -> Meter:
        """Opens TensorBoard, logs the model, and returns the train metrics' meter."""
        self.tb = Summary(self.logdir, self._first_logged())
        log_model(self.run, self.tb, self.tb_root, self.start)
        spikes = LossSpikeGuard(self.run.config.train.max_loss_ratio, self.ckpt)
        return Meter(self.run, self.tb, self.start, self.ckpt.steps, spikes)

    def _flush_logs(self) -> None:
        self.tb.flush()

    def _close_logs(self) -> None:
        self.tb.flush()
        self.tb.close()

    def _write_results(self, step: int) -> None:
        c = self.run.config
        tokens_per_sec = self.meter.median_tokens_per_sec()
        write_results(
            self.workdir,
            step,
            self.last_eval,
            tokens_per_sec,
            c,
            heldout=self.heldout,
            origin=self._origin(step),
        )

    def _sessions(self, step: int) -> list[dict]:
        """Which steps of the run each session trained, at `step` (`sessions_through`)."""
        return provenance.sessions_through(self.prior, self.start, step, self.by)

    def _origin(self, step: int) -> dict:
        """results.json's provenance at `step` (`results_record`)."""
        return provenance.results_record(self._sessions(step), step, self.by)

    def train(self) -> dict:
        c = self.run.config
        self.start, self.state = self.run.step, self.run.state
        self.by = provenance.trained_by()  # this session's: its steps are saved by it
        self.prior = (self.run.meta or {}).get(provenance.SESSIONS) if self.start else []
        self.meter = self._start_logs()
        logging.info('%s', provenance.log_line(self.by))
        if note := provenance.resumed_note(self.prior, self.start, c.train.steps, self.by):
            logging.warning('%s', note)
        first = self.start in (0, c.uptrain.source_step)  # a new run, or a converted one
        # A new run's step-0 score (~ the vocabulary size in perplexity) is logged under its
        # own tags, so it does not set the y-range of the eval charts that compare runs; a
        # converted run's is its conversion's score, always taken.
        prefix = 'eval_init' if self.start == 0 else 'eval'
        step, self.last_eval, self.heldout = self.start, {}, {}
        owed = not first and self._eval_owed()
        try:
            if (first and (c.eval_at_start or prefix == 'eval')) or owed:
                self.last_eval = self._evaluate(self.start, prefix)
            self.meter.restart()  # the first window times steps only
            step = self._steps()
            if step == c.train.steps and HELDOUT in self.run.corpus.tokens:  # lm.data.parts
                self.heldout = self._evaluate(step, HELDOUT, HELDOUT)
        except Interrupted as e:  # in the first evaluation: nothing trained, nothing to save
            logging.warning('%s during the first evaluation: nothing trained, nothing saved', e)
        finally:
            self.meter.bar.close()
            self.ckpt.wait()  # `Run.close` closes it
            self._close_logs()
        finished = step == c.train.steps and (step > self.start or first or owed)
        if finished and not self.stop.signum and jax.process_index() == 0:
            self._write_results(step)
        return {
            'step': step,
            'eval': self.last_eval,
            'heldout': self.heldout,
            'signal': self.stop.signum,
            'state': self.state,
        }

    def _eval_owed(self) -> bool:
        """Whether a resumed run owes the evaluation of its start step: a signal cut it short
        (the checkpoint says so), or, at the last step, results.json was not written for it (a
        stop during the final evaluation, or a kill between the last save and the results)."""
        if self.start == self.run.config.train.steps:
            return results_step(self.workdir) != self.start
        return bool((self.run.meta or {}).get(EVAL_CUT))

    def _steps(self) -> int:
        """Runs the calls from the start to `train.steps` (or a stop signal); returns the step."""
        c, ctx = self.run.config, self.run.ctx
        compiled = _StepCache(self.run, self.meter)
        every = (c.log_every, c.eval_every, c.checkpoint_every)
        sizes = list(call_sizes(self.start, c.train.steps, c.train.steps_per_call, every))
        step = self.start
        for batch in _prefetch(self.run, self.start, sizes):
            n = call_steps(ctx, batch)
            self.state, metrics = compiled(n)(self.state, device_call_batch(ctx, batch))
            step += n
            self.meter.record(step, n, metrics)
            self.ckpt.check()  # an asynchronous save that failed ends the run here
            if self._boundary(step):
                break
        self.meter.drain()
        return step

    def _boundary(self, step: int) -> bool:
        """Logs, checkpoints and evaluates when `step` is due; True when a signal ends the run."""
        c = self.run.config
        due = {
            name: step % every == 0 or step == c.train.steps
            for name, every in (
                ('log', c.log_every),
                ('eval', c.eval_every),
                ('ckpt', c.checkpoint_every),
            )
        }
        if not (any(due.values()) or self.stop.signum):
            return False
        jax.block_until_ready(self.state['step'])
        self.meter.drain()
        if due['log']:
            self.meter.log()
        cut = due['eval']  # until its evaluation completes: a resumed run then repeats it
        if due['eval'] and not self.stop.signum:  # before the save, which flushes it too
            try:
                self.last_eval = self._evaluate(step)
                cut = False
            except Interrupted:  # the step is complete: saved below, then the run ends
                pass
        if due['ckpt'] or self.stop.signum:
            self._save(step, cut)
        if due['eval'] or due['ckpt']:
            self.meter.restart()
        if self.stop.signum:
            name = signal.Signals(self.stop.signum).name
            logging.warning('%s at step %d: checkpoint saved, exiting', name, step)
        return bool(self.stop.signum)

    def _evaluate(self, step: int, prefix: str = 'eval', split: str = 'validation') -> dict:
        run, c = self.run, self.run.config
        metrics = evaluate(
            self.eval_fn,
            self.state['params'],
            run.corpus,
            split,
            batch_size=eval_batch_size(c),
            seq_len=c.data.seq_len,
            eval_tokens=c.eval_tokens,
            batch_sharding=run.ctx.batch_sharding,
            stop=self.stop.check,
        )
        self.tb.scalars(step, {f'{prefix}/{k}': v for k, v in metrics.items()})
        if 'recall_accuracy' in metrics:
            logging.info(
                'eval at step %d: loss %.4f on %d answer tokens, recall accuracy %.4f',
                step,
                metrics['loss'],
                metrics['tokens'],
                metrics['recall_accuracy'],
            )
            return metrics
        logging.info(
            'eval at step %d: loss %.4f ± %.4f (stderr over windows, %d tokens), '
            'perplexity %.3f, %.4f bits/byte',
            step,
            metrics['loss'],
            metrics['loss_stderr'],
            metrics['tokens'],
            metrics['perplexity'],
            metrics['bits_per_byte'],
        )
        return metrics

    def _save(self, step: int, eval_cut: bool = False) -> None:
        run = self.run
        meta = checkpoint_meta(
            run.config,
            run.corpus.fingerprint,
            step,
            run.ctx.abstract_state['params'],
            self.workdir,
        )
        meta[provenance.SESSIONS] = self._sessions(step)
        if eval_cut:
            meta[EVAL_CUT] = True
        # The curve up to a checkpoint survives a kill -9: flushed before the save starts, as
        # an asynchronous save may publish the checkpoint before this thread runs again.
        self._flush_logs()
        self.ckpt.save(step, self.state, meta)
