"""A sweep point's seeds as one seed ensemble (`config.train.ensemble`, scripts/sweep.py
--ensemble): one run trains them together in <sweep_dir>/ensembles/<point>, then each seed's run
<point>_s<seed> is its member split out (`lm.train.split_member`), with the fingerprint and
result separate training gives it, so summaries read the runs as they read separate ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable

import ml_collections

from lm.config import with_values
from lm.config_migration import ADDED_KEYS
from lm.experiments.runner import RunFailed, Spec
from lm.train.ensemble_run import split_member
from lm.train.run import check_loop_config
from lm.train.workdir import flat_config, resumable_key

ENSEMBLES = 'ensembles'  # <sweep_dir>/ensembles/<point>: a point's seeds trained as one program


def seed_runs(specs: list[Spec]) -> list[Spec]:
    """The plan's runs of one seed each (what summaries read), less its ensembles' runs."""
    return [s for s in specs if not s.name.startswith(f'{ENSEMBLES}/')]


@dataclasses.dataclass(frozen=True)
class PointSpecs:
    """The Specs of one sweep point: its seeds trained separately, or as one ensemble.
    `trainer(config, command, tb_dir)` is a Spec's run that trains `config` with `command`."""

    name: str
    command: list[str]
    tb_dir: str
    sweep_dir: str
    trainer: Callable[[ml_collections.ConfigDict, list[str], str], Callable[[str], dict]]

    def _seeded(self, config: ml_collections.ConfigDict, k: int) -> ml_collections.ConfigDict:
        seeded = with_values(config, {'seed': config.seed + k})  # the point's own seed
        try:
            check_loop_config(seeded)
        except ValueError as e:
            raise ValueError(f'sweep point {self.name}: {e}') from None
        return seeded

    def _spec(self, config: ml_collections.ConfigDict, n: int, run, **kw) -> Spec:
        return Spec(
            name=f'{self.name}_s{config.seed}' if n > 1 else self.name,
            fingerprint=flat_config(config),
            run=run,
            arm=self.name,
            seed=config.seed,
            resumable=resumable_key,
            added=ADDED_KEYS,
            **kw,
        )

    def separate(self, config: ml_collections.ConfigDict, n: int) -> list[Spec]:
        """A train.py run per seed."""
        seeded = [self._seeded(config, k) for k in range(n)]
        return [self._spec(c, n, self.trainer(c, self.command, self.tb_dir)) for c in seeded]

    def ensemble(
        self, config: ml_collections.ConfigDict, n: int, groups: int = 1, loop: bool = False
    ) -> list[Spec]:
        """The `n` seeds as `groups` ensembles (train.ensemble_loop = `loop`) of consecutive
        seeds, each a train.py run in a lane of its own (so `groups` can train at once), then
        each seed's run split out of its ensemble (in that lane, after it)."""
        groups = min(groups, n)
        sizes = [n // groups + (j < n % groups) for j in range(groups)]
        specs, first = [], 0
        for j, k in enumerate(sizes):
            name = f'{ENSEMBLES}/{self.name}' + (f'_g{j}' if groups > 1 else '')
            specs += self._group(config, name, first, k, n, loop)
            first += k
        return specs

    def _group(
        self, config: ml_collections.ConfigDict, name: str, first: int, k: int, n: int, loop: bool
    ) -> list[Spec]:
        """The ensemble `name` of seeds first ... first + k - 1 of the point's `n`, and its
        members' runs."""
        settings = {'train.ensemble': k, 'train.ensemble_loop': loop}
        together = self._seeded(with_values(config, settings), first)
        lane = name.split('/', 1)[1]
        first_spec = Spec(
            name=name,
            fingerprint=flat_config(together),
            run=self.trainer(together, self.command, self.tb_dir),
            arm=name,
            seed=together.seed,
            lane=lane,
            resumable=resumable_key,
            added=ADDED_KEYS,
        )
        source = os.path.join(self.sweep_dir, name)
        members = [
            self._spec(
                self._seeded(config, first + i), n, _split(source, i), lane=lane, needs=(name,)
            )
            for i in range(k)
        ]
        return [first_spec, *members]


def _split(ensemble_dir: str, member: int):
    """A Spec's run: member `member` of the finished ensemble in `ensemble_dir` written to the
    run's workdir (replacing an earlier split); its result is the member's results.json."""

    def run(workdir: str) -> dict:
        shutil.rmtree(os.path.join(workdir, 'checkpoints'), ignore_errors=True)
        split_member(ensemble_dir, member, workdir)
        results = os.path.join(workdir, 'results.json')
        if not os.path.exists(results):
            raise RunFailed(f'{ensemble_dir} has no final evaluation for member {member}')
        with open(results) as f:
            return json.load(f)

    return run
