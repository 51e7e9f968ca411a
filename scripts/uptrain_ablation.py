r"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, at small scale.

Train MHA on Tiny Shakespeare (configs/shakespeare_char.py) for --steps N; convert it to GQA-2
and MQA by mean-pooling, keeping the first head, or re-initialising K/V (and, with --methods,
by aligned merging and with similarity grouping: 'similarity-mean', 'similarity-aligned'), and
to MLA at each latent rank of --mla_ranks (MHA2MLA, RoPE on --mla_rope_dim dims); uptrain each
for a fraction alpha of N (round(alpha·N) steps); compare with the same target trained from
scratch for exactly the same total, N + round(alpha·N) steps of the same batch, at every alpha.
Every arm runs for --seeds seeds and is evaluated on the whole validation split (--eval_tokens);
the tables show mean, sample std and 95% t-interval over seeds, and paired differences between
arms (same seed = same source, initialisation and data order) marked where resolved at 95%,
with each model's KV-cache bytes per token (bfloat16, all layers) beside its loss.

  python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt \
      --out_dir=runs/uptrain_ablation --report=docs/uptraining_table.md

--scratch_fractions limits the from-scratch baselines to the budgets of some alphas (they are
most of the cost: each trains N + round(alpha·N) steps); rows without one show "— (not
trained)". --parallel=K runs K seeds at once, each in its own process (log:
<out_dir>/seed<k>.log), then prints the table from the cached results; on 2 CPU cores K = 2
overlaps one seed's compiles and evaluations with the other's training (about 1.3x).

Finished runs are skipped when the command is repeated (results are cached per run); an
--out_dir whose runs were made with other settings (--steps, --schedule, --optimizer_state,
--set, ...) is refused, so compare `--schedule=continue` with `--schedule=rewarm` in two
--out_dirs; `--reuse=<the first>` copies its MHA sources and from-scratch baselines (which do not
depend on the schedule) instead of training them again. `--set=key=value` changes the recipe of
every run (e.g. `--set=model.num_layers=2`).
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from absl import flags, logging

from lm.cli import bootstrap, run_app
from lm.config import load_config_file, with_overrides
from lm.convert.uptrain import METHODS, ConversionOptions, convert_checkpoint
from lm.experiments import stats
from lm.model.accounting import kv_cache_bytes_per_token
from lm.model.attention import VARIANTS
from lm.model.transformer import check_model_config
from lm.train.loop import train

