r"""Evaluate a run's checkpoint and log the result next to its training curves.

The protocol is the run's own (`lm.train.evaluation`: config.eval_tokens and eval_batch_size), so on
the run's validation split this gives exactly the loss its training logged at that step.

  python eval.py --workdir=runs/quickstart                  # latest checkpoint, validation split
  python eval.py --workdir=runs/quickstart --step=400 --split=train --eval_tokens=100000
  python eval.py --workdir=runs/gqa2 --config=configs/shakespeare_char.py \
      --config.data.path=other.txt                          # another data source
  python eval.py --workdir=runs/gqa2 --kv_cache_dtype=int8  # decoded through an int8 KV cache
"""

import json
import math
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags

from lm.cli import (
    bootstrap,
    check_data_overrides,
    check_writable_dir,
    run_app,
)
from lm.data import TASKS, check_same_tokenizer
from lm.distributed import define_distributed_flags
from lm.experiments import evaluate_run
from lm.model import (
    DECODE_KERNELS,
    KV_CACHE_DTYPES,
    check_decode_backend,
    check_model_config,
    check_storage,
)
from lm.train import (
    Run,
    StopRequest,
    Summary,
    assemble,
    check_logdir_owner,
    check_scores_fit,
    claim_logdir,
    eval_batch_size,
    inherited_data,
    run_logdir,
    stored_config,
)

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory holding checkpoints/.', required=True
)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
_SPLIT = flags.DEFINE_enum('split', 'validation', ['train', 'validation'], 'Split to evaluate.')
_TOKENS = flags.DEFINE_integer(
    'eval_tokens', None, "Tokens to evaluate (0 = whole split); default: the run's config."
)
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, "Optional config whose data (source, path, tokenizer) replaces the run's."
)
_CACHE = flags.DEFINE_string(
    'kv_cache_dtype',
    '',
    "'' = the training forward; else each window is decoded token by token through a KV cache "
    f'stored as this ({", ".join(KV_CACHE_DTYPES)}; lm/infer/cached_eval.py), logged as '
    'eval_cache_<dtype>.',
)
_KERNEL = flags.DEFINE_enum(
    'decode_kernel',
    None,
    list(DECODE_KERNELS),
    "A cached eval's decode-step attention (config.model.decode_kernel; 'pallas' needs a GPU); "
    "default: the run's.",
)
define_distributed_flags()
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Shared TensorBoard directory to log to; '' = the one the run was trained with."
)


def check_cache_dtype(model: ml_collections.ConfigDict, data: ml_collections.ConfigDict) -> None:
    """--kv_cache_dtype scores text windows, in caches the model can decode with
    (`check_storage`), and kivi4 needs a window longer than its group."""
    if _CACHE.value and data.source in TASKS:
        raise ValueError('--kv_cache_dtype evaluates text windows; this run is a recall task')
    if _CACHE.value:  # before the data is read (it came after)
        window = 'a window of config.data.seq_len'
        check_storage(check_model_config(model), _CACHE.value, data.seq_len, window)


def check_kernel(model: ml_collections.ConfigDict) -> dict[str, str]:
    """--decode_kernel as `assemble`'s model override ({} = the run's), read by a cached eval
    alone; 'pallas' (given, or the run's) needs a GPU, refused before any data is read."""
    if _KERNEL.value is not None and not _CACHE.value:
        raise ValueError('--decode_kernel is read only by a cached eval: pass --kv_cache_dtype too')
    if _CACHE.value and (_KERNEL.value or model.decode_kernel) == 'pallas':
        if _KERNEL.value:
            check_decode_backend('--decode_kernel')
        else:
            fix = 'pass --decode_kernel=xla (or pallas_interpret)'
            check_decode_backend("the run's config.model.decode_kernel", fix)
    return {} if _KERNEL.value is None else {'decode_kernel': _KERNEL.value}


def _evaluate(restored: Run) -> dict[str, float]:
    """The checkpoint's metrics on --split, by the training forward or through a KV cache."""
    with StopRequest() as stop:  # SIGTERM: stop between batches, write nothing
        return evaluate_run(restored, _SPLIT.value, stop, _CACHE.value)


def check_own_tokens(tokens: int, data: ml_collections.ConfigDict) -> None:
    """The run's own config.eval_tokens must still keep two windows of --config's data."""
    if data.source not in TASKS and 0 < tokens <= data.seq_len:
        raise ValueError(
            f"the run's config.eval_tokens={tokens} is one window or less of --config's "
            f'data.seq_len={data.seq_len}: pass --eval_tokens (0 = the whole split, or more '
            f'than {data.seq_len})'
        )


