"""Orbax checkpoints of the train state plus a JSON side-car (config, data position, shapes,
array checksums, and a checksum of the side-car itself)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint import checkpoint_managers

from lm.train.checksum import array_checksums, meta_checksum, mismatches
from lm.train.interrupt import StopRequest, deferred_stop
from lm.train.workdir import RunError, read_json_object

PINNED = 'pinned.json'  # in the checkpoints directory: {step: why}; never rotated away
# In a side-car: the save holds no optimizer state (an import's step 0); restores leave it out
# and training starts it fresh.
NO_OPT_STATE = 'no_opt_state'
UNFINISHED = '.orbax-checkpoint-tmp'  # in a name there: a save that never finished (ignored)
# In a side-car: the checksum of the rest of it (`checksum.meta_checksum`), checked on every
# read; side-cars saved before it existed have none and are read unchecked.
META_CHECKSUM = 'meta_checksum'
META_FILE = os.path.join('meta', 'metadata')  # a side-car's file in its step's directory


def _closed_loop(error: BaseException | None) -> bool:
    return isinstance(error, RuntimeError) and str(error) == 'Event loop is closed'


def _quiet_abandoned_io() -> None:
    """Once per process: when one writer of an asynchronous save fails, or one read of a
    restore, orbax closes the event loop of the others, and each of their reads or writes still
    in flight then reports 'Event loop is closed' with a traceback from tensorstore's threads
    (35 of them before a damaged checkpoint's one-line refusal). The failure itself is reported
    once, by `Checkpointer`: these reports are dropped."""
    if getattr(sys.excepthook, 'quiet_abandoned_writes', False):
        return
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def quiet_excepthook(t, e, tb):
        if not _closed_loop(e):
            excepthook(t, e, tb)

    def quiet_unraisablehook(u):
        if not _closed_loop(u.exc_value):
            unraisablehook(u)

    quiet_excepthook.quiet_abandoned_writes = True
    sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook


def _join_save_threads(timeout_s: float = 120.0) -> None:
    """After a failed save: waits for orbax's save threads still writing (a process that exits
    under them gets a traceback from each)."""
    for t in threading.enumerate():
        if t is not threading.current_thread() and type(t).__module__.startswith('orbax.'):
            threading.Thread.join(t, timeout_s)  # the plain join: orbax's re-raises the failure


class Checkpointer:
    """`<workdir>/checkpoints`: every save holds 'state' (params, optimizer state, step, RNG) and
    'meta' (the resolved config, the data fingerprint and step, parameter shapes, a checksum
    of every array). The last `keep` saves are kept, and any step pinned with `pin`. A state
    saved without 'opt_state' is marked so in its side-car (`NO_OPT_STATE`)."""

    def __init__(
        self, workdir: str, keep: int = 3, async_save: bool = True, read_only: bool = False
    ):
        self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
        self.read_only = read_only  # restores never move a damaged checkpoint aside
        self._pending: int | None = None  # step of an asynchronous save not yet confirmed
        self._failed = False
        keep_policy = checkpoint_managers.LatestN(None if read_only else keep)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(
                [keep_policy, checkpoint_managers.CustomSteps(sorted(self.pinned()))]
            ),
            save_interval_steps=0 if read_only else 1,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=async_save and not read_only,
        )
        _quiet_abandoned_io()
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=('state', 'meta')
        )

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: dict, meta: dict) -> None:
        """Saves `state` as `step` (in the background when asynchronous); a failed write, of
        this save or of an earlier one, raises RunError naming its step and cause."""
        self.check(wait=True)
        meta = {**meta, 'checksums': array_checksums(state)}
        if 'opt_state' not in state:
            meta[NO_OPT_STATE] = True
        meta[META_CHECKSUM] = meta_checksum(json.loads(json.dumps(meta)), META_CHECKSUM)
        try:
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
                force=True,
            )
        except Exception as e:  # noqa: BLE001 - any failed write ends the run in one line
            raise self._write_error(step, e) from e
        self._pending = step
        if not self.manager.is_saving_in_progress():
            self.check(wait=True)

    def check(self, wait: bool = False) -> None:
        """Raises RunError if the last asynchronous save has failed (disk full, ...): called
        every step, so a failure ends the run at the step after it is known. `wait` blocks
        until that save is done."""
        if self._pending is None or (not wait and self.manager.is_saving_in_progress()):
            return
        step, self._pending = self._pending, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._write_error(step, e) from e
        if not os.path.isdir(os.path.join(self.directory, str(step))):
            raise self._write_error(step, FileNotFoundError('it was not finalized'))

    def _write_error(self, step: int, error: Exception) -> RunError:
        self._failed = True
        _join_save_threads()
        cause = str(error).splitlines()[0] if str(error) else ''
        return RunError(
            f'the checkpoint of step {step} could not be written to {self.directory} '
            f'({type(error).__name__}: {cause}); stopping (checkpoints kept: '
            f'{[s for s in self.steps() if s != step]})'
        )

    def wait(self) -> None:
        """Waits for a save in flight (after a reported failure: returns at once)."""
        if not self._failed:
            self.check(wait=True)

    def close(self) -> None:
        if not self._failed:
            self.manager.close()
            return
        with contextlib.suppress(Exception):  # orbax re-raises the failure already reported
            self.manager.close()

    def pinned(self) -> dict[int, str]:
        """{step: why} of the checkpoints kept whatever `keep` says (see `pin`)."""
        path = os.path.join(self.directory, PINNED)
        if not os.path.exists(path):
            return {}
        return {int(k): v for k, v in read_json_object(path).items()}

    def pin(self, step: int, why: str) -> None:
        """Keeps checkpoint `step` from rotation by this and later Checkpointers of the
        workdir (it is not deleted to make room for newer saves)."""
        if jax.process_index() != 0:
            return
        pinned = {**self.pinned(), step: why}
        path = os.path.join(self.directory, PINNED)
        with open(path + '.tmp', 'w') as f:
            json.dump({str(k): v for k, v in sorted(pinned.items())}, f, indent=1)
        os.replace(path + '.tmp', path)

    def read_meta(self, step: int) -> dict:
        """The side-car of checkpoint `step`, checked against its checksum (`verified_meta`)."""
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return verified_meta(meta['meta'], os.path.join(self.directory, str(step), META_FILE))

    def restore(
        self,
        abstract_state: dict,
        step: int | None = None,
        check_meta: Callable | None = None,
        partial: bool = False,
    ) -> tuple[int, dict, dict]:
        """(step, state, meta) from `step`, or from the newest readable checkpoint.

        `partial` (read-only): `abstract_state` may be a part of the saved tree (e.g. only
        'params'); nothing else is read. A checkpoint saved without optimizer state
        (`NO_OPT_STATE`) restores without 'opt_state'.
        `check_meta(meta)` runs before the state is read (shape checks); its errors propagate.
        A latest checkpoint that is truncated or unreadable is skipped with a warning and moved
        aside to `<step>.unreadable` (kept, not deleted), so training can write that step again.
        Read-only, nothing is moved: an unreadable latest checkpoint is refused in one line naming
        it and the newest readable step.
        """
        if step is not None and step not in self.steps():
            raise FileNotFoundError(
                f'no checkpoint for step {step} in {self.directory}; available: {self.steps()}'
            )
        with deferred_stop() as stop:  # a stop signal is not a reading error
            return self._restore(abstract_state, step, check_meta, partial, stop)

    def _restore(
        self,
        abstract_state: dict,
        step: int | None,
        check_meta: Callable | None,
        partial: bool,
        stop: StopRequest,
    ) -> tuple[int, dict, dict]:
        unreadable = []
        for s in [step] if step is not None else self.steps()[::-1]:
            try:
                meta = self.read_meta(s)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped
                stop.check()
                unreadable.append(self._skip(s, e, step))
                continue
            if check_meta is not None:
                check_meta(meta)
            try:
                restored = self.manager.restore(
                    s,
                    args=ocp.args.Composite(
                        state=self._restore_args(abstract_state, meta, partial)
                    ),
                )
                if bad := mismatches(meta.get('checksums', {}), restored['state']):
                    raise ValueError(
                        f'checksum mismatch in {bad[0]}'
                        + (f' and {len(bad) - 1} more arrays' if len(bad) > 1 else '')
                        + f' of the checkpoint at step {s} in {self.directory}'
                    )
            except Exception as e:  # noqa: BLE001
                stop.check()
                unreadable.append(self._skip(s, e, step))
                continue
            if unreadable and self.read_only:
                raise ValueError(
                    f'the checkpoint at step {unreadable[0]} in {self.directory} is unreadable '
                    f'(see the warning above); a read-only command changes nothing: choose step '
                    f'{s}, the newest readable one (--step={s}); training moves it aside when '
                    'it resumes (a finished run: under a larger config.train.steps)'
                )
            self._move_aside(unreadable)
            return s, restored['state'], meta
        raise FileNotFoundError(f'no readable checkpoint in {self.directory}')

    def _restore_args(self, abstract_state: dict, meta: dict, partial: bool):
        """Orbax restore arguments reading `abstract_state` (less an optimizer state the
        checkpoint lacks); `partial` reads a part of the saved tree."""
        if meta.get(NO_OPT_STATE):
            abstract_state = {k: v for k, v in abstract_state.items() if k != 'opt_state'}
        if not partial:
            return ocp.args.StandardRestore(abstract_state)
        if not self.read_only:
            raise ValueError('a partial restore needs a read-only Checkpointer')
        return ocp.args.PyTreeRestore(
            abstract_state,
            restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state),
            partial_restore=True,
        )

    def _skip(self, s: int, error: Exception, requested: int | None) -> int:
        if requested is not None:
            raise error
        # TensorStore's message ends in a repr of its details: the cause is before it
        cause = str(error).split('. See full TensorStore details')[0]
        first_line = cause.splitlines()[0][:200] if cause else ''
        then = (
            'looking for the newest readable one'
            if self.read_only
            else 'falling back to the previous one'
        )
        logging.warning(
            'checkpoint at step %d in %s is unreadable (%s: %s); %s',
            s,
            self.directory,
            type(error).__name__,
            first_line,
            then,
        )
        return s

    def _move_aside(self, steps: list[int]) -> None:
        if not steps:
            return
        if jax.process_index() == 0:
            for s in steps:
                target, n = os.path.join(self.directory, f'{s}.unreadable'), 1
                while os.path.exists(target):  # kept from an earlier fall-back
                    n += 1
                    target = os.path.join(self.directory, f'{s}.unreadable.{n}')
                os.rename(os.path.join(self.directory, str(s)), target)
        self.manager.reload()


def saved_steps(workdir: str) -> list[int]:
    """The steps of `workdir`'s checkpoints, read without starting a JAX backend."""
    directory = epath.Path(os.path.abspath(os.path.join(workdir, 'checkpoints')))
    if not directory.exists():
        return []
    return sorted(ocp.path.step.checkpoint_steps(directory))


