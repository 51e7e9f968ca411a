"""The training loop: resume or init, steps, eval, checkpoints, TensorBoard and progress."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

from lm import accounting, perf
from lm.checkpoint import Checkpointer, check_same_shapes, param_shapes
from lm.config import ModelConfig
from lm.data import call_batch
from lm.evaluation import evaluate
from lm.experiment import Experiment, checkpoint_meta, prepare
from lm.optimizer import lr_schedule
from lm.summary import Summary, run_logdir
from lm.train_step import (
    call_sharding,
    device_call_batch,
    init_state,
    make_eval_step,
    make_train_step,
)


def call_sizes(start: int, stop: int, steps_per_call: int, every: tuple[int, ...]):
    """Steps per train-step call from `start` to `stop`: `steps_per_call` wherever that many fit
    before the next multiple of any of `every` (log, eval, checkpoint) or `stop`, single steps
    otherwise, so that every such step ends a call."""
    step = start
    while step < stop:
        boundary = min([stop] + [(step // e + 1) * e for e in every])
        n = steps_per_call if step + steps_per_call <= boundary else 1
        yield n
        step += n


def _prefetch(exp: Experiment, start: int, sizes: list[int], depth: int = 2):
    """Yields this process's numpy batch of each call (`lm.data.call_batch`) from a background
    thread."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    c = exp.config

    def produce():
        step = start
        for n in sizes:
            q.put(
                call_batch(
                    exp.corpus.tokens['train'],
                    seed=c.seed,
                    step=step,
                    steps=n,
                    batch_size=c.train.batch_size,
                    seq_len=c.data.seq_len,
                    process_index=jax.process_index(),
                    process_count=jax.process_count(),
                )
            )
            step += n

    threading.Thread(target=produce, daemon=True).start()
    for _ in sizes:
        yield q.get()


class _StopRequest:
    """Turns SIGTERM / SIGINT into a flag the loop checks between steps."""

    def __init__(self):
        self.signum = 0
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        self.signum = signum

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _restore_or_init(exp: Experiment, ckpt: Checkpointer) -> tuple[int, dict]:
    setup = exp.setup
    if not ckpt.steps():
        return 0, init_state(setup, exp.model, exp.config.seed)
    current = param_shapes(setup.abstract_state['params'])
    step, state, meta = ckpt.restore(
        setup.abstract_state,
        check_meta=lambda m: check_same_shapes(
            m['param_shapes'], current, f'the checkpoint in {ckpt.directory}'
        ),
    )
    if meta['data_fingerprint'] != exp.corpus.fingerprint:
        logging.warning('resuming on different data than the checkpoint was trained on')
    logging.info('resumed from %s at step %d', ckpt.directory, step)
    return step, state


def train(config: ml_collections.ConfigDict, workdir: str, tb_dir: str = '') -> dict:
    """Trains (or resumes) the run in `workdir`; returns the last eval metrics and end state."""
    exp = prepare(config)
    stop = _StopRequest()  # from here on, SIGTERM / SIGINT end the run at the next step boundary
    try:
        with jax.set_mesh(exp.setup.mesh):
            return _train(exp, workdir, tb_dir, stop)
    finally:
        stop.restore()


