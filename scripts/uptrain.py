"""Convert an MHA (or GQA) checkpoint to fewer KV heads and set up a run that uptrains it.

  python scripts/uptrain.py --src=runs/mha --dst=runs/gqa2_up --num_kv_heads=2 --method=mean
  python train.py --workdir=runs/gqa2_up        # uptrains for uptrain.fraction x source steps

The new workdir holds a step-0 checkpoint with the converted parameters, a fresh optimizer
state, and the source config with attention / num_kv_heads / schedule updated.
"""

from absl import flags

from lm.cli import bootstrap, check_writable_dir, run_app
from lm.experiment import stored_config
from lm.uptrain import convert_checkpoint

_SRC = flags.DEFINE_string('src', None, 'Workdir of the source (MHA) run.', required=True)
_DST = flags.DEFINE_string('dst', None, 'New workdir for the converted run.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Source checkpoint step; default: the latest.')
_KV = flags.DEFINE_integer(
    'num_kv_heads', None, 'KV heads g after conversion (1 = MQA).', required=True
)
_METHOD = flags.DEFINE_string('method', 'mean', "'mean' | 'first' | 'random'.")
_FRACTION = flags.DEFINE_float(
    'fraction',
    None,
    'Uptraining steps as a fraction of the source '
    "run's steps; default: the config's uptrain.fraction (0.05).",
)
_SEED = flags.DEFINE_integer('seed', 0, "Seed for --method=random's fresh K/V.")
_STEPS = flags.DEFINE_integer(
    'steps',
    None,
    "Uptraining steps; default: --fraction of the source run's steps (needed for a source "
    'at step 0, such as a model imported by scripts/convert_hf.py).',
)


def run() -> int:
    check_writable_dir(_DST.value, '--dst')
    bootstrap(stored_config(_SRC.value, '--src'))
    config = convert_checkpoint(
        _SRC.value,
        _DST.value,
        _KV.value,
        _METHOD.value,
        _STEP.value,
        _FRACTION.value,
        _SEED.value,
        _STEPS.value,
    )
    print(
        f'wrote {_DST.value}: {config.model.attention} with {config.model.num_kv_heads} KV '
        f'heads; next: python train.py --workdir={_DST.value}'
    )
    return 0


if __name__ == '__main__':
    run_app(run)
