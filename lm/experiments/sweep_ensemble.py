"""A sweep point's seeds as one seed ensemble (`config.train.ensemble`, scripts/sweep.py
--ensemble): one run trains them together in <sweep_dir>/ensembles/<point>, then each seed's run
<point>_s<seed> is its member split out (`lm.train.split_member`), with the fingerprint and
result separate training gives it, so summaries read the runs as they read separate ones.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from collections.abc import Callable

import ml_collections

from lm.config import with_values
from lm.config_migration import ADDED_KEYS
from lm.experiments.runner import (
    RunFailed,
    RunStopped,
    Spec,
    cached,
    call,
    read_result,
    recorded_run,
    stopped_by,
)
from lm.experiments.runner import workdir as run_dir
from lm.train.checkpoint import saved_steps
from lm.train.ensemble import check_ensemble_config, check_members_divide_over
from lm.train.identity import flat_config, resumable_key
from lm.train.run import check_loop_config
from lm.train.stored import stored_config
from lm.train.workdir import SPLIT_LOG, RunError, read_json_object

ENSEMBLES = 'ensembles'  # <sweep_dir>/ensembles/<point>: a point's seeds trained as one program


def seed_runs(specs: list[Spec]) -> list[Spec]:
    """The plan's runs of one seed each (what summaries read), less its ensembles' runs."""
    return [s for s in specs if not s.name.startswith(f'{ENSEMBLES}/')]


def one_seed_runs_left(specs: list[Spec], out_dir: str) -> list[str]:
    """A note per point now run on several seeds (<point>_s<seed>) whose one-seed run <point>
    from an earlier sweep is in `out_dir`: that run is not reused, and its seed trains again."""
    arms = sorted({s.arm for s in seed_runs(specs) if s.name != s.arm and isinstance(s.arm, str)})
    return [
        f"note: {arm} (this point's one-seed run) is not reused: on several seeds its runs are "
        f'{arm}_s<seed>, so its seed trains again'
        for arm in arms
        if saved_steps(os.path.join(out_dir, arm))
    ]


@dataclasses.dataclass(frozen=True)
class PointSpecs:
    """The Specs of one sweep point: its seeds trained separately, or as one ensemble.
    `trainer(config, command, tb_dir)` is a Spec's run that trains `config` with `command`;
    `split_command` (scripts/split_ensemble.py) splits an ensemble's members out."""

    name: str
    command: list[str]
    tb_dir: str
    sweep_dir: str
    trainer: Callable[[ml_collections.ConfigDict, list[str], str], Callable[[str], dict]]
    split_command: list[str] = dataclasses.field(default_factory=list)

    def _seeded(
        self, config: ml_collections.ConfigDict, k: int, trains: bool = True
    ) -> ml_collections.ConfigDict:
        """The point's config at its k-th seed, checked as its run will check it (`trains`: a
        run that trains, not a member split out of its ensemble)."""
        seeded = with_values(config, {'seed': config.seed + k})  # the point's own seed
        try:
            check_loop_config(seeded)
            if trains:
                check_ensemble_config(seeded)
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
        each seed's run split out of its ensemble (in that lane, after it). Seeds added to a
        point whose ensembles (of fewer) were made earlier (`_made_before`): those as they were,
        and the added seeds as ensembles of their own (<point>_seeds<first>-<last>, then _g<j>)."""
        specs, first, name = [], 0, f'{ENSEMBLES}/{self.name}'
        for made, k in self._made_before(config.seed, n) if groups == 1 else ():
            specs += self._group(config, made, first, k, n, loop)
            first += k
        if first == n:
            return specs
        if first:  # seeds added since
            name = f'{name}_seeds{config.seed + first}-{config.seed + n - 1}'
        groups = min(groups, n - first)
        sizes = [(n - first) // groups + (j < (n - first) % groups) for j in range(groups)]
        for j, k in enumerate(sizes):
            specs += self._group(config, name + (f'_g{j}' if groups > 1 else ''), first, k, n, loop)
            first += k
        return specs

    def _made_before(self, seed: int, n: int) -> list[tuple[str, int]]:
        """[(ensemble, members)] the point's seeds seed ... seed + n - 1 were trained as by
        earlier runs of the sweep with fewer seeds: its ensemble of the first ones, then each
        one of added seeds that follows on ([] when its ensemble holds n seeds, or none)."""
        name = f'{ENSEMBLES}/{self.name}'
        if not 0 < (had := self._members_of(name)) < n:
            return []
        chain, folder = [(name, had)], os.path.join(self.sweep_dir, ENSEMBLES)
        while had < n:
            prefix = f'{self.name}_seeds{seed + had}-'
            found = [
                (f'{ENSEMBLES}/{d}', k)
                for d in (sorted(os.listdir(folder)) if os.path.isdir(folder) else [])
                if d.startswith(prefix)
                and 0 < (k := self._members_of(f'{ENSEMBLES}/{d}')) <= n - had
            ]
            if not found:
                break
            chain.append(found[0])
            had += found[0][1]
        return chain

    def _members_of(self, name: str) -> int:
        """The members of the ensemble `name` as its run recorded them (0: none recorded)."""
        saved = recorded_run(os.path.join(self.sweep_dir, name)) or {}
        return saved.get('fingerprint', {}).get('train.ensemble', 0)

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
        seeds = [together.seed + i for i in range(k)]
        point = self.name.replace('{', '{{').replace('}', '}}')  # a literal in the template
        split = functools.partial(_split, source, seeds=seeds, name=f'{point}_s{{seed}}')
        members = [
            self._spec(
                self._seeded(config, first + i, trains=False),
                n,
                split(i, command=self.split_command),
                lane=lane,
                needs=(name,),
            )
            for i in range(k)
        ]
        served = functools.partial(_members_finished, members)  # under other groups, say
        return [dataclasses.replace(first_spec, served=served), *members]


def _members_finished(members: list[Spec], out_dir: str) -> bool:
    """Whether every member's run finished with its spec's fingerprint, whatever ensemble made
    it (a sweep re-run with other --ensemble_groups needs no ensemble for them)."""
    return all(cached(m, run_dir(out_dir, m)) is not None for m in members)


def check_ensembles_divide(
    specs: list[Spec], base: ml_collections.ConfigDict, backend: str, count: int
) -> None:
    """Refuses, before any run starts, an ensemble of the plan whose members would not divide
    over its mesh's member axes in its own process: on `backend` with `count` devices
    (lm.cli.runs_devices), or a CPU run's config.mesh.cpu_devices."""
    for spec in specs:
        if not spec.name.startswith(f'{ENSEMBLES}/'):
            continue
        keys = {k: v for k, v in spec.fingerprint.items() if k.startswith(('mesh.', 'train.'))}
        config = with_values(base, keys)
        cpu = config.mesh.cpu_devices
        try:
            check_members_divide_over(config, cpu if backend == 'cpu' and cpu else count)
        except ValueError as e:
            raise ValueError(
                f'--ensemble: {spec.name} (members: --seeds, --ensemble_groups): {e}'
            ) from None


