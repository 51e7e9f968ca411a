"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, as a plan for the experiment
runner (lm.experiments.runner), and its tables (lm.experiments.summary).

Per seed (one lane each): the MHA source trained for N steps; every conversion arm (GQA / MQA by a
pooling method, cross-layer attention by the same methods, MLA at a latent rank) needs that
source, converts its checkpoint and uptrains for round(alpha·N) steps; every target trained from
scratch for N + round(alpha·N) steps at the alphas of `scratch_fractions`. A from-scratch run's
fingerprint is the settings it depends on (`SCRATCH_SETTINGS`), a conversion arm's every setting.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable

import ml_collections
from absl import logging

from lm.config import load_config_file, with_overrides
from lm.convert.uptrain import ConversionOptions, convert_checkpoint
from lm.experiments import stats, summary
from lm.experiments.runner import RunStopped, Spec, read_result
from lm.model import attention
from lm.model.accounting import kv_cache_bytes_per_token
from lm.model.transformer import check_model_config
from lm.train import loop

# What a from-scratch run depends on; uptraining runs depend on every setting.
SCRATCH_SETTINGS = ('data_path', 'steps', 'eval_tokens', 'set')
SOURCE = 'MHA'  # the source's label in the tables


@dataclasses.dataclass(frozen=True)
class Ablation:
    """The ablation's settings (scripts/uptrain_ablation.py's flags)."""

    config_file: str  # the recipe (configs/shakespeare_char.py)
    data_path: str
    steps: int  # N, the source's training steps
    seeds: int
    fractions: tuple[float, ...]  # uptraining fractions alpha
    scratch_fractions: tuple[float, ...]  # the alphas whose budgets get from-scratch baselines
    targets: tuple[int, ...] = (2, 1)  # KV heads after pooling (1 = MQA)
    methods: tuple[str, ...] = ('mean', 'first', 'random')  # pooling, maybe 'similarity-'
    mla_ranks: tuple[int, ...] = ()  # MHA -> MLA arms at these latent ranks
    cla: tuple[str, ...] = ()  # MHA -> cross-layer attention arms: 'cla2', 'mqa_cla2', 'gqa2_cla3'
    mla_rope_dim: int = 8
    calibration_tokens: int | None = None
    optimizer_state: str = 'convert'  # pooled arms; MLA arms are 'fresh'
    eval_tokens: int = 0
    schedule: str = 'continue'
    overrides: tuple[str, ...] = ()  # --set key=value for every run

    def __post_init__(self) -> None:
        if not set(self.scratch_fractions) <= set(self.fractions):
            raise ValueError('--scratch_fractions: every alpha must also be in --fractions')

    def settings(self) -> dict:
        """Every setting that changes a run's result beyond its name (arm, alpha, seed)."""
        return {
            'data_path': os.path.abspath(self.data_path),
            'steps': self.steps,
            'eval_tokens': self.eval_tokens,
            'schedule': self.schedule,
            'optimizer_state': self.optimizer_state,
            'calibration_tokens': self.calibration_tokens,
            'mla_rope_dim': self.mla_rope_dim,
            'set': list(self.overrides),
        }

    def up_steps(self, alpha: float) -> int:
        return round(alpha * self.steps)  # as uptrain_config

    def totals(self) -> list[int]:
        """The from-scratch budgets: N + round(alpha·N) at each of `scratch_fractions`."""
        return sorted({self.steps + self.up_steps(a) for a in self.scratch_fractions})


def base_config(ab: Ablation, seed: int, steps: int) -> ml_collections.ConfigDict:
    """The source (MHA) recipe with the ablation's data, steps, evaluation and overrides."""
    config = load_config_file(ab.config_file, attention.baseline()['attention'])
    config = with_overrides(config, list(ab.overrides))
    config.seed = seed
    config.data.path = ab.data_path
    config.train.steps = steps
    config.eval_tokens = ab.eval_tokens
    config.eval_every = config.checkpoint_every = max(steps, 1)
    return config


