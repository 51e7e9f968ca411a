"""An ensemble's run (`lm.train.ensemble`): its training loop, with TensorBoard, metrics and
results per member, and `split_member`, which writes one member out as an ordinary run.

Layout of an ensemble's workdir: `checkpoints/` holds the whole stacked state (each array
[K, ...]) under the ensemble's config; the TensorBoard run of member i (seed s = seed + i) is
`<logdir>/seed_<s>`, where `<logdir>` is the single run's (`run_logdir`), so the members
overlay as runs of their own; `results.json` lists each member's final evaluation.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from lm.train.checkpoint import Checkpointer, saved_steps
from lm.train.ensemble import member_config, member_seeds, member_tree
from lm.train.evaluation import eval_batch_size, evaluate_members
from lm.train.loop import _Training
from lm.train.loss_spike import LossSpikeGuard
from lm.train.provenance import SESSIONS
from lm.train.run import Run, assemble
from lm.train.run_log import Meter, log_model, write_results
from lm.train.stored import checkpoint_meta, stored_config
from lm.train.summary import Summary
from lm.train.workdir import (
    RunError,
    check_apart,
    check_run_dir,
    read_json_object,
    safe_name,
)


def member_logdir(logdir: str, seed: int) -> str:
    """The TensorBoard run of the member of seed `seed` in an ensemble's `logdir`."""
    return os.path.join(logdir, f'seed_{seed}')


class MemberMeters:
    """`Meter`'s interface over an ensemble: each call's metrics ([K] or [K, N] per name)
    fetched once, one call late, and handed to each member's own Meter (its TensorBoard run,
    its loss-spike guard, whose errors then name the member's seed); the first member's shows
    the progress bar and the log line."""

    def __init__(self, meters: list[Meter], seeds: list[int]):
        self.meters, self.seeds, self.pending = meters, seeds, []

    @property
    def bar(self):
        return self.meters[0].bar

    def restart(self) -> None:
        for m in self.meters:
            m.restart()

    def exclude(self, seconds: float) -> None:
        for m in self.meters:
            m.exclude(seconds)

    def record(self, step: int, n: int, metrics: dict) -> None:
        """Queues the metrics of a call of `n` steps ending at `step` (fetched next call)."""
        self.drain()
        self.pending.append((step, n, metrics))

    def drain(self) -> None:
        """Fetches queued metrics once and hands each member's part to its meter (which checks
        and logs it at once: every call is drained before a log line or a restart)."""
        while self.pending:
            step, n, fetched = self.pending.pop(0)
            fetched = jax.device_get(fetched)
            for i, m in enumerate(self.meters):
                m.record(step, n, member_tree(fetched, i))
                try:
                    m.drain()
                except FloatingPointError as e:  # a non-finite loss or a spike: whose
                    raise FloatingPointError(f'member seed {self.seeds[i]}: {e}') from None

    def log(self) -> None:
        for m in self.meters:
            m.log()

    def median_tokens_per_sec(self) -> float | None:
        """The first member's (each member's tokens over the ensemble's wall time)."""
        return self.meters[0].median_tokens_per_sec()


