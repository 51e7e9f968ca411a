"""Uptraining a seed ensemble: each member converted as its own checkpoint would be.

An ensemble's members may differ in more than their seed (their own learning rate; a
similarity grouping found on each member's heads), so the converted members are ordinary runs
side by side, `<workdir>_s<seed>` (as a sweep names its seeds' runs), each uptrained by
train.py like any converted run.
"""

from __future__ import annotations

import os

import ml_collections

from lm.convert.options import ConversionOptions
from lm.convert.uptrain import SOURCE, WORKDIR, convert_checkpoint
from lm.train.checkpoint import checkpoint_entries
from lm.train.ensemble import member_seeds
from lm.train.interrupt import StopRequest
from lm.train.stored import stored_config
from lm.train.workdir import check_apart


def member_workdirs(source_workdir: str, step: int | None, workdir: str) -> list[str]:
    """The converted runs of the ensemble in `source_workdir` (checkpoint `step`, default the
    newest): `<workdir>_s<seed>` per member; [] when the source is a single run."""
    config = stored_config(source_workdir, SOURCE, step)
    base = os.path.normpath(workdir)
    return [f'{base}_s{seed}' for seed in member_seeds(config)]


def convert_ensemble(
    source_workdir: str,
    options: ConversionOptions,
    workdir: str,
    stop: StopRequest | None = None,
    need_steps: bool = False,
) -> list[tuple[str, ml_collections.ConfigDict]]:
    """[(workdir, config)] of each member of the ensemble in `source_workdir` converted as
    `options` say (`convert_checkpoint` of the member) into its `member_workdirs` directory;
    every one must be free before the first is written. A signal `stop` sees during a
    conversion stops it before that member is written (the ones before it stay written).
    `need_steps`: as `convert_checkpoint`'s."""
    workdirs = member_workdirs(source_workdir, options.source_step, workdir)
    if not workdirs:
        raise ValueError(f'{SOURCE}={source_workdir} is not an ensemble (config.train.ensemble=0)')
    for w in workdirs:
        check_apart(w, WORKDIR, source_workdir, SOURCE)
    if taken := [w for w in workdirs if checkpoint_entries(w)]:
        raise FileExistsError(
            f'{WORKDIR}: {taken[0]} (member run of {workdir}) already holds checkpoints; choose '
            'a new directory'
        )
    return [
        (w, convert_checkpoint(source_workdir, options, w, stop, member=i, need_steps=need_steps))
        for i, w in enumerate(workdirs)
    ]
