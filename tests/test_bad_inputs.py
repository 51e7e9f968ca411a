"""A hostile table of bad inputs over every entry point (train.py, eval.py, scripts/uptrain.py,
scripts/generate.py, scripts/sweep.py and the other scripts): each row runs the entry point as
`python` would, in a forked child of one Python that imported lm once (tests/flag_parse.py), and
must exit != 0 with a one-line `error:` naming the setting or file, before anything is compiled,
and leave every file already written (a trained run, its data cache, configs) untouched."""

import hashlib
import json
import os
import pathlib
import re
import shutil
import socket
from types import SimpleNamespace

import pytest
from conftest import ENV, ROOT, stdlib_text, tiny_config, tiny_train_config, write_config_file
from flag_parse import in_one_python

from lm.config import with_values
from lm.train.checkpoint import Checkpointer
from lm.train.loop import train
from lm.train.run import assemble
from lm.train.stored import checkpoint_meta
from lm.train.summary import claim_logdir


def tree_digest(root: pathlib.Path) -> dict[str, str]:
    """{relative path: sha256 of contents (or 'dir')} of everything under root."""
    out = {}
    for path in sorted(root.rglob('*')):
        rel = str(path.relative_to(root))
        out[rel] = 'dir' if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


DAMAGED_SEEDS = {  # a sweep's summary_seeds.csv: (its text, the error's regex after the file)
    'wrong_header': (
        'arm,seed,eval_loss\nmha,0,3.0\n',
        r' has the header arm,seed,eval_loss, without point: expected the header '
        r'point,seed,eval_loss',
    ),
    'seed_not_a_number': ('point,seed,eval_loss\nmha,zero,3.0\n', r" line 2: seed 'zero' is not a"),
    'empty': ('', r' is empty: expected the header point,seed,eval_loss and a row per'),
    'no_rows': ('point,seed,eval_loss\n', r' holds no rows: expected the header'),
}


WRONG_TYPES = {  # a value of another type than configs/base.py's: (key, value), the error
    'float_for_int': (
        ('model', 'num_heads', 4.0),
        r'model\.num_heads=4\.0 is a float; configs/base\.py has an int there \(8\)$',
    ),
    'text_for_float': (('train', 'lr', 'abc'), r"train\.lr='abc' is a str; .* has a float there"),
    'bool_for_int': (('train', 'steps', True), r'train\.steps=True is a bool; .* has an int'),
    'value_for_section': (('model', 'mla', 3), r'model\.mla is a section in configs/base\.py'),
}


@pytest.fixture(scope='module')
def ctx(tmp_path_factory):
    """A trained tiny run with its data cache, and the files the rows point at."""
    root = tmp_path_factory.mktemp('bad_inputs')
    text = root / 'small.txt'
    text.write_text(stdlib_text(60_000), encoding='utf-8')
    config = tiny_train_config(root, text, **{'train.steps': 4})
    train(config, str(root / 'run'))
    c = SimpleNamespace(root=root, run=root / 'run', text=text, config=config)

    def cfg(name, **overrides):
        """A config file: the trained run's config with overrides."""
        return write_config_file(tiny_train_config(root, text, **overrides), root / f'{name}.py')

    c.cfg = cfg
    claim_logdir(str(c.run), str(root / 'tb'))  # tb/run: the trained run's TensorBoard run
    c.good_cfg = cfg('good')
    for name, ((section, key, value), _) in WRONG_TYPES.items():
        typed = c.config.to_dict()
        typed[section][key] = value
        (root / f'typed_{name}.py').write_text(
            'import ml_collections\n\n\ndef get_config():\n'
            f'    return ml_collections.ConfigDict({typed!r})\n'
        )
    (root / 'syntax.py').write_text('def get_config(:\n')
    (root / 'no_get.py').write_text('x = 1\n')
    (root / 'not_config.py').write_text('def get_config():\n    return 3\n')
    (root / 'frozen.py').write_text(
        f'import ml_collections\nfrom lm.config import load_config_file\n\n\ndef get_config():\n'
        f'    return ml_collections.FrozenConfigDict(load_config_file({str(c.good_cfg)!r}))\n'
    )
    (root / 'partial.py').write_text(
        'import ml_collections\n\n\ndef get_config():\n'
        "    return ml_collections.ConfigDict({'seed': 0})\n"
    )
    (root / 'random.bin').write_bytes(bytes(range(256)) * 64)
    (root / 'one_paragraph.txt').write_text('a single document\n')
    (root / 'short.txt').write_text(stdlib_text(150))  # 16 validation tokens: one window
    (root / 'a_file').write_text('not a directory\n')
    (root / 'broken_tokenizer.json').write_text('{"model": ')
    (root / 'not_tokenizer.json').write_text('{"vocab": [1, 2, 3]}')
    for name, damage in (('empty_bin', 'train.bin'), ('bad_meta', 'meta.json')):
        shutil.copytree(root / 'cache', root / name)
        (victim,) = (root / name).glob(f'*/{damage}')
        victim.write_text('' if damage.endswith('.bin') else '{"dtype": ')
    c.notes = root / 'notes'  # a directory of the user's own, not a run
    c.notes.mkdir()
    (c.notes / 'results.json').write_text('{"mine": 1}\n')
    c.sweep = root / 'a_sweep'  # a sweep directory: its fairness record, seeds and one run
    shutil.copytree(c.run, c.sweep / 'mha_s0')
    (c.sweep / 'match').write_text('width\n')
    (c.sweep / 'summary_seeds.csv').write_text('point,seed,eval_loss\nmha,0,3.0\n')
    for name, (text, _) in DAMAGED_SEEDS.items():  # sweeps whose summary_seeds.csv is damaged
        (root / f'seeds_{name}').mkdir()
        (root / f'seeds_{name}' / 'summary_seeds.csv').write_text(text)
    if os.geteuid() == 0:  # root writes through file modes: use a read-only file system
        c.unwritable = pathlib.Path('/sys/lm_test_unwritable')
    else:
        c.unwritable = root / 'read_only'
        c.unwritable.mkdir()
        c.unwritable.chmod(0o555)
    yield c
    if c.unwritable.is_relative_to(root):
        c.unwritable.chmod(0o755)


