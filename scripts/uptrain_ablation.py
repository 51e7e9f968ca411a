r"""The uptraining ablation of Ainslie et al. (2023), Fig. 4 / Table, at small scale.

Train MHA on the pretrain part of Tiny Shakespeare (configs/shakespeare_char.py) for --steps N;
convert it to GQA-2 and MQA by mean-pooling, keeping the first head, or re-initialising K/V
(and, with --methods, by aligned merging and with similarity grouping: 'similarity-mean',
'similarity-aligned'), to MLA at each latent rank of --mla_ranks (MHA2MLA, RoPE on
--mla_rope_dim dims of one shared key, or of each count of keys in --mla_rope_heads) and to
cross-layer attention (--cla=cla2,mqa_cla2: adjacent layers' K/V merged); uptrain each under
every --schedule for a fraction alpha of N (round(alpha·N) steps) on the uptrain part; compare
with the same target trained from scratch on both parts for exactly the same total, N +
round(alpha·N) steps of the same batch, at every alpha. The corpus is cut into disjoint pretrain
/ uptrain / validation / held-out parts (config.data.split, lm/data/parts.py). Every trained arm
runs at each learning rate of --lrs; each arm is shown at the rate with the lowest mean loss on
the validation part and scored on the held-out part (lm/experiments/lr_grid.py). Every arm runs
for --seeds seeds; the tables show mean, sample std and 95% t-interval over seeds, and paired
differences between arms (same seed = same source, initialisation and data order) marked where
resolved after Holm's correction over the report's comparisons, with each model's KV-cache bytes
per token (bfloat16, all layers) beside its loss; each run's held-out loss goes to
<out_dir>/seeds.csv (at the chosen rate) and every trained run's validation and held-out loss to
<out_dir>/lr_grid.csv. At the end, the held-out loss against KV bytes, one point per arm at its
chosen rate, with the Pareto front: <out_dir>/pareto_heldout_loss.png and the image
'pareto/heldout/loss' in <out_dir>/tb (scripts/plot_pareto.py).

  python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt \
      --out_dir=runs/uptrain_ablation --schedule=continue,rewarm --lrs=3e-4,1e-3,3e-3 \
      --report=runs/uptrain_ablation/report.md

--mha_scratch adds MHA itself trained from scratch on both parts for N + round(alpha·N) steps,
and compares every conversion arm and from-scratch target with it. `--set=data.split_layout=
interleaved` cuts the parts as interleaved blocks of the whole corpus instead of spans
(lm/data/parts.py), so the uptrain part lies no nearer the held-out text than the pretrain part.

--scratch_fractions limits the from-scratch baselines to the budgets of some alphas (they are
most of the cost: each trains N + round(alpha·N) steps); rows without one show "— (not
trained)". --parallel=K runs K seeds at once, each in its own process (log:
<out_dir>/seed<k>.log), then prints the table from the cached results; on 2 CPU cores K = 2
overlaps one seed's compiles and evaluations with the other's training (about 1.3x).

The ablation is a plan of runs (lm.experiments.ablation) handed to the experiment runner
(lm.experiments.runner): finished runs are skipped when the command is repeated (results are
cached per run, <out_dir>/<run>/result.json, with the settings they were made with); an
--out_dir whose runs were made with other settings (--steps, --optimizer_state, --set, ...,
or by an earlier version of this protocol, without corpus parts) is refused, naming the run and
the settings; `--reuse=<an earlier out_dir>` copies every run it holds with the same settings
instead of training it again. `--set=key=value` changes the recipe of every run (e.g.
`--set=model.num_layers=2`, `--set=data.uptrain_fraction=0.2`).
"""

import os
import signal
import sys
import time

from absl import flags

