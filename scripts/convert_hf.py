"""Hugging Face checkpoints in and out of lm (Llama for MHA / GQA / MQA, DeepSeek-V3 for MLA).

  python scripts/convert_hf.py import --hf_dir=DIR_OR_HUB_ID --workdir=runs/llama
  python scripts/convert_hf.py export --workdir=runs/llama_gqa [--step=N] --hf_dir=out/llama_gqa

`import` writes a step-0 run (resolved config + checkpoint, the model's tokenizer.json as
data.tokenizer) that train.py, eval.py, scripts/generate.py and scripts/uptrain.py --src use as
they are; its data / train / mesh settings come from --config (default configs/base.py).
`export` writes config.json, safetensors, the run's tokenizer and the tokenizer / generation
files an import carried (chat template, generation_config.json, ...), which
transformers.AutoModelForCausalLM and AutoTokenizer.from_pretrained load. A non-empty output
(export: --hf_dir; import: --workdir) is refused unless --overwrite (then replaced whole); an
import's --workdir holding checkpoints is refused always, and --overwrite never replaces a
training run or sweep directory, nor a directory holding one, nor on export a directory that is
not an earlier lm export (config.json with its lm_model field, safetensors, no sub-folder), nor
on import one holding a name no run or import writes. Both build their output beside its place
and move it in when complete: a failure or SIGTERM / SIGINT (exit 128 + signal)
leaves the old contents as they were.
"""

import os

from absl import app, flags
from ml_collections import config_flags

from lm.cli import (
    REPO_ROOT,
    bootstrap,
    check_writable_dir,
    define_config_file,
    parse_flags,
    run_reporting_errors,
)
from lm.convert import check_export_dir, check_import_dir, export_hf, import_hf
from lm.data import TASKS
from lm.train import StopRequest, stored_config

_HF_DIR = flags.DEFINE_string(
    'hf_dir', None, 'import: HF directory or hub id to read; export: directory to write.'
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The lm run directory.')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite',
    False,
    'Replace a non-empty output whole (export: --hf_dir; import: a --workdir without '
    'checkpoints), unless it is or holds a training run or sweep directory; refused otherwise.',
)
_STEP = flags.DEFINE_integer('step', None, 'export: checkpoint step; default: the latest.')
_TOKENIZER = flags.DEFINE_string(
    'tokenizer',
    '',
    "import: a tokenizer.json to use instead of --hf_dir's own, or 'byte' (lm's byte tokenizer; "
    'an lm export of a byte run is recognised without it).',
)
_CONFIG = define_config_file(
    os.path.join(REPO_ROOT, 'configs', 'base.py'),
    'import: config whose data, train and mesh settings the run gets (model: from config.json).',
)
COMMANDS = ('import', 'export')


def run(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise ValueError(f'give one command, {" or ".join(COMMANDS)}, got {argv[1:]}')
    if not _HF_DIR.value or not _WORKDIR.value:
        raise ValueError(f'{argv[1]} needs --hf_dir and --workdir')
    overridden = tuple(config_flags.get_override_values(flags.FLAGS['config']))
    if argv[1] == 'export' and (overridden or flags.FLAGS['config'].present):
        raise ValueError(
            'export writes the run as it trained (its saved config): --config and --config.* '
            'apply to import only'
        )
    only = {
        '--step': ('export', _STEP.value is not None),
        '--tokenizer': ('import', _TOKENIZER.value),
    }
    for flag, (command, given) in only.items():
        if given and argv[1] != command:
            raise ValueError(f'{flag} applies to {command} only, not {argv[1]}')
    if argv[1] == 'import' and _CONFIG.value.data.source in TASKS:
        raise ValueError(
            f"--config's data.source={_CONFIG.value.data.source!r} generates its own symbols: an "
            "imported model's tokenizer would do nothing there; import with a text config and "
            'train a recall task from scratch'
        )
    if argv[1] == 'import':
        check_writable_dir(_WORKDIR.value, '--workdir')
        check_import_dir(
            _WORKDIR.value, _HF_DIR.value, _OVERWRITE.value, ('--workdir', '--overwrite')
        )
        bootstrap(_CONFIG.value)
        with StopRequest() as stop:
            config = import_hf(
                _HF_DIR.value,
                _WORKDIR.value,
                _CONFIG.value,
                _TOKENIZER.value,
                stop.check,
                overwrite=_OVERWRITE.value,
                overridden=overridden,
            )
        print(
            f'wrote {_WORKDIR.value}: {config.model.attention}, {config.model.num_layers} layers; '
            f'next: python eval.py --workdir={_WORKDIR.value}'
        )
    else:
        check_writable_dir(_HF_DIR.value, '--hf_dir')
        check_export_dir(
            _WORKDIR.value, _HF_DIR.value, _OVERWRITE.value, ('--hf_dir', '--overwrite')
        )
        bootstrap(stored_config(_WORKDIR.value, step=_STEP.value))
        with StopRequest() as stop:
            export_hf(
                _WORKDIR.value,
                _HF_DIR.value,
                _STEP.value,
                overwrite=_OVERWRITE.value,
                stop=stop.check,
            )
        print(f'wrote {_HF_DIR.value}')
    return 0


if __name__ == '__main__':
    app.run(lambda argv: run_reporting_errors(lambda: run(argv)), flags_parser=parse_flags)