def pooled_config(ab: Ablation, num_kv_heads: int, seed: int, steps: int):
    """The source config with its K/V heads pooled to `num_kv_heads`, trained from scratch."""
    config = base_config(ab, seed, steps)
    config.model.update(attention.VARIANTS[config.model.attention].pooled(num_kv_heads))
    return config


def parse_cla(ab: Ablation, spec: str) -> tuple[int, int]:
    """A CLA arm ('cla<n>', 'mqa_cla<n>', 'gqa<g>_cla<n>': a variant name with '_cla<n>', n >= 2)
    -> (num_kv_heads, n); 0 heads = the source's."""
    try:
        settings = attention.parse_variant(spec)
    except ValueError:
        settings = {}
    n = settings.pop('kv_share_every', 1)
    if n < 2:
        raise ValueError(
            f"--cla: expected 'cla<n>', 'mqa_cla<n>' or 'gqa<g>_cla<n>', n >= 2, got {spec!r}"
        )
    source = check_model_config(base_config(ab, 0, 1).model).num_kv_heads
    target = base_config(ab, 0, 1)
    target.model.update(settings)
    g = check_model_config(target.model).num_kv_heads
    return (0 if g == source else g), n


def cla_label(g: int, n: int) -> str:
    return {0: '', 1: 'MQA-'}.get(g, f'GQA-{g}-') + f'CLA{n}'


def cla_config(ab: Ablation, g: int, n: int, seed: int, steps: int):
    """The source config with K/V shared by every n layers (and pooled to g heads, 0 = kept),
    trained from scratch."""
    config = pooled_config(ab, g, seed, steps) if g else base_config(ab, seed, steps)
    config.model.kv_share_every = n
    return config


def latent_variant() -> str:
    """The attention variant with a KV latent (MLA), the target of latent conversions."""
    return next(name for name, cls in attention.VARIANTS.items() if cls.latent_kv)


def latent_config(ab: Ablation, rank: int, seed: int, steps: int):
    """The source config as the MLA that conversion to latent rank `rank` builds (its RoPE base
    left as the source's), trained from scratch."""
    config = base_config(ab, seed, steps)
    D, P = check_model_config(config.model).head_dim, ab.mla_rope_dim
    target = latent_variant()
    config.model.update(attention=target, num_kv_heads=0)
    config.model[attention.VARIANTS[target].config_section].update(
        kv_lora_rank=rank, q_lora_rank=0, qk_nope_head_dim=D - P, qk_rope_head_dim=P, v_head_dim=D
    )
    return config


def arms(ab: Ablation) -> dict[str, tuple[Callable, dict[str, ConversionOptions]]]:
    """{target label: (scratch config fn(seed, steps), {method: ConversionOptions})}; a bad
    method or combination fails here, before any training."""
    out, common = {}, dict(calibration_tokens=ab.calibration_tokens, schedule=ab.schedule)
    for g in ab.targets:
        methods = {}
        for name in ab.methods:
            grouping, _, method = name.rpartition('-')
            methods[name] = ConversionOptions(
                num_kv_heads=g,
                method=method,
                grouping=grouping or 'contiguous',
                optimizer_state=ab.optimizer_state,
                **common,
            )
        label = 'MQA' if g == 1 else f'GQA-{g}'
        out[label] = (lambda s, t, g=g: pooled_config(ab, g, s, t), methods)
    for g, n in (parse_cla(ab, spec) for spec in ab.cla):
        methods = {}
        for name in ab.methods:
            grouping, _, method = name.rpartition('-')
            methods[name] = ConversionOptions(
                num_kv_heads=g,
                kv_share_every=n,
                method=method,
                grouping=grouping or 'contiguous',
                optimizer_state=ab.optimizer_state,
                **common,
            )
        out[cla_label(g, n)] = (lambda s, t, g=g, n=n: cla_config(ab, g, n, s, t), methods)
    for rank in ab.mla_ranks:
        options = ConversionOptions(
            target=latent_variant(),
            kv_lora_rank=rank,
            qk_rope_head_dim=ab.mla_rope_dim,
            method='joint_svd',
            optimizer_state='fresh',
            **common,
        )
        out[f'MLA-{rank}'] = (
            lambda s, t, c=rank: latent_config(ab, c, s, t),
            {'joint_svd': options},
        )
    return out