from lm.cli import bootstrap, check_writable_dir, run_app
from lm.convert import METHODS, SCHEDULES
from lm.experiments import (
    PLOTTED,
    Ablation,
    RunStopped,
    StopRuns,
    ablation_markdown,
    ablation_report,
    base_config,
    check_ablation,
    check_comparable,
    check_output_file,
    check_output_path,
    chosen_runs,
    compare_table,
    lr_grid_rows,
    mark_ablation,
    plan_ablation,
    run_specs,
    seed_rows,
    summarise_pareto,
    write_csv,
)
from lm.train import AN_ABLATION, check_not_inside_a_run, directory_kind

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
_MHA_SCRATCH = flags.DEFINE_bool(
    'mha_scratch',
    False,
    'Also train MHA from scratch on both parts at every from-scratch budget (the tokens of source '
    '+ uptraining spent without converting); every arm is compared with it.',
)
_TARGETS = flags.DEFINE_list('targets', ['2', '1'], 'KV heads after conversion (1 = MQA).')
_METHODS = flags.DEFINE_list(
    'methods',
    ['mean', 'first', 'random'],
    f"Conversion methods {METHODS}, each optionally as 'similarity-<method>' (similarity "
    'grouping instead of contiguous).',
)
_MLA_RANKS = flags.DEFINE_list('mla_ranks', [], 'MHA -> MLA arms: latent ranks C (none: no MLA).')
_CLA = flags.DEFINE_list(
    'cla',
    [],
    "MHA -> cross-layer attention arms, each converted by every --methods: 'cla2' (KV heads "
    "kept), 'mqa_cla2', 'gqa2_cla3' (none: no CLA).",
)
_MLA_ROPE = flags.DEFINE_integer('mla_rope_dim', 8, 'MHA -> MLA arms: model.mla.qk_rope_head_dim.')
_MLA_ROPE_HEADS = flags.DEFINE_list(
    'mla_rope_heads',
    ['1'],
    'MHA -> MLA arms, one per value and rank: RoPE keys (model.mla.rope_heads), dividing the '
    "source's KV heads: 1 = one shared key (MLA-<C>), G = one per KV head (MLA-<C>-k<G>).",
)
_CALIBRATION = flags.DEFINE_integer(
    'calibration_tokens',
    None,
    "Training tokens the similarity / aligned / MLA conversions fit on; default: the config's.",
)
_OPT_STATE = flags.DEFINE_string(
    'optimizer_state',
    'convert',
    "'convert' (the source's AdamW count and moments, converted like the weights; MLA: zero for "
    "the new latent factors) or 'fresh'.",
)
_EVAL_TOKENS = flags.DEFINE_integer(
    'eval_tokens', 0, 'Validation tokens per evaluation (lm.train.evaluation); 0 = the whole split.'
)
_REPORT = flags.DEFINE_string('report', '', 'Also write the markdown tables to this file.')
_SCHEDULE = flags.DEFINE_list(
    'schedule',
    ['continue'],
    f'Uptraining schedules {SCHEDULES} (config.uptrain.schedule); every method runs under each.',
)
_LRS = flags.DEFINE_list(
    'lrs',
    [],
    "Learning rates of every trained arm (none: the recipe's); each arm is shown at the one "
    'with the lowest validation loss, scored on the held-out part.',
)
_SET = flags.DEFINE_multi_string(
    'set', [], 'key=value override of the recipe for every run (e.g. model.num_layers=2).'
)
_REUSE = flags.DEFINE_string(
    'reuse',
    '',
    'An earlier --out_dir whose finished runs are copied instead of retrained where their '
    'settings match (e.g. the MHA sources and from-scratch baselines of another --schedule).',
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
CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs', 'shakespeare_char.py'
)


def number_list(values: list[str], flag: str, cast: type = float) -> tuple:
    """The flag's values as numbers of type `cast` (float, or int for counts)."""
    try:
        return tuple(cast(a) for a in values)
    except ValueError:
        kind = 'whole numbers' if cast is int else 'numbers'
        raise ValueError(f'{flag}: expected {kind}, got {",".join(values)}') from None


def ablation() -> Ablation:
    """The ablation the flags describe."""
    fractions = number_list(_FRACTIONS.value, '--fractions')
    scratch = _SCRATCH_FRACTIONS.value
    return Ablation(
        config_file=CONFIG,
        data_path=_DATA.value,
        steps=_STEPS.value,
        seeds=_SEEDS.value,
        fractions=tuple(fractions),
        scratch_fractions=tuple(
            fractions if scratch is None else number_list(scratch, '--scratch_fractions')
        ),
        targets=number_list(_TARGETS.value, '--targets', int),
        methods=tuple(_METHODS.value),
        mla_ranks=number_list(_MLA_RANKS.value, '--mla_ranks', int),
        cla=tuple(_CLA.value),
        mla_rope_dim=_MLA_ROPE.value,
        mla_rope_heads=number_list(_MLA_ROPE_HEADS.value, '--mla_rope_heads', int),
        calibration_tokens=_CALIBRATION.value,
        optimizer_state=_OPT_STATE.value,
        eval_tokens=_EVAL_TOKENS.value,
        schedules=tuple(_SCHEDULE.value),
        lrs=number_list(_LRS.value, '--lrs'),
        overrides=tuple(_SET.value),
        mha_scratch=_MHA_SCRATCH.value,
    )