def checkpoint_entries(workdir: str) -> list[str]:
    """The names in `workdir`'s checkpoints directory, less the saves that never finished
    (`*.orbax-checkpoint-tmp*`, which `saved_steps` and restores ignore too)."""
    directory = os.path.join(workdir, 'checkpoints')
    if not os.path.isdir(directory):
        return []
    return sorted(name for name in os.listdir(directory) if UNFINISHED not in name)


def verified_meta(meta: dict, path: str) -> dict:
    """`meta`, read from `path`, once it matches the checksum saved in it (a side-car saved
    before side-cars had one is not checked); else a one-line ValueError naming `path`."""
    saved = meta.get(META_CHECKSUM)
    if saved is not None and saved != meta_checksum(meta, META_CHECKSUM):
        raise ValueError(
            f'{path} does not match its checksum: the side-car (config, data position, shapes, '
            'array checksums) changed after it was saved'
        )
    return meta


def read_step_meta(workdir: str, step: int) -> dict:
    """The JSON side-car of `workdir`'s checkpoint `step`, checked against its checksum
    (`verified_meta`), read without starting a JAX backend."""
    directory = epath.Path(os.path.abspath(os.path.join(workdir, 'checkpoints')))
    meta = ocp.JsonCheckpointHandler().restore(directory / str(step) / 'meta')
    return verified_meta(meta, os.path.join(directory, str(step), META_FILE))


