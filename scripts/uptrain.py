r"""Convert an MHA (or GQA) checkpoint to fewer KV heads and set up a run that uptrains it.

  python scripts/uptrain.py --src=runs/mha --dst=runs/gqa2_up --num_kv_heads=2 --method=mean
  python train.py --workdir=runs/gqa2_up        # uptrains for uptrain.fraction x source steps

A seed ensemble as --src (config.train.ensemble) converts each member as its own checkpoint
would be, into the runs <dst>_s<seed> (docs/ensembles.md).

The new run logs to the source's shared TensorBoard directory (--tb_dir of its training), or
to --tb_dir; train.py, eval.py and analyze_heads.py on it write there too.

The new workdir holds a checkpoint at the source's step N with the converted parameters and
optimizer state (--optimizer_state=convert: the source's AdamW moments, K/V pooled like the
weights; fresh: new ones), and the source config with attention / num_kv_heads updated. Training
continues from step N on the batches the source recipe would use next (new data, no replay),
under --schedule=continue (the source's learning-rate schedule carried on) or rewarm (warmup to
the peak anew, cosine over the uptraining steps).

Beyond contiguous mean-pooling (docs/convert.md, "Conversion methods"):

  # merge the most similar KV heads, each rotated onto its group's first head first
  python scripts/uptrain.py --src=runs/mha --dst=runs/gqa2_al --num_kv_heads=2 \
      --grouping=similarity --method=aligned --optimizer_state=fresh
  # MHA -> MQA + cross-layer attention (CLA2: every two layers share one K/V head)
  python scripts/uptrain.py --src=runs/mha --dst=runs/mqa_cla2 --num_kv_heads=1 \
      --kv_share_every=2
  # per-layer KV heads: 6 over the layers, more where a layer's heads are least alike
  python scripts/uptrain.py --src=runs/mha --dst=runs/kv6 --kv_budget=6
  # MHA / GQA -> MLA (MHA2MLA): latent rank 64, RoPE on 8 dims of a shared key
  python scripts/uptrain.py --src=runs/mha --dst=runs/mla64 --target=mla --kv_lora_rank=64 \
      --qk_rope_head_dim=8 --optimizer_state=fresh
  # ... with a RoPE key per KV head of a 4-KV-head source, as MHA2MLA caches it (4 x 8 dims)
  python scripts/uptrain.py --src=runs/mha --dst=runs/mla64_k4 --target=mla --kv_lora_rank=64 \
      --qk_rope_head_dim=8 --rope_heads=4 --optimizer_state=fresh
"""

import re
import signal
import sys

from absl import flags

from lm.cli import USER_ERRORS, bootstrap, check_writable_dir, run_app
from lm.convert import (
    KEYS,
    SOURCE,
    WORKDIR,
    ConversionOptions,
    cache_summary,
    convert_checkpoint,
    convert_ensemble,
    optimizer_state_summary,
)
from lm.train import (
    StopRequest,
    check_logdir_owner,
    remember_tb_dir,
    remembered_tb_dir,
    stored_config,
)

