"""One-line errors for bad `config.data` settings, before anything is read or compiled: values no
source takes, missing or repeated data files, and settings the chosen source would ignore."""

from __future__ import annotations

import itertools
import os

import ml_collections
from absl import logging

from lm.data.files import text_paths
from lm.data.parts import check_split_config
from lm.data.recall import TASKS, check_recall_config
from lm.data.tokenizer import check_tokenizer_config

SOURCES = ('stdlib', 'text', 'hf', *TASKS)
DECODE_ERRORS = ('strict', 'replace')
HF_SAMPLE_BY = ('line', 'paragraph', 'document')
SAMPLINGS = ('random', 'epochs')
# config.data keys a recall source never reads (text files, held-out share, parts, Hugging
# Face, tokenizer, window sampling), and those of them that are this machine's own.
RECALL_IGNORES = (
    'path',
    'decode_errors',
    'val_fraction',
    'split',
    'uptrain_fraction',
    'heldout_fraction',
    'split_layout',
    'split_block',
    'hf_name',
    'hf_config',
    'hf_split',
    'hf_eval_split',
    'hf_text_column',
    'hf_sample_by',
    'hf_streaming',
    'hf_max_docs',
    'tokenizer',
    'eos_token',
    'bpe_vocab_size',
    'sampling',
)
RECALL_IGNORES_LOCAL = ('cache_dir', 'num_proc')
# config.data keys only a recall task reads, and only a Hugging Face dataset.
RECALL_KEYS = (
    'recall_seed',
    'recall_eval_examples',
    'recall_pairs',
    'recall_train_pairs',
    'recall_vocab',
    'recall_power_a',
    'passkey_lengths',
    'passkey_depths',
)
HF_KEYS = tuple(k for k in RECALL_IGNORES if k.startswith('hf_'))
# The recall keys a task does not read: passkey's grid, MQAR's query law (Zoology's slots are
# uniform). (recall_pairs and recall_vocab, which configs/recall/passkey.py inherits from
# MQAR's file, are left to its checks.)
TASK_IGNORES = {
    'mqar': ('passkey_lengths', 'passkey_depths'),
    'mqar_zoology': ('recall_power_a', 'passkey_lengths', 'passkey_depths'),
    'passkey': ('recall_power_a',),
}


def check_data_config(data: ml_collections.ConfigDict) -> None:
    """One-line errors for bad data settings, before anything is read or compiled: every value
    is checked whatever the source (`check_idle_data` tells settings a source ignores)."""
    if data.source not in SOURCES:
        raise ValueError(f'config.data.source must be one of {SOURCES}, got {data.source!r}')
    _check_values(data)
    if data.source in TASKS:
        return check_recall_config(data)
    if data.source == 'text':
        if not text_paths(data):
            raise ValueError("config.data.path must name at least one text file for source='text'")
    if data.source in ('text', 'hf'):
        for path in text_paths(data):
            if os.path.isdir(path):
                raise ValueError(
                    f'config.data.path: {path!r} is a directory; name text files (comma-separated)'
                )
            if os.path.exists(path) and not os.path.isfile(path):
                raise ValueError(f'config.data.path: {path!r} is not a regular file')
            if not os.path.isfile(path):
                _check_comma_name(data.path)
                raise FileNotFoundError(f'config.data.path: {path!r} does not exist{_hint(path)}')
            if data.source == 'text' and os.path.getsize(path) == 0:
                raise ValueError(f'config.data.path: {path!r} is empty')
        _check_distinct_files(text_paths(data))
    if data.source == 'hf' and not data.hf_name:
        raise ValueError("config.data.hf_name must be set for source='hf'")
    if data.source == 'hf' and data.hf_eval_split == data.hf_split:
        raise ValueError(
            f'config.data.hf_eval_split={data.hf_eval_split!r} is hf_split: validation would be '
            "the training documents; name another split, or '' to hold out every 10th document"
        )


