"""One runner for every experiment: a plan is a list of `Spec`s, one per run, run into one
out_dir with one cache, one resume rule and one fingerprint check (sweeps: lm.experiments.sweep;
the uptraining ablation: lm.experiments.ablation).

A run lives in <out_dir>/<name>: `run.json` holds its fingerprint from the moment it starts,
`result.json` its result with the fingerprint once it finished (written last, atomically, so a
run stopped half-way, `RunStopped`, caches nothing). Repeating a plan skips every run whose
cached fingerprint equals its spec's, re-runs one whose fingerprint changed only in keys its spec
calls resumable (e.g. more `train.steps`: the run goes on from its checkpoint), and refuses, in
one line before any run, an out_dir holding a run made with other settings. Runs of one lane run
in order (a run may need an earlier run of its lane, e.g. a conversion its source); lanes run
side by side.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lm.train.checkpoint import saved_steps
from lm.train.interrupt import StopRequest
from lm.train.workdir import STARTED, read_json_object, safe_name

RESULT = 'result.json'  # a finished run's result and fingerprint
SUPERSEDED = 'result.superseded.json'  # the result of a run since resumed with other settings


class RunFailed(RuntimeError):
    """A run that failed on its own: the plan goes on, and the run's line says why."""


class RunStopped(RuntimeError):
    """A run stopped before it finished (e.g. by SIGTERM): nothing is cached and the plan stops."""


_CHILDREN: set[subprocess.Popen] = set()  # the runs' processes (`call`), for `StopRuns`
_CHILDREN_LOCK = threading.Lock()


class StopRuns(StopRequest):
    """A StopRequest for a plan: SIGTERM / SIGINT also reach the runs' own processes (`call`),
    whose training saves its latest completed step, and no further run starts."""

    def _handle(self, signum, frame, passed_on: bool = False) -> None:
        super()._handle(signum, frame, passed_on)
        with _CHILDREN_LOCK:
            for proc in _CHILDREN:
                proc.send_signal(signum)


def call(argv: list[str], log, echo: Callable[[str], None] | None = None) -> int:
    """Runs `argv` (output to the open file `log`) to its end and returns its exit status; a
    `StopRuns` signal is passed on to it. `echo`: also called with each line of its output."""
    out = {'stdout': subprocess.PIPE, 'text': True} if echo else {'stdout': log}
    with _CHILDREN_LOCK:
        proc = subprocess.Popen(argv, stderr=subprocess.STDOUT, **out)
        _CHILDREN.add(proc)
    try:
        for line in iter(proc.stdout.readline, '') if echo else ():  # as each line comes
            log.write(line)
            log.flush()
            echo(line)
        return proc.wait()
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)


def stopped_by(code: int) -> str | None:
    """'SIGTERM' / 'SIGINT' for the exit status of a process that such a signal stopped."""
    for s in (signal.SIGTERM, signal.SIGINT):
        if code in (128 + s, -s):
            return s.name
    return None


def _never(key: str) -> bool:
    return False


def arm_and_seed(name: str) -> tuple[str, int]:
    """(arm, seed) of a run named <arm>_s<seed> (a point run on several seeds); any other name is
    seed 0 of its own arm."""
    match = re.fullmatch(r'(.+)_s(\d+)', name)
    return (match[1], int(match[2])) if match else (name, 0)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A run: `run(workdir)` does it and returns its result (JSON-serialisable; raises
    `RunFailed` to fail alone). `fingerprint` is every input its result depends on ({key: JSON
    value}); `arm` and `seed` are what summaries group and pair it by."""

    name: str  # its directory under out_dir
    fingerprint: Mapping[str, Any]
    run: Callable[[str], dict]
    arm: Hashable = None
    seed: int = 0
    needs: tuple[str, ...] = ()  # runs of its lane that must have finished before it starts
    lane: str = ''  # '' = a lane of its own
    resume: bool = True  # an unfinished run goes on in its workdir; False: starts clean
    resumable: Callable[[str], bool] = _never  # fingerprint keys that may change: re-run
    # fingerprint keys added since runs were recorded -> the value a record lacking one had
    added: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # out_dir -> whether the run is no longer needed (an ensemble whose members' runs finished)
    served: Callable[[str], bool] | None = None

    @property
    def lane_name(self) -> str:
        return self.lane or self.name


def fingerprint(spec: Spec) -> dict[str, Any]:
    """`spec.fingerprint` as JSON gives it back (tuples become lists), as it is stored."""
    return json.loads(json.dumps(dict(spec.fingerprint)))


def workdir(out_dir: str, spec: Spec) -> str:
    return os.path.join(out_dir, spec.name)


def _read(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    return read_json_object(path)


def _write(path: str, data: dict) -> None:
    """Atomically: lanes in other processes may read it meanwhile."""
    with open(path + '.tmp', 'w') as f:
        json.dump(data, f)
    os.replace(path + '.tmp', path)


def read_result(run_dir: str) -> dict | None:
    """A finished run's result.json (its result and 'fingerprint'), None if it has none."""
    return _read(os.path.join(run_dir, RESULT))