def _trainer(name: str, make: Callable[[str], ml_collections.ConfigDict], tb_dir: str):
    """A Spec's run: trains `make(workdir)` (a config, or a conversion that writes the run's
    first checkpoint and returns its config) with lm.train.loop; result: {'eval': metrics}."""

    def run(workdir: str) -> dict:
        out = loop.train(make(workdir), workdir, tb_dir)
        if not os.path.exists(os.path.join(workdir, 'results.json')):  # written at the last step
            why = f'by {signal.Signals(out["signal"]).name} ' if out['signal'] else ''
            raise RunStopped(
                f'{name} stopped {why}at step {out["step"]} (its checkpoint kept; the ablation '
                'starts an unfinished run again from its beginning)'
            )
        logging.info('%s: eval loss %.4f', name, out['eval']['loss'])
        return {'eval': out['eval']}

    return run


def plan(ab: Ablation, out_dir: str) -> list[Spec]:
    """The ablation's runs, a lane per seed ('seed<k>'): the source first, then per target its
    conversion arms (each needing the source) and its from-scratch baselines. Arms:
    (SOURCE, 'scratch', 0.0), (label, method, alpha) and (label, 'scratch', total steps)."""
    tb = os.path.join(out_dir, 'tb')
    scratch = {k: v for k, v in ab.settings().items() if k in SCRATCH_SETTINGS}
    by_label, specs = arms(ab), []
    for seed in range(ab.seeds):
        lane, src = f'seed{seed}', f'mha_s{seed}'
        source = _trainer(src, lambda w, s=seed: base_config(ab, s, ab.steps), tb)
        specs.append(Spec(src, scratch, source, (SOURCE, 'scratch', 0.0), seed, lane=lane))
        for label, (make, methods) in by_label.items():
            for method, options in methods.items():
                for alpha in ab.fractions:
                    name = f'{label}_{method}_a{alpha:g}_s{seed}'
                    opts = dataclasses.replace(options, fraction=alpha, seed=seed)
                    convert = _converter(os.path.join(out_dir, src), opts)
                    run = _trainer(name, convert, tb)
                    arm = (label, method, alpha)
                    specs.append(Spec(name, ab.settings(), run, arm, seed, (src,), lane))
            for total in ab.totals():
                name = f'{label}_scratch_{total}_s{seed}'
                run = _trainer(name, lambda w, s=seed, t=total, m=make: m(s, t), tb)
                specs.append(Spec(name, scratch, run, (label, 'scratch', total), seed, lane=lane))
    # An unfinished run starts clean: a conversion writes into an empty workdir.
    return [dataclasses.replace(s, resume=False) for s in specs]


def _converter(source_dir: str, options: ConversionOptions) -> Callable[[str], object]:
    """The setup of a conversion arm: converts the source's checkpoint into the workdir."""
    return lambda workdir: convert_checkpoint(source_dir, options, workdir)


def kv_bytes(ab: Ablation) -> dict[str, int]:
    """{label: KV-cache bytes per token (bfloat16, all layers)} of the source and every target."""
    makes = {SOURCE: lambda s, t: base_config(ab, s, t)}
    makes.update({label: make for label, (make, _) in arms(ab).items()})
    return {
        label: kv_cache_bytes_per_token(check_model_config(make(0, ab.steps).model))
        for label, make in makes.items()
    }