_SRC = flags.DEFINE_string('src', None, 'Workdir of the source (MHA) run.', required=True)
_DST = flags.DEFINE_string('dst', None, 'New workdir for the converted run.', required=True)
_STEP = flags.DEFINE_integer('step', None, 'Source checkpoint step; default: the latest.')
_KV = flags.DEFINE_integer(
    'num_kv_heads', 0, 'KV heads g after conversion (1 = MQA); unset for --target=mla.'
)
_SHARE = flags.DEFINE_integer(
    'kv_share_every',
    1,
    "Cross-layer attention: merge each N adjacent layers' K/V into one (CLA2: 2); with "
    "--num_kv_heads unset, each layer keeps the source's KV heads.",
)
_METHOD = flags.DEFINE_string(
    'method',
    '',
    "'mean' | 'first' | 'random' | 'aligned' (Procrustes-aligned mean); --target=mla: "
    "'joint_svd'. Default: 'mean', or 'joint_svd' for --target=mla.",
)
_GROUPING = flags.DEFINE_string(
    'grouping',
    '',
    "Which KV heads merge: 'contiguous' (Ainslie et al.) or 'similarity' (most similar heads, "
    "by the head-analysis KV-head similarity on the source's training text); default: "
    "'similarity' with --kv_budget, else 'contiguous'.",
)
_BUDGET = flags.DEFINE_integer(
    'kv_budget',
    0,
    'Per-layer KV heads: this many over all layers, given to the layers whose heads are least '
    'alike, each layer by similarity grouping and mean pooling (--num_kv_heads unset). 0 = off.',
)
_TARGET = flags.DEFINE_string(
    'target', '', "'' = fewer K/V heads (GQA / MQA); 'mla' = MHA2MLA latent attention."
)
_KV_LORA = flags.DEFINE_integer(
    'kv_lora_rank', 0, '--target=mla: latent rank C (config.model.mla.kv_lora_rank).'
)
_ROPE_DIM = flags.DEFINE_integer(
    'qk_rope_head_dim', 0, '--target=mla: RoPE width of each RoPE key (even; frequency pairs x 2).'
)
_ROPE_HEADS = flags.DEFINE_integer(
    'rope_heads',
    1,
    "--target=mla: RoPE keys per token, dividing the source's KV heads G: 1 = one shared key "
    '(their mean); G = each KV head its own, as MHA2MLA (config.model.mla.rope_heads).',
)
_CALIBRATION = flags.DEFINE_integer(
    'calibration_tokens',
    None,
    "Source training tokens that similarity / aligned / mla fit on; default: the config's "
    'uptrain.calibration_tokens.',
)
_FRACTION = flags.DEFINE_float(
    'fraction',
    None,
    'Uptraining steps as a fraction of the source '
    "run's steps; default: the config's uptrain.fraction (0.05).",
)
_SCHEDULE = flags.DEFINE_string(
    'schedule',
    'continue',
    "'continue': the source's learning-rate schedule carried on (plus --warmup_steps of ramp "
    "if > 0); 'rewarm': warmup to the peak lr anew, cosine over the uptraining steps.",
)
_WARMUP = flags.DEFINE_integer(
    'warmup_steps',
    None,
    "Uptraining steps of warmup ('rewarm') or of ramp from 0 ('continue'); -1: 10% of them "
    "('rewarm'), none ('continue'); default: the config's uptrain.warmup_steps (-1).",
)
_LR = flags.DEFINE_float(
    'lr',
    None,
    'Peak learning rate of the converted run, its min_lr scaled by the same factor; default: '
    "the source's (config.train.lr).",
)
_OPT_STATE = flags.DEFINE_string(
    'optimizer_state',
    'convert',
    "'convert': the source's AdamW state, K/V moments pooled like the weights (MLA: the kept "
    "parameters' moments, zero for the new factors); 'fresh': new.",
)
_DATA_SPLIT = flags.DEFINE_string(
    'data_split',
    None,
    "Corpus part the converted run trains on (config.data.split): '' (the whole training split), "
    "'pretrain', 'uptrain' or 'pretrain+uptrain'; default: the source's. A source trained on "
    "'pretrain' uptrains on the part set aside for it with 'uptrain'.",
)
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Shared TensorBoard directory of the new run; '' = the source's."
)
_SEED = flags.DEFINE_integer('seed', 0, "Seed for --method=random's fresh K/V.")
_STEPS = flags.DEFINE_integer(
    'steps',
    None,
    "Uptraining steps; default: --fraction of the source run's steps (needed for a source "
    'at step 0, such as a model imported by scripts/convert_hf.py).',
)


