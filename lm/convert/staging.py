"""Directories built beside their place and moved in when complete, so a failure, an error or a
stop signal leaves the old contents or the new, never a mix (HF import and export)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator

from lm.convert.hf import LM_FIELD
from lm.convert.hf_files import CARRIED, CARRIED_DIRS
from lm.train.checkpoint import checkpoint_entries
from lm.train.workdir import (
    BEFORE_FIRST_CHECKPOINT,
    RUN_FILES,
    check_apart,
    check_not_in_checkpoints,
    check_replaceable,
    check_train_workdir,
    safe_name,
)


def _check_empty(path: str, setting: str, option: str, ignore: tuple[str, ...] = ()) -> None:
    """One-line FileExistsError when directory `path` holds anything but `ignore`d names."""
    held = sorted(set(os.listdir(path)) - set(ignore)) if os.path.isdir(path) else []
    if held:
        shown = ', '.join(held[:3]) + (f' and {len(held) - 3} more' if len(held) > 3 else '')
        raise FileExistsError(
            f'{setting}={path!r} is not empty (it holds {shown}); pass {option} to replace it whole'
        )


def check_export_dir(
    workdir: str,
    out_dir: str,
    overwrite: bool,
    names: tuple[str, str] = ('out_dir', 'overwrite=True'),
) -> None:
    """One-line errors, before any work, for an export into `out_dir`: a file, the run's workdir
    (or a directory inside it, or one holding it), a non-empty directory without `overwrite`,
    or with it one that is or holds a training run or sweep directory (`check_replaceable`).
    `names`: how the caller spells the directory and the option in errors."""
    setting, option = names
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f'{setting}={out_dir!r} is a file, not a directory')
    check_apart(out_dir, setting, workdir, "the run's workdir")
    check_not_in_checkpoints(out_dir, setting)
    if overwrite:
        check_replaceable(out_dir, setting, option)
        _check_an_export(out_dir, setting, option)
    else:
        _check_empty(out_dir, setting, option)


def _check_an_export(path: str, setting: str, option: str) -> None:
    """`option` replaces an earlier export whole: a non-empty `path` must look like one (a
    config.json with lm's own field and safetensors weights, files only), never a project, a
    git checkout, a folder of data that a mistyped path named or a Hugging Face model that lm
    did not write (a download, the source of an import)."""
    if not os.path.isdir(path) or not (held := os.listdir(path)):
        return
    weights = {'model.safetensors', 'model.safetensors.index.json'} & set(held)
    folders = sorted(
        n for n in held if os.path.isdir(os.path.join(path, n)) and n not in CARRIED_DIRS
    )
    others = sorted(n for n in held if not _exported(n) and n not in folders)
    why = ''
    if folders:
        why = f'the folder {folders[0]}'
    elif 'config.json' not in held or not weights:
        why = 'no config.json and safetensors weights'
    elif others:
        why = f'{others[0]}, which an export does not write'
    elif not _has_lm_field(os.path.join(path, 'config.json')):
        why = f'its config.json has no "{LM_FIELD}" field, which every lm export writes'
    if why:
        raise ValueError(
            f'{setting}={path!r} does not look like a Hugging Face export ({why}): {option} '
            'replaces only an earlier export; give a new or empty directory'
        )


def _has_lm_field(config_json: str) -> bool:
    """Whether `config_json` is a JSON object holding the field an lm export writes."""
    try:
        with open(config_json) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and LM_FIELD in config


def _exported(name: str) -> bool:
    """Whether an export writes files of this name: its config, weights and carried files."""
    return name in ('config.json', 'model.safetensors.index.json', *CARRIED, *CARRIED_DIRS) or (
        name.endswith('.safetensors')
    )


def check_import_dir(
    workdir: str,
    hf_dir: str,
    overwrite: bool,
    names: tuple[str, str] = ('workdir', 'overwrite=True'),
) -> None:
    """One-line errors, before any work, for an import of `hf_dir` into `workdir`: a file, a
    directory holding checkpoints (unfinished saves do not count), the local `hf_dir` (or one
    inside it or holding it), one that cannot be a run's own (`check_train_workdir`), a
    non-empty directory without `overwrite` (which replaces it whole), or with it one that is
    or holds anywhere below it a training run (a checkpoints/ directory, even of unfinished
    saves) or a sweep directory (`check_replaceable`). `names`: how the caller spells the
    directory and the option in errors."""
    setting, option = names
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f'{setting}={workdir!r} is a file, not a directory')
    if os.path.isdir(hf_dir):
        check_apart(workdir, setting, hf_dir, 'the HF directory')
    if checkpoint_entries(workdir):
        raise FileExistsError(f'{setting}: {workdir} already holds checkpoints; choose a new one')
    if overwrite:
        check_replaceable(workdir, setting, option)
        _check_a_run_dir(workdir, setting, option)
    else:
        _check_empty(workdir, setting, option, ignore=('checkpoints',))  # unfinished saves only
    check_train_workdir(workdir, setting)  # not inside another run


# What an import's (or a run's) directory may hold without a checkpoint: `option` replaces it.
RUN_NAMES = ('checkpoints', RUN_FILES, 'results.json', *BEFORE_FIRST_CHECKPOINT)


def _check_a_run_dir(path: str, setting: str, option: str) -> None:
    """`option` replaces a run's directory whole: a non-empty `path` holding a name no run or
    import writes (a project, a folder of one's own data) is refused, naming it."""
    names = os.listdir(path) if os.path.isdir(path) else []
    if held := sorted(n for n in set(names) - set(RUN_NAMES) if not n.startswith('.')):
        raise ValueError(
            f'{setting}={path!r} holds {held[0]}, which no run or import writes: {option} '
            "replaces only an earlier import's directory; give a new or empty one"
        )


def new_dir(parent: str, prefix: str) -> str:
    """A new directory `<parent>/<prefix><random>` with the mode os.makedirs gives (0o777 less
    the umask), so it can be moved into place as it is (tempfile.mkdtemp's is 0o700)."""
    while True:
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


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
    build = new_dir(parent, f'{prefix}{os.getpid()}-')
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
