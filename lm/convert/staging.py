"""Directories built beside their place and moved in when complete, so a failure, an error or a
stop signal leaves the old contents or the new, never a mix (HF import and export)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from lm.train.workdir import safe_name


def check_export_dir(
    workdir: str,
    out_dir: str,
    overwrite: bool,
    names: tuple[str, str] = ('out_dir', 'overwrite=True'),
) -> None:
    """One-line errors, before any work, for an export into `out_dir`: a file, the run's workdir
    (or a directory inside it, or one holding it), or a non-empty directory without
    `overwrite`. `names`: how the caller spells the directory and the option in errors."""
    setting, option = names
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f'{setting}={out_dir!r} is a file, not a directory')
    run, out = os.path.realpath(workdir), os.path.realpath(out_dir)
    if os.path.commonpath([run, out]) in (run, out):
        where = 'is inside' if os.path.commonpath([run, out]) == run else 'holds'
        raise ValueError(f"{setting}={out_dir!r} {where} the run's workdir {workdir!r}")
    held = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    if held and not overwrite:
        shown = ', '.join(held[:3]) + (f' and {len(held) - 3} more' if len(held) > 3 else '')
        raise FileExistsError(
            f'{setting}={out_dir!r} is not empty (it holds {shown}); pass {option} to replace '
            'it whole'
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def remove_abandoned(parent: str, prefix: str) -> None:
    """Removes the staging directories `<prefix><pid>-*` in `parent` (and the '-old' copies
    `replace_dir` sets aside) whose process no longer runs: what a `kill -9` left behind.
    Those of a process still running (an export into the same place) are left alone."""
    for name in os.listdir(parent):
        if name.startswith(prefix):
            pid = name[len(prefix) :].split('-', 1)[0]
            if not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@contextlib.contextmanager
def staged(target: str, what: str) -> Iterator[str]:
    """A new directory beside `target` (same parent, so moving it in is a rename),
    `.<name>.<what>-partial-<pid>-*`, removed if the block raises anything (an error or
    `Interrupted`); those a killed process left for the same target are removed first."""
    target = os.path.abspath(target)
    name = safe_name(os.path.basename(target), f'the {what} target {target}')
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    prefix = f'.{name}.{what}-partial-'
    remove_abandoned(parent, prefix)
    build = tempfile.mkdtemp(prefix=f'{prefix}{os.getpid()}-', dir=parent)
    try:
        yield build
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


def replace_dir(build: str, target: str) -> None:
    """Moves directory `build` to `target`; an existing `target` is renamed aside first and
    removed once `build` is in place (a kill in between leaves both whole, beside it)."""
    if os.path.isdir(target) and not os.listdir(target):
        os.rmdir(target)
    old = None
    if os.path.exists(target):
        old = build + '-old'
        os.rename(target, old)
    os.rename(build, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def move_into(build: str, target: str) -> None:
    """Moves the entries of directory `build` into `target`, replacing those of the same names,
    'checkpoints' last (an absent or empty `target` is replaced by `build` at once)."""
    if not os.path.isdir(target) or not os.listdir(target):
        replace_dir(build, target)
        return
    for name in sorted(os.listdir(build), key=lambda n: n == 'checkpoints'):
        dest = os.path.join(target, name)
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        os.replace(os.path.join(build, name), dest)
    os.rmdir(build)