def _meta_or_none(workdir: str, step: int) -> dict | None:
    """Checkpoint `step`'s side-car (`read_step_meta`), or None where it cannot be read or
    verified."""
    try:
        return read_step_meta(workdir, step)
    except Exception:  # noqa: BLE001 - any unreadable side-car
        return None


def read_sound_meta(workdir: str, step: int, flag: str = '--workdir') -> dict:
    """`read_step_meta`; a side-car that cannot be read or verified is refused in one line
    naming the newest other step whose side-car is sound (`flag` names the workdir)."""
    try:
        return read_step_meta(workdir, step)
    except Exception as e:  # noqa: BLE001 - any unreadable side-car is refused in one line
        raise _damaged_meta_error(workdir, step, e, flag) from e


def _damaged_meta_error(workdir: str, step: int, error: Exception, flag: str) -> ValueError:
    """The refusal of checkpoint `step` of `workdir`, whose side-car could not be read or
    verified (`error`), naming the newest other step whose side-car is sound."""
    others = (s for s in saved_steps(workdir)[::-1] if s != step)
    sound = next((s for s in others if _meta_or_none(workdir, s) is not None), None)
    directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    cause = str(error).splitlines()[0] if str(error) else type(error).__name__
    where = '' if directory in cause else f' in {directory}'
    hint = (
        f'choose step {sound}, the newest readable one (--step={sound})'
        if sound is not None
        else f'{flag} holds no other readable checkpoint'
    )
    return ValueError(f'the checkpoint at step {step}{where} is unreadable ({cause}); {hint}')


