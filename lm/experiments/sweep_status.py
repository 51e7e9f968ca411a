"""Where a sweep's runs stand (scripts/sweep.py --status): read from their files only, so it is
safe beside the sweep running."""

from __future__ import annotations

import datetime
import os

from lm.experiments import runner
from lm.experiments.runner import Spec
from lm.experiments.sweep import PROGRESS
from lm.train.checkpoint import saved_steps
from lm.train.workdir import RUN_LOG, read_json_object

SHOWN = ('loss', 'recall_accuracy')  # the final evaluation's values `progress` prints


def last_eval(workdir: str, steps: int) -> str:
    """'last eval at step N' from a sweep run's train.log (absl lines, 'I1127 14:52:26.93 ...')
    and, from the last two evaluations' times, the minutes left to `steps` at that rate; or
    'no eval yet'."""
    evals = []  # (time, step) of each evaluation line
    path = os.path.join(workdir, RUN_LOG)
    if os.path.exists(path):
        with open(path, errors='replace') as f:
            for line in f:
                if PROGRESS[0] in line:
                    step = int(line.split(PROGRESS[0], 1)[1].split(':')[0])
                    evals.append((_log_time(line), step))
    if not evals:
        return 'no eval yet'
    text = f'last eval at step {evals[-1][1]}'
    (t0, s0), (t1, s1) = evals[-2:] if len(evals) > 1 else (evals[0], evals[0])
    if t0 is not None and t1 is not None and s1 > s0 and t1 > t0:
        per_step = (t1 - t0).total_seconds() / (s1 - s0)
        text += f' (~{per_step * (steps - s1) / 60:.0f} min left at its last rate)'
    return text


def _log_time(line: str) -> datetime.datetime | None:
    """The time of an absl log line ('I1127 14:52:26.934585 ...'; no year), None if it has none."""
    try:
        return datetime.datetime.strptime(' '.join(line[1:].split()[:2]), '%m%d %H:%M:%S.%f')
    except ValueError:
        return None


def _finished_otherwise(spec: Spec, result: dict) -> tuple[str, str]:
    """(state, line) of a run that finished under another fingerprint than `spec`'s: one a
    re-run resumes (only resumable keys changed), or one with other settings it refuses."""
    if 'fingerprint' not in result:
        return 'with other settings', f'{spec.name}: finished with no settings recorded'
    if fixed := runner.changes(result['fingerprint'], spec):
        more = f' (and {len(fixed) - 1} more)' if len(fixed) > 1 else ''
        line = f'{spec.name}: finished with other settings: {fixed[0]}{more}; a re-run refuses it'
        return 'with other settings', line
    moved = '; '.join(runner.changes(result['fingerprint'], spec, resumable=True))
    step = result['step']
    if step > spec.fingerprint.get('train.steps', step):  # `runner.check` refuses it
        line = f"{spec.name}: finished at step {step}, past the plan's train.steps; a re-run "
        return 'with other settings', line + 'refuses it'
    return 'to resume', f'{spec.name}: finished at step {step}; a re-run resumes it ({moved})'


def _split_step(spec: Spec, workdir: str) -> int | None:
    """The step of an ensemble member's run that its ensemble's split wrote (a checkpoint and
    the run's results.json at the plan's steps) but the sweep has not recorded yet (stopped
    between members: one split writes this member and the later ones); else None."""
    if not spec.needs or runner.read_result(workdir) is not None:
        return None
    path, saved = os.path.join(workdir, 'results.json'), saved_steps(workdir)
    if not os.path.exists(path) or not saved:
        return None
    step = read_json_object(path).get('step')
    return step if step == spec.fingerprint['train.steps'] == saved[-1] else None


def _started_otherwise(spec: Spec, workdir: str) -> list[str]:
    """The settings a started, unfinished run was made with that differ from `spec`'s, which a
    re-run refuses (`runner.check`); [] when none, or when it is not started."""
    path = os.path.join(workdir, runner.STARTED)
    if not (spec.resume and os.path.exists(path)):
        return []
    started = read_json_object(path)
    if 'fingerprint' not in started:
        return ['no fingerprint recorded']
    return runner.changes(started['fingerprint'], spec)


def progress(specs: list[Spec], sweep_dir: str) -> list[str]:
    """Where each planned run stands, one line each, then a count; reads files only (safe
    beside a running sweep): finished (its final evaluation; an ensemble member split but not
    yet recorded), finished under settings a re-run resumes it to (more train.steps, ...),
    finished or started with other settings than the plan's (a re-run refuses it), started (its
    last evaluation and checkpoint) or not started."""
    states = ('finished', 'to resume', 'with other settings', 'started', 'not started')
    lines, counts = [], dict.fromkeys(states, 0)
    for spec in specs:
        wd, steps = runner.workdir(sweep_dir, spec), spec.fingerprint['train.steps']
        result = runner.read_result(wd)
        if result is not None and runner.cached(spec, wd) is not None:
            counts['finished'] += 1
            final = result.get('eval', {})  # an ensemble's run: its members' runs show it
            metrics = ', '.join(
                f'{k.replace("_", " ")} {final[k]:.4f}' for k in SHOWN if k in final
            )
            shown = f'eval {metrics}' if metrics else "its members' runs hold its evaluations"
            lines.append(f'{spec.name}: finished at step {result["step"]}: {shown}')
        elif spec.served is not None and spec.served(sweep_dir):
            counts['finished'] += 1
            lines.append(f'{spec.name}: not needed: the runs it makes finished earlier')
        elif result is not None:
            state, line = _finished_otherwise(spec, result)
            counts[state] += 1
            lines.append(line)
        elif (split := _split_step(spec, wd)) is not None:
            counts['finished'] += 1
            split_line = f'split from its ensemble at step {split}; a re-run records it'
            lines.append(f'{spec.name}: {split_line}')
        elif fixed := _started_otherwise(spec, wd):
            counts['with other settings'] += 1
            more = f' (and {len(fixed) - 1} more)' if len(fixed) > 1 else ''
            lines.append(
                f'{spec.name}: started with other settings: {fixed[0]}{more}; a re-run refuses it'
            )
        elif os.path.exists(os.path.join(wd, runner.STARTED)):
            counts['started'] += 1
            saved = saved_steps(wd)
            at = f'checkpoint at step {saved[-1]}' if saved else 'no checkpoint yet'
            if saved and saved[-1] > steps:  # resumed for longer elsewhere, then stopped
                where = f"{at}, past the plan's {steps} steps"
            else:
                where = f'{last_eval(wd, steps)}, {at}, of {steps} steps'
            lines.append(f'{spec.name}: started: {where}')
        else:
            counts['not started'] += 1
            lines.append(f'{spec.name}: not started')
    tally = ', '.join(f'{n} {state}' for state, n in counts.items())
    return [*lines, f'{len(specs)} runs in {sweep_dir}: {tally}']
