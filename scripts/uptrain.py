"""Convert an MHA (or GQA) checkpoint to fewer KV heads and set up a run that uptrains it.

  python scripts/uptrain.py --src=runs/mha --dst=runs/gqa2_up --num_kv_heads=2 --method=mean
  python train.py --workdir=runs/gqa2_up        # uptrains for uptrain.fraction x source steps

The new workdir holds a checkpoint at the source's step N with the converted parameters and
optimizer state (--optimizer_state=convert: the source's AdamW moments, K/V pooled like the
weights; fresh: new ones), and the source config with attention / num_kv_heads updated. Training
continues from step N on the batches the source recipe would use next (new data, no replay),
under --schedule=continue (the source's learning-rate schedule carried on) or rewarm (warmup to
the peak anew, cosine over the uptraining steps).
"""

from absl import flags

from lm.cli import bootstrap, check_writable_dir, run_app
from lm.experiment import stored_config
from lm.uptrain import check_flags, convert_checkpoint

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
_SCHEDULE = flags.DEFINE_string(
    'schedule',
    'continue',
    "'continue': the source's learning-rate schedule carried on (plus uptrain.warmup_steps of "
    "ramp if > 0); 'rewarm': warmup to the peak lr anew, cosine over the uptraining steps.",
)
_OPT_STATE = flags.DEFINE_string(
    'optimizer_state',
    'convert',
    "'convert': the source's AdamW state, K/V moments pooled like the weights; 'fresh': new.",
)
_SEED = flags.DEFINE_integer('seed', 0, "Seed for --method=random's fresh K/V.")
_STEPS = flags.DEFINE_integer(
    'steps',
    None,
    "Uptraining steps; default: --fraction of the source run's steps (needed for a source "
    'at step 0, such as a model imported by scripts/convert_hf.py).',
)


def run() -> int:
    check_flags(
        _KV.value,
        _METHOD.value,
        _STEP.value,
        _FRACTION.value,
        _SEED.value,
        _SCHEDULE.value,
        _OPT_STATE.value,
    )
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
        _SCHEDULE.value,
        _OPT_STATE.value,
    )
    print(
        f'wrote {_DST.value}: {config.model.attention} with {config.model.num_kv_heads} KV '
        f'heads at step {config.uptrain.source_step} ({_SCHEDULE.value} schedule, '
        f'{_OPT_STATE.value} optimizer state, to step {config.train.steps}); next: '
        f'python train.py --workdir={_DST.value}'
    )
    return 0


if __name__ == '__main__':
    run_app(run)
