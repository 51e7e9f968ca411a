"""Hugging Face directories <-> lm workdirs: `import_hf` writes a step-0 run from config.json,
safetensors and the tokenizer files; `export_hf` writes a run's checkpoint back as an HF
directory (the tokenizer and generation files of both: lm/convert/hf_files.py).

Tensors are read one at a time (single file or sharded index) and each device's block is read
straight into its sharding on the run's mesh, so no host ever holds a whole checkpoint; dtypes
are kept (bf16 stays bf16). Export streams one tensor at a time into safetensors shards
(the files themselves: `lm/convert/safetensors_files.py`). The layouts and refusals are in
`lm/convert/hf.py` and the variants' own mappings (lm/model/hf_mapping.py).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from lm.convert import hf, hf_files
from lm.convert.safetensors_files import SafetensorsReader, ShardWriter
from lm.convert.staging import check_export_dir, check_import_dir, replace_dir, staged
from lm.model.transformer import model_config
from lm.train.checkpoint import Checkpointer, check_finite
from lm.train.run import Run, assemble
from lm.train.stored import checkpoint_meta
from lm.train.workdir import RUN_TOKENIZER


def resolve_hf_dir(hf_dir: str) -> str:
    """A local directory as given, else a hub id downloaded (or found in the local hub cache)
    through `huggingface_hub`; a one-line error when neither works."""
    if os.path.isdir(hf_dir):
        return hf_dir
    if not re.fullmatch(r'[\w.-]+/[\w.-]+', hf_dir):
        raise FileNotFoundError(f'--hf_dir={hf_dir!r} is neither a directory nor a hub id')
    import huggingface_hub

    errors = []
    for local_only in (False, True):
        try:
            return huggingface_hub.snapshot_download(
                hf_dir, allow_patterns=hf_files.HUB_PATTERNS, local_files_only=local_only
            )
        except Exception as e:  # noqa: BLE001 - offline, unknown id, gated: all one line
            errors.append(f'{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ""}')
    raise FileNotFoundError(
        f'--hf_dir={hf_dir!r} is not a local directory and could not be fetched from the hub '
        f'or found in its cache ({errors[0]})'
    )


def _check_tensors(reader: SafetensorsReader, tensors: list[hf.Tensor], hf_config: dict) -> None:
    """One-line errors for missing, unexpected or mis-shaped tensors (shapes are checked when
    placed); tied embeddings with a different stored lm_head are refused."""
    if not hf_config.get('tie_word_embeddings') and 'lm_head.weight' not in reader.files:
        raise ValueError(
            'config.json tie_word_embeddings=False, but the checkpoint has no lm_head.weight'
        )
    wanted = {t.hf for t in tensors}
    for name in sorted(wanted):
        if name not in reader.files:
            raise ValueError(f'the checkpoint has no tensor {name}, which config.json implies')
    L = hf_config['num_hidden_layers']
    for name in sorted(set(reader.files) - wanted):
        layer = re.match(r'model\.layers\.(\d+)\.', name)
        if layer and int(layer.group(1)) >= L:  # DeepSeek's multi-token-prediction layers
            continue
        if name.endswith('rotary_emb.inv_freq'):
            continue
        if name == 'lm_head.weight' and hf_config.get('tie_word_embeddings'):
            same = np.array_equal(
                reader.read(name, slice(None), slice(None)),
                reader.read('model.embed_tokens.weight', slice(None), slice(None)),
            )
            if same:
                continue
            raise ValueError(
                'config.json tie_word_embeddings=True, but the checkpoint stores an lm_head.weight '
                'different from model.embed_tokens.weight'
            )
        if name.endswith('.bias'):
            raise ValueError(
                f'the checkpoint has {name}; lm has no such bias (config.json says none)'
            )
        raise ValueError(f'the checkpoint has tensor {name}, which lm has no place for')


def load_params(
    reader: SafetensorsReader,
    tensors: list[hf.Tensor],
    abstract_params: dict,
    shardings: dict,
    stop: Callable[[], None] = lambda: None,
) -> dict:
    """The lm parameter tree, each array made directly in its sharding from the blocks its
    devices hold (read from the safetensors files one tensor at a time; `stop()` runs before
    each, to raise `Interrupted` on a stop signal)."""

    def leaf(tree: dict, t: hf.Tensor):
        for key in t.lm:
            tree = tree[key]
        return tree

    for t in tensors:  # every shape checked before anything is read
        expect, got = _hf_shape(t, leaf(abstract_params, t).shape), reader.shape(t.hf)
        if got != expect:
            raise ValueError(f'tensor {t.hf} has shape {got}; config.json implies {expect}')
    params: dict = {}
    for t in tensors:
        stop()
        abstract, sharding = leaf(abstract_params, t), leaf(shardings, t)
        dtype = abstract.dtype

        def block(index, t=t, dtype=dtype, shape=abstract.shape):
            read = lambda rows, cols: reader.read(t.hf, rows, cols)
            return np.asarray(hf.to_lm_block(read, t, shape, index)).astype(dtype)

        value = jax.make_array_from_callback(abstract.shape, sharding, block)
        node = params
        for key in t.lm[:-1]:
            node = node.setdefault(key, {})
        node[t.lm[-1]] = value
    return params


def _hf_shape(t: hf.Tensor, lm_shape: tuple[int, ...]) -> tuple[int, ...]:
    if t.lm == ('embed',):
        return tuple(lm_shape)
    if not t.linear:
        return (math.prod(lm_shape),)
    return (math.prod(lm_shape[t.n_in :]), math.prod(lm_shape[: t.n_in]))


def _read_hf_config(hf_dir: str) -> tuple[str, dict]:
    """(the local directory of `hf_dir`, its config.json)."""
    directory = resolve_hf_dir(hf_dir)
    path = hf_files.check_has_config(directory)
    with open(path) as f:
        try:
            return directory, json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f'--hf_dir: {path} is not valid JSON ({e})') from None


def _save_step0(
    run: Run,
    reader: SafetensorsReader,
    tensors: list[hf.Tensor],
    build: str,
    source: str,
    stop: Callable[[], None],
    workdir: str,
) -> None:
    """Writes the step-0 checkpoint into `build` (moved to `workdir` once complete): the
    parameters read into their shardings on the run's mesh, no optimizer state (training starts
    it fresh on its first resume, so the import never holds it)."""
    ctx, seed = run.ctx, run.config.seed
    with jax.set_mesh(run.mesh):
        params = load_params(
            reader, tensors, ctx.abstract_state['params'], ctx.state_sharding['params'], stop
        )
        reader.close()
        state = {
            'params': params,
            'step': jax.device_put(jnp.zeros((), jnp.int32), ctx.state_sharding['step']),
            'rng': jax.device_put(
                jax.random.key_data(jax.random.key(seed)), ctx.state_sharding['rng']
            ),
        }
        out = Checkpointer(build, async_save=False)
        abstract = ctx.abstract_state['params']
        out.save(0, state, checkpoint_meta(run.config, source, 0, abstract, workdir))
        out.close()


def import_hf(
    hf_dir: str,
    workdir: str,
    base: ml_collections.ConfigDict,
    tokenizer_path: str = '',
    stop: Callable[[], None] = lambda: None,
    overwrite: bool = False,
    overridden: tuple[str, ...] = (),
) -> ml_collections.ConfigDict:
    """Writes `workdir` as a step-0 lm run of the HF model in `hf_dir` (a directory or hub id):
    `base` with its model section from config.json (the variant the registry maps its
    `model_type` to), `data.tokenizer` the model's tokenizer.json (or `tokenizer_path`: another
    tokenizer.json or 'byte'; `hf_files.read_tokenizer`), the tokenizer and generation files
    copied into <workdir>/hf/, parameters in the checkpoint's dtype. Returns the config. A
    non-empty `workdir` is refused unless `overwrite`, one holding checkpoints always
    (`check_import_dir`); the run is built beside it and replaces it whole when complete;
    `stop()` runs between tensors (see `load_params`). `overridden`: the keys of `base` the user
    set (--config.KEY); one that the import sets itself is refused in one line."""
    check_import_dir(workdir, hf_dir, overwrite)
    directory, hf_config = _read_hf_config(hf_dir)
    model, rope_interleave = hf.model_from_hf(hf_config)
    _check_overridden(overridden, model, hf_dir)
    longest = hf_config.get('max_position_embeddings', base.data.seq_len)
    if base.data.seq_len > longest:
        logging.warning(
            "config.data.seq_len=%d is longer than %s's max_position_embeddings=%d: its windows "
            'reach positions the model never saw; --config.data.seq_len=%d matches it',
            base.data.seq_len,
            hf_dir,
            longest,
            longest,
        )
    hf.check_known(model, base.model.to_dict())
    tokenizer = hf_files.read_tokenizer(directory, tokenizer_path, model['vocab_size'])
    reader = SafetensorsReader(directory)
    config = ml_collections.ConfigDict(base.to_dict())
    config.model.update(model)
    config.model.param_dtype = reader.dtype('model.embed_tokens.weight')
    cfg = model_config(config.model)
    tensors = hf.tensor_map(cfg, rope_interleave)
    _check_tensors(reader, tensors, hf_config)

    with staged(workdir, 'import') as build:
        config.data.tokenizer = hf_files.copy_into_run(directory, tokenizer, build)
        config.data.eos_token = hf_files.eos_token(directory, hf_config, tokenizer)
        run = assemble(config)  # the run's other settings fail here, not in train.py
        if tokenizer != hf_files.BYTE:  # where the copy will be once `build` is moved in
            run.config.data.tokenizer = os.path.join(os.path.abspath(workdir), RUN_TOKENIZER)
        _save_step0(run, reader, tensors, build, f'hf:{hf_dir}', stop, workdir)
        stop()  # a signal during the save: nothing is moved in
        replace_dir(build, workdir)
    logging.info('imported %s (%s) into %s', hf_dir, cfg.attention, workdir)
    return run.config


def _check_overridden(overridden: tuple[str, ...], model: dict, hf_dir: str) -> None:
    """A one-line error for an override of what the import takes from the HF model: its model
    settings (config.json, `model`), parameter dtype and tokenizer."""
    for key in overridden:
        section, _, name = key.partition('.')
        if section == 'model' and (name.split('.')[0] in model or name == 'param_dtype'):
            raise ValueError(
                f'config.{key}: the import takes it from {hf_dir} (config.json and weights), so '
                'the override would do nothing; the other model settings (dtype, attention_impl, '
                '...) are yours'
            )
        if key in ('data.tokenizer', 'data.eos_token'):
            raise ValueError(
                f"config.{key}: the import sets it from {hf_dir}'s tokenizer files; another "
                'tokenizer is --tokenizer=FILE (or byte)'
            )


def _write_tensors(
    out_dir: str,
    tensors: list[hf.Tensor],
    params: dict,
    max_bytes: int,
    stop: Callable[[], None],
) -> None:
    """Streams `params` into safetensors shards, one tensor in host memory at a time;
    `stop()` runs before each."""

    def leaf(t: hf.Tensor):
        node = params
        for key in t.lm:
            node = node[key]
        return node

    def values():
        for t in tensors:
            stop()
            yield hf.to_hf(t, np.asarray(jax.device_get(leaf(t))))

    entries = []
    for t in tensors:
        x = leaf(t)
        entries.append((t.hf, _hf_shape(t, x.shape), np.dtype(x.dtype)))
    writer = ShardWriter(out_dir, entries, max_bytes)
    logging.info('writing %d tensors to %s', len(tensors), out_dir)
    writer.write(values())


def export_hf(
    workdir: str,
    out_dir: str,
    step: int | None = None,
    max_shard_bytes: int = 5 * 2**30,
    overwrite: bool = False,
    stop: Callable[[], None] = lambda: None,
) -> str:
    """Writes `workdir`'s checkpoint (latest or `step`) to `out_dir` as a Hugging Face
    directory: config.json (the architecture the run's attention variant maps to: Llama or
    DeepseekV3), safetensors, the run's tokenizer as files transformers loads, and the
    tokenizer and generation files an import carried (`hf_files`). Returns `out_dir`. A
    non-empty `out_dir` is refused unless `overwrite`; the export is built beside it and
    replaces it whole when complete. `stop()` runs between tensors (to raise `Interrupted` on
    a stop signal)."""
    if jax.process_count() > 1:
        raise ValueError('export runs in one process (it gathers one tensor at a time)')
    check_export_dir(workdir, out_dir, overwrite)
    # What transformers cannot express, or a variant with no mapping or one that leaves a
    # parameter out, is refused before any array is read.
    restored = assemble(workdir, state='params', step=step, check=hf.check_exportable)
    check_finite(restored.state['params'], f'the checkpoint at step {restored.step} of {workdir}')
    config, cfg = restored.config, restored.model_cfg
    files = hf_files.files_dir(workdir, config)
    source = hf_files.source_config(files)
    tokenizer = hf_files.run_tokenizer(config)
    extra = {k: source[k] for k in ('bos_token_id', 'eos_token_id', 'pad_token_id') if k in source}
    extra = {**hf_files.special_ids(tokenizer), **extra}
    max_len = hf_files.max_position(workdir, config)
    hf_config = hf.hf_from_model(cfg, max_len, **extra)
    hf_config[hf.LM_FIELD] = hf.lm_only(config.model.to_dict(), hf_config)
    tensors = hf.tensor_map(cfg, rope_interleave=hf.exports_interleaved_rope(cfg))
    with staged(out_dir, 'export') as build:
        _write_tensors(build, tensors, restored.state['params'], max_shard_bytes, stop)
        with open(os.path.join(build, 'config.json'), 'w') as f:
            json.dump(hf_config, f, indent=2)
        hf_files.write_tokenizer(build, config, tokenizer, files, max_len)
        stop()
        replace_dir(build, out_dir)
    logging.info('exported %s step %d to %s', workdir, restored.step, out_dir)
    return out_dir