_DATA = flags.DEFINE_string('data_path', 'data/tinyshakespeare.txt', 'Text file.')
_OUT = flags.DEFINE_string('out_dir', 'runs/uptrain_ablation', 'Workdirs and TensorBoard.')
_STEPS = flags.DEFINE_integer('steps', 1000, 'MHA pre-training steps N.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per point.')
_FRACTIONS = flags.DEFINE_list('fractions', ['0', '0.05', '0.1'], 'Uptraining fractions alpha.')
_SCRATCH_FRACTIONS = flags.DEFINE_list(
    'scratch_fractions',
    None,
    'The alphas whose total budget N + round(alpha*N) gets from-scratch baselines of every target '
    '(default: all of --fractions; empty: none).',
)
_TARGETS = flags.DEFINE_list('targets', ['2', '1'], 'KV heads after conversion (1 = MQA).')
_METHODS = flags.DEFINE_list(
    'methods',
    ['mean', 'first', 'random'],
    f"Conversion methods {METHODS}, each optionally as 'similarity-<method>' (similarity "
    'grouping instead of contiguous).',
)
_MLA_RANKS = flags.DEFINE_list('mla_ranks', [], 'MHA -> MLA arms: latent ranks C (none: no MLA).')
_MLA_ROPE = flags.DEFINE_integer('mla_rope_dim', 8, 'MHA -> MLA arms: model.mla.qk_rope_head_dim.')
_CALIBRATION = flags.DEFINE_integer(
    'calibration_tokens',
    None,
    "Training tokens the similarity / aligned / MLA conversions fit on; default: the config's.",
)
_OPT_STATE = flags.DEFINE_string(
    'optimizer_state',
    'convert',
    "GQA / MQA arms: 'convert' (the source's AdamW moments) or 'fresh'; MLA arms are fresh.",
)
_EVAL_TOKENS = flags.DEFINE_integer(
    'eval_tokens', 0, 'Validation tokens per evaluation (lm.train.evaluation); 0 = the whole split.'
)
_REPORT = flags.DEFINE_string('report', '', 'Also write the markdown tables to this file.')
_SCHEDULE = flags.DEFINE_enum(
    'schedule', 'continue', ['continue', 'rewarm'], 'Uptraining schedule (config.uptrain.schedule).'
)
_SET = flags.DEFINE_multi_string(
    'set', [], 'key=value override of the recipe for every run (e.g. model.num_layers=2).'
)
_REUSE = flags.DEFINE_string(
    'reuse',
    '',
    'An earlier --out_dir whose finished from-scratch runs (MHA sources, from-scratch baselines) '
    'are copied instead of retrained where their settings match.',
)
_COMPARE = flags.DEFINE_string(
    'compare_with',
    '',
    'An earlier --out_dir (e.g. the other --schedule): also print the paired difference, this '
    'run minus that one, of every conversion arm both hold for every seed.',
)
_PARALLEL = flags.DEFINE_integer(
    'parallel', 1, 'Seeds run at once, each in its own process (logs: <out_dir>/seed<k>.log).'
)
_ONLY_SEED = flags.DEFINE_integer(
    'only_seed', None, 'Run only this seed (what --parallel starts per seed); prints no table.'
)
# What a from-scratch run depends on; uptraining runs depend on every setting.
SCRATCH_SETTINGS = ('data_path', 'steps', 'eval_tokens', 'set')

CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'shakespeare_char.py'
)


def base_config(variant: str, seed: int, steps: int):
    config = with_overrides(load_config_file(CONFIG, variant), _SET.value)
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


def mla_config(rank: int, seed: int, steps: int):
    """The source (MHA) config as the MLA that conversion to latent rank `rank` builds (its RoPE
    base left as the source's), trained from scratch."""
    config = base_config('mha', seed, steps)
    D, P = check_model_config(config.model).head_dim, _MLA_ROPE.value
    config.model.update(attention='mla', num_kv_heads=0)
    config.model.mla.update(kv_lora_rank=rank, q_lora_rank=0)
    config.model.mla.update(qk_nope_head_dim=D - P, qk_rope_head_dim=P, v_head_dim=D)
    return config


def arms(targets: list[int]) -> dict[str, tuple]:
    """{target label: (scratch config fn(seed, steps), {method: ConversionOptions})}; a bad
    method or combination fails here, before any training."""
    out, common = {}, dict(calibration_tokens=_CALIBRATION.value, schedule=_SCHEDULE.value)
    for g in targets:
        methods = {}
        for name in _METHODS.value:
            grouping, _, method = name.rpartition('-')
            methods[name] = ConversionOptions(
                num_kv_heads=g,
                method=method,
                grouping=grouping or 'contiguous',
                optimizer_state=_OPT_STATE.value,
                **common,
            )
        label = 'MQA' if g == 1 else f'GQA-{g}'
        out[label] = (lambda s, t, g=g: pooled_config(g, s, t), methods)
    for rank in map(int, _MLA_RANKS.value):
        options = ConversionOptions(
            target='mla',
            kv_lora_rank=rank,
            qk_rope_head_dim=_MLA_ROPE.value,
            method='joint_svd',
            optimizer_state='fresh',
            **common,
        )
        out[f'MLA-{rank}'] = (lambda s, t, c=rank: mla_config(c, s, t), {'joint_svd': options})
    return out


def settings() -> dict:
    """Every flag that changes a run's result beyond its name (arm, alpha, seed)."""
    return {
        'data_path': os.path.abspath(_DATA.value),
        'steps': _STEPS.value,
        'eval_tokens': _EVAL_TOKENS.value,
        'schedule': _SCHEDULE.value,
        'optimizer_state': _OPT_STATE.value,
        'calibration_tokens': _CALIBRATION.value,
        'mla_rope_dim': _MLA_ROPE.value,
        'set': list(_SET.value),
    }


