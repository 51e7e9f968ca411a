r"""Train (or resume) a language model from a config file.

  python train.py --config=configs/quickstart.py --workdir=runs/quickstart
  python train.py --config=configs/shakespeare_char.py:gqa2 --workdir=runs/gqa2 \
      --config.data.path=data/tinyshakespeare.txt --config.train.steps=500

Re-running the same command on a workdir that holds a checkpoint resumes from it; a changed
config is refused unless --allow_config_change (see lm.train.identity.RESUMABLE_KEYS). One run at a
time owns a workdir.
"""

import os

from absl import flags
from ml_collections import config_flags

from lm.cli import (
    bootstrap,
    check_inactive_overrides,
    check_writable_dir,
    run_app,
    saved_config_overrides,
)
from lm.config import check_config_keys, with_overrides
from lm.convert import check_uptrain_config
from lm.data import cache_dir
from lm.distributed import define_distributed_flags
from lm.train import (
    check_logdir_owner,
    check_loop_config,
    check_not_past,
    check_run_dir,
    check_tb_dir_kept,
    finished_step,
    latest_sound_step,
    read_latest_meta,
    run_logdir,
    stored_config,
    train,
)

_CONFIG = config_flags.DEFINE_config_file(
    'config',
    None,
    'Config file (path[:arg]); optional when --workdir holds a checkpoint, whose '
    'saved config is then used.',
    lock_config=True,
)
# --config.KEY=VALUE without --config: applied to the workdir's saved config (a run trained on)
_SAVED_OVERRIDES = saved_config_overrides()
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory: checkpoints/ and tb/ go here.', required=True
)
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Shared TensorBoard directory (run = workdir name); '' = <workdir>/tb."
)
_ALLOW_CHANGE = flags.DEFINE_bool(
    'allow_config_change',
    False,
    'Resume a checkpoint under a config that differs from its own (beyond train.steps, '
    'intervals, caches, mesh and XLA options, which may always change: '
    'lm.train.identity.RESUMABLE_KEYS).',
)

define_distributed_flags()


def run() -> int:
    tb_flag = '--tb_dir' if _TB_DIR.value else '--workdir'
    check_writable_dir(_WORKDIR.value, '--workdir')
    check_run_dir(_WORKDIR.value)
    check_tb_dir_kept(_WORKDIR.value, _TB_DIR.value)
    # what the run writes into, before any work: its checkpoints and its TensorBoard directory
    check_writable_dir(os.path.join(_WORKDIR.value, 'checkpoints'), '--workdir')
    check_writable_dir(run_logdir(_WORKDIR.value, _TB_DIR.value), tb_flag)
    check_logdir_owner(_WORKDIR.value, _TB_DIR.value, tb_flag)
    if _CONFIG.value is not None:
        config = _CONFIG.value
        check_config_keys(config)
    elif (step := latest_sound_step(_WORKDIR.value)) is not None:  # a damaged newer one: moved
        saved = stored_config(_WORKDIR.value, step=step)  # aside by the resume, as with --config
        config = with_overrides(saved, _SAVED_OVERRIDES, '--config.*')
    else:
        given = ' (--config.* overrides apply to a saved config)' if _SAVED_OVERRIDES else ''
        raise ValueError(
            f'--config is required: {_WORKDIR.value} holds no checkpoint to resume{given}'
        )
    given = config_flags.get_override_values(flags.FLAGS['config']) if _CONFIG.value else {}
    check_inactive_overrides(config, [*given, *(o.partition('=')[0] for o in _SAVED_OVERRIDES)])
    check_not_past(read_latest_meta(_WORKDIR.value), config, _WORKDIR.value)  # before the rest
    check_loop_config(config)  # the intervals too, which a finished run below would not read
    check_uptrain_config(config.uptrain)
    check_writable_dir(cache_dir(config.data), 'config.data.cache_dir')
    if (done := finished_step(config, _WORKDIR.value)) is not None:
        print(f'{_WORKDIR.value} is already at train.steps={done}: nothing to do')
        return 0
    bootstrap(config, shared={'--workdir': _WORKDIR.value, '--tb_dir': _TB_DIR.value})
    result = train(config, _WORKDIR.value, _TB_DIR.value, _ALLOW_CHANGE.value)
    return 128 + result['signal'] if result['signal'] else 0


if __name__ == '__main__':
    run_app(run)