def closed_port() -> int:
    """A loopback port nothing listens on (just freed)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


TRAIN, EVAL, GENERATE = 'train.py', 'eval.py', 'scripts/generate.py'
UPTRAIN, SWEEP = 'scripts/uptrain.py', 'scripts/sweep.py'
CONVERT, HF_MODEL = 'scripts/convert_hf.py', str(ROOT / 'tests' / 'fixtures' / 'hf' / 'llama_mha')

# (id, entry point, args(ctx), regex the last stderr line must match after 'error: ')
ROWS = [
    (
        'train_windows_whose_attention_scores_cannot_fit',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.data.seq_len=100000'],
        r"config\.train\.batch_size=\d+: one layer's attention scores alone need [\d.]+ GiB",
    ),
    (
        'generate_pallas_kernel_without_a_gpu',  # refused before the restore and the prompt
        GENERATE,
        lambda c: ['--prompt=ROMEO', '--decode_kernel=pallas'],
        r"^error: --decode_kernel='pallas' needs a GPU \(Triton kernels\); this backend is 'cpu'",
    ),
    (
        'resume_changed_config_refused_before_data',  # the new data cache is never built
        TRAIN,
        lambda c: [
            '--workdir=COPY',
            f'--config={c.good_cfg}',
            '--config.train.lr=0.5',
            f'--config.data.cache_dir={c.root}/cache_of_a_refused_resume',
        ],
        r'was trained with a different config: .*train\.lr: ',
    ),
    (
        'multi_host_coordinator_never_answers',  # not JAX's native abort (exit 134) at its timeout
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--workdir={c.root}/mh',
            f'--coordinator_address=127.0.0.1:{closed_port()}',
            '--num_processes=2',
            '--process_id=1',
            '--distributed_timeout=1',
        ],
        r'--coordinator_address=127\.0\.0\.1:\d+: no coordinator answered in 1 s ',
    ),
    (
        'config_missing',
        TRAIN,
        lambda c: [f'--config={c.root}/nope.py'],
        r'--config=.*nope\.py.*'
        r'does not exist',
    ),
    (
        'config_given_twice',  # absl would keep the last and fail on its overrides
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--config={c.good_cfg}', '--config.train.steps=1'],
        r'^error: --config is given 2 times \(.*\): give one config file and change its keys',
    ),
    (
        'config_not_python',  # a run's results.json or config.json: the loader takes .py only
        TRAIN,
        lambda c: [f'--config={c.notes}/results.json'],
        r'--config=.*results\.json: .*results\.json is not a Python config file',
    ),
    (
        'config_syntax',
        TRAIN,
        lambda c: [f'--config={c.root}/syntax.py'],
        r'--config=.*syntax '
        r'error in .*syntax\.py line 1',
    ),
    (
        'override_without_config_file_or_saved_config',  # with a checkpoint: the saved one's
        TRAIN,
        lambda c: [f'--workdir={c.root}/fresh', '--config.train.steps=300'],
        r'--config is required: .*/fresh holds no checkpoint to resume \(--config\.\* overrides '
        r'apply to a saved config\)$',
    ),
    (
        'override_without_config_file',  # eval.py reads no saved config through overrides
        EVAL,
        lambda c: [f'--workdir={c.run}', '--config.data.seq_len=8'],
        r'--config\.data\.seq_len overrides a key of --config=FILE, which is not given',
    ),
    (
        'config_no_get_config',
        TRAIN,
        lambda c: [f'--config={c.root}/no_get.py'],
        r'--config=.*'
        r'defines no get_config',
    ),
    (
        'config_bad_arg',
        TRAIN,
        lambda c: ['--config=configs/shakespeare_char.py:zzz'],
        r"--config=configs/shakespeare_char\.py:zzz: .*unknown variant 'zzz'",
    ),
    (
        'config_arg_not_taken',
        TRAIN,
        lambda c: ['--config=configs/base.py:mha'],
        r'--config=configs/base\.py:mha: get_config\(\) .* takes no argument',
    ),
    (
        'config_not_a_config',
        TRAIN,
        lambda c: [f'--config={c.root}/not_config.py'],
        r'--config=.*returned int, not an ml_collections\.ConfigDict',
    ),
    (
        'config_frozen',  # not "a --config.* override does not fit" with no override given
        TRAIN,
        lambda c: [f'--config={c.root}/frozen.py'],
        r'--config=.*frozen\.py: get_config\(\) returned a FrozenConfigDict; return an ml_',
    ),
    (
        'config_lacks_keys',
        TRAIN,
        lambda c: [f'--config={c.root}/partial.py'],
        r'--config: the config lacks async_checkpointing, .* and \d+ more; start it from '
        r'configs/base\.py',
    ),
    (
        'config_key_typo',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.train.stpes=10'],
        r"--config\.\*: unknown config key 'train\.stpes' \(did you mean 'train\.steps'\?\)$",
    ),
    (  # MLA's settings with attention='gqa': trained, and the override did nothing
        'override_of_a_section_the_attention_does_not_read',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.mla.kv_lora_rank=8'],
        r"--config\.model\.mla\.kv_lora_rank does nothing: config\.model\.attention='gqa' reads no "
        r'config\.model\.mla',
    ),
    (
        'config_key_moved_to_a_section',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.kv_lora_rank=8'],
        r"unknown config key 'model\.kv_lora_rank' \(did you mean 'model\.mla\.kv_lora_rank'\?\)$",
    ),
    (
        'workdir_read_only',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--workdir=UNWRITABLE'],
        r'--workdir=.*(not writable|cannot be created)',
    ),
    (
        'workdir_is_a_file',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--workdir={c.root}/a_file'],
        r"--workdir=.*a_file' is a file",
    ),
    (
        'cache_dir_read_only',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.data.cache_dir=UNWRITABLE'],
        r'config\.data\.cache_dir=.*(not writable|cannot be)',
    ),
    (
        'tb_dir_read_only',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--tb_dir=UNWRITABLE'],
        r'--tb_dir=.*(not writable|cannot be created)',
    ),
    (
        'hf_offline',
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            '--config.data.source=hf',
            '--config.data.hf_name=someone/no_such_dataset',
            '--config.data.path=',
        ],
        r"config\.data\.hf_name='someone/no_such_dataset' could not be loaded .*offline",
    ),
    *[
        (
            f'hf_{name}',
            TRAIN,
            lambda c, setting=setting: [
                f'--config={c.good_cfg}',
                '--config.data.source=hf',
                '--config.data.hf_name=text',  # the local builder, on config.data.path
                setting.replace('ONE_PARAGRAPH', str(c.root / 'one_paragraph.txt')),
            ],
            pattern,
        )
        for name, setting, pattern in (
            (
                'text_column_missing',
                '--config.data.hf_text_column=body',
                r"config\.data\.hf_text_column='body' is not a column of "
                r"config\.data\.hf_name='text'; its columns are \['text'\]$",
            ),
            (
                'split_unknown',
                '--config.data.hf_split=nope',
                r"config\.data\.hf_split='nope': Unknown split",
            ),
            (  # one document: none is every 1/val_fraction-th; no empty cache is left
                'split_without_documents',
                '--config.data.path=ONE_PARAGRAPH',
                r'config\.data: the validation split holds no text .*; nothing was cached$',
            ),
            (
                'max_docs_negative',
                '--config.data.hf_max_docs=-1',
                r'config\.data\.hf_max_docs must be >= 0 \(0 = all\), got -1$',
            ),
        )
    ],
    (
        'num_layers_beyond_memory',  # refused by arithmetic, not after minutes of tracing
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.num_layers=100000000'],
        r'config\.model needs at least [\d.]+ GiB for the parameters and gradients of its '
        r'embedding and MLPs alone \(vocab_size=\d+, num_layers=100000000, ',
    ),
    (
        'vocab_beyond_memory',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.vocab_size=2000000000'],
        r'config\.model needs at least [\d.]+ GiB .*\(vocab_size=2000000000, .*more than the '
        r'[\d.]+ GiB of the 1 device: a smaller model or more devices$',
    ),
    (
        'model_vocab_below_the_byte_tokenizer',  # before any text is read
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.vocab_size=100'],
        r'config\.model\.vocab_size=100 is smaller than the tokenizer vocabulary \(258, '
        r"config\.data\.tokenizer='byte'\)$",
    ),
    (
        'model_vocab_below_the_bpe_to_train',  # before the BPE is trained and the text encoded
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            '--config.data.tokenizer=bpe',
            '--config.model.vocab_size=600',
            f'--config.data.cache_dir={c.root}/cache_of_a_refused_bpe',
        ],
        r'config\.model\.vocab_size=600 is smaller than config\.data\.bpe_vocab_size=4096',
    ),
    (
        'eval_other_text_of_one_window',  # not 'one batch of config.train.batch_size'
        EVAL,
        lambda c: [  # the text is tokenised (and cached, outside the digest) to count its tokens
            f'--config={c.good_cfg}',
            f'--config.data.path={c.root}/short.txt',
            f'--config.data.cache_dir={c.root.parent}/cache_of_short_text',
        ],
        r'the validation split has 16 tokens, fewer than the 18 of two evaluation windows of '
        r'config\.data\.seq_len=\d+ targets',
    ),
    (
        'eval_tb_dir_inside_another_run',  # its logs landed among that run's files
        EVAL,
        lambda c: [f'--workdir={c.run}', f'--tb_dir={c.sweep}/mha_s0'],
        r'^error: --tb_dir: .*/mha_s0/run would be inside the run .*/mha_s0, among its files',
    ),
    (
        'eval_text_by_another_tokenizer',  # its ids are not the ones the checkpoint embeds
        EVAL,
        lambda c: [f'--config={c.good_cfg}', '--config.data.tokenizer=bpe'],
        r'^error: --config: the data would be tokenised by a BPE to be trained on config\.data\.'
        r"source='text', path='.*small\.txt', not by the run's \(config\.data\.tokenizer="
        r"'byte'\), whose token ids the checkpoint embeds$",
    ),
    (
        'data_path_that_stdlib_ignores',  # it would train on Python's .py files instead
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            '--config.data.source=stdlib',
            f'--config.data.path={c.text}',
        ],
        r"config\.data\.path='.*small\.txt' does nothing for source='stdlib'.*set "
        r"config\.data\.source='text'",
    ),
    *[
        (
            f'config_file_value_{name}',  # a config built from a dict keeps no types
            TRAIN,
            lambda c, name=name: [f'--config={c.root}/typed_{name}.py'],
            rf'^error: --config: config\.{pattern}',
        )
        for name, (_, pattern) in WRONG_TYPES.items()
    ],
    (
        'data_path_is_a_directory',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--config.data.path={c.root}/cache'],
        r"config\.data\.path: '.*cache' is a directory",
    ),
    (
        'data_not_utf8',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--config.data.path={c.root}/random.bin'],
        r"config\.data\.path: '.*random\.bin' is not UTF-8 text \(byte 0x80 at offset 128\); "
        r"set config\.data\.decode_errors='replace'",
    ),
    (
        'tokenizer_corrupt',
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--config.data.tokenizer={c.root}/broken_tokenizer.json',
        ],
        r"config\.data\.tokenizer: '.*broken_tokenizer\.json' is not a tokenizer\.json",
    ),
    (
        'tokenizer_not_a_tokenizer',
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--config.data.tokenizer={c.root}/not_tokenizer.json',
        ],
        r"config\.data\.tokenizer: '.*not_tokenizer\.json' is not a tokenizer\.json",
    ),
    (
        'data_cache_empty_file',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--config.data.cache_dir={c.root}/empty_bin'],
        r"data cache file '.*empty_bin/\w+/train\.bin' is damaged \(empty.*delete '.*' to rebuild",
    ),
    (
        'data_cache_corrupt_meta',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--config.data.cache_dir={c.root}/bad_meta'],
        r"data cache file '.*bad_meta/\w+/meta\.json' is corrupt .*delete '.*' to rebuild it",
    ),
    (
        'lr_nan',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.train.lr=nan'],
        r'config\.train\.lr must be a finite number, got nan',
    ),
    (
        'lr_inf',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.train.lr=inf'],
        r'config\.train\.lr must be a finite number, got inf',
    ),
    (
        'finished_run_given_a_bad_interval',  # not 'nothing to do' (exit 0) for a finished run
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.train.steps=4', '--config.log_every=0'],
        r'config\.log_every must be > 0, got 0$',
    ),
    (
        'model_larger_than_memory',  # not an out-of-memory traceback while initialising
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.model.head_dim=100000000'],
        r'config\.model needs [\d.]+ GiB per device for the train state and gradients alone, '
        r'more than the [\d.]+ GiB a device has',
    ),
    (
        'uptrain_schedule_unknown',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', '--config.uptrain.schedule=x'],
        r"config\.uptrain\.schedule must be one of \('continue', 'rewarm'\), got 'x'$",
    ),
    (
        'eval_ignored_model_override',
        EVAL,
        lambda c: [f'--config={c.good_cfg}', '--config.model.d_model=64'],
        r'--config\.model\.d_model would be ignored',
    ),
    (
        'eval_workdir_is_the_checkpoints_dir',
        EVAL,
        lambda c: [f'--workdir={c.run}/checkpoints'],
        r'--workdir: .*/checkpoints holds no checkpoint: it is inside the run .*; give the run',
    ),
    (
        'eval_workdir_missing',
        EVAL,
        lambda c: [f'--workdir={c.root}/no_such_run'],
        r'--workdir: .*/no_such_run does not exist$',
    ),
    (
        'eval_tokens_one_window',
        EVAL,
        lambda c: ['--eval_tokens=3'],
        r'--eval_tokens=3: expected 0 \(the whole split\) or more than one window of \d+ tokens',
    ),
    (
        'eval_tb_dir_read_only',
        EVAL,
        lambda c: ['--tb_dir=UNWRITABLE'],
        r'--tb_dir=.*(not writable|cannot be created)',
    ),
    (
        'prompt_not_utf8',
        GENERATE,
        lambda c: [b'--prompt=caf\xe9'],
        r'--prompt \(number 1\) is not valid UTF-8: byte 0xe9 at offset 3',
    ),
    (  # a sampled token reads at most 1 + 4 - 1 cached tokens of a group of 32: all float
        'generate_kivi4_shorter_than_its_group',
        GENERATE,
        lambda c: ['--prompt=A', '--max_new_tokens=4', '--kv_cache_dtype=kivi4'],
        r"kv_cache_dtype='kivi4' would quantise nothing: the longest prompt \+ reply "
        r'\(4 tokens\) never completes a group of config\.model\.kv_quant_group=32',
    ),
    (
        'max_new_tokens_zero',
        GENERATE,
        lambda c: ['--max_new_tokens=0'],
        r'--max_new_tokens must be > 0, got 0',
    ),
    (
        'temperature_nan',
        GENERATE,
        lambda c: ['--sampling=temperature=nan'],
        r'sampling temperature must be a finite number >= 0, got nan',
    ),
    *[
        (
            f'uptrain_dst_{name}',
            UPTRAIN,
            lambda c, dst=dst: [f'--src={c.run}', f'--dst={dst(c)}', '--num_kv_heads=2'],
            rf"--dst='.*' {where} --src '.*/run'$",
        )
        for name, dst, where in (
            ('inside_src', lambda c: c.run / 'sub', 'is inside'),
            ('a_step_of_src', lambda c: c.run / 'checkpoints' / '4', 'is inside'),
            ('holds_src', lambda c: c.root, 'holds'),
        )
    ],
    (  # the path read as '<file>/checkpoints'
        'uptrain_src_is_a_file',
        UPTRAIN,
        lambda c: [f'--src={c.good_cfg}', f'--dst={c.root}/v_file', '--num_kv_heads=2'],
        r'--src: .*/good\.py is a file, not a run directory$',
    ),
    (
        'uptrain_dst_inside_another_run',  # a run inside a run: never a directory of its own
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.sweep}/mha_s0/gqa2', '--num_kv_heads=2'],
        r"--dst='.*mha_s0/gqa2' is inside the run .*/mha_s0; give the new run a directory",
    ),
    (
        'convert_import_override_of_what_config_json_sets',  # the HF model's: silently dropped
        CONVERT,
        lambda c: [
            'import',
            f'--hf_dir={HF_MODEL}',
            f'--workdir={c.root}/imp',
            '--config.model.num_heads=8',
        ],
        r'^error: config\.model\.num_heads: the import takes it from .*llama_mha \(config\.json ',
    ),
    (
        'convert_import_unknown_key_of_the_default_config',  # parsed as the flag is defined
        CONVERT,
        lambda c: [
            'import',
            f'--hf_dir={HF_MODEL}',
            f'--workdir={c.root}/imp',
            '--config.train.stepz=3',
        ],
        r"^error: --config\.\*: unknown config key 'train\.stepz' \(did you mean 'train\.steps"
        r"'\?\)$",
    ),
    (
        'convert_export_with_a_config',  # export writes the run's saved config
        CONVERT,
        lambda c: [
            'export',
            f'--hf_dir={c.root}/exp',
            f'--workdir={c.run}',
            '--config.train.steps=3',
        ],
        r'^error: export writes the run as it trained \(its saved config\): --config and ',
    ),
    *[
        (  # a sweep directory, or a folder of runs, given where one run is read
            f'{name}_reads_{what}',
            entry,
            lambda c, args=args, where=where: args(where(c)),
            rf'^error: --(workdir|src): .*/{leaf} is {kind}, not a run; name one of its runs',
        )
        # one message (lm.train.stored) for every reader: each entry point with one kind
        for (name, entry, args), (what, where, leaf, kind) in zip(
            (
                ('eval', EVAL, lambda w: [f'--workdir={w}']),
                ('generate', GENERATE, lambda w: [f'--workdir={w}', '--prompt=a']),
                ('uptrain', UPTRAIN, lambda w: [f'--src={w}', f'--dst={w}_up', '--num_kv_heads=2']),
            ),
            (
                ('a_sweep', lambda c: c.sweep, 'a_sweep', 'a sweep directory'),
                ('a_folder_of_runs', lambda c: c.sweep.parent, '[^/]+', 'a folder of runs'),
                ('a_sweep', lambda c: c.sweep, 'a_sweep', 'a sweep directory'),
            ),
            strict=True,
        )
    ],
    (
        'convert_import_inside_a_run',
        CONVERT,
        lambda c: ['import', f'--hf_dir={HF_MODEL}', f'--workdir={c.run}/imported'],
        r"--workdir='.*/imported' is inside the run .*/run; give the new run a directory",
    ),
    (
        'uptrain_no_target',
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.root}/up'],
        r'--num_kv_heads is required \(or --target=mla, --kv_share_every > 1 or --kv_budget\)$',
    ),
    (
        'uptrain_dst_is_a_file',
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.root}/a_file', '--num_kv_heads=1'],
        r"--dst=.*a_file' is a file",
    ),
    (
        'tb_run_of_another_workdir',  # two runs named 'run' in one --tb_dir: mixed curves
        TRAIN,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--workdir={c.root}/elsewhere/run',
            f'--tb_dir={c.root}/tb',
        ],  # fmt: skip
        r'--tb_dir: .*tb/run is the TensorBoard run of .*/run; a run of the same name would mix',
    ),
    (  # allowed, a changed param_dtype made every checkpoint read as damaged
        'resume_with_another_param_dtype',
        TRAIN,
        lambda c: [
            '--workdir=COPY',
            '--allow_config_change',
            '--config.model.param_dtype=bfloat16',
        ],
        r"config\.model\.param_dtype='bfloat16': the checkpoint in .*checkpoints holds float32 "
        r"parameters, and a run resumes in the dtype it saved; resume with param_dtype='float32'",
    ),
    (  # it blamed the warmup (the rate would be 0 at every step of a 1-step run)
        'resume_with_fewer_steps_than_saved',
        TRAIN,
        lambda c: ['--workdir=COPY', '--config.train.steps=1'],
        r'--workdir: .*run_resume_with_fewer_steps_than_saved holds a checkpoint at step \d+, '
        r'past config\.train\.steps=1: raise train\.steps',
    ),
    (  # a resumed run's curves would be split between two TensorBoard runs
        'resume_with_another_tb_dir',
        TRAIN,
        lambda c: ['--workdir=COPY', f'--tb_dir={c.root}/other_tb'],
        r"--tb_dir='.*/other_tb': the run in .*run_resume_with_another_tb_dir has logged to "
        r'.*run_resume_with_another_tb_dir/tb so far; resume it with the --tb_dir it was trained '
        r'with \(none\)',
    ),
    (
        'sweep_dir_is_a_file',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/a_file'],
        r"--sweep_dir=.*a_file' is a file",
    ),
    (
        'sweep_dir_is_a_run',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.run}'],
        r'--sweep_dir: .* is a training run, not a sweep directory',
    ),
    (
        'sweep_points_empty',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/sweep', '--points='],
        r'--points: empty: name at least one point, or leave it out for all',
    ),
    (
        'sweep_ensemble_does_not_divide',  # found up front, not as each point's failed run
        SWEEP,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--sweep_dir={c.root}/sweep',
            '--ensemble',
            '--seeds=3',
            '--config.mesh.cpu_devices=2',
        ],  # fmt: skip
        r'--ensemble: ensembles/\w+ \(members: --seeds, --ensemble_groups\): '
        r'config.train.ensemble=3 members do not divide over the mesh axes',
    ),
    *[  # --overwrite replaces its output whole: never a run or sweep, nor one holding either
        (
            f'convert_{command}_overwrite_{name}',
            CONVERT,
            lambda c, command=command, out=out: [
                command,
                f'--hf_dir={HF_MODEL if command == "import" else out(c)}',
                f'--workdir={out(c) if command == "import" else c.run}',
                '--overwrite',
            ],
            rf"--{'workdir' if command == 'import' else 'hf_dir'}='.*' {what}; --overwrite "
            'replaces it whole and would delete it',
        )
        for command, name, out, what in (
            ('import', 'sweep_dir', lambda c: c.sweep, 'is a sweep directory'),
            ('import', 'holding_runs', lambda c: c.root, 'holds a sweep directory, .*/a_sweep'),
            ('export', 'another_run', lambda c: c.sweep / 'mha_s0', 'is a training run'),
            ('export', 'sweep_dir', lambda c: c.sweep, 'is a sweep directory'),
        )
    ],
    *[  # a run's own directory: not a sweep's, nor in another run's checkpoints
        (
            f'train_workdir_{name}',
            TRAIN,
            lambda c, workdir=workdir: [f'--config={c.good_cfg}', f'--workdir={workdir(c)}'],
            pattern,
        )
        for name, workdir, pattern in (
            ('a_sweep_dir', lambda c: c.sweep, r"--workdir='.*a_sweep' is a sweep directory, not"),
            (
                'a_folder_of_runs',
                lambda c: c.root,
                r"--workdir='.*' holds a (training run|sweep directory), \w+; train each run in",
            ),
            (
                'checkpoints_of_a_run',
                lambda c: c.run / 'checkpoints',
                r"--workdir='.*' is the checkpoints directory of the run .*/run; give",
            ),
            (
                'inside_a_run',
                lambda c: c.run / 'child',
                r"--workdir='.*/child' is inside the run .*/run; give the new run a directory",
            ),
            (
                'inside_checkpoints_of_a_run',
                lambda c: c.run / 'checkpoints' / 'new',
                r"--workdir='.*/new' is inside the checkpoints directory of the run .*/run; give",
            ),
            (  # the run would write its results.json over the user's and its files beside
                'not_a_run_holding_files',
                lambda c: c.notes,
                r"--workdir='.*/notes' is not a run \(no checkpoints/\) but holds results\.json; "
                r'a new run starts in an empty directory, so that nothing there is written over',
            ),
        )
    ],
    (
        'uptrain_dst_not_a_run_holding_files',
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.notes}', '--num_kv_heads=2'],
        r"--dst='.*/notes' is not a run \(no checkpoints/\) but holds results\.json; a new run",
    ),
    *[  # its summary.md and figures would replace a run's or sweep's own files
        (
            f'analyze_heads_out_is_{name}',
            'scripts/analyze_heads.py',
            lambda c, out=out: [f'--workdir={c.run}', f'--out={out(c)}', '--max_batches=1'],
            rf"--out='.*' is {kind}; give the analysis a directory of its own",
        )
        for name, out, kind in (
            ('a_sweep_dir', lambda c: c.sweep, 'a sweep directory'),
            ('a_run', lambda c: c.sweep / 'mha_s0', 'a training run'),
        )
    ],
    (  # it would be taken for an unreadable checkpoint, or deleted with one
        'analyze_heads_out_inside_a_runs_checkpoints',
        'scripts/analyze_heads.py',
        lambda c: [f'--workdir={c.run}', f'--out={c.run}/checkpoints/4', '--max_batches=1'],
        r"--out='.*/run/checkpoints/4' is inside the run .*/run's checkpoints/, where it would be "
        r'taken for a checkpoint or deleted with one',
    ),
    (
        'train_tb_dir_a_runs_checkpoints',
        TRAIN,
        lambda c: [f'--config={c.good_cfg}', f'--tb_dir={c.run}/checkpoints'],
        r"--tb_dir='.*/run/checkpoints/new_train_tb_dir_a_runs_checkpoints' is inside the run ",
    ),
    (
        'eval_sweep_out_is_the_sweeps_own_file',
        'scripts/eval_sweep.py',
        lambda c: [
            f'--sweep_dir={c.sweep}',
            f'--config={c.good_cfg}',
            f'--out={c.sweep}/summary_seeds.csv',
        ],
        r"--out=.*a_sweep/summary_seeds\.csv is the sweep's own summary_seeds\.csv",
    ),
    *[  # cache_quality.py's outputs: never the sweep's own files (summary_seeds.csv is its input)
        (
            f'cache_quality_{flag}_is_the_sweeps_own_file',
            'scripts/cache_quality.py',
            lambda c, flag=flag, name=name: (
                [
                    f'--sweep_dir={c.sweep}',
                    '--points=mha',
                    '--kv_cache_dtypes=int8',
                    f'--{flag}={c.sweep}/{name}',
                ]
                + ([] if flag == 'out' else [f'--out={c.root}/q.csv'])
            ),
            rf'--{flag}=.*a_sweep/{pattern}',
        )
        for flag, name, pattern in (
            ('out', 'summary_seeds.csv', r"summary_seeds\.csv is the sweep's own summary_seeds"),
            ('sweep_out', 'summary.csv', r"summary\.csv is the sweep's own summary\.csv"),
            ('pareto_table', 'mha_s0/p.csv', r'mha_s0/p\.csv is inside .*a_sweep/mha_s0, a dir'),
        )
    ],
    *[  # a damaged summary_seeds.csv: one line naming it and what it should hold
        (
            f'cache_quality_seeds_csv_{name}',
            'scripts/cache_quality.py',
            lambda c, name=name: [
                f'--sweep_dir={c.root}/seeds_{name}',
                '--points=mha',
                '--kv_cache_dtypes=int8',
                f'--out={c.root}/q.csv',
            ],
            rf'--sweep_dir: .*seeds_{name}/summary_seeds\.csv{pattern}',
        )
        for name, (_, pattern) in DAMAGED_SEEDS.items()
    ],
    (  # the same reader for eval_sweep.py (the order of its rows)
        'eval_sweep_seeds_csv_wrong_header',
        'scripts/eval_sweep.py',
        lambda c: [
            f'--sweep_dir={c.root}/seeds_wrong_header',
            f'--config={c.good_cfg}',
            f'--out={c.root}/e.csv',
        ],
        r'--sweep_dir: .*seeds_wrong_header/summary_seeds\.csv has the header arm,seed,eval_loss',
    ),
]


def entry_env(c) -> dict[str, str]:
    """The entry points' environment: no network for Hugging Face, its cache in the test's
    directory."""
    return {
        **ENV,
        'HF_HUB_OFFLINE': '1',
        'HF_DATASETS_OFFLINE': '1',
        'HF_HOME': str(c.root.parent / 'hf_home'),
    }


@pytest.fixture(scope='module')
def outcomes(ctx):
    """Every row, in forked children of one Python that imported lm once (tests/flag_parse.py,
    "run"), and the digest of everything written before and after all of them. A train.py row
    trains a new run unless it names a workdir; `--workdir=COPY` resumes its own copy of the
    trained run (a row whose error shows only after the workdir lock is taken would otherwise
    be refused as 'in use' by its neighbour)."""
    calls = []
    for name, script, args, _ in ROWS:
        argv = [os.fsdecode(a).replace('=UNWRITABLE', f'={ctx.unwritable}') for a in args(ctx)]
        if script == TRAIN and '--workdir=COPY' in argv:  # resuming a copy of the trained run
            shutil.copytree(ctx.run, ctx.root / f'run_{name}')
            argv[argv.index('--workdir=COPY')] = f'--workdir={ctx.root / f"run_{name}"}'
        elif script == TRAIN and not any(a.startswith('--workdir') for a in argv):
            argv.append(f'--workdir={ctx.root / f"new_{name}"}')  # a new run, refused unmade
        elif script in (EVAL, GENERATE) and not any(a.startswith('--workdir') for a in argv):
            argv.append(f'--workdir={ctx.run}')
        calls.append({'cwd': str(ROOT), 'argv': [str(ROOT / script), *argv], 'run': True})
    before = tree_digest(ctx.root)
    results = in_one_python(calls, ROOT, entry_env(ctx))
    return dict(zip([r[0] for r in ROWS], results, strict=True)), before, tree_digest(ctx.root)


@pytest.mark.slow
@pytest.mark.parametrize(('row', 'pattern'), [(r[0], r[3]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_error_and_touches_nothing(outcomes, row, pattern):
    runs, before, after = outcomes
    code, out = runs[row]['code'], runs[row]['out']
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert code != 0 and 'Traceback' not in out, out[-3000:]
    assert lines and lines[-1].startswith('error: '), out[-3000:]
    assert re.search(pattern, lines[-1]), lines[-1]
    assert 'compiled the train step' not in out  # refused before any compile
    assert after == before, sorted(set(after) ^ set(before))[:5]  # nothing written or touched


# -- refusals before any work: the row must be refused before the entry point writes anything,
# not even the directories of its outputs.

BENCH, CACHE_Q, EVAL_SWEEP = (
    'scripts/bench_decode.py',
    'scripts/cache_quality.py',
    ('scripts/eval_sweep.py'),
)
ABLATION, PARETO, ROOFLINE = (
    'scripts/uptrain_ablation.py',
    'scripts/plot_pareto.py',
    'scripts/plot_roofline.py',
)
ROOFLINE_JSON = {  # bench_decode.py --json files that are not its rows
    'missing_keys': '[{"variant": "mha", "batch": 1}]',
    'an_object': '{"variant": "mha"}',
    'not_json': 'nope',
    'empty': '[]',
}
GET_POINTS = {  # sweep files: the body of get_points()
    'points_not_a_list': "return {'name': 'a'}",
    'point_not_a_dict': 'return [1]',
    'point_seeds_zero': "return [{'name': 'a', 'seeds': 0}]",
    'get_points_raises': 'return 1 / 0',
    'point_value_of_another_type': "return [{'name': 'a', 'model.num_heads': 'x'}]",
    'point_named_pareto': "return [{'name': 'pareto'}]",
    'points_empty': 'return []',
    'kv_points': "return [{'name': 'mha', 'model.attention': 'mha', 'model.num_kv_heads': 0}, "
    "{'name': 'gqa2', 'model.attention': 'gqa', 'model.num_kv_heads': 2}]",
}


def save_step0(config, workdir) -> None:
    """A step-0 run of `config`: its initial parameters saved as training saves them."""
    run = assemble(config, state='init')
    ckpt = Checkpointer(str(workdir), async_save=False)
    ckpt.save(
        0, run.state, checkpoint_meta(run.config, 'test', 0, run.ctx.abstract_state['params'])
    )
    ckpt.close()


@pytest.fixture(scope='module')
def early(ctx):
    """ctx with a step-0 MQAR run, a sweep of one finished CLA run and malformed sweep files."""
    root = ctx.root
    mqar = tiny_config(attention='mha')
    mqar.model.vocab_size = 64  # the symbols'
    mqar.data.update(source='mqar', recall_pairs=4, recall_vocab=64, seq_len=32)
    ctx.mqar = root / 'mqar'
    save_step0(mqar, ctx.mqar)
    cla = with_values(ctx.config, {'model.kv_share_every': 2, 'model.vocab_size': 258})
    ctx.cla_sweep = root / 'cla_sweep'
    save_step0(cla, ctx.cla_sweep / 'cla2_s0')
    (ctx.cla_sweep / 'cla2_s0' / 'result.json').write_text(json.dumps({'fingerprint': {'seed': 0}}))
    (ctx.cla_sweep / 'summary_seeds.csv').write_text('point,seed,eval_loss\ncla2,0,3.0\n')
    ablation_run = root / 'ablation' / 'GQA-2_mean_a0.1_s0'  # a run of uptrain_ablation.py
    ablation_run.mkdir(parents=True)
    result = {'fingerprint': {'steps': 10, 'split': 'uptrain'}}
    (ablation_run / 'result.json').write_text(json.dumps(result))
    (root / 'ablation' / 'ablation.json').write_text('{"settings": {}}')  # its out_dir's mark
    (root / 'ablation' / 'seeds.csv').write_text('model,conversion,alpha_or_steps,seed,x\n')
    (root / 'pareto.csv').write_text(
        'panel,family,label,kv_cache_bytes_per_token,metric,seed,value\n'
        'p,float,mha,2048,eval/loss,0,3.0\n'
    )
    for name, text in ROOFLINE_JSON.items():
        (root / f'roofline_{name}.json').write_text(text)
    ctx.eval64 = root / 'eval64'  # a step-0 text run scored on 64 tokens
    save_step0(with_values(ctx.config, {'eval_tokens': 64, 'model.vocab_size': 258}), ctx.eval64)
    ctx.pallas = root / 'pallas'  # a step-0 run whose decode steps ask for the GPU kernel
    save_step0(
        with_values(ctx.config, {'model.decode_kernel': 'pallas', 'model.vocab_size': 258}),
        ctx.pallas,
    )
    ctx.hf_like = root / 'hf_like'  # an HF model folder with a file of the user's own
    ctx.hf_like.mkdir()
    for name in ('config.json', 'model.safetensors', 'NOTES.md'):
        (ctx.hf_like / name).write_text('{}')
    base = (root / 'good.py').read_text()
    for name, body in GET_POINTS.items():
        (root / f'{name}.py').write_text(f'{base}\n\ndef get_points():\n    {body}\n')
    return ctx


EARLY = [
    (  # it ran out of memory (25 GB) allocating them, a traceback after compiling
        'eval_windows_whose_attention_scores_cannot_fit',
        EVAL,
        lambda c: [
            f'--workdir={c.eval64}',
            '--config=configs/shakespeare_char.py',
            '--config.data.seq_len=100000',
            '--eval_tokens=0',
        ],
        r"^error: eval\.py: one layer's attention scores alone need [\d.]+ GiB per device ",
    ),
    (  # it named the import's staging tokenizer path and a setting never given
        'convert_import_with_a_recall_config',
        CONVERT,
        lambda c: [
            'import',
            f'--hf_dir={HF_MODEL}',
            f'--workdir={c.root}/imp_recall',
            '--config=configs/recall/mqar.py',
        ],
        r"--config's data\.source='mqar' generates its own symbols",
    ),
    (  # refused before the checkpoint and data load (it came after both)
        'eval_cache_dtype_of_a_recall_run',
        EVAL,
        lambda c: [f'--workdir={c.mqar}', '--kv_cache_dtype=int8'],
        r'--kv_cache_dtype evaluates text windows; this run is a recall task',
    ),
    (  # refused after the data was read and tokenised
        'eval_int8_cache_of_a_cla_run',
        EVAL,
        lambda c: [f'--workdir={c.cla_sweep}/cla2_s0', '--kv_cache_dtype=int8'],
        r"config\.model\.kv_share_every=2 with kv_cache_dtype='int8': CLA decodes from float "
        r'caches only$',
    ),
    (  # a flag nothing reads
        'eval_decode_kernel_without_a_cache',
        EVAL,
        lambda c: [f'--workdir={c.eval64}', '--decode_kernel=xla'],
        r'--decode_kernel is read only by a cached eval: pass --kv_cache_dtype too$',
    ),
    (
        'eval_pallas_kernel_without_a_gpu',
        EVAL,
        lambda c: [f'--workdir={c.eval64}', '--kv_cache_dtype=float', '--decode_kernel=pallas'],
        r"^error: --decode_kernel='pallas' needs a GPU \(Triton kernels\); this backend is 'cpu'",
    ),
    (  # it failed after the data was read, advising a setting eval.py cannot change
        'eval_a_pallas_run_through_a_cache_without_a_gpu',
        EVAL,
        lambda c: [f'--workdir={c.pallas}', '--kv_cache_dtype=float'],
        r"the run's config\.model\.decode_kernel='pallas' needs a GPU \(Triton kernels\); this "
        r"backend is 'cpu': "
        r'pass --decode_kernel=xla \(or pallas_interpret\)$',
    ),
    (  # its loss was the float cache's, tagged eval_cache_kivi4
        'eval_kivi4_windows_shorter_than_its_group',
        EVAL,
        lambda c: [f'--workdir={c.eval64}', '--kv_cache_dtype=kivi4'],
        r"kv_cache_dtype='kivi4' would quantise nothing: a window of config\.data\.seq_len \(16 "
        r'tokens\) never completes a group',
    ),
    (  # the variant picked a model the checkpoint replaces: silently ignored
        'eval_config_with_a_variant',
        EVAL,
        lambda c: [f'--workdir={c.eval64}', '--config=configs/shakespeare_char.py:mqa'],
        r"eval\.py takes only the data from --config; the argument ':mqa' of "
        r"configs/shakespeare_char\.py picks a model, which is the checkpoint's: give the file "
        r'alone$',
    ),
    (  # the run's own eval_tokens under another config's windows: it blamed settings not given
        'eval_config_whose_windows_swallow_the_runs_eval_tokens',
        EVAL,
        lambda c: [f'--workdir={c.eval64}', '--config=configs/shakespeare_char.py'],
        r"the run's config\.eval_tokens=64 is one window or less of --config's "
        r'data\.seq_len=64: pass --eval_tokens',
    ),
    *[
        (f'bench_{name}', f'scripts/bench_{script}.py', lambda c, extra=extra: extra(c), pattern)
        for name, script, extra, pattern in (
            (
                'data_unknown_device',
                'data',
                lambda c: [f'--text={c.text}', '--device=bogus'],
                r"--device='bogus': expected one of \[",
            ),
            (
                'data_mfu_zero',
                'data',
                lambda c: [f'--text={c.text}', '--mfu=0'],
                r'--mfu must be in \(0, 1\]',
            ),
            (
                'ensemble_rounds_zero',
                'ensemble',
                lambda c: ['--rounds=0'],
                r'--rounds must be >= 1, got 0',
            ),
            (
                'xla_options_calls_zero',
                'xla_options',
                lambda c: ['--calls=0'],
                r'--calls must be >= 1, got 0',
            ),
            (
                'torch_baseline_set_without_target',
                'torch_baseline',
                lambda c: ['--set=model.d_model=32'],
                r'--set applies to --target_loss only',
            ),
        )
    ],  # fmt: skip
    *[
        (
            f'uptrain_{name}',
            'scripts/uptrain.py',
            lambda c, extra=extra: [f'--src={c.run}', f'--dst={c.root}/up_refused', *extra],
            pattern,
        )
        for name, extra, pattern in (
            (
                'calibration_tokens_unread',
                ['--num_kv_heads=2', '--calibration_tokens=100'],
                r'--calibration_tokens does nothing here: only similarity grouping',
            ),
            (
                'seed_without_random',
                ['--num_kv_heads=2', '--seed=5'],
                r"--seed draws --method=random's K/V only; --method=mean",
            ),
            (
                'steps_and_fraction',
                ['--num_kv_heads=2', '--steps=3', '--fraction=0.25'],
                r'--steps and --fraction both set the uptraining steps: give one',
            ),
            (
                'kv_budget_with_mla',
                ['--target=mla', '--kv_lora_rank=8', '--qk_rope_head_dim=2', '--kv_budget=2'],
                r'--kv_budget does not apply to --target=mla',
            ),
        )
    ],  # fmt: skip
    (  # the error named --config=FILE:bogus, a flag the user did not give
        'profile_train_unknown_variant',
        'scripts/profile_train.py',
        lambda c: ['--variant=bogus', '--steps=1'],
        r"^error: --variant=bogus: --config=.*:bogus: .*unknown variant 'bogus'",
    ),
    (  # every variant's config before the first is timed (it came after mha's whole row)
        'bench_train_unknown_variant_after_a_good_one',
        'scripts/bench_train.py',
        lambda c: ['--variants=mha,bogus'],
        r"^error: --variants=bogus: --config=.*:bogus: .*unknown variant 'bogus'; expected "
        r"'mha'.*\)$",
    ),
    (
        'bench_train_no_variants',
        'scripts/bench_train.py',
        lambda c: ['--variants='],
        r'--variants is empty',
    ),  # fmt: skip
    (
        'convert_import_with_the_export_step',
        CONVERT,
        lambda c: ['import', f'--hf_dir={HF_MODEL}', f'--workdir={c.root}/imp_x', '--step=3'],
        r'--step applies to export only, not import',
    ),
    (  # --status read it as a sweep of one unstarted run
        'sweep_status_of_a_training_run',
        'scripts/sweep.py',
        lambda c: ['--config=configs/shakespeare_char.py', f'--sweep_dir={c.run}', '--status'],
        r'--sweep_dir: .* is a training run, not a sweep directory',
    ),
    (  # another run's checkpoints/ would hold a step that is not a checkpoint
        'export_into_another_runs_checkpoints',
        CONVERT,
        lambda c: ['export', f'--workdir={c.run}', f'--hf_dir={c.sweep}/mha_s0/checkpoints/7'],
        r"--hf_dir=.*mha_s0/checkpoints/7' is inside the run .*mha_s0's checkpoints/",
    ),
    (
        'profile_trace_into_a_runs_checkpoints',
        'scripts/profile_train.py',
        lambda c: [f'--trace_dir={c.run}/checkpoints/9', '--steps=1'],
        r"--trace_dir=.*/checkpoints/9' is inside the run .*run's checkpoints/",
    ),
    (  # --overwrite replaces only what an export writes, never the user's own files
        'export_overwrite_of_a_folder_with_other_files',
        CONVERT,
        lambda c: ['export', f'--workdir={c.run}', f'--hf_dir={c.hf_like}', '--overwrite'],
        r"--hf_dir=.*hf_like' does not look like a Hugging Face export \(NOTES\.md, which an "
        r'export does not write\)',
    ),
    (
        'eval_tokens_of_a_recall_run',  # it scores its examples: the flag would do nothing
        EVAL,
        lambda c: [f'--workdir={c.mqar}', '--eval_tokens=1000'],
        r"--eval_tokens does nothing for source='mqar': a recall task scores "
        r'config\.data\.recall_eval_examples=\d+ examples',
    ),
    (
        'train_set_override',
        TRAIN,
        lambda c: ['--set=train.steps=5'],
        r"Unknown command line flag 'set'; this script takes config overrides as "
        r'--config\.KEY=VALUE',
    ),
    (
        'bench_train_config_override',
        'scripts/bench_train.py',
        lambda c: ['--config.train.steps=5'],
        r"Unknown command line flag 'config\.train\.steps'; this script takes config "
        r'overrides as --set=train\.steps=VALUE',
    ),
    (
        'profile_train_config_without_variants',
        'scripts/profile_train.py',
        lambda c: ['--config=configs/quickstart.py', '--variant=gqa'],
        r'--config=configs/quickstart\.py:gqa: get_config\(\) in configs/quickstart\.py takes no '
        r"argument \(the script builds the variant 'gqa' it times as get_config\('gqa'\): give a "
        r'--config whose get_config takes a variant name, as configs/shakespeare_char\.py',
    ),
    (
        'bench_decode_json_is_a_directory',
        BENCH,
        lambda c: [f'--json={c.root}'],
        r'--json=.* is a directory; give a file path',
    ),
    (  # a benchmark's rows never replace a run's result.json (a sweep then read a list)
        'bench_decode_json_a_runs_record',
        BENCH,
        lambda c: [f'--json={c.run}/results.json'],
        r"--json=.*/run/results\.json would replace the run .*'s own results\.json",
    ),
    *[  # flags no row reads: the rows ran, and the flag did nothing
        (f'bench_decode_{name}', BENCH, lambda c, args=args: ['--variants=mha', *args], pattern)
        for name, args, pattern in (
            ('window_without_local', ['--window=100'], r"--window shapes '<variant>_local'"),
            (
                'layer_pattern_without_local',
                ['--layer_pattern=LG'],
                r"--layer_pattern shapes '<variant>_local' variants only; --variants has none$",
            ),
            (
                'kv_quant_group_without_kivi4',
                ['--kv_quant_group=8', '--kv_cache_dtype=int8'],
                r'--kv_quant_group groups a kivi4 cache only; --kv_cache_dtype is int8$',
            ),
        )
    ],
    (
        'bench_decode_bandwidth_negative',
        BENCH,
        lambda c: ['--bandwidth_gib=-1'],
        r'--bandwidth_gib',
    ),
    (
        'bench_decode_cache_beyond_memory',  # it failed allocating, in a traceback
        BENCH,
        lambda c: ['--batch=4096', '--contexts=65536', '--variants=mha'],
        r"^error: --batch=4096 --contexts=65536: mha's cache of 65664 slots per row \(4104\.0 "
        r'GiB\) and weights \(0\.0 GiB\) exceed the [\d.]+ GiB a device has',
    ),
    (
        'bench_decode_weights_beyond_memory',  # a small cache of a huge model: it failed too
        BENCH,
        lambda c: ['--d_model=65536', '--num_layers=1', '--contexts=16', '--variants=mqa'],
        r"^error: --batch=4 --contexts=16: mqa's cache of .* and weights \(\d+\.\d GiB\) exceed",
    ),
    (
        'bench_decode_bandwidth_beyond_memory',
        BENCH,
        lambda c: ['--bandwidth_gib=100000'],
        r'^error: --bandwidth_gib=100000\.0: its copy holds 200000\.0 GiB, more than the',
    ),
    *[
        (f'{script[8:-3]}_{flag}_zero', script, lambda c, flag=flag: [f'--{flag}=0'], rf'--{flag} ')
        for script, flag in (
            ('scripts/bench_train.py', 'steps'),
            ('scripts/profile_train.py', 'steps'),
            ('scripts/bench_data.py', 'make_mb'),
        )
    ],
    (
        'bench_train_json_not_json',
        'scripts/bench_train.py',
        lambda c: [f'--json={c.text}'],
        r'--json=.*small\.txt: expected a file name ending in \.json$',
    ),
    (
        'bench_decode_json_unwritable',
        BENCH,
        lambda c: ['--json=UNWRITABLE/x/decode.json'],
        r'--json=.*(not writable|cannot be created)',
    ),
    (
        'bench_decode_batch_zero',
        BENCH,
        lambda c: ['--batch=0'],
        r'--batch=0: expected whole numbers >= 1',
    ),
    (
        'bench_decode_contexts_not_numbers',
        BENCH,
        lambda c: ['--contexts=abc'],
        r'--contexts=abc: expected whole numbers >= 1',
    ),
    (
        'bench_decode_new_tokens_zero',
        BENCH,
        lambda c: ['--new_tokens=0'],
        r'--new_tokens must be >= 1, got 0',
    ),
    (
        'bench_decode_cla_with_int8_before_other_rows',
        BENCH,
        lambda c: ['--variants=mha,cla2', '--kv_cache_dtype=int8'],
        r"--variants: cla2: config\.model\.kv_share_every=2 with kv_cache_dtype='int8'",
    ),
    (
        'cache_quality_out_is_a_directory',
        CACHE_Q,
        lambda c: [f'--sweep_dir={c.cla_sweep}', f'--out={c.root}'],
        r'--out=.* is a directory; give a file path ending in \.csv',
    ),
    *[
        (  # a data file or a README is never replaced by a table
            f'{os.path.basename(script)[:-3]}_out_not_a_csv',
            script,
            lambda c, extra=extra: [f'--sweep_dir={c.cla_sweep}', *extra(c), f'--out={c.text}'],
            r'--out=.*small\.txt: expected a file name ending in \.csv$',
        )
        for script, extra in (
            (CACHE_Q, lambda c: []),
            (EVAL_SWEEP, lambda c: [f'--config={c.good_cfg}']),
        )
    ],
    (
        'cache_quality_cla_run_before_evaluating',
        CACHE_Q,
        lambda c: [
            f'--sweep_dir={c.cla_sweep}',
            '--points=cla2',
            '--kv_cache_dtypes=int8',
            f'--out={c.root}/new_dir/q.csv',
        ],
        r'--points: cla2 \(.*cla2_s0\) with --kv_cache_dtypes=int8: '
        r'config\.model\.kv_share_every=2 with kv_cache_dtype=',
    ),
    (
        'cache_quality_out_and_sweep_out_the_same_file',
        CACHE_Q,
        lambda c: [
            f'--sweep_dir={c.cla_sweep}',
            f'--out={c.root}/q.csv',
            f'--sweep_out={c.root}/q.csv',
        ],
        r'--out and --sweep_out name the same file',
    ),
    *[
        (
            f'cache_quality_empty_{flag}',
            CACHE_Q,
            lambda c, flag=flag: [
                f'--sweep_dir={c.cla_sweep}',
                f'--out={c.root}/q.csv',
                f'--{flag}=',
            ],
            rf'--{flag}: expected one or more values, got none',
        )
        for flag in ('points', 'kv_cache_dtypes')
    ],
    (
        'eval_sweep_on_an_ablation_out_dir',
        EVAL_SWEEP,
        lambda c: [
            f'--sweep_dir={c.root}/ablation',
            f'--config={c.good_cfg}',
            f'--out={c.root}/e.csv',
        ],
        r'--sweep_dir: .*ablation is not a sweep directory: .* \(it holds an uptrain_ablation',
    ),
    *[
        (
            f'uptrain_ablation_{flag}_zero',
            ABLATION,
            lambda c, flag=flag: [f'--{flag}=0', f'--out_dir={c.root}/abl'],
            rf'--{flag}: expected >= 1, got 0',
        )
        for flag in ('seeds', 'steps')
    ],
    *[
        (  # the ablation sets these in every run: the --set was replaced silently
            f'uptrain_ablation_set_{key}',
            ABLATION,
            lambda c, key=key, value=value: [f'--set={key}={value}', f'--out_dir={c.root}/abl'],
            rf"--set '{re.escape(key)}={value}': the ablation sets {re.escape(key)} itself, from ",
        )
        for key, value in (('seed', 7), ('data.path', 'x.txt'), ('train.steps', 3))
    ],
    *[
        (  # its runs would be made inside a run, or beside a sweep's
            f'uptrain_ablation_out_dir_{name}',
            ABLATION,
            lambda c, where=where: [f'--out_dir={where(c)}'],
            rf"--out_dir='.*' is {kind}; the ablation makes its runs in a directory of its own$",
        )
        for name, where, kind in (
            ('a_run', lambda c: c.run, 'a training run'),
            ('a_sweep', lambda c: c.sweep, 'a sweep directory'),
        )
    ],
    (
        'uptrain_ablation_out_dir_inside_a_run',
        ABLATION,
        lambda c: [f'--out_dir={c.run}/abl'],
        r"--out_dir='.*/run/abl' is inside the run .*/run; give the new run a directory",
    ),
    (
        'sweep_dir_inside_a_run',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.run}/sw'],
        r"--sweep_dir='.*/run/sw' is inside the run .*/run; give the new run a directory",
    ),
    (
        'uptrain_ablation_compare_with_itself',  # it printed +0.0000 as a result
        ABLATION,
        lambda c: [f'--compare_with={c.root}/abl', f'--out_dir={c.root}/abl'],
        r'^error: --compare_with=.*/abl is --out_dir itself; name an earlier one$',
    ),
    (
        'uptrain_ablation_compare_with_no_such_runs',  # its table came out empty, at the end
        ABLATION,
        lambda c: [f'--compare_with={c.sweep}', f'--out_dir={c.root}/abl', f'--data_path={c.text}'],
        r"^error: --compare_with=.*: it holds no result of this ablation's conversion runs "
        r'\([\w.-]+, \.\.\.\): give an earlier --out_dir of the same arms$',
    ),
    (
        'uptrain_ablation_report_in_a_missing_directory',
        ABLATION,
        lambda c: [f'--report={c.root}/nodir/report.md', f'--out_dir={c.root}/abl'],
        r'--report=.*: its directory .*nodir does not exist',
    ),
    (
        'plot_pareto_out_is_a_directory',
        PARETO,
        lambda c: [f'--table={c.root}/pareto.csv', f'--out={c.root}'],
        r'--out=.* is a directory; give a file path',
    ),
    (
        'plot_pareto_out_not_png',
        PARETO,
        lambda c: [f'--table={c.root}/pareto.csv', f'--out={c.root}/p'],
        r'--out=.*/p: expected a file name ending in \.png',
    ),
    (
        'plot_pareto_exclude_every_point',
        PARETO,
        lambda c: [f'--table={c.root}/pareto.csv', f'--out={c.root}/p.png', '--exclude=mha'],
        r'--exclude left no points',
    ),
    (
        'plot_roofline_out_not_png',
        ROOFLINE,
        lambda c: [f'--json={c.root}/roofline_empty.json', f'--out={c.root}/roof'],
        r'--out=.*/roof: expected a file name ending in \.png',
    ),
    *[
        (
            f'plot_roofline_json_{name}',
            ROOFLINE,
            lambda c, name=name: [f'--json={c.root}/roofline_{name}.json', f'--out={c.root}/r.png'],
            rf'--json: .*roofline_{name}\.json(:| is)',
        )
        for name in ROOFLINE_JSON
    ],
    (
        'make_tables_studies_is_a_file',
        'scripts/make_tables.py',
        lambda c: [f'--studies={c.root}/a_file', '--check'],
        r'--studies=.*a_file is not a directory',
    ),
    (
        'analyze_heads_the_same_run_twice',
        'scripts/analyze_heads.py',
        lambda c: [f'--workdir={c.run}', f'--compare={c.run}', f'--out={c.root}/heads'],
        r'--compare=.*: run run@4 is also --workdir; give each run',
    ),
    (
        'eval_sweep_out_over_an_ablations_seeds_csv',  # it replaced the ablation's own table
        EVAL_SWEEP,
        lambda c: [
            f'--sweep_dir={c.cla_sweep}',
            f'--config={c.good_cfg}',
            f'--out={c.root}/ablation/seeds.csv',
        ],
        r"--out=.*/ablation/seeds\.csv would replace the uptraining ablation .*/ablation's own "
        r'seeds\.csv; give a path outside it',
    ),
    (
        'uptrain_ablation_report_over_its_own_seeds_csv',  # the report replaced seeds.csv
        ABLATION,
        lambda c: [f'--out_dir={c.root}/ablation', f'--report={c.root}/ablation/seeds.csv'],
        r'^error: --report=.*/ablation/seeds\.csv: expected a file name ending in \.md$',
    ),
    (
        'sweep_dir_is_an_ablation_out_dir',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/ablation'],
        r'^error: --sweep_dir: .*/ablation is an uptrain_ablation out_dir, not a sweep directory$',
    ),
    (
        'eval_sweep_out_is_a_directory',
        EVAL_SWEEP,
        lambda c: [f'--sweep_dir={c.cla_sweep}', f'--config={c.good_cfg}', f'--out={c.root}'],
        r'--out=.* is a directory; give a file path ending in \.csv',
    ),
    (
        'sweep_grid_lr_nan',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/sw', '--grid=train.lr=nan'],
        r'sweep point \S+: config\.train\.lr must be a finite number, got nan',
    ),
    (
        'sweep_grid_data_value_bogus',  # refused before the sweep's first run, not in its log
        SWEEP,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--sweep_dir={c.root}/sw',
            '--grid=data.sampling=epochs,bogus',
        ],
        r"sweep point \S+: config\.data\.sampling must be one of .*, got 'bogus'",
    ),
    (
        'sweep_grid_steps_negative',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/sw', '--grid=train.steps=-5'],
        r'sweep point \S+: config\.train\.steps must be >= 0 .*got -5',
    ),
    *[
        (
            f'sweep_file_{name}',
            SWEEP,
            lambda c, name=name: [f'--config={c.root}/{name}.py', f'--sweep_dir={c.root}/sw'],
            pattern,
        )
        for name, pattern in (
            ('points_not_a_list', r'get_points\(\) of .* returned dict, not a list of points'),
            ('point_not_a_dict', r'point 1 is 1, not a dict of settings'),
            ('point_seeds_zero', r'point 1 has seeds=0; expected >= 1'),
            ('get_points_raises', r'get_points\(\) of .* failed: ZeroDivisionError'),
            (
                'point_value_of_another_type',
                r"sweep point a: model\.num_heads='x' is a str; the config has an int there "
                r'\(\d+\)$',
            ),
            ('points_empty', r'get_points\(\) of .* returned no points: list at least one'),
            (
                'point_named_pareto',
                r"sweep point pareto: 'pareto' is the TensorBoard run of the "
                r"sweep's Pareto figures",
            ),
        )
    ],
    (
        'generate_id_outside_the_vocabulary',
        GENERATE,
        lambda c: [f'--workdir={c.mqar}', '--prompt=1 4000'],
        r"--prompt \(number 1, '1 4000'\): '4000' is not a symbol id: expected whole numbers "
        r'0\.\.63',
    ),
    (
        'generate_negative_id',
        GENERATE,
        lambda c: [f'--workdir={c.mqar}', '--prompt=-2 5'],
        r"'-2' is not a symbol id",
    ),
    (
        'train_recall_source_with_a_bad_sampling',
        TRAIN,
        lambda c: [
            f'--config={ROOT / "configs" / "recall" / "mqar.py"}',
            f'--workdir={c.root}/mqar_new',
            '--config.data.sampling=bogus',
        ],
        r"^error: config\.data\.sampling must be one of \('random', 'epochs'\), got 'bogus'",
    ),
    (
        'train_recall_source_with_a_text_setting',
        TRAIN,
        lambda c: [
            f'--config={ROOT / "configs" / "recall" / "mqar.py"}',
            f'--workdir={c.root}/mqar_new',
            '--config.data.val_fraction=0.5',
        ],
        r"config\.data\.val_fraction=0\.5 does nothing for source='mqar'",
    ),
    *[
        (
            f'train_{key}_nothing_reads',  # a setting the split or tokenizer would not read
            TRAIN,
            lambda c, key=key, value=value: [
                f'--config={c.good_cfg}',
                f'--workdir={c.root}/idle_{key}',
                f'--config.data.{key}={value}',
            ],
            rf'^error: config\.data\.{key}={value!r} does nothing with {why}',
        )
        for key, value, why in (
            ('bpe_vocab_size', 8192, "tokenizer='byte'"),
            ('uptrain_fraction', 0.2, "split=''"),
        )
    ],
    *[
        (
            f'generate_seed_{name}',
            GENERATE,
            lambda c, seed=seed: [f'--workdir={c.mqar}', '--prompt=1 5', f'--seed={seed}'],
            rf'^error: --seed must be an integer in \[0, 2\*\*32\), got {seed}$',
        )
        for name, seed in (('past_2_32', 2**32), ('negative', -1))
    ],
    (
        'sweep_override_of_a_key_a_point_sets',
        SWEEP,
        lambda c: [
            f'--config={c.root}/kv_points.py',
            f'--sweep_dir={c.root}/sw',
            '--points=mha,gqa2',
            '--config.model.num_kv_heads=1',
        ],
        r'^error: --config\.model\.num_kv_heads: sweep point mha sets model\.num_kv_heads=0 '
        r'itself, so the override would do nothing',
    ),
    (
        'sweep_override_of_a_grid_key',
        SWEEP,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--sweep_dir={c.root}/sw',
            '--grid=train.lr=1e-3,2e-3',
            '--config.train.lr=5e-3',
        ],
        r"^error: --config\.train\.lr: --grid sets train\.lr too, and the grid's values",
    ),
    (
        'sweep_parallel_zero',
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/sw', '--parallel=0'],
        r'^error: --parallel must be >= 1, got 0$',
    ),
    (
        'sweep_ensemble_flag_without_ensemble',  # separate runs: it would do nothing
        SWEEP,
        lambda c: [f'--config={c.good_cfg}', f'--sweep_dir={c.root}/sw', '--ensemble_groups=2'],
        r'^error: --ensemble_groups applies to --ensemble sweeps only; add --ensemble$',
    ),
    (
        'sweep_more_ensemble_groups_than_seeds',  # it used to be lowered to the seeds silently
        SWEEP,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--sweep_dir={c.root}/sw',
            '--seeds=2',
            '--ensemble',
            '--ensemble_groups=3',
        ],
        r'^error: --ensemble_groups=3 is more than the 2 seeds of any point: each group is an '
        r'ensemble of at least one seed \(at most 2\)$',
    ),
    (
        'sweep_override_of_what_ensemble_sets',  # --ensemble_program sets it: silently replaced
        SWEEP,
        lambda c: [
            f'--config={c.good_cfg}',
            f'--sweep_dir={c.root}/sw',
            '--seeds=2',
            '--ensemble',
            '--config.train.ensemble_loop=true',
        ],
        r'^error: --config\.train\.ensemble_loop sets train\.ensemble_loop, but with --ensemble '
        r'the sweep sets it from --ensemble_program',
    ),
    (
        'sweep_named_point_that_cannot_run',
        SWEEP,
        lambda c: [
            f'--config={c.root}/kv_points.py',
            f'--sweep_dir={c.root}/sw',
            '--points=mha,gqa2',
            '--config.model.num_heads=3',
            '--config.model.head_dim=8',
        ],
        r'^error: --points: gqa2 cannot run: config\.model\.num_heads=3 must be divisible by '
        r'num_kv_heads=2',
    ),
    (
        'uptrain_fraction_rounds_to_no_step',  # the run has 4 steps: 0.05 x 4 rounds to 0
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.root}/up0', '--num_kv_heads=2'],
        r"^error: --fraction=0\.05 of the source's 4 steps rounds to 0 uptraining steps, so "
        r'train\.py would train nothing: set a larger --fraction or --steps >= 1$',
    ),
    (
        'uptrain_no_step',
        UPTRAIN,
        lambda c: [f'--src={c.run}', f'--dst={c.root}/up0', '--num_kv_heads=2', '--steps=0'],
        r'^error: --steps=0 leaves nothing to uptrain: set it >= 1$',
    ),
]


@pytest.fixture(scope='module')
def early_outcomes(early):
    """Every EARLY row, in forked children of one Python (tests/flag_parse.py), and the digest
    of everything written before and after them."""
    calls = [
        {
            'cwd': str(ROOT),
            'argv': [
                str(ROOT / script),
                *(a.replace('=UNWRITABLE', f'={early.unwritable}') for a in args(early)),
            ],
            'run': True,
        }
        for _, script, args, _ in EARLY
    ]
    before = tree_digest(early.root)
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'HF_HUB_OFFLINE': '1'}
    results = in_one_python(calls, ROOT, env)
    return dict(zip([r[0] for r in EARLY], results, strict=True)), before, tree_digest(early.root)


@pytest.mark.slow
@pytest.mark.parametrize(
    ('row', 'pattern'), [(r[0], r[3]) for r in EARLY], ids=[r[0] for r in EARLY]
)
def test_early_refusal_is_one_line_before_any_work(early_outcomes, row, pattern):
    results, before, after = early_outcomes
    code, out = results[row]['code'], results[row]['out']
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert code != 0 and 'Traceback' not in out, out[-3000:]
    assert lines and lines[-1].startswith('error: '), out[-3000:]
    assert re.search(pattern, lines[-1]), lines[-1]
    assert after == before  # nothing written, not even the directories of outputs
