r"""What each attention head does: per-head scores, KV-head similarity and loss by position.

  python scripts/analyze_heads.py --workdir=runs/mha --out=runs/mha/heads
  python scripts/analyze_heads.py --workdir=runs/mha --compare=runs/gqa2@2000 \
      --compare=runs/gqa2 --out=runs/heads_mha_vs_gqa2

(runs/gqa2 converted from the 2000-step runs/mha by scripts/uptrain.py: its first checkpoint,
step 2000, is the converted model.) Every run and step is checked before any analysis.

Writes OUT/heads.csv (run, layer, head, previous_token, induction, duplicate_token, sink,
entropy), OUT/kv_similarity.csv (run, layer, kind, head_a, head_b, value), OUT/summary.md, PNG
heatmaps (layer x head per score, one panel per run), one example attention map per layer and
run, KV-head similarity and loss by position (what an earlier analysis wrote in OUT is removed
first; other files there are kept; an OUT that is a training run or sweep directory, or holds
those names without an earlier analysis's heads.csv, is refused, and so is one holding an
analysis of other runs unless --overwrite);
each run's scores and images also go to its TensorBoard directory at its checkpoint step. A run
is WORKDIR or WORKDIR@STEP (--step applies to --workdir). Scores are defined in
lm/analysis/scores.py.
"""

import csv
import os
import re
import signal
import sys

from absl import flags

