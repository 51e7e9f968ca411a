r"""Sample text from a trained checkpoint with the KV-cache decoder.

  python scripts/generate.py --workdir=runs/shakespeare_mha --prompt="ROMEO:" --max_new_tokens=50
  python scripts/generate.py --workdir=runs/gqa2 --prompt="ROMEO:" --prompt="JULIET:" \
      --sampling=temperature=0.8,top_k=40
  python scripts/generate.py --workdir=runs/gqa2 --prompts_file=prompts.txt   # one per line

The context is the model's maximum position (`max_position`: an imported model's
max_position_embeddings, else the length it was trained at): a prompt longer than it, or a
prompt plus --max_new_tokens beyond it, is refused before the checkpoint is read; without
--max_new_tokens it generates what the context leaves after the longest prompt (at most 200).
The whole generation is one jitted loop. One prompt streams its text to stdout as tokens are
made; a batch prints each prompt's text when the batch is done (progress on stderr). SIGTERM /
SIGINT stop it within a token: one line on stderr, exit 128 + the signal number.
"""

import sys

import numpy as np
from absl import flags
from flax import nnx

from lm.cli import bootstrap, run_app
from lm.convert import max_position
from lm.data import Tokenizer, load_tokenizer
from lm.infer import Decoder, parse_sampling
from lm.model import (
    DECODE_KERNELS,
    KV_CACHE_DTYPES,
    check_decode_backend,
    check_storage,
    model_config,
)
from lm.train import StopRequest, assemble, check_finite, check_seed, stored_config

DEFAULT_NEW = 200  # --max_new_tokens when not given: at most this many (what the context leaves)

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory holding checkpoints/.', required=True
)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
_PROMPTS = flags.DEFINE_multi_string(
    'prompt', None, "Prompt text; repeat for a batch (default: one '\\n' prompt)."
)
_PROMPTS_FILE = flags.DEFINE_string(
    'prompts_file', None, 'UTF-8 text file of prompts, one per line (after any --prompt).'
)
_MAX_NEW = flags.DEFINE_integer(
    'max_new_tokens',
    None,
    "Tokens to generate per prompt (prompt + these <= the model's context); default: what the "
    f'context leaves after the longest prompt, at most {DEFAULT_NEW}.',
)
_SAMPLING = flags.DEFINE_string(
    'sampling',
    'temperature=0.8,top_k=40',
    "'greedy' or name=value pairs of temperature, top_k, top_p.",
)
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed, in [0, 2**32).')
_STOP = flags.DEFINE_bool('stop_at_eos', True, 'Stop a row at the end-of-text token.')
_KV_DTYPE = flags.DEFINE_enum(
    'kv_cache_dtype',
    'float',
    list(KV_CACHE_DTYPES),
    'KV cache storage: compute dtype, int8, or kivi4 (KIVI 4-bit, config.model.kv_quant_group).',
)
_KERNEL = flags.DEFINE_enum(
    'decode_kernel',
    None,
    list(DECODE_KERNELS),
    "Decode steps' attention (config.model.decode_kernel; 'pallas': one fused GPU kernel per "
    "layer, power-of-2 head widths); default: the run's.",
)
_STREAM_CONTEXT = 4  # tokens decoded before the new ones, so a token's spacing is kept


def check_prompts(prompts: list[str]) -> None:
    """Each --prompt must be UTF-8 text (undecodable argv bytes arrive as lone surrogates)."""
    for i, prompt in enumerate(prompts):
        try:
            prompt.encode('utf-8')
        except UnicodeEncodeError as e:
            raw = prompt.encode('utf-8', 'surrogateescape')
            offset = len(prompt[: e.start].encode('utf-8', 'surrogateescape'))
            raise ValueError(
                f'--prompt (number {i + 1}) is not valid UTF-8: byte 0x{raw[offset]:02x} at '
                f'offset {offset}'
            ) from None


def read_prompts() -> list[str]:
    """The --prompt values, then the lines of --prompts_file (blank lines skipped)."""
    prompts = list(_PROMPTS.value or [])
    if _PROMPTS_FILE.value is not None:
        try:
            with open(_PROMPTS_FILE.value, encoding='utf-8-sig') as f:  # a BOM is no text
                prompts += [line.rstrip('\r\n') for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f'--prompts_file={_PROMPTS_FILE.value!r}: {e}') from None
        if not prompts:
            raise ValueError(f'--prompts_file={_PROMPTS_FILE.value!r} holds no prompt')
    return prompts or ['\n']


def check_lengths(prompts: list[str], rows: list[list[int]], max_new: int, context: int) -> None:
    """One-line refusals of a prompt longer than the model's context, and of a prompt plus
    `max_new` tokens beyond it."""
    for i, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        if not row:
            raise ValueError(
                f'prompt {i + 1} ({prompt!r}) is no tokens: every prompt needs at least one '
                "(with no --prompt at all, the prompt is '\\n')"
            )
        if len(row) >= context:
            shown = prompt if len(prompt) <= 30 else prompt[:30] + '...'
            than = 'longer than' if len(row) > context else 'as long as'
            raise ValueError(
                f"prompt {i + 1} ({shown!r}) is {len(row)} tokens, {than} the model's "
                f'context of {context} positions: no new token fits'
            )
    longest = max(len(r) for r in rows)
    if longest + max_new > context:
        raise ValueError(
            f'--max_new_tokens={max_new}: the longest prompt ({longest} tokens) plus {max_new} new '
            f"tokens exceed the model's context of {context} positions; at most "
            f'{context - longest} new tokens fit'
        )