def recorded(saved: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    """A run's `saved` fingerprint with the keys `spec.added` that it lacks set to their values
    (a run recorded by code older than those keys)."""
    now = fingerprint(spec)
    added = json.loads(json.dumps({k: v for k, v in spec.added.items() if k in now}))
    return {**{k: v for k, v in added.items() if k not in saved}, **saved}


def changes(saved: Mapping[str, Any], spec: Spec, resumable: bool = False) -> list[str]:
    """["key: 'old' -> 'new'", ...]: the fingerprint keys, outside the resumable ones (with
    `resumable`: among them), in which `spec` differs from a run's `saved` fingerprint."""
    now, saved = fingerprint(spec), recorded(saved, spec)
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key, '(absent)'), now.get(key, '(absent)')
        if a != b and bool(spec.resumable(key)) == resumable:
            out.append(f'{key}: {a!r} -> {b!r}')
    return out


def _check_plan(specs: list[Spec]) -> None:
    """Names are unique and safe (`safe_name`: each '/'-separated part of a run's name, and its
    lane's, is one directory name), and every run's needs come earlier in its lane."""
    seen: dict[str, str] = {}
    for spec in specs:
        parts = spec.name.split('/') + (spec.lane.split('/') if spec.lane else [])
        for part in parts:
            safe_name(part, f'run {spec.name!r} of the plan')
        if spec.name in seen:
            raise ValueError(f'the plan has two runs named {spec.name}')
        for need in spec.needs:
            if seen.get(need) != spec.lane_name:
                raise ValueError(f'run {spec.name} needs {need}, not an earlier run of its lane')
        seen[spec.name] = spec.lane_name


def recorded_run(run_dir: str, resume: bool = True) -> dict | None:
    """What `run_dir`'s run recorded (its 'fingerprint'): its result if it finished, else, for a
    run that may `resume`, what it recorded when it started; None if neither."""
    saved = read_result(run_dir)
    if saved is None and resume:
        saved = _read(os.path.join(run_dir, STARTED))
    return saved


def check(specs: list[Spec], out_dir: str, flag: str = '--out_dir') -> None:
    """Refuses, in one line naming the first such run and the keys, an out_dir holding runs made
    with other settings (finished, or started and resumable); deletes nothing."""
    _check_plan(specs)
    stale = []
    for spec in specs:
        saved = recorded_run(workdir(out_dir, spec), spec.resume)
        if saved is None:
            continue
        if 'fingerprint' not in saved:  # made before runs recorded one
            stale.append((spec, ['no fingerprint recorded']))
        elif diff := changes(saved['fingerprint'], spec):
            stale.append((spec, diff))
    if stale:
        spec, diff = stale[0]
        more = f' (and {len(stale) - 1} more runs)' if len(stale) > 1 else ''
        raise ValueError(
            f'{flag}: {workdir(out_dir, spec)}{more} was made with other settings: '
            f'{"; ".join(diff)}; use another {flag}, or delete those runs to redo them'
        )
    _check_not_past(specs, out_dir, flag)


def _check_not_past(specs: list[Spec], out_dir: str, flag: str) -> None:
    """Refuses a run whose checkpoint is past the plan's train.steps (a re-run with fewer
    steps): its train.py would refuse it after the runner set its result aside."""
    for spec in specs:
        if (steps := spec.fingerprint.get('train.steps')) is None:
            continue
        saved = saved_steps(workdir(out_dir, spec))
        if saved and saved[-1] > steps:
            raise ValueError(
                f'{flag}: {workdir(out_dir, spec)} holds a checkpoint at step {saved[-1]}, past '
                f"the plan's train.steps={steps}: give at least {saved[-1]} steps, or use another "
                f'{flag}'
            )


def cached(spec: Spec, run_dir: str) -> dict | None:
    """The result in `run_dir` if it finished with exactly `spec`'s fingerprint."""
    saved = read_result(run_dir)
    if saved is None or 'fingerprint' not in saved:
        return None
    return saved if recorded(saved['fingerprint'], spec) == fingerprint(spec) else None


def results(specs: list[Spec], out_dir: str) -> dict[str, dict]:
    """{name: result} of the plan's runs that finished with their spec's fingerprint."""
    found = {s.name: cached(s, workdir(out_dir, s)) for s in specs}
    return {name: r for name, r in found.items() if r is not None}