def tables(ab: Ablation, values: dict[tuple, dict[int, float]]) -> str:
    """The ablation table (with each arm's paired difference to from-scratch training of the
    same target at the same total budget where one was trained, and the target's KV-cache bytes
    per token) and the paired method comparisons, all one family for Holm's correction.
    `values`: {arm: {seed: final eval loss}} (lm.experiments.summary.by_arm)."""
    n, kv, methods = ab.steps, kv_bytes(ab), {k: list(m) for k, (_, m) in arms(ab).items()}
    pairs = {}  # (arm a, arm b) -> its comparison, in table order
    for label, names in methods.items():
        for method in names:
            for alpha in ab.fractions:
                scratch = (label, 'scratch', n + ab.up_steps(alpha))
                if scratch in values:
                    pairs[((label, method, alpha), scratch)] = None
        for alpha in ab.fractions:
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    pairs[((label, a, alpha), (label, b, alpha))] = None
    done = summary.family([(values[a], values[b]) for a, b in pairs])
    pairs = dict(zip(pairs, done, strict=True))
    lines = [
        f'Final eval loss over {ab.seeds} seeds (same seed = same MHA source, initialisation and '
        'data order): mean ± sample std (ddof 1), 95% t-interval; Δ = paired difference over '
        'seeds with its 95% interval; KV cache: bytes per token over all layers in bfloat16. '
        + summary.family_note(len(pairs)),
        '',
        '| model | conversion | α (uptraining steps) | total steps | eval loss | 95% CI | '
        'Δ vs from scratch, same total steps | KV cache B/token |',
        '|---|---|---|---|---|---|---|---|',
        f'| MHA (source) | — | — | {n} | {summary.cell(values[(SOURCE, "scratch", 0.0)])} | — | '
        f'{kv[SOURCE]} |',
    ]
    for label, names in methods.items():
        for method in names:
            for alpha in ab.fractions:
                arm, up = (label, method, alpha), ab.up_steps(alpha)
                done = pairs.get((arm, (label, 'scratch', n + up)))
                delta = summary.diff_cell(done[0], done[2]) if done else '— (not trained)'
                lines.append(
                    f'| {label} | {method} | {alpha:g} ({up}) | {n + up} | '
                    f'{summary.cell(values[arm])} | {delta} | {kv[label]} |'
                )
        for total in ab.totals():
            lines.append(
                f'| {label} | from scratch | — | {total} | '
                f'{summary.cell(values[(label, "scratch", total)])} | — | {kv[label]} |'
            )
    return '\n'.join(lines + _method_comparisons(pairs))


def _method_comparisons(pairs: dict[tuple, tuple]) -> list[str]:
    """Table rows of the paired difference between every two conversion methods of a target."""
    lines = []
    for (a, b), (diff, _, p_holm) in pairs.items():
        if b[1] != 'scratch':
            ordering = stats.ordering(a[1], b[1], diff, summary.holm_resolved(p_holm))
            cell = summary.diff_cell(diff, p_holm)
            lines.append(f'| {a[0]} | {a[2]:g} | {a[1]} | {b[1]} | {cell} | {ordering} |')
    header = [
        '',
        '| model | α | a | b | Δ loss a − b (95% CI), p (Holm) | ordering |',
        '|---|---|---|---|---|---|',
    ]
    return header + lines if lines else []


def compare_table(
    ab: Ablation, specs: list[Spec], values: dict[tuple, dict[int, float]], out_dir: str, other: str
) -> str:
    """Paired differences (same seed = same source) between this out_dir's conversion arms and
    the same runs in `other` (an earlier out_dir, e.g. the other schedule), read from its cached
    results; Holm-corrected over the rows."""
    theirs: dict[tuple, dict[int, float]] = {}
    settings = None
    for spec in specs:
        saved = read_result(os.path.join(other, spec.name))
        if spec.arm[1] != 'scratch' and saved is not None:
            theirs.setdefault(spec.arm, {})[spec.seed] = summary.loss(saved)
            settings = saved.get('fingerprint', saved.get('settings'))  # older: 'settings'
    keys = [k for k, ours in values.items() if set(theirs.get(k, {})) >= set(ours)]
    done = summary.family([(values[k], theirs[k]) for k in keys])
    rows = [
        f'| {label} | {method} | {alpha:g} | {summary.diff_cell(d, p_holm)} | {d.n} |'
        for (label, method, alpha), (d, _, p_holm) in zip(keys, done, strict=True)
    ]
    now = ab.settings()
    changed = ', '.join(
        f'{k} {settings[k]} there' for k in now if settings and settings.get(k) != now[k]
    )
    return '\n'.join(
        [
            f'Paired difference over seeds, this run ({out_dir}) minus {other} '
            f'({changed or "same settings"}). {summary.family_note(len(rows))}',
            '',
            '| model | conversion | α | Δ loss this − that (95% CI) | seeds |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )
