r"""What partial-RoPE selection keeps of a run's attention when it is converted to MLA: lm's
ladder of pairs with one shared RoPE key (scripts/uptrain.py --target=mla) against MHA2MLA's
own pairs and key per KV head (lm/convert/rope_selection.py), per layer, on calibration windows
of the run's training split.

  python scripts/mla_rope_selection.py --workdir=runs/mha --qk_rope_head_dim=16
  python scripts/mla_rope_selection.py --workdir=runs/mha_s0 --workdir=runs/mha_s1 \
      --qk_rope_head_dim=16 --out=rope_selection.csv

Prints one row per run, layer and selection: pairs kept per KV head, RoPE values cached per token
and layer, the relative error of the causal q·k logits and the mean total-variation distance of
the attention rows, both against the source. The joint SVD that follows is the same for every
selection and is not part of the measure. --out writes, per selection (arm) and run (its
config.seed), both measures averaged over layers: a per-seed CSV for the 'seeds' doc table.
"""

import os

import numpy as np
from absl import flags
from flax import nnx

from lm.cli import USER_ERRORS, bootstrap, check_writable_dir, run_app
from lm.convert import (
    KEYS,
    ConversionOptions,
    calibration_inputs,
    check_conversion,
    choose_stride,
    pair_contribution,
    selections,
)
from lm.experiments import write_csv
from lm.train import assemble, stored_config

_WORKDIR = flags.DEFINE_multi_string(
    'workdir', None, 'Run to measure (MHA / GQA / MQA); repeatable.'
)
_OUT = flags.DEFINE_string('out', '', 'Per-seed CSV (arm, seed, logit_error, attention_tv).')
_ROPE_DIM = flags.DEFINE_integer(
    'qk_rope_head_dim', None, 'P: RoPE dims kept per head (P / 2 pairs).', required=True
)
_CALIBRATION = flags.DEFINE_integer(
    'calibration_tokens', None, "Calibration tokens; default: the run's uptrain.calibration_tokens."
)
FLAGS = {
    KEYS['qk_rope_head_dim']: '--qk_rope_head_dim',
    KEYS['calibration_tokens']: '--calibration_tokens',
}


def measure(workdir: str) -> tuple[int, list[tuple[int, str, dict]]]:
    """(the run's seed, (layer, selection, its row) for every layer), the ladder stride chosen
    on all layers as the conversion chooses it."""
    opts = ConversionOptions(
        target='mla', kv_lora_rank=1, qk_rope_head_dim=_ROPE_DIM.value,
        calibration_tokens=_CALIBRATION.value,
    )  # fmt: skip
    bootstrap(stored_config(workdir))
    run = assemble(
        workdir,
        state='params',
        data=True,
        check=lambda cfg: check_conversion(cfg, opts),
    )
    model = nnx.merge(run.ctx.graphdef, run.state['params'])
    T = run.config.data.seq_len
    num_tokens = opts.calibration_tokens or run.config.uptrain.calibration_tokens
    inputs = calibration_inputs(model, run.corpus.tokens['train'], T, num_tokens)
    blocks = [b['attn'] for b in run.state['params']['blocks'].values()]
    P = opts.qk_rope_head_dim
    stride = choose_stride(
        sum(pair_contribution(a, x) for a, x in zip(blocks, inputs, strict=True)), P
    )
    rows = []
    for layer, (attn, x_ME) in enumerate(zip(blocks, inputs, strict=True)):
        x_BTE = x_ME.reshape(-1, T, x_ME.shape[-1])
        for name, row in selections(attn, x_BTE, run.model_cfg.rope_theta, P, stride).items():
            rows.append((layer, name, row))
    return run.config.seed, rows


def run() -> int:
    if not _WORKDIR.value:
        raise ValueError('--workdir is required (repeat it for several runs)')
    if _OUT.value:
        check_writable_dir(os.path.dirname(os.path.abspath(_OUT.value)), '--out')
    results = []
    try:
        for workdir in _WORKDIR.value:
            results.append((workdir, *measure(workdir)))
    except USER_ERRORS as e:
        message = str(e)
        for key, flag in FLAGS.items():
            message = message.replace(key, flag)
        raise type(e)(message) from None
    print('| run | layer | selection | pairs per KV head | RoPE values cached | logit error | TV |')
    print('|---|---|---|---|---|---|---|')
    for workdir, _, rows in results:
        for layer, name, r in rows:
            print(
                f'| {workdir} | {layer} | {name} | {r["pairs"]} | {r["rope_cache"]} | '
                f'{r["logit_error"]:.4f} | {r["attention_tv"]:.4f} |'
            )
    if _OUT.value:
        write_seeds(_OUT.value, [(seed, rows) for _, seed, rows in results])
    return 0


def write_seeds(path: str, runs: list[tuple[int, list]]) -> None:
    """Per selection and run, both measures averaged over the run's layers."""
    out = []
    for name in dict.fromkeys(name for _, rows in runs for _, name, _ in rows):
        for seed, rows in runs:
            mine = [r for _, n, r in rows if n == name]
            means = {
                k: float(np.mean([r[k] for r in mine])) for k in ('logit_error', 'attention_tv')
            }
            out.append({'arm': name, 'seed': seed, **means})
    write_csv(path, out)
    print(f'wrote {path}: {len(out)} rows')


if __name__ == '__main__':
    run_app(run)