def _copy_run(src: str, dst: str) -> None:
    """Copies the finished run `src` to `dst` whole or not at all: into a hidden sibling, then
    renamed, so no reader (another lane, a later command after a kill) sees a run whose
    result.json arrived before its checkpoints."""
    staging = os.path.join(os.path.dirname(dst), f'.{os.path.basename(dst)}.copy-{os.getpid()}')
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(staging, dst)


def run_one(spec: Spec, out_dir: str, reuse: str = '') -> str:
    """Runs `spec` unless cached (or copied from `reuse`, an earlier out_dir holding it with the
    same fingerprint); returns its one-line outcome."""
    wd = workdir(out_dir, spec)
    if cached(spec, wd) is not None:
        return f'{spec.name}: finished earlier, skipped'
    if spec.served is not None and spec.served(out_dir):
        return f'{spec.name}: not needed (the runs it makes finished earlier), skipped'
    if reuse and cached(spec, earlier := workdir(reuse, spec)) is not None:
        _copy_run(earlier, wd)
        return f'{spec.name}: copied from {earlier}'
    if missing := [n for n in spec.needs if read_result(os.path.join(out_dir, n)) is None]:
        return f'{spec.name}: not run: {", ".join(missing)} did not finish'
    if not spec.resume:
        shutil.rmtree(wd, ignore_errors=True)
    elif os.path.isfile(os.path.join(wd, RESULT)):  # finished with other (resumable) settings:
        # no longer finished while it trains on; its old result is kept beside it
        os.replace(os.path.join(wd, RESULT), os.path.join(wd, SUPERSEDED))
    os.makedirs(wd, exist_ok=True)
    _write(os.path.join(wd, STARTED), {'fingerprint': fingerprint(spec)})
    print(f'{spec.name}: started in {wd}', flush=True)
    t = time.time()
    try:
        result = spec.run(wd)
    except RunFailed as e:
        return f'{spec.name}: FAILED ({e}) in {time.time() - t:.0f} s'
    _write(os.path.join(wd, RESULT), {**result, 'fingerprint': fingerprint(spec)})
    return f'{spec.name}: done in {time.time() - t:.0f} s'


def lanes(specs: list[Spec]) -> dict[str, list[Spec]]:
    """{lane: its runs in plan order}, lanes in the order they first appear."""
    out: dict[str, list[Spec]] = {}
    for spec in specs:
        out.setdefault(spec.lane_name, []).append(spec)
    return out


def _relaunch(names: list[str], out_dir: str, parallel: int, argv: Callable) -> None:
    """Runs each lane in its own process (`argv(lane)`, log <out_dir>/<lane>.log), `parallel`
    at a time; stops at the first that fails."""

    def one(lane: str) -> tuple[str, int, str]:
        log = os.path.join(out_dir, f'{lane}.log')
        with open(log, 'w') as f:
            code = call(argv(lane), f)
        return lane, code, log

    os.makedirs(out_dir, exist_ok=True)
    with ThreadPoolExecutor(parallel) as pool:
        for lane, code, log in pool.map(one, names):
            if name := stopped_by(code):
                raise RunStopped(f'{lane} stopped by {name} (its log: {log})')
            if code:
                raise SystemExit(f'{lane} failed (exit {code}); its log: {log}')
            print(f'{lane}: done (log: {log})', flush=True)


def run(
    specs: list[Spec],
    out_dir: str,
    parallel: int = 1,
    *,
    reuse: str = '',
    relaunch: Callable[[str], list[str]] | None = None,
    only_lane: str | None = None,
    flag: str = '--out_dir',
    stop: StopRequest | None = None,
) -> dict[str, dict]:
    """Checks the out_dir (`check`), runs the plan's lanes `parallel` at a time and returns
    `results`. With `relaunch` (lane -> argv of a process that runs that lane alone, with
    `only_lane`), parallel lanes run in their own processes; without it in threads (for runs that
    start their own process). Each run prints its one-line outcome. Once `stop` (a `StopRuns`)
    has a signal, no further run starts: the plan ends in `RunStopped`."""
    check(specs, out_dir, flag)
    by_lane = lanes(specs)
    if only_lane is not None:
        if only_lane not in by_lane:
            raise ValueError(f'no lane {only_lane!r} in the plan (lanes: {", ".join(by_lane)})')
        by_lane = {only_lane: by_lane[only_lane]}
    if relaunch is not None and parallel > 1 and only_lane is None:
        _relaunch(list(by_lane), out_dir, parallel, relaunch)
        return results(specs, out_dir)

    def lane(batch: list[Spec]) -> None:
        for spec in batch:
            if stop is not None and stop.signum:
                raise RunStopped(f'stopped by {signal.Signals(stop.signum).name}')
            print(run_one(spec, out_dir, reuse), flush=True)

    if relaunch is not None or parallel == 1:  # in this thread: training installs signal handlers
        for batch in by_lane.values():
            lane(batch)
    else:
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(lane, by_lane.values()))
    return results(specs, out_dir)