def _train(exp: Experiment, workdir: str, tb_dir: str, stop: _StopRequest) -> dict:
    c, setup = exp.config, exp.setup
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(workdir, c.keep_checkpoints, c.async_checkpointing)
    start, state = _restore_or_init(exp, ckpt)
    total = c.train.steps
    tb = Summary(run_logdir(workdir, tb_dir))
    counts = accounting.param_counts(exp.model)
    flops_tok = accounting.flops_per_token(exp.model, c.data.seq_len)
    peak_total, peak_source = perf.peak_flops(c.train.peak_flops)
    tb.text('config', '```\n' + c.to_json(indent=2) + '\n```')
    tb.hparams(_hparams(c, exp.model, counts['total']))
    logging.info(
        'model: %s params (%s), %.3g FLOPs/token; peak %.3g FLOP/s on %d devices (%s)',
        f'{counts["total"]:,}',
        ', '.join(f'{k} {v:,}' for k, v in counts.items() if k != 'total'),
        flops_tok,
        peak_total,
        jax.device_count(),
        peak_source,
    )
    step_fns: dict[int, Callable] = {}  # steps per call -> compiled train step
    eval_fn = make_eval_step(setup)
    schedule = lr_schedule(c.train)
    tokens_per_step = c.train.batch_size * c.data.seq_len
    is_main = jax.process_index() == 0

    def run_eval(step: int) -> dict:
        metrics = evaluate(
            eval_fn,
            state['params'],
            exp.corpus,
            'validation',
            batch_size=c.train.batch_size,
            seq_len=c.data.seq_len,
            num_batches=c.eval_batches,
            batch_sharding=setup.batch_sharding,
        )
        tb.scalars(step, {f'eval/{k}': v for k, v in metrics.items()})
        logging.info(
            'eval at step %d: loss %.4f, perplexity %.3f, %.4f bits/byte',
            step,
            metrics['loss'],
            metrics['perplexity'],
            metrics['bits_per_byte'],
        )
        return metrics

    def save(step: int) -> None:
        ckpt.save(
            step,
            state,
            checkpoint_meta(c, exp.corpus.fingerprint, step, setup.abstract_state['params']),
        )
        tb.flush()  # the curve up to a checkpoint survives a kill -9

    last_eval = run_eval(start) if start == 0 else {}
    pending: list = []  # (last step, metrics on device), fetched one call late
    window = {'t': time.perf_counter(), 'steps': 0}
    bar = tqdm(total=total, initial=start, disable=not is_main, mininterval=1.0, unit='step')

    def drain() -> None:
        """Fetches queued metrics, checks them, logs them (one TensorBoard point per step)."""
        while pending:
            last, fetched = pending.pop(0)
            fetched = {k: np.atleast_1d(v) for k, v in jax.device_get(fetched).items()}
            n = len(fetched['loss'])
            for i in range(n):
                s, m = last - n + 1 + i, {k: float(v[i]) for k, v in fetched.items()}
                if not (np.isfinite(m['loss']) and np.isfinite(m['grad_norm'])):
                    raise FloatingPointError(
                        f'non-finite loss ({m["loss"]}) or gradient norm ({m["grad_norm"]}) at '
                        f'step {s}; stopping without saving that state (last checkpoint: '
                        f'{ckpt.steps()})'
                    )
                tb.scalars(s, {f'train/{k}': v for k, v in m.items()})  # loss, grad_norm, lr
                bar.set_postfix(loss=f'{m["loss"]:.4f}', refresh=False)
                bar.update(1)
                window['last'] = (s, m)

    def compiled_step(n: int) -> Callable:
        """The train step taking n steps per call, compiled ahead of time on first use (its
        compile time is logged and left out of the step-time window)."""
        if n not in step_fns:
            t = time.perf_counter()
            shape = (c.train.batch_size, c.data.seq_len + 1)
            batch = jax.ShapeDtypeStruct(
                shape if n == 1 else (n, *shape), np.int32, sharding=call_sharding(setup, n)
            )
            fn = make_train_step(setup, c.train.grad_accum_steps, n, schedule)
            step_fns[n] = fn.lower(setup.abstract_state, batch).compile()
            dt = time.perf_counter() - t
            logging.info('compiled the train step (%d step(s) per call) in %.1f s', n, dt)
            window['t'] += dt
        return step_fns[n]

    def log_perf(step: int) -> None:
        dt = (time.perf_counter() - window['t']) / max(window['steps'], 1)
        tps = tokens_per_step / dt
        if window['steps'] > 0:
            speeds.append(tps)
        utilisation = perf.mfu(tps, flops_tok, peak_total)
        tb.scalars(
            step, {'perf/step_time': dt, 'perf/tokens_per_sec': tps, 'perf/mfu': utilisation}
        )
        s, m = window['last']
        logging.info(
            'step %d/%d | loss %.4f | grad norm %.3f | lr %.2e | %.1f ms/step | '
            '%.0f tok/s | MFU %.1f%%',
            s,
            total,
            m['loss'],
            m['grad_norm'],
            m['lr'],
            dt * 1e3,
            tps,
            utilisation * 100,
        )
        window.update(t=time.perf_counter(), steps=0)

    speeds: list[float] = []
    step = start
    try:
        every = (c.log_every, c.eval_every, c.checkpoint_every)
        sizes = list(call_sizes(start, total, c.train.steps_per_call, every))
        for batch in _prefetch(exp, start, sizes):
            n = 1 if batch.ndim == 2 else batch.shape[0]
            state, metrics = compiled_step(n)(state, device_call_batch(setup, batch))
            step += n
            drain()
            pending.append((step, metrics))
            window['steps'] += n
            boundary = step % c.log_every == 0 or step == total
            due_eval, due_ckpt = (
                step % c.eval_every == 0 or step == total,
                (step % c.checkpoint_every == 0 or step == total),
            )
            if boundary or due_eval or due_ckpt or stop.signum:
                jax.block_until_ready(state['step'])
                drain()
                if boundary:
                    log_perf(step)
                if due_ckpt or stop.signum:
                    save(step)
                if due_eval:
                    last_eval = run_eval(step)
                if due_eval or due_ckpt:
                    window.update(t=time.perf_counter(), steps=0)
                if stop.signum:
                    logging.warning(
                        '%s at step %d: checkpoint saved, exiting',
                        signal.Signals(stop.signum).name,
                        step,
                    )
                    break
        drain()
    finally:
        bar.close()
        ckpt.wait()
        ckpt.close()
        tb.flush()
        tb.close()
    if step == total and (step > start or start == 0) and not stop.signum and is_main:
        _write_results(
            workdir,
            {
                'step': step,
                'eval': last_eval,
                'model': dataclasses.asdict(exp.model),
                'params': counts['total'],
                'kv_cache_bytes_per_token': accounting.kv_cache_bytes_per_token(
                    exp.model, 'bfloat16'
                ),
                'tokens_per_sec': float(np.median(speeds)) if speeds else None,
            },
        )
    return {'step': step, 'eval': last_eval, 'signal': stop.signum, 'state': state}


