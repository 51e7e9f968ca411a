"""What a run records besides checkpoints: train metrics and throughput (`Meter`), the model
and its HParams (`log_model`, lm.train.hparams), and `results.json` of a finished run
(`write_results`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

from lm.data.windows import num_windows
from lm.model import accounting, attention
from lm.train import perf, provenance
from lm.train.hparams import hparam_values
from lm.train.identity import config_fingerprint
from lm.train.loss_spike import LossSpikeGuard
from lm.train.run import Run
from lm.train.summary import Summary


class Meter:
    """Train metrics and throughput: queues each call's metrics and fetches them one call late
    (`drain`: checked, one TensorBoard point per step, progress bar), and times the steps
    since the last `restart` for the periodic log line (`log`). Not `verbose` (an ensemble's
    members but the first): no progress bar and no log line, TensorBoard only. `who`: whose
    values the log line shows, said after the step (an ensemble's first member)."""

    def __init__(
        self,
        run: Run,
        tb: Summary,
        start: int,
        checkpoints: Callable,
        spikes: LossSpikeGuard,
        verbose: bool = True,
        who: str = '',
    ):
        c = run.config
        self.tb, self.total, self.checkpoints = tb, c.train.steps, checkpoints
        self.spikes = spikes
        self.tokens_per_step = c.train.batch_size * c.data.seq_len
        # epochs = windows read / non-overlapping windows in the split (for 'random' sampling:
        # in expectation)
        self.epochs_per_step = c.train.batch_size / num_windows(
            len(run.corpus.tokens['train']), c.data.seq_len
        )
        self.flops_per_token = accounting.flops_per_token(run.model_cfg, c.data.seq_len)
        self.peak, _ = perf.peak_flops(c.train.peak_flops)
        self.warned_peak = False  # said once that the stated peak is below the achieved rate
        self.verbose, self.who = verbose, f' | {who}' if who else ''
        self.pending: list = []  # (last step of a call, its metrics on device)
        self.speeds: list[float] = []  # tokens/s of each timed window
        self.last: tuple[int, dict] = (start, {})
        self.bar = tqdm(
            total=self.total,
            initial=start,
            disable=jax.process_index() != 0 or not verbose,
            mininterval=1.0,
            unit='step',
        )
        self.restart()

    def restart(self) -> None:
        self.t, self.steps = time.perf_counter(), 0

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` (a compile) out of the current window."""
        self.t += seconds

    def record(self, step: int, n: int, metrics: dict) -> None:
        """Queues the metrics of a call of `n` steps ending at `step` (fetched next call)."""
        self.drain()
        self.pending.append((step, metrics))
        self.steps += n

    def drain(self) -> None:
        """Fetches queued metrics, checks them, logs them (one TensorBoard point per step)."""
        while self.pending:
            last, fetched = self.pending.pop(0)
            fetched = {k: np.atleast_1d(v) for k, v in jax.device_get(fetched).items()}
            n = len(fetched['loss'])
            for i in range(n):
                s, m = last - n + 1 + i, {k: float(v[i]) for k, v in fetched.items()}
                if not (np.isfinite(m['loss']) and np.isfinite(m['grad_norm'])):
                    raise FloatingPointError(
                        f'non-finite loss ({m["loss"]}) or gradient norm ({m["grad_norm"]}) at '
                        f'step {s}; stopping without saving that state (last checkpoint: '
                        f'{self.checkpoints()})'
                    )
                self.spikes.observe(s, m['loss'])
                self.tb.scalars(s, {f'train/{k}': v for k, v in m.items()})  # loss, grad_norm, lr
                self.bar.set_postfix(loss=f'{m["loss"]:.4f}', refresh=False)
                self.bar.update(1)
                self.last = (s, m)

    def log(self) -> None:
        """Step time, tokens/s and MFU of the window since the last restart, and a log line."""
        dt = (time.perf_counter() - self.t) / max(self.steps, 1)
        tps = self.tokens_per_step / dt
        if self.steps > 0:
            self.speeds.append(tps)
        utilisation = self._mfu(tps)
        s, m = self.last
        values = {
            'perf/step_time': dt,
            'perf/tokens_per_sec': tps,
            'data/tokens_seen': s * self.tokens_per_step,
            'data/epochs': s * self.epochs_per_step,
        }
        if utilisation is not None:
            values['perf/mfu'] = utilisation
        self.tb.scalars(s, values)
        self.restart()
        if not self.verbose:
            return
        logging.info(
            'step %d/%d%s | loss %.4f | grad norm %.3f | lr %.2e | %.1f ms/step | %.0f tok/s%s',
            s,
            self.total,
            self.who,
            m['loss'],
            m['grad_norm'],
            m['lr'],
            dt * 1e3,
            tps,
            '' if utilisation is None else f' | MFU {utilisation:.1%}',
        )

    def _mfu(self, tokens_per_sec: float) -> float | None:
        """MFU against the stated peak (None without one); a stated peak below the achieved
        FLOP/s is wrong, said once, and no MFU is logged."""
        utilisation = perf.mfu(tokens_per_sec, self.flops_per_token, self.peak)
        if utilisation is None and self.peak > 0 and not self.warned_peak:
            self.warned_peak = True
            logging.warning(
                'MFU not logged: %.3g FLOP/s achieved exceeds the stated peak %.3g '
                '(config.train.peak_flops is per device)',
                tokens_per_sec * self.flops_per_token,
                self.peak,
            )
        return utilisation

    def median_tokens_per_sec(self) -> float | None:
        return float(np.median(self.speeds)) if self.speeds else None


def log_model(run: Run, tb: Summary, tb_root: str, start: int, log: bool = True) -> None:
    """The run's config (at `start`, the step this session starts from: one per session, as a
    resumed one may change train.steps and the like) and HParams (in the TensorBoard directory
    `tb_root`) to TensorBoard; with `log`, model size, FLOPs and peak to the log (an ensemble
    logs them once)."""
    c, cfg = run.config, run.model_cfg
    counts = accounting.param_counts(cfg)
    peak_total, peak_source = perf.peak_flops(c.train.peak_flops)
    tb.text('config', '```\n' + shown_config(c).to_json(indent=2) + '\n```', start)
    tb.hparams(hparam_values(c, cfg, counts['total']), tb_root)
    if not log:
        return
    logging.info(
        'model: %s params (%s), %.3g FLOPs/token; on %d devices, mesh %s; %s',
        f'{counts["total"]:,}',
        ', '.join(f'{k} {v:,}' for k, v in counts.items() if k != 'total'),
        accounting.flops_per_token(cfg, c.data.seq_len),
        jax.device_count(),
        ' x '.join(f'{name}={size}' for name, size in run.mesh.shape.items()),
        f'peak {peak_total:.3g} FLOP/s ({peak_source})' if peak_total else peak_source,
    )


def shown_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`c` as TensorBoard shows it: without the `config.model` sections of variants other than
    the active one (an MHA run shows no MLA key)."""
    shown = ml_collections.ConfigDict(c.to_dict())
    for name in attention.inactive_sections(c.model.attention):
        if name in shown.model:
            del shown.model[name]
    return shown


def write_results(
    workdir: str,
    step: int,
    last_eval: dict,
    tokens_per_sec: float | None,
    config: ml_collections.ConfigDict,
    key: str = 'eval',
    heldout: dict | None = None,
    origin: dict | None = None,
) -> None:
    """`<workdir>/results.json` of a finished run: its last step, final eval metrics under `key`
    (an ensemble: 'members', a list of {seed, eval}), a run on a part's final held-out metrics
    (`heldout`, lm.data.parts: its reported score), median training throughput, config
    fingerprint (sweeps read it, and skip runs that have one) and what trained it (`origin`:
    `lm.train.provenance.results_record`'s keys; by default this process as 'trained_by'; {}
    leaves it out as unknown); written atomically."""
    results = {
        'step': step,
        key: last_eval,
        **({'heldout': heldout} if heldout else {}),
        'tokens_per_sec': tokens_per_sec,
        'config_fingerprint': config_fingerprint(config),
        **({'trained_by': provenance.trained_by()} if origin is None else origin),
    }
    path = os.path.join(workdir, 'results.json')
    with open(path + '.tmp', 'w') as f:
        json.dump(results, f, indent=1)
    os.replace(path + '.tmp', path)
