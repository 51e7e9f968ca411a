"""A run directory: what it is (a run, a sweep) and where a run may start, its ownership, its
bookkeeping files, and the TensorBoard directory it logs to.

One run at a time owns a workdir (`WorkdirLock`: an OS file lock, so a process killed with -9
leaves nothing that blocks the next one); a resume's config is checked in `lm.train.identity`.
A name becomes a file or directory name only through `safe_name`. A tokenizer the run keeps inside
itself (an import's or an uptrained run's, in `RUN_FILES`) is saved relative to the run
(`run_relative`) and read back where the run now is (`run_resolved`), so a run can be moved.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
import socket
from typing import Any

LOCK_NAME = '.lock'
RUN_FILES = 'hf'  # <workdir>/hf: the side files a run keeps (an import's tokenizer, config.json)
RUN_TOKENIZER = os.path.join(RUN_FILES, 'tokenizer.json')  # the run's own tokenizer, if any
TB_FILE = 'tensorboard.json'  # the shared TensorBoard directory the run was trained with
SWEEP_MARK = 'match'  # the file scripts/sweep.py marks a sweep directory with (its fairness)
ABLATION_MARK = 'ablation.json'  # scripts/uptrain_ablation.py's out_dir mark (its settings)
# the kinds `directory_kind` tells
A_RUN, A_SWEEP, AN_ABLATION = 'a training run', 'a sweep directory', 'an uptrain_ablation out_dir'
STARTED = 'run.json'  # a sweep's or an ablation's run: its fingerprint, written before it starts
RUN_LOG = 'train.log'  # a sweep's run: what its train.py printed
SWEEP_CONFIG = 'sweep_config.py'  # a sweep's run: the config file its train.py reads
SPLIT_LOG = 'split.log'  # a sweep's ensemble member: what its split printed
# What a directory may hold when a new run starts in it (no checkpoints/ yet), besides hidden
# names (locks, staging): what a run writes before its first checkpoint, and what a sweep writes
# for the run it starts. Anything else is the user's or another tool's (an export, an analysis).
BEFORE_FIRST_CHECKPOINT = ('tb', TB_FILE, STARTED, RUN_LOG, SWEEP_CONFIG, SPLIT_LOG)

_UNSAFE = re.compile(r'[/\\\x00-\x1f\x7f]')  # separators and control characters


def safe_name(name: Any, what: str) -> str:
    """`name`, once it is fit to be one file or directory name inside the directory it is
    meant for: a non-empty string, not '.' or '..', without a path separator ('/' or '\\', so
    never an absolute path) or control character, not starting with '.' (hidden names are
    staging directories and locks). Else a one-line ValueError naming `what` (e.g. the sweep
    point), raised before anything is written."""
    if not isinstance(name, str) or not name:
        reason = 'a name must be a non-empty string'
    elif name in ('.', '..') or name.startswith('.'):
        reason = "a name must not be '.', '..' or start with '.'"
    elif match := _UNSAFE.search(name):
        reason = f'a name must hold no path separator or control character ({match[0]!r})'
    else:
        return name
    raise ValueError(f'{what}: {name!r} cannot name a directory: {reason}')


def check_apart(path: str, setting: str, other: str, other_name: str) -> None:
    """One-line ValueError when directory `path` is `other`, lies inside it or holds it (so
    writing one could change or remove the other); `other_name` says what `other` is."""
    mine, theirs = os.path.realpath(path), os.path.realpath(other)
    common = os.path.commonpath([mine, theirs])
    if common in (mine, theirs):
        where = 'is' if mine == theirs else 'is inside' if common == theirs else 'holds'
        raise ValueError(f'{setting}={path!r} {where} {other_name} {other!r}')


def directory_kind(path: str) -> str:
    """What directory `path` is: `A_RUN` (it holds checkpoints/), `A_SWEEP` (it holds
    `SWEEP_MARK`, written when scripts/sweep.py starts), `AN_ABLATION` (`ABLATION_MARK`, written
    when scripts/uptrain_ablation.py starts), else ''."""
    if os.path.isdir(os.path.join(path, 'checkpoints')):
        return A_RUN
    if os.path.isfile(os.path.join(path, SWEEP_MARK)):
        return A_SWEEP
    return AN_ABLATION if os.path.isfile(os.path.join(path, ABLATION_MARK)) else ''


def held_directories(path: str) -> list[tuple[str, str]]:
    """The runs and sweeps directly inside directory `path` (a folder of runs), as (name, kind)
    pairs sorted by name; [] when `path` is no directory. Hidden names are not counted: a
    conversion's, import's or export's staging directory, left by a killed one (the next one
    into that target removes it)."""
    if not os.path.isdir(path):
        return []
    names = sorted(n for n in os.listdir(path) if not n.startswith('.'))
    held = ((name, directory_kind(os.path.join(path, name))) for name in names)
    return [(name, kind) for name, kind in held if kind]


def check_replaceable(path: str, setting: str, option: str) -> None:
    """One-line ValueError when directory `path`, which `option` would replace whole, is or
    holds anywhere below it a training run or a sweep directory (`directory_kind`)."""
    for top, dirs, _ in os.walk(path):
        if kind := directory_kind(top):
            what = f'is {kind}' if top == path else f'holds {kind}, {top}'
            raise ValueError(
                f'{setting}={path!r} {what}; {option} replaces it whole and would delete it: '
                'choose another directory'
            )
        dirs.sort()


def check_train_workdir(path: str, setting: str = '--workdir') -> None:
    """One-line ValueError when `path` cannot be a run's own directory: a sweep directory, a
    directory holding runs or sweeps (a folder of runs), or a directory inside another run
    (its checkpoints/ or elsewhere: it would hold a run inside a run). Object stores
    (gs://...) pass."""
    if '://' in path:
        return
    if directory_kind(path) == A_SWEEP:
        raise ValueError(
            f'{setting}={path!r} is {A_SWEEP}, not a run; train each run in a directory of its '
            'own (a sweep trains its runs in its subdirectories)'
        )
    held = held_directories(path) if directory_kind(path) != A_RUN else []
    if held:  # a folder of runs, not a run
        name, kind = held[0]
        raise ValueError(
            f'{setting}={path!r} holds {kind}, {name}; train each run in a directory of its '
            f'own (e.g. {os.path.join(path, "NEW_RUN")})'
        )
    check_not_inside_a_run(path, setting)


def check_new_run_dir(path: str, setting: str = '--workdir') -> None:
    """One-line ValueError when a new run (no checkpoints/ in `path` yet) would start in a
    directory holding files that are not a run's (`BEFORE_FIRST_CHECKPOINT`): the user's own, an
    export or an analysis, which the run would write beside (its checkpoints, TensorBoard files)
    or over (its results.json). Object stores (gs://...) and runs pass."""
    if '://' in path or not os.path.isdir(path) or directory_kind(path) == A_RUN:
        return
    ours = BEFORE_FIRST_CHECKPOINT
    other = [n for n in sorted(os.listdir(path)) if not (n.startswith('.') or n in ours)]
    if other:
        more = f' and {len(other) - 1} more' if len(other) > 1 else ''
        raise ValueError(
            f'{setting}={path!r} is not a run (no checkpoints/) but holds {other[0]}{more}; a new '
            f'run starts in an empty directory, so that nothing there is written over: choose '
            f'another (e.g. {os.path.join(path, "run")})'
        )


def check_run_dir(path: str, setting: str = '--workdir') -> None:
    """Both checks of a directory a run is made in: it can be a run's own
    (`check_train_workdir`), and a new run there writes over nothing (`check_new_run_dir`)."""
    check_train_workdir(path, setting)
    check_new_run_dir(path, setting)


def run_above(path: str) -> str | None:
    """The training run that directory `path` lies inside (at any depth), or None."""
    parent = os.path.dirname(os.path.realpath(path))
    while parent != os.path.dirname(parent):
        if directory_kind(parent) == A_RUN:
            return parent
        parent = os.path.dirname(parent)
    return None


def check_not_inside_a_run(path: str, setting: str) -> None:
    """One-line ValueError when directory `path`, where new runs would be made (a run, a sweep
    or an ablation), lies inside a training run: its checkpoints/ or anywhere else in it."""
    if (run := run_above(path)) is None:
        return
    mine, checkpoints = os.path.realpath(path), os.path.join(run, 'checkpoints')
    where = (
        ('is' if mine == checkpoints else 'is inside') + ' the checkpoints directory of'
        if os.path.commonpath([mine, checkpoints]) == checkpoints
        else 'is inside'
    )
    raise ValueError(
        f'{setting}={path!r} {where} the run {run}; give the new run a directory of its own, '
        'outside it'
    )


def check_not_in_checkpoints(path: str, setting: str) -> None:
    """One-line ValueError for an output directory below a run's checkpoints/: it would be taken
    for an unreadable checkpoint, or deleted with one (config.keep_checkpoints)."""
    if '://' in path or (run := run_above(path)) is None:
        return
    mine, checkpoints = os.path.realpath(path), os.path.join(run, 'checkpoints')
    if mine != checkpoints and os.path.commonpath([mine, checkpoints]) == checkpoints:
        raise ValueError(
            f"{setting}={path!r} is inside the run {run}'s checkpoints/, where it would be taken "
            'for a checkpoint or deleted with one; give a path outside it'
        )


def _with_tokenizer(saved: dict, tokenizer: str) -> dict:
    return {**saved, 'data': {**saved['data'], 'tokenizer': tokenizer}}


def run_relative(saved: dict, workdir: str) -> dict:
    """A config (as JSON) to save with the run in `workdir`: a `data.tokenizer` file inside the
    run is stored relative to it ('hf/tokenizer.json'), so the run can be moved."""
    tokenizer = saved.get('data', {}).get('tokenizer', '')
    if not (tokenizer.endswith('.json') and os.path.isabs(tokenizer)):
        return saved
    run, path = os.path.realpath(workdir), os.path.realpath(tokenizer)
    if os.path.commonpath([run, path]) != run:
        return saved  # the user's own file, outside the run
    return _with_tokenizer(saved, os.path.relpath(path, run))


def run_resolved(saved: dict, workdir: str) -> dict:
    """A config saved with the run in `workdir` with its `data.tokenizer` file where it is now:
    a relative path is the run's own (`run_relative`; else, for configs saved before, relative
    to the working directory); an absolute one that no longer exists is the run's own copy
    (`RUN_TOKENIZER`) when it has one (a run imported before tokenizers were saved relative,
    then moved)."""
    tokenizer = saved.get('data', {}).get('tokenizer', '')
    if not tokenizer.endswith('.json'):
        return saved
    own = os.path.join(os.path.abspath(workdir), RUN_TOKENIZER)
    if not os.path.isabs(tokenizer):
        inside = os.path.join(os.path.abspath(workdir), tokenizer)
        found = inside if os.path.isfile(inside) or not os.path.isfile(tokenizer) else tokenizer
        return _with_tokenizer(saved, found)
    if not os.path.isfile(tokenizer) and os.path.isfile(own):
        return _with_tokenizer(saved, own)
    return saved


def check_run_files(tokenizer: str, workdir: str, flag: str = '--workdir') -> None:
    """A one-line error naming the missing tokenizer.json the run in `workdir` reads (its
    `data.tokenizer`, from `run_resolved`) and what to do."""
    if not tokenizer.endswith('.json') or os.path.isfile(tokenizer):
        return
    own = os.path.join(os.path.abspath(workdir), RUN_TOKENIZER)
    what = (
        f'the run keeps it in {RUN_FILES}/: restore the run whole (from the backup or archive it '
        'came from), or import or convert it again'
        if os.path.abspath(tokenizer) == own
        else f'put it back, or copy it into the run as {own}'
    )
    raise FileNotFoundError(
        f'{flag}={workdir}: the tokenizer {tokenizer} (config.data.tokenizer) is missing; {what}'
    )


class RunError(RuntimeError):
    """A run cannot start or go on; the message says why in one line."""


class WorkdirLock:
    """`with WorkdirLock(path):` owns `path` (created if needed) or raises RunError naming the
    owner's pid and host. Only `owner=True` processes lock (process 0 of a multi-host run; the
    others share its workdir). A directory this lock created and left empty is removed again."""

    def __init__(self, path: str, flag: str = '--workdir', owner: bool = True):
        self.path, self.flag, self.owner = os.path.abspath(path), flag, owner
        self._fd: int | None = None
        self._made_dir = self._made_file = False

    def __enter__(self) -> WorkdirLock:
        if self.owner:
            self._acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _acquire(self) -> None:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f'{self.flag}: {self.path} is a file, not a directory')
        self._made_dir = not os.path.exists(self.path)
        lock_path = os.path.join(self.path, LOCK_NAME)
        try:
            os.makedirs(self.path, exist_ok=True)
            while True:
                existed = os.path.exists(lock_path)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = os.pread(fd, 512, 0).decode(errors='replace').strip()
                    os.close(fd)
                    raise RunError(
                        f'{self.flag}: {self.path} is in use by another run '
                        f'({owner or "owner unknown"}); wait for it to end or use another '
                        'directory'
                    ) from None
                if _same_file(fd, lock_path):  # not unlinked by a releasing owner meanwhile
                    break
                os.close(fd)
        except OSError as e:
            raise ValueError(
                f'{self.flag}: cannot take ownership of {self.path} ({e.strerror or e})'
            ) from None
        self._fd, self._made_file = fd, not existed
        since = datetime.datetime.now().isoformat(timespec='seconds')
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f'pid {os.getpid()} on host {socket.gethostname()}, since {since}'.encode(), 0
        )

    def release(self) -> None:
        """Gives the directory up (removing what only the lock itself put there)."""
        if self._fd is None:
            return
        lock_path = os.path.join(self.path, LOCK_NAME)
        if self._made_file and _same_file(self._fd, lock_path):
            os.unlink(lock_path)
            if self._made_dir and not os.listdir(self.path):
                os.rmdir(self.path)
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def remember_tb_dir(workdir: str, tb_dir: str) -> None:
    """Records the shared TensorBoard directory of the run in `workdir` ('' = its own
    `<workdir>/tb`), so that every tool that logs for it writes there too."""
    path = os.path.join(workdir, TB_FILE)
    with open(path + '.tmp', 'w') as f:
        json.dump({'tb_dir': os.path.abspath(tb_dir) if tb_dir else ''}, f)
    os.replace(path + '.tmp', path)


def remembered_tb_dir(workdir: str) -> str:
    """The shared TensorBoard directory recorded by `remember_tb_dir` ('' = none: the run logs
    to `<workdir>/tb`)."""
    path = os.path.join(workdir, TB_FILE)
    if not os.path.exists(path):
        return ''
    return read_json_object(path)['tb_dir']


def read_json_object(path: str) -> dict:
    """The JSON object in `path`, a file lm wrote (a run's bookkeeping, results); a one-line
    ValueError naming the file when it no longer holds one (changed or cut short since)."""
    with open(path) as f:
        text = f.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f'{path} is not the JSON lm wrote ({e.msg}: line {e.lineno} column {e.colno}); it '
            'was changed or cut short since'
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f'{path} holds a JSON {type(value).__name__}, not the object lm wrote')
    return value