def from_scratch(name: str) -> bool:
    """Whether run `name` is an MHA source or a from-scratch baseline (no conversion)."""
    return name.startswith('mha_s') or '_scratch_' in name


def changed_settings(name: str, saved: dict | None) -> list[str]:
    """The settings that run `name` depends on and that differ between `saved` and now."""
    now = settings()
    keys = SCRATCH_SETTINGS if from_scratch(name) else now
    return sorted(k for k in keys if (saved or {}).get(k) != now[k])


def saved_settings(workdir: str) -> dict | None:
    with open(os.path.join(workdir, 'result.json')) as f:
        return json.load(f).get('settings')


def check_out_dir() -> None:
    """Refuses an --out_dir whose finished runs were made with other settings (before any
    training, deleting nothing)."""
    for name in sorted(os.listdir(_OUT.value)) if os.path.isdir(_OUT.value) else []:
        if os.path.exists(os.path.join(_OUT.value, name, 'result.json')):
            changed = changed_settings(name, saved_settings(os.path.join(_OUT.value, name)))
            if changed:
                raise ValueError(
                    f'--out_dir: {_OUT.value} holds runs made with other settings '
                    f'({", ".join(changed)}); use another --out_dir'
                )
    for flag in (_REUSE, _COMPARE):
        if flag.value and not os.path.isdir(flag.value):
            raise ValueError(
                f'--{flag.name}: {flag.value} is not a directory (an earlier --out_dir)'
            )


def cached_run(name: str, start) -> float:
    """Final eval loss of run `name`; `start(workdir, tb_dir)` trains it unless it finished
    earlier (`check_out_dir` has checked the settings it was made with)."""
    workdir = os.path.join(_OUT.value, name)
    result_path = os.path.join(workdir, 'result.json')
    earlier = os.path.join(_REUSE.value, name) if _REUSE.value else ''
    if not os.path.exists(result_path) and from_scratch(name) and earlier:
        if os.path.exists(os.path.join(earlier, 'result.json')):
            if not changed_settings(name, saved_settings(earlier)):
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.copytree(earlier, workdir)
                logging.info('%s: copied from %s', name, earlier)
    if os.path.exists(result_path):
        with open(result_path) as f:
            return json.load(f)['eval']['loss']
    shutil.rmtree(workdir, ignore_errors=True)  # an unfinished run of these settings
    metrics = start(workdir, os.path.join(_OUT.value, 'tb'))['eval']
    if not os.path.exists(os.path.join(workdir, 'results.json')):  # written at the last step
        raise SystemExit(f'{name}: stopped before its last step (SIGTERM?); nothing cached')
    with open(result_path + '.tmp', 'w') as f:  # atomic: seeds running in parallel read it
        json.dump({'eval': metrics, 'settings': settings()}, f)
    os.replace(result_path + '.tmp', result_path)
    logging.info('%s: eval loss %.4f', name, metrics['loss'])
    return metrics['loss']


def fmt(losses: dict[int, float]) -> str:
    est = stats.estimate(list(losses.values()))
    return f'{est.mean:.4f} ± {est.std:.4f} | {est.interval()}'


def fmt_diff(a: dict[int, float], b: dict[int, float]) -> str:
    d = stats.paired_difference(a, b)
    return f'{d.mean:+.4f} {d.interval()}{" ✓" if d.resolved else ""}'


def run_seeds_in_parallel(seeds: range) -> None:
    """Runs every seed's arms in its own process, --parallel at a time (one XLA process per seed
    overlaps one seed's compiles and evaluations with another's training)."""

    def one(seed: int) -> tuple[int, int, str]:
        log = os.path.join(_OUT.value, f'seed{seed}.log')
        args = [*sys.argv[1:], f'--only_seed={seed}', '--parallel=1', '--report=']
        with open(log, 'w') as f:
            code = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *args],
                stdout=f,
                stderr=subprocess.STDOUT,
            ).returncode
        return seed, code, log

    os.makedirs(_OUT.value, exist_ok=True)
    with ThreadPoolExecutor(_PARALLEL.value) as pool:
        for seed, code, log in pool.map(one, seeds):
            if code:
                raise SystemExit(f'seed {seed} failed (exit {code}); its log: {log}')
            logging.info('seed %d done (%s)', seed, log)