def continuation(tokenizer: Tokenizer, before: list[int], new: list[int]) -> str:
    """The text of `new` as it continues `before` (its last tokens decoded with it, so that
    spacing is kept)."""
    context = before[-_STREAM_CONTEXT:]
    head, text = tokenizer.decode(context), tokenizer.decode(context + new)
    return text[len(head) :] if text.startswith(head) else text


def encode_prompts(tokenizer: Tokenizer, prompts: list[str]) -> list[list[int]]:
    """The prompts' ids; one line naming the prompt a tokenizer of ids cannot read."""
    rows = []
    for i, prompt in enumerate(prompts):
        try:
            rows.append(tokenizer.encode(prompt))
        except ValueError as e:
            raise ValueError(f'--prompt (number {i + 1}, {prompt!r}): {e}') from None
    return rows


class Stream:
    """The host end of the generation loop: prints row 0's text to stdout as its tokens arrive
    (a batch: progress lines on stderr instead), and asks the loop to stop once a stop signal
    has arrived."""

    def __init__(
        self, tokenizer: Tokenizer, eos: int | None, batch: int, max_new: int, stop, shown=()
    ):
        self.tokenizer, self.eos, self.stop = tokenizer, eos, stop
        self.batch, self.max_new = batch, max_new
        self.shown: list[int] = list(shown)  # tokens already printed (the prompt's)
        self.pending: list[int] = []  # tokens whose text is not yet whole
        self.steps = 0

    def __call__(self, tokens_B: np.ndarray) -> bool:
        self.steps += 1
        if self.batch > 1:
            every = max(self.max_new // 10, 1)
            if self.steps % every == 0:
                print(f'generated {self.steps}/{self.max_new} tokens', file=sys.stderr, flush=True)
        elif tokens_B[0] >= 0 and tokens_B[0] != self.eos:
            self.pending.append(int(tokens_B[0]))
            self.flush(final=False)
        return self.stop.arrived()

    def flush(self, final: bool = True) -> None:
        """Prints the pending tokens' text; not `final`, only when it ends in whole characters."""
        if not self.pending:
            return
        text = continuation(self.tokenizer, self.shown, self.pending)
        if text.endswith('\ufffd') and not final and len(self.pending) < 8:
            return  # a character split across tokens: wait for its other bytes
        sys.stdout.write(text)
        sys.stdout.flush()
        self.shown += self.pending
        self.pending = []


def run() -> int:
    prompts = read_prompts()
    check_prompts(prompts)
    if _MAX_NEW.value is not None and _MAX_NEW.value <= 0:
        raise ValueError(f'--max_new_tokens must be > 0, got {_MAX_NEW.value}')
    check_seed(_SEED.value, '--seed')
    sampling = parse_sampling(_SAMPLING.value)
    config = stored_config(_WORKDIR.value, step=_STEP.value)
    tokenizer = load_tokenizer(config.data)
    rows = encode_prompts(tokenizer, prompts)
    context = max_position(_WORKDIR.value, config)
    max_new = _MAX_NEW.value or max(1, min(DEFAULT_NEW, context - max(map(len, rows))))
    check_lengths(prompts, rows, max_new, context)
    read = max(map(len, rows)) + max_new - 1  # the most cached tokens a sampled token reads
    check_storage(model_config(config.model), _KV_DTYPE.value, read, 'the longest prompt + reply')
    bootstrap(config)
    if (_KERNEL.value or config.model.decode_kernel) == 'pallas':  # before the restore
        check_decode_backend('--decode_kernel' if _KERNEL.value else 'config.model.decode_kernel')
    with StopRequest() as stop:
        kernel = {} if _KERNEL.value is None else {'decode_kernel': _KERNEL.value}
        restored = assemble(
            _WORKDIR.value, state='params', step=_STEP.value, model_overrides=kernel
        )
        where = f'--workdir={_WORKDIR.value}: the checkpoint at step {restored.step}'
        check_finite(restored.state['params'], where)
        stop.check()
        decoder = Decoder(
            nnx.merge(restored.ctx.graphdef, restored.state['params']),
            kv_cache_dtype=_KV_DTYPE.value,
        )
        del restored  # the decoder holds the parameters
        eos = tokenizer.eos_id if _STOP.value else None
        mark = tokenizer.continuation_mark
        shown = rows[0] if mark else []  # text: the continuation starts as it always did
        stream = Stream(tokenizer, eos, len(rows), max_new, stop, shown)
        if len(rows) == 1:
            sys.stdout.write(prompts[0] + mark)
        outs = decoder.generate(
            rows, max_new, sampling, eos_id=eos, seed=_SEED.value, on_token=stream
        )
        stream.flush()
        if len(rows) == 1:
            print('\n' + '-' * 40)
        stop.check()
    if len(rows) > 1:
        for prompt, row, out in zip(prompts, rows, outs, strict=True):
            new = [t for t in out if t != eos]
            text = continuation(tokenizer, row, new) if mark else tokenizer.decode(new)
            print(prompt + mark + text)
            print('-' * 40)
    return 0


if __name__ == '__main__':
    run_app(run)
