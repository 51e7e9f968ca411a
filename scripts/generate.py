r"""Sample text from a trained checkpoint with the KV-cache decoder.

  python scripts/generate.py --workdir=runs/shakespeare_mha --prompt="ROMEO:" --max_new_tokens=200
  python scripts/generate.py --workdir=runs/gqa2 --prompt="ROMEO:" --prompt="JULIET:" \
      --sampling=temperature=0.8,top_k=40
"""

from absl import flags
from flax import nnx

from lm.cli import bootstrap, run_app
from lm.data.corpus import load_tokenizer
from lm.infer.decode import Decoder, parse_sampling
from lm.model.kv_cache import KV_CACHE_DTYPES
from lm.train.run import assemble, stored_config

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory holding checkpoints/.', required=True
)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step; default: the latest.')
_PROMPTS = flags.DEFINE_multi_string('prompt', ['\n'], 'Prompt text; repeat for a batch.')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 200, 'Tokens to generate per prompt.')
_SAMPLING = flags.DEFINE_string(
    'sampling',
    'temperature=0.8,top_k=40',
    "'greedy' or name=value pairs of temperature, top_k, top_p.",
)
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_STOP = flags.DEFINE_bool('stop_at_eos', True, 'Stop a row at the end-of-text token.')
_KV_DTYPE = flags.DEFINE_enum(
    'kv_cache_dtype', 'float', list(KV_CACHE_DTYPES), 'KV cache storage: compute dtype or int8.'
)


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


def run() -> int:
    check_prompts(_PROMPTS.value)
    if _MAX_NEW.value <= 0:
        raise ValueError(f'--max_new_tokens must be > 0, got {_MAX_NEW.value}')
    sampling = parse_sampling(_SAMPLING.value)
    bootstrap(stored_config(_WORKDIR.value, step=_STEP.value))
    restored = assemble(_WORKDIR.value, state='restore', step=_STEP.value)
    tokenizer = load_tokenizer(restored.config.data)
    model = nnx.merge(restored.ctx.graphdef, restored.state['params'])
    decoder = Decoder(model, kv_cache_dtype=_KV_DTYPE.value)
    eos = tokenizer.eos_id if _STOP.value else None
    context = restored.config.data.seq_len
    # The model saw at most `context` tokens in training: like nanoGPT, generate in chunks of
    # context / 2, each conditioned on the latest context - chunk tokens.
    rows = [tokenizer.encode(p) for p in _PROMPTS.value]
    outs: list[list[int]] = [[] for _ in rows]
    remaining, chunk_index = _MAX_NEW.value, 0
    while remaining > 0:
        active = [i for i, o in enumerate(outs) if not (o and o[-1] == eos)]
        if not active:
            break
        chunk = min(remaining, max(context // 2, 1))
        windows = [(rows[i] + outs[i])[-(context - chunk) :] for i in active]
        new = decoder.generate(
            windows, chunk, sampling, eos_id=eos, seed=_SEED.value + chunk_index, cache_len=context
        )
        for i, tokens in zip(active, new, strict=True):
            outs[i] += tokens
        remaining -= chunk
        chunk_index += 1
    for prompt, out in zip(_PROMPTS.value, outs, strict=True):
        print(prompt + tokenizer.decode(t for t in out if t != eos))
        print('-' * 40)
    return 0


if __name__ == '__main__':
    run_app(run)