def _write_results(workdir: str, results: dict) -> None:
    """`<workdir>/results.json`: final eval metrics, size and median throughput of a finished
    run (what sweeps summarise)."""
    path = os.path.join(workdir, 'results.json')
    with open(path + '.tmp', 'w') as f:
        json.dump(results, f, indent=1)
    os.replace(path + '.tmp', path)


def _hparams(c: ml_collections.ConfigDict, cfg: ModelConfig, num_params: int) -> dict:
    """Flat scalar hyper-parameters for TensorBoard's HParams tab: first what runs are compared
    by (attention, heads, what the KV cache holds and its size, parameters, seed, uptraining
    origin), then every model, train and data setting. Integers stay Python ints."""
    if cfg.attention == 'mla':
        kv_heads = cfg.num_heads  # MLA up-projects K/V per query head from the cached latent
        cache = f'c_KV {cfg.kv_lora_rank} + k_R {cfg.qk_rope_head_dim}'
    else:
        kv_heads = cfg.num_kv_heads
        cache = f'K,V {cfg.num_kv_heads} heads x {cfg.head_dim}'
    values = {
        'attention': cfg.attention,
        'num_heads': int(cfg.num_heads),
        'num_kv_heads': int(kv_heads),
        'kv_cache': cache,
        'kv_cache_bytes_per_token': int(accounting.kv_cache_bytes_per_token(cfg, 'bfloat16')),
        'params': int(num_params),
        'seed': int(c.seed),
        'uptrain.source': c.uptrain.source_workdir or 'none',
        'uptrain.method': c.uptrain.method or 'none',
    }
    values.update({f'model.{k}': v for k, v in dataclasses.asdict(cfg).items()})
    values.update({f'train.{k}': v for k, v in c.train.items()})
    values.update(
        {
            'data.source': c.data.source,
            'data.tokenizer': c.data.tokenizer,
            'data.seq_len': c.data.seq_len,
        }
    )
    return values
