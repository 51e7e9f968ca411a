r"""The eager PyTorch baseline: nanoGPT's model and CPU recipe for Tiny Shakespeare
(4 layers, 4 heads, d_model 128, context 64, batch 12, GELU MLP, LayerNorm without bias,
learned positions, AdamW), timed the way scripts/bench_train.py times ours, so the two compare
on one machine. Needs `pip install torch` (not a dependency of lm). scripts/bench_train.py runs
the same baseline interleaved with ours and prints the ratio; this script times it alone.

  python scripts/bench_torch_baseline.py --steps=60
  python scripts/bench_torch_baseline.py --steps=30 --profile_top=15   # where its time goes

With --target_loss it instead trains the baseline on the recipe's data (configs/
shakespeare_char.py: its split, batches, steps, learning rates) and prints the validation loss
of the whole split every --eval_every steps, with the seconds since training started, until the
loss reaches the target (time to quality; vocabulary: the recipe's byte tokenizer):

  python scripts/bench_torch_baseline.py --target_loss=1.886 --eval_every=100 \
      --data_path=data/tinyshakespeare.txt
"""

import numpy as np
from absl import flags
from baselines import torch_nanogpt, torch_profile

from lm.cli import RecipeFlags, bootstrap, run_app
from lm.data import load_corpus, load_tokenizer
from lm.train import cpu_model, mfu, peak_flops, print_profile

RECIPE = RecipeFlags(__name__)

_STEPS = flags.DEFINE_integer('steps', 60, 'Timed steps (median reported).')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Untimed steps.')
_THREADS = flags.DEFINE_integer('threads', 0, 'torch.set_num_threads; 0 = torch default.')
_TARGET = flags.DEFINE_float('target_loss', 0.0, 'Train until this validation loss; 0 = time.')
_PEAK = flags.DEFINE_float('peak_flops', 0.0, 'Stated peak FLOP/s of this CPU for MFU (0: none).')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 100, 'Steps between evaluations (--target_loss).')
_PROFILE_TOP = flags.DEFINE_integer(
    'profile_top',
    0,
    'Also profile --steps steps with torch.profiler and print the op time per category (as '
    'scripts/profile_train.py does for ours) and this many ops; 0 = off.',
)


def time_to_loss() -> int:
    c = RECIPE.config('mha')
    bootstrap(c, compilation_cache=False)
    corpus = load_corpus(c.data)
    shape = torch_nanogpt.Shape(
        vocab=load_tokenizer(c.data).vocab_size,
        n_layer=c.model.num_layers,
        n_head=c.model.num_heads,
        n_embd=c.model.d_model,
        block=c.data.seq_len,
        batch=c.train.batch_size,
    )
    print(
        f'eager PyTorch nanoGPT baseline, time to validation loss {_TARGET.value} on {cpu_model()}'
    )
    print('| step | validation loss (whole split) | seconds since training started |')
    print('|---|---|---|')
    rows = torch_nanogpt.train_to_loss(
        corpus.tokens['train'],
        corpus.tokens['validation'],
        shape,
        target=_TARGET.value,
        steps=c.train.steps,
        eval_every=_EVAL_EVERY.value,
        lr=c.train.lr,
        min_lr=c.train.min_lr,
        warmup=c.train.warmup_steps,
        seed=c.seed,
        eval_batch_size=c.eval_batch_size,
        threads=_THREADS.value,
    )
    for r in rows:
        print(f'| {r["step"]} | {r["val_loss"]:.4f} | {r["seconds"]:.1f} |', flush=True)
    return 0


def run() -> int:
    if _STEPS.value < 1 or _WARMUP.value < 0:
        raise ValueError(
            f'--steps must be >= 1 and --warmup >= 0, got {_STEPS.value}, {_WARMUP.value}'
        )
    if _TARGET.value > 0:
        return time_to_loss()
    given = [f'--{n}' for n in ('config', 'set', 'data_path') if flags.FLAGS[n].present]
    if given:
        raise ValueError(
            f'{", ".join(given)} {"apply" if len(given) > 1 else "applies"} to --target_loss '
            "only: the timing runs nanoGPT's fixed shape (scripts/bench_train.py times the "
            "baseline at a config's shape)"
        )
    shape = torch_nanogpt.Shape()
    stepper = torch_nanogpt.make_stepper(shape, threads=_THREADS.value)
    torch_nanogpt.time_steps(stepper, _WARMUP.value)
    dt = float(np.median(torch_nanogpt.time_steps(stepper, _STEPS.value)))
    peak, source = peak_flops(_PEAK.value)
    tps = shape.batch * shape.block / dt
    fpt = stepper.flops_per_token
    print(
        f'eager PyTorch {stepper.version} nanoGPT baseline on {cpu_model()}: '
        f'{stepper.params:,} params, {stepper.threads} threads, '
        f'{f"peak {peak / 1e9:,.0f} GFLOP/s ({source})" if peak else source}'
    )
    utilisation = mfu(tps, fpt, peak)
    shown = '—' if utilisation is None else f'{utilisation:.1%}'
    print(
        f'| torch eager | {dt * 1e3:.1f} ms/step | {tps:,.0f} tokens/s | '
        f'{fpt * tps / 1e9:.1f} GFLOP/s | MFU {shown} |'
    )
    if _PROFILE_TOP.value > 0:
        prof, wall = torch_profile.profile_steps(stepper, _STEPS.value)
        print(
            f'\nunder torch.profiler: {wall:.1f} ms/step, {prof.busy:.1f} ms/step of op self '
            'time (one thread; each op runs on all of them)'
        )
        print_profile(prof, _PROFILE_TOP.value)
    return 0


if __name__ == '__main__':
    run_app(run)