from lm.analysis import (
    SCORES,
    RunHeads,
    analyse_run,
    attention_figure,
    check_runs,
    file_label,
    kv_figure,
    log_run,
    loss_figure,
    parse_run,
    save,
    score_figure,
    summary_markdown,
    write_csv,
    write_kv_csv,
)
from lm.cli import bootstrap, check_writable_dir, run_app
from lm.train import (
    A_RUN,
    StopRequest,
    check_logdir_owner,
    check_not_in_checkpoints,
    claim_logdir,
    directory_kind,
    run_logdir,
    stored_config,
)

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run to analyse.', required=True)
_STEP = flags.DEFINE_integer('step', None, "--workdir's checkpoint step; default: the latest.")
_COMPARE = flags.DEFINE_multi_string(
    'compare', [], 'Another run to analyse beside it: WORKDIR or WORKDIR@STEP (repeatable).'
)
_OUT = flags.DEFINE_string(
    'out', None, 'Directory for heads.csv, summary.md and PNGs.', required=True
)
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Replace an earlier analysis in --out of runs other than these.'
)
_TB_DIR = flags.DEFINE_string(
    'tb_dir', '', "Shared TensorBoard directory to log to; '' = the one each run was trained with."
)
_BATCH = flags.DEFINE_integer('batch', 32, 'Validation windows per forward pass.')
_MAX_BATCHES = flags.DEFINE_integer(
    'max_batches', 0, 'Batches of validation windows to score (0 = the whole split).'
)
_NUM_RANDOM = flags.DEFINE_integer(
    'num_random', 128, 'Repeated random sequences for the induction / duplicate scores.'
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the random sequences (the same for every run).')


def run() -> int:
    for name, flag in (('batch', _BATCH), ('num_random', _NUM_RANDOM)):
        if flag.value < 1:
            raise ValueError(f'--{name} must be >= 1, got {flag.value}')
    if _MAX_BATCHES.value < 0:
        raise ValueError(f'--max_batches must be >= 0 (0 = all), got {_MAX_BATCHES.value}')
    check_writable_dir(_OUT.value, '--out')
    if _TB_DIR.value:
        check_writable_dir(_TB_DIR.value, '--tb_dir')
    specs = [(_WORKDIR.value, _STEP.value, '--workdir')]
    specs += [(*parse_run(c), f'--compare={c}') for c in _COMPARE.value]
    check_out(_OUT.value, check_runs(specs))
    for workdir, _, flag in specs:  # its images go to its TensorBoard run
        check_logdir_owner(workdir, _TB_DIR.value, flag)
    bootstrap(stored_config(_WORKDIR.value, step=_STEP.value))
    with StopRequest() as stop:  # SIGTERM: stop between batches, before anything is written
        runs = [
            analyse_run(
                workdir,
                step,
                batch=_BATCH.value,
                max_batches=_MAX_BATCHES.value,
                num_random=_NUM_RANDOM.value,
                seed=_SEED.value,
                flag=flag,
                stop=stop.check,
            )
            for workdir, step, flag in specs
        ]
        stop.check()
        write(runs)  # a signal meanwhile waits: the few files are written whole
    if stop.signum:
        name = signal.Signals(stop.signum).name
        print(f'stopped by {name} while writing {_OUT.value}: written whole', file=sys.stderr)
        return 128 + stop.signum
    return 0


# The files `write` makes in --out (per-run images named after each run's label).
OUTPUTS = re.compile(
    r'(heads\.csv|kv_similarity\.csv|summary\.md|loss_by_position\.png|'
    rf'({"|".join((*SCORES, "first_position"))})\.png|'
    r'attention_.+_L\d+\.png|kv_similarity_.+\.png)'
)


def check_out(out: str, labels: list[str]) -> None:
    """One-line error for an --out whose files an analysis would replace but no analysis wrote
    (a training run or sweep directory, or a directory holding one of the names `write` makes
    without an earlier analysis's heads.csv), or an earlier analysis of runs other than
    `labels` (without --overwrite)."""
    check_not_in_checkpoints(out, '--out')
    if kind := directory_kind(out):  # its summary.md and figures are not ours to replace
        inside = os.path.join(out, 'heads')
        raise ValueError(
            f'--out={out!r} is {kind}; give the analysis a directory of its own'
            + (f' (e.g. {inside})' if kind == A_RUN else '')
        )
    ours = sorted(n for n in os.listdir(out) if OUTPUTS.fullmatch(n)) if os.path.isdir(out) else []
    earlier = _earlier_analysis(out)
    if ours and earlier is None:
        raise ValueError(
            f'--out={out!r} holds {ours[0]}, which an analysis would replace, but no earlier '
            "analysis's heads.csv: give a new directory or an earlier analysis's"
        )
    if (others := sorted(set(earlier or ()) - set(labels))) and not _OVERWRITE.value:
        raise ValueError(
            f'--out={out!r} holds an analysis of {", ".join(others)}, not analysed now (a run '
            'at another step counts as another): give another --out, or --overwrite to replace it'
        )


def _earlier_analysis(out: str) -> list[str] | None:
    """The runs of the analysis whose heads.csv `out` holds (its run column), or None if it
    holds none (no such file, or not an analysis's header)."""
    try:
        with open(os.path.join(out, 'heads.csv'), newline='') as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or rows[0][:3] != ['run', 'layer', 'head']:
        return None
    return [r[0] for r in rows[1:] if r]


def remove_old_outputs(out: str) -> None:
    """Removes what an earlier analysis wrote in `out` (only the names `write` makes), so no
    image of a run not analysed now stays beside the new tables."""
    for name in os.listdir(out):
        if OUTPUTS.fullmatch(name) and os.path.isfile(path := os.path.join(out, name)):
            os.remove(path)


def write(runs: list[RunHeads]) -> None:
    """The CSVs, summary, figures and TensorBoard entries of the analysed runs."""
    out = _OUT.value
    os.makedirs(out, exist_ok=True)
    remove_old_outputs(out)
    write_csv(runs, os.path.join(out, 'heads.csv'))
    write_kv_csv(runs, os.path.join(out, 'kv_similarity.csv'))
    with open(os.path.join(out, 'summary.md'), 'w') as f:
        f.write(summary_markdown(runs))
    for score in (*SCORES, 'first_position'):
        save(score_figure(score, runs), os.path.join(out, f'{score}.png'))
    save(loss_figure(runs), os.path.join(out, 'loss_by_position.png'))
    for r in runs:
        name = file_label(r.label)
        images = {}
        for score in (*SCORES, 'first_position'):
            images[score] = save(score_figure(score, [r]))
        for layer in range(len(r.example_probs)):
            path = os.path.join(out, f'attention_{name}_L{layer}.png')
            fig = attention_figure(r, layer)
            images[f'attention_L{layer}'] = save(fig, path)
        if r.kv is not None:
            path = os.path.join(out, f'kv_similarity_{name}.png')
            images['kv_similarity'] = save(kv_figure(r), path)
        claim_logdir(r.workdir, _TB_DIR.value)  # its run there is this workdir's
        log_run(r, run_logdir(r.workdir, _TB_DIR.value), images)
        print(f'{r.label}: ICL score {r.icl_score:.3f}, sink rate {r.sink_rate:.3f}')
    print(f'wrote {out}/heads.csv, summary.md and PNGs; TensorBoard: heads/*')


if __name__ == '__main__':
    run_app(run)