# The library's errors name config keys (KEYS); this script's user sees its flags, each named
# as its option but --step, plus the two workdirs.
FLAGS = {KEYS[name]: f'--{name}' for name in KEYS if name in flags.FLAGS} | {
    KEYS['source_step']: '--step',
    SOURCE: '--src',
    WORKDIR: '--dst',
}
_KEY = re.compile(
    r'(?<![\w./])(' + '|'.join(map(re.escape, sorted(FLAGS, key=len, reverse=True))) + r')(?![\w/])'
)


def with_flags(message: str) -> str:
    """`message` with every config key of FLAGS named by its flag."""
    return _KEY.sub(lambda m: FLAGS[m.group(1)], message)


def options() -> ConversionOptions:
    """The conversion the flags ask for; one line for a flag that would do nothing."""
    made = _options()
    if _CALIBRATION.value is not None and not made.needs_calibration:
        raise ValueError(
            '--calibration_tokens does nothing here: only similarity grouping, aligned merging, '
            'a KV budget or a latent target read the source text; leave it unset'
        )
    if flags.FLAGS['seed'].present and made.method != 'random':
        raise ValueError(f"--seed draws --method=random's K/V only; --method={made.method}")
    return made


def _options() -> ConversionOptions:
    return ConversionOptions(
        target=_TARGET.value,
        num_kv_heads=_KV.value,
        kv_share_every=_SHARE.value,
        kv_lora_rank=_KV_LORA.value,
        qk_rope_head_dim=_ROPE_DIM.value,
        rope_heads=_ROPE_HEADS.value,
        method=_METHOD.value,
        grouping=_GROUPING.value,
        calibration_tokens=_CALIBRATION.value,
        source_step=_STEP.value,
        steps=_STEPS.value,
        fraction=_FRACTION.value,
        schedule=_SCHEDULE.value,
        warmup_steps=_WARMUP.value,
        optimizer_state=_OPT_STATE.value,
        lr=_LR.value,
        seed=_SEED.value,
        kv_budget=_BUDGET.value,
        data_split=_DATA_SPLIT.value,
    )


def run() -> int:
    try:
        conversion = options()
        check_writable_dir(_DST.value, '--dst')
        source = stored_config(_SRC.value, '--src', conversion.source_step)
        bootstrap(source)
        tb_dir = _TB_DIR.value or remembered_tb_dir(_SRC.value)
        if _TB_DIR.value:
            check_writable_dir(tb_dir, '--tb_dir')
        check_logdir_owner(_DST.value, tb_dir, '--dst')
        with StopRequest() as stop:  # SIGTERM / SIGINT: stop the conversion, write nothing
            if source.train.ensemble:  # each member, as its own checkpoint: <dst>_s<seed>
                written = convert_ensemble(
                    _SRC.value, conversion, _DST.value, stop, need_steps=True
                )
            else:
                config = convert_checkpoint(
                    _SRC.value, conversion, _DST.value, stop, need_steps=True
                )
                written = [(_DST.value, config)]
    except USER_ERRORS as e:
        raise type(e)(with_flags(str(e))) from None
    for dst, config in written:
        remember_tb_dir(dst, tb_dir)  # train.py, eval.py, ... log there
        print(
            f'wrote {dst}: {config.model.attention} with {cache_summary(config)} by '
            f'{config.uptrain.method} ({config.uptrain.grouping} grouping) at step '
            f'{config.uptrain.source_step} ({_SCHEDULE.value} schedule, '
            f'{optimizer_state_summary(config)}, to step {config.train.steps}, on '
            f'{f"data.split={config.data.split!r}" if config.data.split else "all the data"}); '
            'next: '
            f'python train.py --workdir={dst}' + (f' --tb_dir={tb_dir}' if tb_dir else '')
        )
    if stop.signum:  # it arrived while writing, which is let finish
        print(f'stopped by {signal.Signals(stop.signum).name} once written', file=sys.stderr)
        return 128 + stop.signum
    return 0


if __name__ == '__main__':
    run_app(run)