def check_flags(seeds: int) -> None:
    """One-line errors for the flags the ablation's settings do not check; --report: a file
    in an existing writable directory, or in --out_dir (which the runs make)."""
    report = _REPORT.value
    in_out_dir = os.path.dirname(os.path.abspath(report)) == os.path.abspath(_OUT.value)
    if report and in_out_dir:  # the directory is made with the runs; the ablation's own files
        check_output_path(report, '--report', '.md', _OUT.value)
    elif report:
        check_output_file(report, '--report', '.md')
    if _PARALLEL.value < 1:
        raise ValueError(f'--parallel: expected >= 1, got {_PARALLEL.value}')
    if _ONLY_SEED.value is not None and _ONLY_SEED.value not in range(seeds):
        raise ValueError(f'--only_seed: expected one of 0..{seeds - 1} (--seeds)')
    for flag in (_REUSE, _COMPARE):
        if flag.value and os.path.realpath(flag.value) == os.path.realpath(_OUT.value):
            raise ValueError(f'--{flag.name}={flag.value} is --out_dir itself; name an earlier one')
        if flag.value and not os.path.isdir(flag.value):
            raise ValueError(
                f'--{flag.name}: {flag.value} is not a directory (an earlier --out_dir)'
            )


def relaunch(lane: str) -> list[str]:
    """This command for one seed's lane ('seed<k>'), in its own process."""
    args = [*sys.argv[1:], f'--only_seed={lane.removeprefix("seed")}', '--parallel=1', '--report=']
    return [sys.executable, os.path.abspath(__file__), *args]


def run() -> int:
    check_writable_dir(_OUT.value, '--out_dir')
    if (kind := directory_kind(_OUT.value)) and kind != AN_ABLATION:
        raise ValueError(
            f'--out_dir={_OUT.value!r} is {kind}; the ablation makes its runs in a directory of '
            'its own'
        )
    check_not_inside_a_run(_OUT.value, '--out_dir')
    ab = ablation()
    check_flags(ab.seeds)
    bootstrap(base_config(ab, 0, 1))
    t0 = time.time()
    specs = plan_ablation(ab, _OUT.value)
    check_ablation(ab)
    if _COMPARE.value:
        check_comparable(specs, _COMPARE.value)
    if _ONLY_SEED.value is None:  # the lanes' processes: their parent has marked it
        mark_ablation(_OUT.value, ab.settings())  # its files then refused as others' outputs
    only = None if _ONLY_SEED.value is None else f'seed{_ONLY_SEED.value}'
    with StopRuns() as stop:  # SIGTERM: the run in progress saves; no new run starts
        try:
            found = run_specs(
                specs,
                _OUT.value,
                _PARALLEL.value,
                reuse=_REUSE.value,
                relaunch=relaunch,
                only_lane=only,
                stop=stop,
            )
        except RunStopped as e:
            print(f'{e}; no further runs started', file=sys.stderr)
            return 128 + (stop.signum or signal.SIGTERM)
    if only is not None:
        print(f'seed {_ONLY_SEED.value} done in {time.time() - t0:.0f} s (no table: one seed)')
        return 0
    values, chosen = ablation_report(specs, found)
    seeds = seed_rows(values, ('model', 'conversion', 'alpha_or_steps'), 'heldout_loss')
    write_csv(os.path.join(_OUT.value, 'seeds.csv'), seeds)  # per seed, for results/
    write_csv(os.path.join(_OUT.value, 'lr_grid.csv'), lr_grid_rows(specs, found))
    runs = chosen_runs(specs, found, chosen, _OUT.value)
    summarise_pareto(runs, _OUT.value, os.path.join(_OUT.value, 'tb'), PLOTTED)
    table = ablation_markdown(ab, values, chosen)
    if _COMPARE.value:
        table += '\n\n' + compare_table(ab, specs, chosen, values, _OUT.value, _COMPARE.value)
    print(table)
    print(f'wall time: {time.time() - t0:.0f} s')
    if _REPORT.value:
        with open(_REPORT.value, 'w') as f:
            f.write(table + '\n')
    return 0


if __name__ == '__main__':
    run_app(run)
