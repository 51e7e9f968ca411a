"""The files of a Hugging Face directory besides config.json and the weights: the tokenizer and
generation files, carried unchanged through import (into <workdir>/hf/) and export, and the
tokenizer of a run trained here written as files transformers loads.

Import takes the directory's tokenizer.json (or `--tokenizer`: another tokenizer.json, or 'byte'
for lm's byte tokenizer); a tokenizer.json that is lm's byte tokenizer (an lm export of a byte
run) imports as 'byte', so the run tokenises exactly as the one exported. Export writes the run's
tokenizer as tokenizer.json (a byte-level BPE without merges for the byte tokenizer), the carried
files beside it, and a tokenizer_config.json where none was carried.
"""

from __future__ import annotations

import json
import os
import shutil

import ml_collections

from lm.data.corpus import load_tokenizer
from lm.data.tokenizer import PAD, ByteTokenizer, HFTokenizer, Tokenizer, is_byte_tokenizer
from lm.train.workdir import RUN_FILES

HF_SUBDIR = RUN_FILES  # <workdir>/hf: the imported tokenizer files and the source config.json
SOURCE_CONFIG = 'source_config.json'  # the imported config.json, as <workdir>/hf holds it
BYTE = 'byte'
CARRIED = (
    'tokenizer.json',
    'tokenizer_config.json',
    'special_tokens_map.json',
    'added_tokens.json',
    'chat_template.jinja',  # where transformers 5 keeps the chat template
    'chat_template.json',
    'generation_config.json',
    'tokenizer.model',
    'vocab.json',
    'merges.txt',
    'vocab.txt',
)
CARRIED_DIRS = ('additional_chat_templates',)  # transformers' named extra chat templates
HUB_PATTERNS = [
    'config.json',
    '*.safetensors',
    'model.safetensors.index.json',
    *CARRIED,
    *(f'{d}/*' for d in CARRIED_DIRS),
]


def check_has_config(directory: str) -> str:
    """config.json's path in `directory`; a one-line error saying what to do when it is absent
    (a GGUF-only directory is named as such)."""
    path = os.path.join(directory, 'config.json')
    if os.path.isfile(path):
        return path
    gguf = sorted(n for n in os.listdir(directory) if n.endswith('.gguf'))
    if gguf:
        raise FileNotFoundError(
            f'{directory} holds {gguf[0]} but no config.json: lm imports Hugging Face safetensors '
            "directories, not GGUF; use the model's safetensors repository, or convert with "
            f"transformers: AutoModelForCausalLM.from_pretrained(DIR, gguf_file='{gguf[0]}')"
            '.save_pretrained(OUT) (and AutoTokenizer likewise), then import OUT'
        )
    raise FileNotFoundError(f'{path} does not exist')


def read_tokenizer(directory: str, tokenizer: str, vocab_size: int) -> str:
    """What the imported run tokenises with: BYTE (given as `tokenizer`, or the directory's
    tokenizer.json is lm's byte tokenizer), else the path of the tokenizer.json (`tokenizer`, or
    the directory's). Refused in one line when absent or larger than `vocab_size`."""
    own = os.path.join(directory, 'tokenizer.json')
    if tokenizer == BYTE:
        if vocab_size < ByteTokenizer.vocab_size:
            raise ValueError(
                f'--tokenizer=byte needs config.json vocab_size >= {ByteTokenizer.vocab_size} '
                f'(256 bytes, end-of-text and pad), got {vocab_size}'
            )
        if os.path.isfile(own) and not is_byte_tokenizer(HFTokenizer.from_file(own).tok):
            raise ValueError(
                f"--tokenizer=byte: {own} is not lm's byte tokenizer, so the model's ids mean "
                'other tokens; leave --tokenizer out to use it'
            )
        return BYTE
    path = tokenizer or own
    if tokenizer and not os.path.isfile(path):
        what = 'is a directory' if os.path.isdir(path) else 'does not exist'
        raise FileNotFoundError(f'--tokenizer={path} {what}; give a tokenizer.json file')
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f'{path} does not exist (a sentencepiece tokenizer.model only?): pass '
            "--tokenizer=a tokenizer.json, e.g. from transformers' "
            'AutoTokenizer.from_pretrained(DIR).save_pretrained(OUT), or --tokenizer=byte for '
            "a model trained with lm's byte tokenizer"
        )
    found = HFTokenizer.from_file(path)
    if found.vocab_size > vocab_size:
        raise ValueError(
            f'{path} has {found.vocab_size} tokens, more than config.json vocab_size={vocab_size}'
        )
    return BYTE if is_byte_tokenizer(found.tok) else path