def _latest_sound(workdir: str, flag: str) -> tuple[int, dict] | None:
    """(step, side-car) of `workdir`'s newest checkpoint whose side-car is sound, or None when
    it has no checkpoint; with no sound one, the newest is refused in one line."""
    steps = saved_steps(workdir)
    for step in reversed(steps):
        if (meta := _meta_or_none(workdir, step)) is not None:
            return step, meta
    if steps:
        read_sound_meta(workdir, steps[-1], flag)  # raises, naming the directory
    return None


def latest_sound_step(workdir: str, flag: str = '--workdir') -> int | None:
    """The newest checkpoint step of `workdir` whose side-car is sound, or None when it has no
    checkpoint. A damaged newer one is passed over, as a resume passes over it (and moves it
    aside); with no sound one, the newest is refused in one line."""
    found = _latest_sound(workdir, flag)
    return None if found is None else found[0]


def read_latest_meta(workdir: str, flag: str = '--workdir') -> dict | None:
    """The JSON side-car of `workdir`'s newest sound checkpoint (`latest_sound_step`; checked),
    or None, read without starting a JAX backend (so device settings from the saved config can
    still be applied)."""
    found = _latest_sound(workdir, flag)
    return None if found is None else found[1]


def param_shapes(abstract_params: dict) -> dict[str, list[int]]:
    """{'blocks/0/attn/q_proj/kernel': [E, H, D], ...} for a (pure dict) parameter tree."""
    flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    return {'/'.join(str(getattr(k, 'key', k)) for k in path): list(x.shape) for path, x in flat}


@jax.jit
def _all_finite(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x))


def check_finite(params: dict, where: str) -> None:
    """Raises FloatingPointError naming the first parameter of `params` (a pure dict tree) that
    holds a NaN or an infinity; `where` names the checkpoint in the message. Checked one array
    at a time, so the temporaries are one array's."""
    finite = jax.device_get(jax.tree.map(_all_finite, params))
    flat = jax.tree_util.tree_flatten_with_path(finite)[0]
    for path, finite in flat:
        if not finite:
            name = '/'.join(str(getattr(k, 'key', k)) for k in path)
            raise FloatingPointError(
                f'{where} holds non-finite parameters (NaN or inf), first in {name}; '
                'refusing to use them'
            )


def check_same_shapes(saved: dict[str, list[int]], current: dict[str, list[int]], where: str):
    """Raises naming the first parameter whose shape (or presence) differs."""
    for name in sorted(set(saved) | set(current)):
        a, b = saved.get(name), current.get(name)
        if a != b:
            raise ValueError(
                f'{where} was made by a different model: parameter {name} has shape '
                f'{tuple(a) if a else "(absent)"} there but {tuple(b) if b else "(absent)"} in '
                'this config'
            )