def check_eval_tokens(tokens: int | None, data: ml_collections.ConfigDict) -> None:
    """--eval_tokens must keep two windows or more of the data evaluated (the loss's standard
    error is over windows); a recall task scores its examples instead, so it takes none."""
    if tokens is not None and data.source in TASKS:
        raise ValueError(
            f'--eval_tokens does nothing for source={data.source!r}: a recall task scores '
            f'config.data.recall_eval_examples={data.recall_eval_examples} examples'
        )
    seq_len = data.seq_len
    if tokens is not None and (tokens < 0 or 0 < tokens <= seq_len):
        raise ValueError(
            f'--eval_tokens={tokens}: expected 0 (the whole split) or more than one window of '
            f'{seq_len} tokens (the standard error is over windows)'
        )


def protocol(data: ml_collections.ConfigDict) -> dict[str, object]:
    """The data settings that change an evaluation of the same tokens (the data fingerprint
    covers the text and tokenizer only): a value other than the run's own gets its own tag."""
    return {'seq_len': data.seq_len, 'document_mask': data.document_mask}


def same_data(restored: Run, own_data: bool) -> bool:
    """Whether the data evaluated is what the checkpoint recorded training on, as far as it can
    tell: its fingerprint, or the run's own data config where the checkpoint's fingerprint is
    inherited (an import's, a conversion's first step). The run's own data read as another file
    (a relative config.data.path from another directory, a file changed since) says so on
    stderr and is logged as other data, not as the run's eval."""
    recorded = restored.meta['data_fingerprint']
    if restored.corpus.fingerprint == recorded:
        return True
    if own_data and inherited_data(restored.config, restored.step, recorded):
        return True
    if own_data:
        print(
            f"warning: the run's data as read here (config.data.path="
            f'{restored.config.data.path!r}) is not what step {restored.step} recorded training '
            f'on (fingerprint {restored.corpus.fingerprint[:12]}, recorded {recorded[:12]}): '
            'logged as other data',
            file=sys.stderr,
        )
    return False


def run() -> int:
    if _CONFIG.value is not None:
        check_data_overrides('eval.py')
    if _CACHE.value and _CACHE.value not in KV_CACHE_DTYPES:
        raise ValueError(f'--kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {_CACHE.value!r}')
    tb_flag = '--tb_dir' if _TB_DIR.value else '--workdir'
    check_writable_dir(run_logdir(_WORKDIR.value, _TB_DIR.value), tb_flag)  # outputs first
    check_logdir_owner(_WORKDIR.value, _TB_DIR.value, tb_flag)
    config = stored_config(_WORKDIR.value, step=_STEP.value)
    data = config.data if _CONFIG.value is None else _CONFIG.value.data  # the data scored
    check_eval_tokens(_TOKENS.value, data)
    if _CONFIG.value is not None:
        if _TOKENS.value is None:
            check_own_tokens(config.eval_tokens, data)
        check_same_tokenizer(config.data, data, '--config')
    check_cache_dtype(config.model, data)
    bootstrap(config)
    kernel = check_kernel(config.model)
    own_data, own_protocol = _CONFIG.value is None, protocol(config.data)
    if not own_data:
        config.data = _CONFIG.value.data
    own_tokens = config.eval_tokens
    if _TOKENS.value is not None:
        config.eval_tokens = _TOKENS.value
    if not _CACHE.value:  # a cached eval scores one position at a time: no [T, T] scores
        check_scores_fit(config, eval_batch_size(config), 'eval.py')  # before the restore
    restored = assemble(
        config,
        state='params',
        workdir=_WORKDIR.value,
        step=_STEP.value,
        data=True,
        model_overrides=kernel,
    )
    metrics = _evaluate(restored)
    if not math.isfinite(metrics['loss']):
        raise FloatingPointError(
            f'--workdir={_WORKDIR.value}: the loss of step {restored.step} is {metrics["loss"]} '
            '(non-finite parameters or activations); nothing written'
        )
    same = same_data(restored, own_data)
    prefix = (
        'eval'
        if same and _SPLIT.value == 'validation'
        else (f'eval_{config.data.source}_{restored.corpus.fingerprint[:6]}_{_SPLIT.value}')
    )
    if _CACHE.value:  # decoded through a cache: its own tag, never the run's eval
        prefix += f'_cache_{_CACHE.value}'
    if restored.config.eval_tokens != own_tokens:  # another protocol: never overwrite the run's
        prefix += f'_tokens{metrics["tokens"]}'  # the tokens it scored
    prefix += ''.join(f'_{k}{v}' for k, v in protocol(config.data).items() if v != own_protocol[k])

    print(json.dumps({'step': restored.step, 'split': _SPLIT.value, 'tag': prefix, **metrics}))
    claim_logdir(_WORKDIR.value, _TB_DIR.value, tb_flag)  # its run there is this workdir's
    tb = Summary(run_logdir(_WORKDIR.value, _TB_DIR.value))
    tb.scalars(restored.step, {f'{prefix}/{k}': v for k, v in metrics.items()})
    tb.close()
    return 0


if __name__ == '__main__':
    run_app(run)