def _copy_carried(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
    """Copies the CARRIED files and CARRIED_DIRS that `src` holds into `dst`, but `skip`."""
    for name in CARRIED:
        if name not in skip and os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    for name in CARRIED_DIRS:
        if os.path.isdir(os.path.join(src, name)):
            shutil.copytree(os.path.join(src, name), os.path.join(dst, name), dirs_exist_ok=True)


def copy_into_run(directory: str, tokenizer: str, workdir: str) -> str:
    """Copies the carried files of `directory` (`tokenizer` as tokenizer.json unless BYTE) and
    config.json (as source_config.json) into <workdir>/hf; returns `config.data.tokenizer` for
    the run once `workdir` is in place (BYTE, or the copied tokenizer.json's absolute path)."""
    out = os.path.join(workdir, HF_SUBDIR)
    os.makedirs(out, exist_ok=True)
    _copy_carried(directory, out, () if tokenizer == BYTE else ('tokenizer.json',))
    if tokenizer != BYTE:
        shutil.copyfile(tokenizer, os.path.join(out, 'tokenizer.json'))
    shutil.copyfile(os.path.join(directory, 'config.json'), os.path.join(out, SOURCE_CONFIG))
    return BYTE if tokenizer == BYTE else os.path.abspath(os.path.join(out, 'tokenizer.json'))


def _inside(path: str, directory: str) -> str | None:
    """`path` relative to `directory` when it lies inside it, else None."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return (
        os.path.relpath(path, directory)
        if os.path.commonpath([path, directory]) == directory
        else None
    )


def lent_tokenizer(tokenizer: str, source_workdir: str, workdir: str) -> str:
    """`config.data.tokenizer` of a run converted from `source_workdir` into `workdir`: a
    tokenizer.json the source keeps inside itself is read from the converted run's copy
    (`copy_run_files`), at the same place in it; any other is left as it is."""
    if not tokenizer.endswith('.json') or (rel := _inside(tokenizer, source_workdir)) is None:
        return tokenizer
    return os.path.join(os.path.abspath(workdir), rel)


def copy_run_files(source_workdir: str, workdir: str, tokenizer: str = '') -> None:
    """Copies what `source_workdir` lends a run converted from it (lm/convert/uptrain.py): its
    imported files (<workdir>/hf) and its `tokenizer` (config.data.tokenizer) when the source
    keeps it inside itself, at the same places, so the converted run stands on its own."""
    src = os.path.join(source_workdir, HF_SUBDIR)
    if os.path.isdir(src):
        shutil.copytree(src, os.path.join(workdir, HF_SUBDIR), dirs_exist_ok=True)
    dst = lent_tokenizer(tokenizer, source_workdir, workdir)
    if dst != tokenizer and not os.path.isfile(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(tokenizer, dst)


def _token_text(token) -> str | None:
    return token.get('content') if isinstance(token, dict) else token


def eos_token(directory: str, hf_config: dict, tokenizer: str) -> str:
    """The end-of-text token of an imported tokenizer.json: tokenizer_config.json's eos_token,
    else config.json's eos_token_id; '' when neither names one (and for BYTE, whose is fixed)."""
    if tokenizer == BYTE:
        return ''
    tok = HFTokenizer.from_file(tokenizer).tok
    path = os.path.join(directory, 'tokenizer_config.json')
    if os.path.isfile(path):
        with open(path) as f:
            eos = _token_text(json.load(f).get('eos_token'))
        if eos and tok.token_to_id(eos) is not None:
            return eos
    eos_id = hf_config.get('eos_token_id')
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    if isinstance(eos_id, int) and (name := tok.id_to_token(eos_id)) is not None:
        return name
    return ''


def files_dir(workdir: str, config: ml_collections.ConfigDict) -> str:
    """The directory of the run's imported files (the one holding source_config.json): beside
    its tokenizer.json, else <workdir>/hf; '' for a run trained here."""
    candidates = [os.path.join(workdir, HF_SUBDIR)]
    if config.data.tokenizer.endswith('.json'):
        candidates.insert(0, os.path.dirname(os.path.abspath(config.data.tokenizer)))
    for d in candidates:
        if os.path.isfile(os.path.join(d, SOURCE_CONFIG)):
            return d
    return ''


def source_config(directory: str) -> dict:
    """The imported config.json in `directory` (from `files_dir`); {} for ''."""
    if not directory:
        return {}
    with open(os.path.join(directory, SOURCE_CONFIG)) as f:
        return json.load(f)


def max_position(workdir: str, config: ml_collections.ConfigDict) -> int:
    """The longest sequence (in positions) the run's model serves: an imported model's
    `max_position_embeddings` (its config.json, kept with the run), else the length it was
    trained at, `config.data.seq_len`."""
    source = source_config(files_dir(workdir, config))
    return int(source.get('max_position_embeddings', config.data.seq_len))


def run_tokenizer(config: ml_collections.ConfigDict) -> Tokenizer:
    """The run's tokenizer (a BPE trained here is read from the data cache, or trained again)."""
    if config.data.tokenizer == BYTE:  # needs no data
        return ByteTokenizer()
    if config.data.tokenizer.endswith('.json'):
        return HFTokenizer.from_file(config.data.tokenizer, config.data.eos_token)
    return load_tokenizer(config.data)


def _tokenizer_config(tokenizer: Tokenizer, max_len: int) -> dict:
    """tokenizer_config.json for transformers: tokenizing and decoding as lm does (special-token
    text kept as text where lm's tokenizer keeps it so)."""
    tok = tokenizer.hf_tokenizer()
    eos = tok.id_to_token(tokenizer.eos_id)
    out = {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        'eos_token': eos,
        'model_max_length': max_len,
        'clean_up_tokenization_spaces': False,
        'split_special_tokens': tokenizer.encode(eos) != [tokenizer.eos_id],
    }
    if tok.token_to_id(PAD) is not None:
        out['pad_token'] = PAD
    return out


def special_ids(tokenizer: Tokenizer) -> dict:
    """config.json's eos_token_id and pad_token_id (when it has one) of an exported tokenizer."""
    pad = tokenizer.hf_tokenizer().token_to_id(PAD)
    return {'eos_token_id': tokenizer.eos_id, **({'pad_token_id': pad} if pad is not None else {})}


def write_tokenizer(
    out_dir: str, config: ml_collections.ConfigDict, tokenizer: Tokenizer, source: str, max_len: int
) -> None:
    """Writes the run's tokenizer.json (the file itself when the run reads one), the carried
    files of `source` (`files_dir`) and, where none was carried, a tokenizer_config.json."""
    path = os.path.join(out_dir, 'tokenizer.json')
    if config.data.tokenizer.endswith('.json'):
        shutil.copyfile(config.data.tokenizer, path)
    else:
        tokenizer.hf_tokenizer().save(path)
    if source:
        _copy_carried(source, out_dir, ('tokenizer.json',))
    if not os.path.isfile(os.path.join(out_dir, 'tokenizer_config.json')):
        with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w') as f:
            json.dump(_tokenizer_config(tokenizer, max_len), f, indent=2)
