"""TensorBoard logging with tensorboardX: scalars, the resolved config, and hparams
(`lm.train.hparams`).

Only process 0 writes; on other processes every call is a no-op. tensorboardX is imported when
a writer is made, and without PyTorch (`lm.train.hparams.import_tensorboardx`).
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from lm.train import hparams as hparams_tab
from lm.train.workdir import (
    TB_FILE,
    check_not_in_checkpoints,
    read_json_object,
    remembered_tb_dir,
    run_above,
)


def run_logdir(workdir: str, tb_dir: str = '') -> str:
    """A run's TensorBoard directory: `<tb_dir>/<workdir name>` when runs share one `tb_dir`
    (so their curves overlay), else `<workdir>/tb`. `tb_dir=''`: the one the run was trained
    with (`lm.train.workdir.remembered_tb_dir`)."""
    tb_dir = tb_dir or remembered_tb_dir(workdir)
    if tb_dir:
        return os.path.join(tb_dir, os.path.basename(os.path.abspath(workdir)))
    return os.path.join(workdir, 'tb')


OWNER_FILE = 'workdir.json'  # in a shared tb_dir's run: the workdir whose run it is


def check_logdir_owner(workdir: str, tb_dir: str, flag: str) -> None:
    """One-line error when `workdir`'s run in a shared TensorBoard directory (`tb_dir`, or the
    one it remembers) is another workdir's, one that still exists: two runs of one name there
    would mix their curves. A run in its own `<workdir>/tb` cannot clash; one inside another
    run's checkpoints/ would be taken for a checkpoint (`check_not_in_checkpoints`). A logdir
    copied elsewhere with its tb_dir (the owner file names the logdir it was written in) is
    the copy's: its owner logs to the original."""
    tb_dir = tb_dir or remembered_tb_dir(workdir)
    if not tb_dir:
        return
    logdir = run_logdir(workdir, tb_dir)
    check_not_in_checkpoints(logdir, flag)
    if (run := run_above(logdir)) and run != os.path.realpath(workdir):
        raise ValueError(
            f'{flag}: {logdir} would be inside the run {run}, among its files; give TensorBoard '
            'a directory outside other runs'
        )
    path = os.path.join(logdir, OWNER_FILE)
    if not os.path.exists(path):
        return
    record = read_json_object(path)
    owner = record['workdir']
    if record.get('logdir', os.path.realpath(logdir)) != os.path.realpath(logdir):
        return  # copied with its tb_dir (a copied sweep): the owner logs to the original
    if owner != os.path.realpath(workdir) and os.path.isdir(owner):  # not moved away
        raise ValueError(
            f'{flag}: {logdir} is the TensorBoard run of {owner}; a run of the same name '
            f'would mix its curves with it: give {workdir} another name, or use another --tb_dir'
        )


def check_tb_dir_kept(workdir: str, tb_dir: str) -> None:
    """One-line error when the run in `workdir`, resumed, is given a `--tb_dir` other than the
    one it has logged to so far: its curves would be split between two TensorBoard runs. Its
    first directory gone (moved or deleted), the new one is taken."""
    if not tb_dir or not os.path.exists(os.path.join(workdir, TB_FILE)):
        return  # the remembered directory, or a run that has not started
    old, new = run_logdir(workdir), run_logdir(workdir, tb_dir)
    if os.path.realpath(old) != os.path.realpath(new) and os.path.isdir(old) and os.listdir(old):
        kept = f'--tb_dir={was}' if (was := remembered_tb_dir(workdir)) else 'none'
        raise ValueError(
            f'--tb_dir={tb_dir!r}: the run in {workdir} has logged to {old} so far; resume it '
            f'with the --tb_dir it was trained with ({kept}) so its curves stay in one run'
        )


def claim_logdir(workdir: str, tb_dir: str, flag: str = '--tb_dir') -> None:
    """Records `workdir` as the owner of its run in the shared `tb_dir` (see
    `check_logdir_owner`, which this runs first, naming `flag`); '' = none shared: nothing to
    record. Every command that writes into a run of a shared tb_dir claims it first."""
    check_logdir_owner(workdir, tb_dir, flag)
    if tb_dir:
        logdir = run_logdir(workdir, tb_dir)
        os.makedirs(logdir, exist_ok=True)
        path = os.path.join(logdir, OWNER_FILE)
        with open(path + '.tmp', 'w') as f:
            json.dump({'workdir': os.path.realpath(workdir), 'logdir': os.path.realpath(logdir)}, f)
        os.replace(path + '.tmp', path)


def _file_suffix() -> str:
    """An event file's name suffix: tensorboardX names a file by the second and the host alone,
    so a second file of that second (this process's next, or another process's, e.g. eval.py
    right after another) would truncate the first. Nanoseconds keep the names apart and in the
    order they were made, which is the order TensorBoard reads them in."""
    return f'.{time.time_ns()}'


class Summary:
    """A run's TensorBoard writer. `start`: the step a training session starts logging at;
    TensorBoard then drops this run's events at that step and later that an earlier session
    wrote (a session killed past its last checkpoint logged steps its resumption logs again)."""

    def __init__(self, logdir: str, start: int | None = None):
        self.writer, self.logdir = None, logdir
        if jax.process_index() == 0:
            hparams_tab.import_tensorboardx()
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(logdir, flush_secs=30, filename_suffix=_file_suffix())
            if start is not None:
                self._session_start(start)

    def _session_start(self, step: int) -> None:
        """A SessionLog START event at `step`: TensorBoard purges the run's earlier-written
        events at steps >= `step` when it reads it (its 'orphaned data')."""
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        start = SessionLog(status=SessionLog.START)
        self._file_writer().add_event(Event(step=step, wall_time=time.time(), session_log=start))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """All `values` at `step` as one event (one hand-off to the writer's process queue,
        ~0.1 ms, instead of one per value: the train loop logs every step)."""
        if self.writer:
            from tensorboardX.proto.summary_pb2 import Summary as SummaryProto
            from tensorboardX.summary import scalar

            merged = SummaryProto(value=[scalar(t, v).value[0] for t, v in values.items()])
            self._file_writer().add_summary(merged, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        if self.writer:
            self.writer.add_text(tag, text, step)

    def image(self, tag: str, image_HWC: np.ndarray, step: int = 0) -> None:
        """An RGB(A) uint8 image [height, width, channels] in the Images tab."""
        if self.writer:
            self.writer.add_image(tag, image_HWC, step, dataformats='HWC')

    def hparams(self, values: dict[str, float | int | str | bool], root: str) -> None:
        """Registers the run in the HParams tab of the TensorBoard directory `root` (this
        logdir's parent when runs share one, else the logdir). Its metric columns read this
        run's own scalars (eval/perplexity, ...), so the table shows their latest values."""
        if self.writer:
            hparams_tab.register(self.logdir, root, values)

    def _file_writer(self):
        """tensorboardX's file writer, recreated (on a new event file) after a `flush`."""
        return self.writer._get_file_writer()

    def flush(self) -> None:
        """Writes every event logged so far to disk before returning. tensorboardX's own
        flush() leaves events queued for its writer thread unwritten, so the writer is closed
        (which drains that queue); the next event starts a new event file of the same run."""
        if self.writer:
            self.writer.close()
            self.writer._filename_suffix = _file_suffix()  # the next event file's

    def close(self) -> None:
        if self.writer:
            self.writer.close()
            self.writer._filename_suffix = _file_suffix()  # the next event file's
