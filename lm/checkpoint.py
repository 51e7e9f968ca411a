"""Orbax checkpoints of the train state plus a JSON side-car (config, data position, shapes)."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath


class Checkpointer:
    """`<workdir>/checkpoints`: every save holds 'state' (params, optimizer state, step, RNG) and
    'meta' (the resolved config, the data fingerprint and step, parameter shapes)."""

    def __init__(
        self, workdir: str, keep: int = 3, async_save: bool = True, read_only: bool = False
    ):
        self.directory = os.path.abspath(os.path.join(workdir, 'checkpoints'))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
            save_interval_steps=0 if read_only else 1,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=async_save and not read_only,
        )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=('state', 'meta')
        )

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: dict, meta: dict) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()

    def read_meta(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            'meta'
        ]

    def restore(
        self, abstract_state: dict, step: int | None = None, check_meta: Callable | None = None
    ) -> tuple[int, dict, dict]:
        """(step, state, meta) from `step`, or from the newest readable checkpoint.

        `check_meta(meta)` runs before the state is read (shape checks); its errors propagate.
        A latest checkpoint that is truncated or unreadable is skipped with a warning and moved
        aside to `<step>.unreadable` (kept, not deleted), so training can write that step again.
        """
        if step is not None and step not in self.steps():
            raise FileNotFoundError(
                f'no checkpoint for step {step} in {self.directory}; available: {self.steps()}'
            )
        unreadable = []
        for s in [step] if step is not None else self.steps()[::-1]:
            try:
                meta = self.read_meta(s)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped
                unreadable.append(self._skip(s, e, step))
                continue
            if check_meta is not None:
                check_meta(meta)
            try:
                restored = self.manager.restore(
                    s, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
                )
            except Exception as e:  # noqa: BLE001
                unreadable.append(self._skip(s, e, step))
                continue
            self._move_aside(unreadable)
            return s, restored['state'], meta
        raise FileNotFoundError(f'no readable checkpoint in {self.directory}')

    def _skip(self, s: int, error: Exception, requested: int | None) -> int:
        if requested is not None:
            raise error
        first_line = str(error).splitlines()[0][:200] if str(error) else ''
        logging.warning(
            'checkpoint at step %d in %s is unreadable (%s: %s); falling back to the previous one',
            s,
            self.directory,
            type(error).__name__,
            first_line,
        )
        return s

    def _move_aside(self, steps: list[int]) -> None:
        if not steps:
            return
        if jax.process_index() == 0:
            for s in steps:
                os.rename(
                    os.path.join(self.directory, str(s)),
                    os.path.join(self.directory, f'{s}.unreadable'),
                )
        self.manager.reload()


def read_latest_meta(workdir: str) -> dict | None:
    """The JSON side-car of `workdir`'s newest checkpoint, or None, read without starting a JAX
    backend (so device settings from the saved config can still be applied)."""
    directory = epath.Path(os.path.abspath(os.path.join(workdir, 'checkpoints')))
    if not directory.exists():
        return None
    steps = sorted(ocp.path.step.checkpoint_steps(directory))
    if not steps:
        return None
    return ocp.JsonCheckpointHandler().restore(directory / str(steps[-1]) / 'meta')


def param_shapes(abstract_params: dict) -> dict[str, list[int]]:
    """{'blocks/0/attn/q_proj/kernel': [E, H, D], ...} for a (pure dict) parameter tree."""
    flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    return {'/'.join(str(getattr(k, 'key', k)) for k in path): list(x.shape) for path, x in flat}


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
