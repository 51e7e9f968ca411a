r"""MQAR held-out accuracy of a checkpoint by the answer's order in its row (1st answered query,
2nd, ...), beside what a model with no recall gets there: one that knows which values its row
holds and which are answered already (each key is queried once) scores 1/P, 1/(P-1), ..., 1.

  python scripts/recall_by_order.py --workdir=runs/p4_s32_long

Prints one JSON line: step, by_order, no_recall (that shortcut's accuracy at each order).
"""

import json

from absl import flags

from lm.cli import bootstrap, run_app
from lm.data import nth_answer_only
from lm.train import assemble, eval_batch_size, evaluate_recall, make_eval_step, stored_config

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory of an MQAR run.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')


def run() -> int:
    config = stored_config(_WORKDIR.value, step=_STEP.value)
    if config.data.source != 'mqar':
        raise ValueError(
            f"--workdir={_WORKDIR.value}: data.source is {config.data.source!r}, expected 'mqar'"
        )
    bootstrap(config)
    restored = assemble(config, state='params', workdir=_WORKDIR.value, step=_STEP.value, data=True)
    rows, cells = restored.corpus.task.split('validation')
    eval_step, pairs = make_eval_step(restored.ctx), config.data.recall_pairs
    by_order = [
        evaluate_recall(
            eval_step,
            restored.state['params'],
            nth_answer_only(rows, n),
            cells,
            [],
            eval_batch_size(restored.config),
            restored.ctx.batch_sharding,
        )['recall_accuracy']
        for n in range(pairs)
    ]
    no_recall = [1 / (pairs - n) for n in range(pairs)]
    print(json.dumps({'step': restored.step, 'by_order': by_order, 'no_recall': no_recall}))
    return 0


if __name__ == '__main__':
    run_app(run)
