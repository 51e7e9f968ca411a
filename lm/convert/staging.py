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


@contextlib.contextmanager
def staged(target: str, what: str) -> Iterator[str]:
    """A new directory beside `target` (same parent, so moving it in is a rename), removed if
    the block raises anything (an error or `Interrupted`)."""
    target = os.path.abspath(target)
    safe_name(os.path.basename(target), f'the {what} target {target}')
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    build = tempfile.mkdtemp(prefix=f'.{os.path.basename(target)}.{what}-partial-', dir=parent)
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