def _check_distinct_files(paths: list[str]) -> None:
    """Refuses a file named twice (by any path): its text would be read twice, and could then
    be in both splits (validation is the end of the last file)."""
    seen: dict[str, str] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(
                f'config.data.path names one file twice ({seen[real]!r} and {path!r}): list '
                'each file once'
            )
        seen[real] = path


def _check_comma_name(value: str) -> None:
    """Refuses a `data.path` whose pieces are missing files because a file's own name holds a
    comma (the list separator): no file name can hold one."""
    parts = value.split(',')
    for i, j in itertools.combinations(range(len(parts) + 1), 2):
        name = ','.join(parts[i:j]).strip()
        if j - i > 1 and os.path.isfile(name):
            raise ValueError(
                f'config.data.path: {name!r} is a file whose name holds a comma, but data.path '
                'is a comma-separated list of files: link or copy it to a name without one'
            )


def _hint(path: str) -> str:
    """What to do about a data file that is not there: a relative path is read from the current
    directory (a run's saved one from where it trained); the recipes' file can be fetched."""
    notes = [] if os.path.isabs(path) else [f'relative to the current directory {os.getcwd()}']
    if os.path.basename(path) == 'tinyshakespeare.txt':
        notes.append('fetch it: python scripts/get_data.py tinyshakespeare')
    return f' ({"; ".join(notes)})' if notes else ''


def _check_values(data: ml_collections.ConfigDict) -> None:
    """One-line errors for data values no source takes (the tokenizer's file must exist)."""
    if not 0 < data.val_fraction < 1:
        raise ValueError(f'config.data.val_fraction must be in (0, 1), got {data.val_fraction}')
    if data.seq_len <= 0:
        raise ValueError(f'config.data.seq_len must be > 0, got {data.seq_len}')
    for key, allowed in (
        ('decode_errors', DECODE_ERRORS),
        ('hf_sample_by', HF_SAMPLE_BY),
        ('sampling', SAMPLINGS),
    ):
        if data[key] not in allowed:
            raise ValueError(f'config.data.{key} must be one of {allowed}, got {data[key]!r}')
    num = data.num_proc
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ValueError(
            f'config.data.num_proc must be an integer >= 0 (0 = every CPU, up to 16), got {num!r}'
        )
    if data.hf_max_docs < 0:
        raise ValueError(f'config.data.hf_max_docs must be >= 0 (0 = all), got {data.hf_max_docs}')
    check_tokenizer_config(data)
    check_split_config(data)


# config.data keys only a corpus cut into parts (data.split) reads.
SPLIT_KEYS = ('uptrain_fraction', 'heldout_fraction', 'split_layout', 'split_block')


def unread_data_keys(data: ml_collections.ConfigDict) -> dict[str, str]:
    """{key: why} of the `config.data` keys a run of these settings never reads, whatever their
    values: for a recall source every text setting (RECALL_IGNORES) and the other tasks' own
    (TASK_IGNORES), for the others the recall tasks' (RECALL_KEYS), the Hugging Face dataset's
    (HF_KEYS) but for 'hf', the path for 'stdlib', the parts' (SPLIT_KEYS) with no data.split,
    split_block but for the interleaved layout (and uptrain_fraction with it when
    'pretrain+uptrain' is the whole training split), bpe_vocab_size but for 'bpe' and eos_token
    but for a tokenizer.json."""
    if data.source in TASKS:
        unread = dict.fromkeys(
            RECALL_IGNORES, f'for source={data.source!r} (its rows are generated)'
        )
        return unread | dict.fromkeys(TASK_IGNORES[data.source], f'for source={data.source!r}')
    read_by_others = RECALL_KEYS + (HF_KEYS if data.source != 'hf' else ())
    unread = dict.fromkeys(read_by_others, f'for source={data.source!r}')
    if data.source == 'stdlib':
        unread['path'] = (
            "for source='stdlib', which reads this Python's own .py files (to train on the "
            "file, set config.data.source='text')"
        )
    if not data.split:
        unread.update(dict.fromkeys(SPLIT_KEYS, "with split='' (no parts are cut)"))
    elif data.split_layout != 'interleaved':
        unread['split_block'] = f'with split_layout={data.split_layout!r}'
        if data.split == 'pretrain+uptrain':  # the whole training split, wherever it is cut
            unread['uptrain_fraction'] = (
                f"with split='pretrain+uptrain' and split_layout={data.split_layout!r} (the whole "
                'training split)'
            )
    if data.tokenizer != 'bpe':
        unread['bpe_vocab_size'] = f'with tokenizer={data.tokenizer!r} (no BPE is trained)'
    if not data.tokenizer.endswith('.json'):
        unread['eos_token'] = f'with tokenizer={data.tokenizer!r} (not a tokenizer.json)'
    return unread