def _holds_split(out: str, seed: int, step: int) -> bool:
    """Whether the run directory `out` holds the split of the member of seed `seed` at `step`
    (read without starting a JAX backend)."""
    try:
        return saved_steps(out) == [step] and stored_config(out).seed == seed
    except (ValueError, RunError):  # a cut or foreign checkpoint: split it again
        return False


def to_split(outs: dict[int, str], seeds: list[int], member: int, step: int) -> list[int]:
    """The members a split for `member` makes, of an ensemble at `step` whose members' runs are
    `outs`: this one and each later one not finished at `step` (a run finished before its sweep
    was extended holds an earlier step) and not already split there."""
    return [
        m
        for m in range(member, len(seeds))
        if (m == member or not _finished_at(outs[m], step))
        and not _holds_split(outs[m], seeds[m], step)
    ]


def _finished_at(out: str, step: int) -> bool:
    result = read_result(out)
    return result is not None and result.get('step') == step


def _split(ensemble_dir: str, member: int, *, seeds: list[int], name: str, command: list[str]):
    """A Spec's run: member `member` of the finished ensemble in `ensemble_dir`, whose members
    have `seeds` and the runs `name.format(seed=...)` beside it, written to the run's workdir;
    its result is the member's results.json. The split is `command` (scripts/split_ensemble.py)
    in a process of its own, so this one never holds the ensemble's devices (a GPU's memory
    belongs to the next train.py). It splits this member and each later one not finished and
    not split at the ensemble's step, the ensemble restored once for them all."""

    def run(workdir: str) -> dict:
        parent, step = os.path.dirname(workdir), saved_steps(ensemble_dir)[-1]
        outs = {m: os.path.join(parent, name.format(seed=seeds[m])) for m in range(len(seeds))}
        todo = to_split(outs, seeds, member, step)
        for m in todo:  # an earlier split of the member, or one cut short: replaced
            shutil.rmtree(os.path.join(outs[m], 'checkpoints'), ignore_errors=True)
        if todo:
            _split_process(command, ensemble_dir, parent, name, todo, workdir)
        results = os.path.join(workdir, 'results.json')
        if not os.path.exists(results):
            raise RunFailed(f'{ensemble_dir} has no final evaluation for member {member}')
        return read_json_object(results)

    return run


def _split_process(
    command: list[str], ensemble_dir: str, parent: str, name: str, members: list[int], log_dir: str
) -> None:
    """`command` (scripts/split_ensemble.py) splitting `members` of `ensemble_dir` into
    `parent`/`name`, logging to <log_dir>/split.log; RunStopped if a signal stopped it."""
    argv = [
        *command,
        f'--workdir={ensemble_dir}',
        f'--out_dir={parent}',
        f'--name={name}',
        f'--members={",".join(map(str, members))}',
    ]
    with open(os.path.join(log_dir, SPLIT_LOG), 'a') as log:
        code = call(argv, log)
    if signal_name := stopped_by(code):
        raise RunStopped(f'splitting {ensemble_dir} stopped by {signal_name}')
    if code:
        raise RunFailed(f'splitting {ensemble_dir} exited with {code}: see split.log')