def fraction_list(values: list[str], flag: str) -> list[float]:
    try:
        return [float(a) for a in values]
    except ValueError:
        raise ValueError(f'{flag}: expected numbers (alphas), got {",".join(values)}') from None


def run() -> int:
    bootstrap(base_config('mha', 0, 1))
    check_out_dir()
    t0 = time.time()
    n, seeds = _STEPS.value, range(_SEEDS.value)
    fractions = fraction_list(_FRACTIONS.value, '--fractions')
    scratch_fractions = fractions
    if _SCRATCH_FRACTIONS.value is not None:
        scratch_fractions = fraction_list(_SCRATCH_FRACTIONS.value, '--scratch_fractions')
    if not set(scratch_fractions) <= set(fractions):
        raise ValueError('--scratch_fractions: every alpha must also be in --fractions')
    if _PARALLEL.value < 1:
        raise ValueError(f'--parallel: expected >= 1, got {_PARALLEL.value}')
    if _ONLY_SEED.value is not None and _ONLY_SEED.value not in seeds:
        raise ValueError(f'--only_seed: expected one of 0..{len(seeds) - 1} (--seeds)')
    by_label = arms([int(g) for g in _TARGETS.value])
    up_steps = {alpha: round(alpha * n) for alpha in fractions}  # as uptrain_config
    totals = sorted({n + up_steps[alpha] for alpha in scratch_fractions})
    if _PARALLEL.value > 1 and _ONLY_SEED.value is None:
        run_seeds_in_parallel(seeds)  # the loop below then finds every run cached
    results: dict[tuple, dict[int, float]] = {}  # arm -> {seed: final eval loss}
    for seed in seeds if _ONLY_SEED.value is None else [_ONLY_SEED.value]:
        src = f'mha_s{seed}'
        results.setdefault(('MHA', 'scratch', 0.0), {})[seed] = cached_run(
            src, lambda w, tb, s=seed: train(base_config('mha', s, n), w, tb)
        )
        for label, (scratch, methods) in by_label.items():
            for method, options in methods.items():
                for alpha in fractions:

                    def uptrain(w, tb, options=options, alpha=alpha, s=seed, src=src):
                        src_dir = os.path.join(_OUT.value, src)
                        options = dataclasses.replace(options, fraction=alpha, seed=s)
                        return train(convert_checkpoint(src_dir, options, w), w, tb)

                    results.setdefault((label, method, alpha), {})[seed] = cached_run(
                        f'{label}_{method}_a{alpha:g}_s{seed}', uptrain
                    )
            for total in totals:
                # From scratch at the same token budget as source + uptraining (same batch).
                results.setdefault((label, 'scratch', total), {})[seed] = cached_run(
                    f'{label}_scratch_{total}_s{seed}',
                    lambda w, tb, s=seed, t=total, make=scratch: train(make(s, t), w, tb),
                )
    if _ONLY_SEED.value is not None:
        print(f'seed {_ONLY_SEED.value} done in {time.time() - t0:.0f} s (no table: one seed)')
        return 0
    scratch_configs = {'MHA': lambda s, t: base_config('mha', s, t)}
    scratch_configs.update({label: make for label, (make, _) in by_label.items()})
    kv_bytes = {
        label: kv_cache_bytes_per_token(check_model_config(make(0, n).model))
        for label, make in scratch_configs.items()
    }
    methods = {label: list(m) for label, (_, m) in by_label.items()}
    table = tables(results, n, len(seeds), fractions, methods, up_steps, totals, kv_bytes)
    if _COMPARE.value:
        table += '\n\n' + compare_table(results, _COMPARE.value)
    print(table)
    print(f'wall time: {time.time() - t0:.0f} s')
    if _REPORT.value:
        with open(_REPORT.value, 'w') as f:
            f.write(table + '\n')
    return 0


