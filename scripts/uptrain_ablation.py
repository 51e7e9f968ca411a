"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, at small scale.

Train MHA on Tiny Shakespeare (configs/shakespeare_char.py) for --steps N; convert it to GQA-2
and MQA by mean-pooling, keeping the first head, or re-initialising K/V; uptrain each for a
fraction alpha of N (round(alpha·N) steps); compare with GQA-2 / MQA trained from scratch for
exactly the same total, N + round(alpha·N) steps of the same batch, at every alpha. Every arm
runs for --seeds seeds and is evaluated on the whole validation split (--eval_tokens); the tables
show mean, sample std and 95% t-interval over seeds, and paired differences between arms (same
seed = same source, initialisation and data order) marked where resolved at 95%.

  python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt \
      --out_dir=runs/uptrain_ablation --report=docs/uptraining_table.md

Finished runs are skipped when the command is repeated (results are cached per run).
"""

import json
import os
import shutil
import time

from absl import flags, logging

from lm import stats
from lm.attention import VARIANTS
from lm.cli import bootstrap, run_app
from lm.config import load_config_file
from lm.train_loop import train
from lm.uptrain import METHODS, convert_checkpoint

_DATA = flags.DEFINE_string('data_path', 'data/tinyshakespeare.txt', 'Text file.')
_OUT = flags.DEFINE_string('out_dir', 'runs/uptrain_ablation', 'Workdirs and TensorBoard.')
_STEPS = flags.DEFINE_integer('steps', 1000, 'MHA pre-training steps N.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per point.')
_FRACTIONS = flags.DEFINE_list('fractions', ['0', '0.05', '0.1'], 'Uptraining fractions alpha.')
_TARGETS = flags.DEFINE_list('targets', ['2', '1'], 'KV heads after conversion (1 = MQA).')
_METHODS = flags.DEFINE_list('methods', list(METHODS), 'Conversion methods.')
_EVAL_TOKENS = flags.DEFINE_integer(
    'eval_tokens', 0, 'Validation tokens per evaluation (lm.evaluation); 0 = the whole split.'
)
_REPORT = flags.DEFINE_string('report', '', 'Also write the markdown tables to this file.')

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'shakespeare_char.py'
)


def base_config(variant: str, seed: int, steps: int):
    config = load_config_file(CONFIG, variant)
    config.seed = seed
    config.data.path = _DATA.value
    config.train.steps = steps
    config.eval_tokens = _EVAL_TOKENS.value
    config.eval_every = config.checkpoint_every = max(steps, 1)
    return config


def pooled_config(num_kv_heads: int, seed: int, steps: int):
    """The source (MHA) config with its K/V heads pooled to `num_kv_heads`, trained from scratch."""
    config = base_config('mha', seed, steps)
    config.model.update(VARIANTS[config.model.attention].pooled(num_kv_heads))
    return config


def cached_run(name: str, start) -> float:
    """Final eval loss of run `name`; `start(workdir, tb_dir)` trains it unless cached with the
    same evaluation protocol (`--eval_tokens`)."""
    workdir = os.path.join(_OUT.value, name)
    result_path = os.path.join(workdir, 'result.json')
    if os.path.exists(result_path):
        with open(result_path) as f:
            cached = json.load(f)
        if cached.get('eval_tokens') == _EVAL_TOKENS.value:
            return cached['eval']['loss']
    shutil.rmtree(workdir, ignore_errors=True)
    metrics = start(workdir, os.path.join(_OUT.value, 'tb'))['eval']
    with open(result_path, 'w') as f:
        json.dump({'eval': metrics, 'eval_tokens': _EVAL_TOKENS.value}, f)
    logging.info('%s: eval loss %.4f', name, metrics['loss'])
    return metrics['loss']


def fmt(losses: dict[int, float]) -> str:
    est = stats.estimate(list(losses.values()))
    return f'{est.mean:.4f} ± {est.std:.4f} | {est.interval()}'


def fmt_diff(a: dict[int, float], b: dict[int, float]) -> str:
    d = stats.paired_difference(a, b)
    return f'{d.mean:+.4f} {d.interval()}{" ✓" if d.resolved else ""}'


def run() -> int:
    bootstrap(base_config('mha', 0, 1), compilation_cache=False)
    t0 = time.time()
    n, seeds = _STEPS.value, range(_SEEDS.value)
    fractions = [float(a) for a in _FRACTIONS.value]
    methods = _METHODS.value
    targets = [int(g) for g in _TARGETS.value]
    label = {g: 'MQA' if g == 1 else f'GQA-{g}' for g in targets}
    up_steps = {alpha: round(alpha * n) for alpha in fractions}  # as lm.uptrain.uptrain_config
    results: dict[tuple, dict[int, float]] = {}  # arm -> {seed: final eval loss}
    for seed in seeds:
        src = f'mha_s{seed}'
        results.setdefault(('MHA', 'scratch', 0.0), {})[seed] = cached_run(
            src, lambda w, tb, s=seed: train(base_config('mha', s, n), w, tb)
        )
        for g in targets:
            for method in methods:
                for alpha in fractions:
                    name = f'{label[g]}_{method}_a{alpha:g}_s{seed}'

                    def uptrain(w, tb, g=g, method=method, alpha=alpha, s=seed, src=src):
                        config = convert_checkpoint(
                            os.path.join(_OUT.value, src), w, g, method, fraction=alpha, seed=s
                        )
                        return train(config, w, tb)

                    results.setdefault((label[g], method, alpha), {})[seed] = cached_run(
                        name, uptrain
                    )
            for total in sorted({n + k for k in up_steps.values()}):
                # From scratch at the same token budget as source + uptraining (same batch).
                results.setdefault((label[g], 'scratch', total), {})[seed] = cached_run(
                    f'{label[g]}_scratch_{total}_s{seed}',
                    lambda w, tb, s=seed, g=g, t=total: train(pooled_config(g, s, t), w, tb),
                )
    table = tables(results, n, len(seeds), fractions, methods, targets, label, up_steps)
    print(table)
    print(f'wall time: {time.time() - t0:.0f} s')
    if _REPORT.value:
        with open(_REPORT.value, 'w') as f:
            f.write(table + '\n')
    return 0


def tables(results, n, num_seeds, fractions, methods, targets, label, up_steps) -> str:
    """The ablation table (with each arm's paired difference to from-scratch training at the
    same total budget) and the paired method comparisons; ✓ = resolved at 95%."""
    lines = [
        f'Final eval loss over {num_seeds} seeds (same seed = same MHA source, initialisation and '
        'data order): mean ± sample std (ddof 1), 95% t-interval; Δ = paired difference over '
        'seeds with its 95% interval, ✓ = resolved (the interval excludes 0).',
        '',
        '| model | conversion | α (uptraining steps) | total steps | eval loss | 95% CI | '
        'Δ vs from scratch, same total steps |',
        '|---|---|---|---|---|---|---|',
        f'| MHA (source) | — | — | {n} | {fmt(results[("MHA", "scratch", 0.0)])} | — |',
    ]
    for g in targets:
        for method in methods:
            for alpha in fractions:
                arm, scratch = (
                    results[(label[g], method, alpha)],
                    results[(label[g], 'scratch', n + up_steps[alpha])],
                )
                lines.append(
                    f'| {label[g]} | {method} | {alpha:g} ({up_steps[alpha]}) | '
                    f'{n + up_steps[alpha]} | {fmt(arm)} | {fmt_diff(arm, scratch)} |'
                )
        for total in sorted({n + k for k in up_steps.values()}):
            lines.append(
                f'| {label[g]} | from scratch | — | {total} | '
                f'{fmt(results[(label[g], "scratch", total)])} | — |'
            )
    if len(methods) > 1:
        lines += [
            '',
            '| model | α | a | b | Δ loss a − b (95% CI) | ordering |',
            '|---|---|---|---|---|---|',
        ]
        for g in targets:
            for alpha in fractions:
                for i, a in enumerate(methods):
                    for b in methods[i + 1 :]:
                        ra, rb = results[(label[g], a, alpha)], results[(label[g], b, alpha)]
                        d = stats.paired_difference(ra, rb)
                        lines.append(
                            f'| {label[g]} | {alpha:g} | {a} | {b} | {fmt_diff(ra, rb)} | '
                            f'{stats.ordering(a, b, d)} |'
                        )
    return '\n'.join(lines)


if __name__ == '__main__':
    run_app(run)
