r"""Write members of a seed ensemble (config.train.ensemble) out as ordinary run directories.

Member i becomes `<out_dir>/seed_<seed + i>` (`--name` sets the name): the single run's
config (ensemble off, its own seed) and a checkpoint of its parameters and optimizer state at
the ensemble's step, so eval.py, scripts/generate.py, scripts/convert_hf.py export and train.py
(resuming it as a single run) read it like any run.

  python scripts/split_ensemble.py --workdir=runs/ens --out_dir=runs/ens_members
  python scripts/split_ensemble.py --workdir=runs/ens --out_dir=runs/m --members=0,3 --step=500
  python scripts/split_ensemble.py --workdir=runs/ens --out_dir=runs --name='ens_s{seed}'
"""

from absl import flags

from lm.cli import bootstrap, check_writable_dir, run_app
from lm.train import (
    Interrupted,
    StopRequest,
    member_seeds,
    split_members,
    split_request,
    stored_config,
)

_WORKDIR = flags.DEFINE_string('workdir', None, 'The ensemble run directory.', required=True)
_OUT_DIR = flags.DEFINE_string(
    'out_dir', None, 'Where the members go, one directory (--name) each.', required=True
)
_NAME = flags.DEFINE_string(
    'name', 'seed_{seed}', "A member's directory in --out_dir: {seed} its seed, {member} its index."
)
_MEMBERS = flags.DEFINE_list('members', [], 'Member indices (0-based); default: all.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')


def run() -> int:
    check_writable_dir(_OUT_DIR.value, '--out_dir')
    config = stored_config(_WORKDIR.value, step=_STEP.value)
    seeds = member_seeds(config)
    if not seeds:
        raise ValueError(f'--workdir: {_WORKDIR.value} is not an ensemble (train.ensemble=0)')
    outs = split_request(_WORKDIR.value, _OUT_DIR.value, _MEMBERS.value, seeds, _NAME.value)
    bootstrap(config)

    def done(m: int, out: str) -> None:
        print(f'member {m} (seed {seeds[m]}) -> {out}', flush=True)

    with StopRequest() as stop:
        try:
            split_members(_WORKDIR.value, outs, _STEP.value, stop.check, done)
        except Interrupted as e:  # between members: those printed are split, each whole
            print(f'{e}: the members above are split; run the command again for the rest')
            return 128 + e.signum
    return 0


if __name__ == '__main__':
    run_app(run)