def compare_table(results: dict[tuple, dict[int, float]], other: str) -> str:
    """Paired differences (same seed = same source) between this --out_dir's conversion arms and
    the same arms in `other`, read from its cached results; ✓ = resolved at 95%."""
    rows, theirs = [], None
    for (label, method, alpha), ours in results.items():
        paths = {s: os.path.join(other, f'{label}_{method}_a{alpha:g}_s{s}') for s in ours}
        if method == 'scratch' or not all(
            os.path.exists(f'{p}/result.json') for p in paths.values()
        ):
            continue
        that = {}
        for s, path in paths.items():
            with open(os.path.join(path, 'result.json')) as f:
                saved = json.load(f)
            that[s], theirs = saved['eval']['loss'], saved['settings']
        rows.append(f'| {label} | {method} | {alpha:g} | {fmt_diff(ours, that)} | {len(ours)} |')
    now = settings()
    changed = ', '.join(f'{k} {theirs[k]} there' for k in now if theirs and theirs.get(k) != now[k])
    return '\n'.join(
        [
            f'Paired difference over seeds, this run ({_OUT.value}) minus {other} '
            f'({changed or "same settings"}); ✓ = resolved at 95% (the interval excludes 0).',
            '',
            '| model | conversion | α | Δ loss this − that (95% CI) | seeds |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )


def tables(results, n, num_seeds, fractions, methods, up_steps, totals, kv_bytes) -> str:
    """The ablation table (with each arm's paired difference to from-scratch training of the
    same target at the same total budget where `totals` has it, and the target's KV-cache bytes
    per token) and the paired method comparisons; ✓ = resolved at 95%."""
    lines = [
        f'Final eval loss over {num_seeds} seeds (same seed = same MHA source, initialisation and '
        'data order): mean ± sample std (ddof 1), 95% t-interval; Δ = paired difference over '
        'seeds with its 95% interval, ✓ = resolved (the interval excludes 0); KV cache: bytes '
        'per token over all layers in bfloat16.',
        '',
        '| model | conversion | α (uptraining steps) | total steps | eval loss | 95% CI | '
        'Δ vs from scratch, same total steps | KV cache B/token |',
        '|---|---|---|---|---|---|---|---|',
        f'| MHA (source) | — | — | {n} | {fmt(results[("MHA", "scratch", 0.0)])} | — | '
        f'{kv_bytes["MHA"]} |',
    ]
    for label, names in methods.items():
        for method in names:
            for alpha in fractions:
                arm = results[(label, method, alpha)]
                scratch = results.get((label, 'scratch', n + up_steps[alpha]))
                lines.append(
                    f'| {label} | {method} | {alpha:g} ({up_steps[alpha]}) | '
                    f'{n + up_steps[alpha]} | {fmt(arm)} | '
                    f'{fmt_diff(arm, scratch) if scratch else "— (not trained)"} | '
                    f'{kv_bytes[label]} |'
                )
        for total in totals:
            lines.append(
                f'| {label} | from scratch | — | {total} | '
                f'{fmt(results[(label, "scratch", total)])} | — | {kv_bytes[label]} |'
            )
    comparisons = [
        (label, alpha, a, b)
        for label, names in methods.items()
        for alpha in fractions
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    if comparisons:
        lines += [
            '',
            '| model | α | a | b | Δ loss a − b (95% CI) | ordering |',
            '|---|---|---|---|---|---|',
        ]
    for label, alpha, a, b in comparisons:
        ra, rb = results[(label, a, alpha)], results[(label, b, alpha)]
        d = stats.paired_difference(ra, rb)
        lines.append(
            f'| {label} | {alpha:g} | {a} | {b} | {fmt_diff(ra, rb)} | {stats.ordering(a, b, d)} |'
        )
    return '\n'.join(lines)


if __name__ == '__main__':
    run_app(run)
