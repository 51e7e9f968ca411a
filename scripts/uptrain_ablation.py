"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, at small scale.

Train MHA on Tiny Shakespeare (configs/shakespeare_char.py) for --steps; convert it to GQA-2 and
MQA by mean-pooling, keeping the first head, or re-initialising K/V; uptrain each for a fraction
alpha of --steps; compare with GQA-2 / MQA trained from scratch for --steps x (1 + max alpha).
Every point runs for --seeds seeds; the table shows final eval loss mean ± std over seeds.

  python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt \
      --out_dir=runs/uptrain_ablation --report=docs/uptraining_table.md

Finished runs are skipped when the command is repeated (results are cached per run).
"""

import json
import os
import shutil
import time

import numpy as np
from absl import flags, logging

from lm.cli import run_app
from lm.config import load_config_file
from lm.sharding import set_cpu_devices
from lm.train_loop import train
from lm.uptrain import METHODS, convert_checkpoint

_DATA = flags.DEFINE_string('data_path', 'data/tinyshakespeare.txt', 'Text file.')
_OUT = flags.DEFINE_string('out_dir', 'runs/uptrain_ablation', 'Workdirs and TensorBoard.')
_STEPS = flags.DEFINE_integer('steps', 1000, 'MHA pre-training steps N.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per point.')
_FRACTIONS = flags.DEFINE_list('fractions', ['0', '0.05', '0.1'], 'Uptraining fractions alpha.')
_TARGETS = flags.DEFINE_list('targets', ['2', '1'], 'KV heads after conversion (1 = MQA).')
_METHODS = flags.DEFINE_list('methods', list(METHODS), 'Conversion methods.')
_EVAL_BATCHES = flags.DEFINE_integer('eval_batches', 50, 'Held-out batches per evaluation.')
_REPORT = flags.DEFINE_string('report', '', 'Also write the markdown table to this file.')

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'shakespeare_char.py'
)


def base_config(variant: str, seed: int, steps: int):
    config = load_config_file(CONFIG, variant)
    config.seed = seed
    config.data.path = _DATA.value
    config.train.steps = steps
    config.eval_batches = _EVAL_BATCHES.value
    config.eval_every = config.checkpoint_every = max(steps, 1)
    return config


def cached_run(name: str, start) -> float:
    """Final eval loss of run `name`; `start(workdir, tb_dir)` trains it unless cached."""
    workdir = os.path.join(_OUT.value, name)
    result_path = os.path.join(workdir, 'result.json')
    if os.path.exists(result_path):
        with open(result_path) as f:
            return json.load(f)['eval_loss']
    shutil.rmtree(workdir, ignore_errors=True)
    loss = start(workdir, os.path.join(_OUT.value, 'tb'))['eval']['loss']
    with open(result_path, 'w') as f:
        json.dump({'eval_loss': loss}, f)
    logging.info('%s: eval loss %.4f', name, loss)
    return loss


def fmt(losses: list[float]) -> str:
    return f'{np.mean(losses):.4f} ± {np.std(losses):.4f}'


def run() -> int:
    set_cpu_devices(base_config('mha', 0, 1).mesh)
    t0 = time.time()
    n, seeds = _STEPS.value, range(_SEEDS.value)
    fractions = [float(a) for a in _FRACTIONS.value]
    targets = [int(g) for g in _TARGETS.value]
    label = {g: 'MQA' if g == 1 else f'GQA-{g}' for g in targets}
    results: dict[tuple, list[float]] = {}
    for seed in seeds:
        src = f'mha_s{seed}'
        results.setdefault(('MHA', 'scratch', 0.0), []).append(
            cached_run(src, lambda w, tb, s=seed: train(base_config('mha', s, n), w, tb))
        )
        for g in targets:
            for method in _METHODS.value:
                for alpha in fractions:
                    name = f'{label[g]}_{method}_a{alpha:g}_s{seed}'

                    def uptrain(w, tb, g=g, method=method, alpha=alpha, s=seed, src=src):
                        config = convert_checkpoint(
                            os.path.join(_OUT.value, src), w, g, method, fraction=alpha, seed=s
                        )
                        return train(config, w, tb)

                    results.setdefault((label[g], method, alpha), []).append(
                        cached_run(name, uptrain)
                    )
            total = round(n * (1 + max(fractions)))
            variant = 'mqa' if g == 1 else f'gqa{g}'
            results.setdefault((label[g], 'scratch', max(fractions)), []).append(
                cached_run(
                    f'{label[g]}_scratch_s{seed}',
                    lambda w, tb, s=seed, v=variant, t=total: train(base_config(v, s, t), w, tb),
                )
            )
    lines = [
        f'| model | conversion | α (uptraining steps) | eval loss, mean ± std over {len(seeds)} '
        'seeds |',
        '|---|---|---|---|',
        f'| MHA (source) | — | — ({n} steps) | {fmt(results[("MHA", "scratch", 0.0)])} |',
    ]
    for g in targets:
        for method in _METHODS.value:
            for alpha in fractions:
                lines.append(
                    f'| {label[g]} | {method} | {alpha:g} ({round(alpha * n)}) | '
                    f'{fmt(results[(label[g], method, alpha)])} |'
                )
        lines.append(
            f'| {label[g]} | from scratch | — ({round(n * (1 + max(fractions)))} steps) '
            f'| {fmt(results[(label[g], "scratch", max(fractions))])} |'
        )
    table = '\n'.join(lines)
    print(table)
    print(f'wall time: {time.time() - t0:.0f} s')
    if _REPORT.value:
        with open(_REPORT.value, 'w') as f:
            f.write(table + '\n')
    return 0


if __name__ == '__main__':
    run_app(run)