# config.data keys the scored text (validation, held-out, recall examples) and its tokens
# depend on, beside data.split's part cuts (`eval_text_settings`).
EVAL_TEXT_KEYS = (
    'source',
    'path',
    'decode_errors',
    'val_fraction',
    *(k for k in HF_KEYS if k != 'hf_streaming'),
    'tokenizer',
    'eos_token',
    'bpe_vocab_size',
    'seq_len',
    *(k for k in RECALL_KEYS if k != 'recall_train_pairs'),
)


def eval_text_settings(flat: dict) -> dict:
    """The settings of a run's flat config (`lm.train.identity.flat_config`) that the text its
    evaluation scores depends on: two runs that differ in one are scored on different text, so
    their losses are not paired by seed. A part (data.split) cuts the held-out text from
    validation whichever part it trains on; its interleaved blocks depend on every share."""
    out = {f'data.{k}': flat.get(f'data.{k}') for k in EVAL_TEXT_KEYS}
    out['eval_tokens'] = flat.get('eval_tokens')
    if flat.get('data.split'):
        out['data.split'] = 'a part'
        out['data.heldout_fraction'] = flat.get('data.heldout_fraction')
        if flat.get('data.split_layout') == 'interleaved':
            for k in ('split_layout', 'split_block', 'uptrain_fraction'):
                out[f'data.{k}'] = flat.get(f'data.{k}')
    return out


def idle_data_settings(data: ml_collections.ConfigDict, defaults: dict[str, tuple]) -> dict:
    """{key: why it does nothing} for each `unread_data_keys` setting away from its defaults
    (`defaults`: configs/base.py's value and an upgraded old config's,
    `lm.config.default_values`)."""
    return {k: why for k, why in unread_data_keys(data).items() if data[k] not in defaults[k]}


def reset_idle_data(data: ml_collections.ConfigDict, defaults: dict[str, tuple]) -> dict:
    """Sets each of `idle_data_settings` back to its configs/base.py value (in place), so the
    config says what the run uses; {'key=old value': why it did nothing} of those reset."""
    reset = {}
    for key, why in idle_data_settings(data, defaults).items():
        reset[f'{key}={data[key]!r}'] = why
        data[key] = defaults[key][0]
    return reset


def check_idle_data(data: ml_collections.ConfigDict, defaults: dict[str, tuple]) -> None:
    """A setting the run never reads (`idle_data_settings`) is refused in one line (it would
    do nothing); this machine's own settings (RECALL_IGNORES_LOCAL), which a user may give
    every run, are only warned about for a recall source."""
    if idle := idle_data_settings(data, defaults):
        key, why = next(iter(idle.items()))
        raise ValueError(
            f'config.data.{key}={data[key]!r} does nothing {why}: '
            f"leave it at configs/base.py's {defaults[key][0]!r}"
        )
    recall = data.source in TASKS
    local = [f'{k}={data[k]!r}' for k in RECALL_IGNORES_LOCAL if data[k] not in defaults[k]]
    if recall and local:
        logging.log_first_n(
            logging.WARNING,
            'config.data.%s ignored: source=%r generates its rows (nothing is read or cached)',
            1,
            ', '.join(local),
            data.source,
        )