class EnsembleTraining(_Training):
    """`_Training` of an ensemble: one TensorBoard run, meter and evaluation per member."""

    def _start_logs(self) -> MemberMeters:
        c = self.run.config
        self.seeds = member_seeds(c)
        self.tbs, meters = [], []
        for i, seed in enumerate(self.seeds):
            tb = Summary(member_logdir(self.logdir, seed), self._first_logged())
            member = dataclasses.replace(self.run, config=member_config(c, i))
            log_model(member, tb, self.tb_root, self.start, log=i == 0)
            spikes = LossSpikeGuard(c.train.max_loss_ratio, self.ckpt)
            who = f'seed {seed} (member 1 of {len(self.seeds)}; tok/s its own)'
            meters.append(
                Meter(member, tb, self.start, self.ckpt.steps, spikes, verbose=i == 0, who=who)
            )
            self.tbs.append(tb)
        logging.info(
            'ensemble of %d members (seeds %s), each the model above', len(self.seeds), self.seeds
        )
        return MemberMeters(meters, self.seeds)

    def _flush_logs(self) -> None:
        for tb in self.tbs:
            tb.flush()

    def _close_logs(self) -> None:
        for tb in self.tbs:
            tb.flush()
            tb.close()

    def _write_results(self, step: int) -> None:
        c = self.run.config
        tokens_per_sec = self.meter.median_tokens_per_sec()
        members = self.last_eval or [{}] * len(self.seeds)
        members = [{'seed': s, 'eval': e} for s, e in zip(self.seeds, members, strict=True)]
        write_results(
            self.workdir,
            step,
            members,
            tokens_per_sec,
            c,
            key='members',
            origin=self._origin(step),
        )

    def _evaluate(self, step: int, prefix: str = 'eval', split: str = 'validation') -> list:
        """Each member's `evaluate` metrics, in one pass; logged to its own run."""
        run, c = self.run, self.run.config
        per_member = evaluate_members(
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
        for tb, metrics in zip(self.tbs, per_member, strict=True):
            tb.scalars(step, {f'{prefix}/{k}': v for k, v in metrics.items()})
        losses_K = np.array([m['loss'] for m in per_member])
        logging.info(
            'eval at step %d: loss of %d members %.4f (min %.4f, max %.4f, sd %.4f), %d tokens',
            step,
            len(losses_K),
            losses_K.mean(),
            losses_K.min(),
            losses_K.max(),
            losses_K.std(ddof=1) if len(losses_K) > 1 else 0.0,
            per_member[0]['tokens'],
        )
        return per_member


def split_member(workdir: str, member: int, out: str, step: int | None = None) -> str:
    """Writes member `member` of the ensemble in `workdir` (its checkpoint `step`, default the
    newest) to `out` as an ordinary run: its config (`member_config`: ensemble off, seed + i)
    and a checkpoint of its params, optimizer state, step and RNG, with a results.json when
    the ensemble's has its evaluation. generate, export and eval.py then read `out` as any run
    (and train.py resumes it as the single run). Returns `out`."""
    return split_members(workdir, {member: out}, step)[0]


def split_members(
    workdir: str,
    outs: dict[int, str],
    step: int | None = None,
    stop: Callable[[], None] = lambda: None,
    done: Callable[[int, str], None] = lambda member, out: None,
) -> list[str]:
    """`split_member` for each member `m` of `outs` to `outs[m]`, the ensemble restored once.
    Every `outs` directory is checked before any array is read: one already holding that
    member at that step (a split cut short, run again) is left as it is; one holding another
    run is refused. Each member's checkpoint is saved whole or not at all; `stop()` runs
    before each (a stop request ends the split between members), `done(member, out)` after."""
    config = stored_config(workdir, step=step)
    if not config.train.ensemble:
        raise RunError(f'--workdir: {workdir} is not an ensemble (config.train.ensemble=0)')
    step = saved_steps(workdir)[-1] if step is None else step
    todo = {m: out for m, out in outs.items() if not _split_already(out, config, m, step)}
    with assemble(workdir, state='restore', step=step) as run:
        for member, out in outs.items():
            if member in todo:
                stop()
                single = member_run(run, member, out)
                os.makedirs(out, exist_ok=True)
                ckpt = Checkpointer(out, keep=1, async_save=False)
                try:
                    ckpt.save(single.step, single.state, single.meta)
                finally:
                    ckpt.close()
            _split_results(workdir, member, out, step, member_config(config, member))
            done(member, out)
    return list(outs.values())


def split_request(
    workdir: str, out_dir: str, given: list[str], seeds: list[int], name: str = 'seed_{seed}'
) -> dict[int, str]:
    """{member: its directory <out_dir>/<name>} for the members asked for (`given` as typed,
    each once, in 0..k-1; default all), `name` filled in by `member_names`; each directory must
    lie outside `workdir` and not hold it. One-line errors, before anything is read."""
    k = len(seeds)
    if bad := [m for m in given if not m.isdigit() or int(m) >= k]:
        raise ValueError(f'--members: {bad} are not member indices 0..{k - 1}')
    if len({int(m) for m in given}) < len(given):
        raise ValueError(f'--members: {",".join(given)} names a member twice')
    asked = [int(m) for m in given] or list(range(k))
    names = member_names(name, seeds, asked)
    outs = {m: os.path.join(out_dir, names[m]) for m in asked}
    for m, out in outs.items():
        check_apart(out, f'--out_dir: member {m}', workdir, 'the ensemble --workdir')
        check_run_dir(out, f"member {m}'s directory")
    return outs


def member_names(
    template: str, seeds: list[int], asked: list[int], flag: str = '--name'
) -> list[str]:
    """Each member's directory name: `template` with {seed} (its seed) and {member} (its index)
    filled in; one-line errors for a template that names no field, names another, or makes a
    name unfit for a directory (`safe_name`) or two `asked` members' names the same."""
    try:
        names = [template.format(seed=s, member=m) for m, s in enumerate(seeds)]
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f'{flag}: {template!r} may hold only {{seed}} and {{member}} ({type(e).__name__}: {e})'
        ) from None
    for name in names:
        safe_name(name, flag)
    if len({names[m] for m in asked}) < len(asked):
        raise ValueError(
            f'{flag}: {template!r} gives two members one name: use {{seed}} or {{member}}'
        )
    return names


def _split_already(out: str, config, member: int, step: int) -> bool:
    """Whether `out` holds member `member` of `config`'s ensemble at `step` already (a split
    stopped after it); a one-line error when it holds another run."""
    saved = saved_steps(out)
    if not saved:
        return False
    if saved == [step] and stored_config(out).seed == config.seed + member:
        return True
    raise RunError(f'--out_dir: {out} already holds a run')


def member_run(run: Run, member: int, workdir: str | None = None) -> Run:
    """Member `member` of the restored ensemble `run` as the single run it is (`member_config`):
    that run's context on the same devices, its state in that context's shardings, and the
    checkpoint side-car its own run would save (in `workdir`, when it is to be written)."""
    config = member_config(run.config, member)
    single = assemble(config)
    state = jax.tree.map(
        lambda x, s: jax.device_put(x[member], s), run.state, single.ctx.state_sharding
    )
    abstract = single.ctx.abstract_state['params']
    meta = checkpoint_meta(config, run.meta['data_fingerprint'], run.step, abstract, workdir)
    if SESSIONS in run.meta:  # the ensemble's steps were its members'
        meta[SESSIONS] = run.meta[SESSIONS]
    return dataclasses.replace(single, step=run.step, state=state, meta=meta)


def _split_results(workdir: str, member: int, out: str, step: int, config) -> None:
    """The member's results.json, when the ensemble's was written at `step`."""
    path = os.path.join(workdir, 'results.json')
    if not os.path.isfile(path):
        return
    results = read_json_object(path)
    if results.get('step') != step:
        return
    entry = results['members'][member]
    # the ensemble's provenance, not this process's (none in an older ensemble's: unknown)
    origin = {k: results[k] for k in ('trained_by', 'evaluated_by', SESSIONS) if k in results}
    write_results(out, step, entry['eval'], results['tokens_per_sec'], config, origin=origin)
