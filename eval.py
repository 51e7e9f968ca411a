"""Evaluate a run's checkpoint and log the result next to its training curves.

  python eval.py --workdir=runs/quickstart                  # latest checkpoint, validation split
  python eval.py --workdir=runs/quickstart --step=500 --split=train
  python eval.py --workdir=runs/gqa2 --config=configs/shakespeare_char.py \
      --config.data.path=other.txt                          # another data source
"""

import json

from absl import flags
from ml_collections import config_flags

from lm.checkpoint import Checkpointer
from lm.cli import (
    check_writable_dir,
    define_distributed_flags,
    initialize_distributed,
    run_app,
    use_compilation_cache,
)
from lm.config import upgrade_config
from lm.evaluation import evaluate
from lm.experiment import prepare, stored_config
from lm.sharding import set_cpu_devices
from lm.summary import Summary, run_logdir
from lm.train_step import make_eval_step

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory holding checkpoints/.', required=True
)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
_SPLIT = flags.DEFINE_enum('split', 'validation', ['train', 'validation'], 'Split to evaluate.')
_BATCHES = flags.DEFINE_integer('eval_batches', 0, 'Batches to evaluate; 0 = the whole split.')
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, "Optional config whose data (source, path, tokenizer) replaces the run's."
)
define_distributed_flags()
_TB_DIR = flags.DEFINE_string('tb_dir', '', "TensorBoard directory of the run; '' = <workdir>/tb.")


def run() -> int:
    if _CONFIG.value is not None:
        ignored = sorted(
            k
            for k in config_flags.get_override_values(flags.FLAGS['config'])
            if not k.startswith('data.')
        )
        if ignored:
            raise ValueError(
                f'eval.py takes only --config.data.* from --config; --config.{ignored[0]} would be '
                "ignored (the model, training and mesh settings are the checkpoint's)"
            )
    saved = stored_config(_WORKDIR.value)
    check_writable_dir(
        run_logdir(_WORKDIR.value, _TB_DIR.value), '--tb_dir' if _TB_DIR.value else '--workdir'
    )
    set_cpu_devices(saved.mesh)
    use_compilation_cache(saved.compilation_cache_dir)
    initialize_distributed()
    ckpt = Checkpointer(_WORKDIR.value, read_only=True)
    if not ckpt.steps():
        raise FileNotFoundError(f'no checkpoint in {ckpt.directory}')
    meta = ckpt.read_meta(_STEP.value if _STEP.value is not None else ckpt.steps()[-1])
    config = upgrade_config(meta['config'])
    own_data = _CONFIG.value is None
    if not own_data:
        config.data = _CONFIG.value.data
    config.eval_batches = _BATCHES.value
    exp = prepare(config)
    step, state, _ = ckpt.restore(exp.setup.abstract_state, _STEP.value)
    ckpt.close()
    metrics = evaluate(
        make_eval_step(exp.setup),
        state['params'],
        exp.corpus,
        _SPLIT.value,
        batch_size=config.train.batch_size,
        seq_len=config.data.seq_len,
        num_batches=_BATCHES.value,
        batch_sharding=exp.setup.batch_sharding,
    )
    same = own_data or exp.corpus.fingerprint == meta['data_fingerprint']
    # Never the in-training `eval/*` tag: that curve is config.eval_batches batches at each eval
    # step; this is another protocol (the whole split, or --eval_batches), so it gets its own.
    if same and _SPLIT.value == 'validation':
        prefix = f'eval_first{_BATCHES.value}' if _BATCHES.value else 'eval_full'
    else:
        prefix = f'eval_{config.data.source}_{exp.corpus.fingerprint[:6]}_{_SPLIT.value}'
    print(json.dumps({'step': step, 'split': _SPLIT.value, 'tag': prefix, **metrics}))
    tb = Summary(run_logdir(_WORKDIR.value, _TB_DIR.value))
    tb.scalars(step, {f'{prefix}/{k}': v for k, v in metrics.items()})
    tb.close()
    return 0


if __name__ == '__main__':
    run_app(run)
