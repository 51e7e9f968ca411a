"""Doc tables generated from committed CSVs (`docs/studies/<study>/results/<name>.csv`), so no
table in a study can disagree with its data: `scripts/make_tables.py` rewrites every marked region

    <!-- table: KIND NAME -->
    ...generated...
    <!-- /table -->

of a study's README.md with the table of kind KIND made from its results/NAME.csv
(`<!-- table: KIND NAME seeds A-B -->`: from the rows of seeds A to B alone; `... pairs a:b,c:d
-->` after it, for the 'seeds' kind: only the stated pairs a − b, c − d, Holm over them; a
final ` described`: a result no stated test answers, shown without ✓ marks). Kinds:
- 'seeds': per-seed values (columns arm, seed, value): per arm mean ± std and 95% t-interval,
  then every pair's paired difference with its exact sign-flip p beside the t-test's. A sweep's
  summary_seeds.csv (point, seed, then its values) gives one such table per value, and every
  value's comparisons (with, for a recall CSV, the Fisher tests of the 'learned' kind) are ONE
  Holm family: the question's (lm.experiments.summary.question).
- 'within': the same CSV with arms named '<group>/<arm>' ('mqa/width', 'mqa/params'): only the
  arms of one group are compared, Holm-corrected over those pairs.
- 'intervals': comparisons kept only as reported summaries (columns family, a, b, diff, ci_lo,
  ci_hi, seeds): each p recovered from its t-interval, Holm-corrected within its family.
- 'ablation' (this kind, 'targets' and 'lr_grid' are in lm.experiments.ablation_doc_tables):
  an uptraining ablation's seeds.csv (columns model, conversion, alpha_or_steps, seed, value):
  per target model a 'seeds' table of its uptrained arms (α > 0) and its from-scratch
  baselines (and MHA from scratch at a budget, where trained), each model Holm-corrected on
  its own; the source's rows and the untrained conversions (α = 0) are left out.
- 'targets': the same seeds.csv with several targets converted the same ways (MLA-32 and
  MLA-32-k4): per arm they share (α = 0 included), each target's estimate, and the paired
  differences between targets, Holm-corrected over every arm's comparisons together.
- 'against_base': per-seed values (columns arm, seed, value) with arms '<base>' and
  '<base>+<option>' ('b', 'b+int8'): each option's arms against their own base arm, one Holm
  family per option (the question "what does this option cost?"), nothing across options or
  bases.
- 'rows': any CSV as it is, one table row per CSV row (measurements with no seeds, such as
  where corpus parts lie).
- 'curve': a learning curve (columns run, step, metric, value): one row per step, one column
  per run, of the CSV's first metric.
- 'last_step': the same CSV, one row per run: every metric at the run's last step.
- 'learned': per-seed recall accuracies (a sweep's summary_seeds.csv): per arm the runs that
  reached LEARNED (left the plateau: a two-valued outcome on MQAR), with a Clopper-Pearson 95%
  interval of the rate, then every pair's Fisher exact test (unpaired: the counts),
  Holm-corrected in the CSV's one family with the t-tests its 'seeds' table shows.
- 'recall_pairs': the same CSV tested as a statement that named two families, each Holm over
  the arm pairs alone: the runs that learned (Fisher) and the per-seed recall accuracy (paired
  t-test); the 'learned' and 'seeds' tables beside it give the stricter one-family correction.
- 'lr_grid': an uptraining ablation's lr_grid.csv (columns model, conversion, alpha_or_steps,
  lr, seed, validation_loss, heldout_loss): per arm the mean validation loss at each rate, the
  rate chosen on it and the held-out loss there (lm.experiments.lr_grid).
- 'lr_screen': a recall task's learning-rate screen (columns point, lr, seed, eval_loss,
  eval_recall_accuracy): per arm its mean accuracy and answer loss at each rate and the rate
  `lr_grid.choose_by_accuracy` picks (bold).
- 'seed_curve': a sweep's learning curves (the same columns, runs named <arm>_s<seed>): one
  column per arm, its mean ± std over seeds at each step.
- 'steps_to': the same curves: per run the first step its first metric reached REACHED, per arm
  their mean ± std and 95% t-interval, then the paired differences (same seed), Holm-corrected
  over the pairs tested; a pair with a run that never reached it is not tested.
- 'capacity': a recall sweep over KV state and pairs (lm.experiments.capacity): the accuracy
  grid, then one Holm family per question (KV state at equal pairs; pairs at equal KV).
- 'trend': a pre-registered trend (columns arm, x, seed, value; lm.experiments.trend): per arm
  its estimate, then the per-seed slope of the value in x and the end arms' difference, one
  Holm family of two.

Damaged inputs are refused in one line naming the file and line, before any doc is written: a
marker without its partner, a CSV that is not UTF-8 text, has no rows, a row of other length
than its header, a non-finite number, or two rows with the same key (lm.experiments.table_inputs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from lm.experiments import (
    ablation_doc_tables,
    capacity,
    recall_tables,
    stats,
    summary,
    trend,
)
from lm.experiments.runner import arm_and_seed
from lm.experiments.table_inputs import check_markers, read_csv, read_text

MARKER = re.compile(
    r'(<!-- table: (\w+) ([\w.-]+)(?: seeds (\d+)-(\d+))?(?: pairs ([\w.:,-]+))?'
    r'(?P<described> described)? -->\n)(?P<body>.*?)(?P<close><!-- /table -->)',
    re.S,
)
RESOLVED_NOTE = summary.RESOLVED_NOTE  # replaced by DESCRIBED_NOTE in a described table
DESCRIBED_NOTE = 'described, not a stated test: no ✓ marks, and no p here resolves anything.'


def intervals_table(rows: list[dict]) -> str:
    """Reported comparisons re-tested: p from each interval, Holm within each family."""
    families: dict[str, list[dict]] = {}
    for r in rows:
        families.setdefault(r['family'], []).append(r)
    lines = [
        'p: recovered from each reported t-interval; no sign-flip p, since only the intervals were '
        'kept, not the per-seed values.',
        '',
        '| family (m) | a | b | Δ a − b | 95% CI | p | p (Holm) | ordering |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for name, members in families.items():
        diffs = [
            stats.Estimate(
                int(r['seeds']),
                float(r['diff']),
                float('nan'),
                float(r['ci_lo']),
                float(r['ci_hi']),
            )
            for r in members
        ]
        p = [stats.p_from_interval(d.mean, d.lo, d.hi, d.n) for d in diffs]
        for r, d, raw, adj in zip(members, diffs, p, stats.holm(p), strict=True):
            verdict = stats.ordering(r['a'], r['b'], d, summary.holm_resolved(adj))
            lines.append(
                f'| {name} ({len(members)}) | {r["a"]} | {r["b"]} | {d.mean:+.4f} | '
                f'{d.interval()} | {raw:.3g} | {adj:.3g} | {verdict}'
                f'{" ✓" if summary.holm_resolved(adj) else ""} |'
            )
    return '\n'.join(lines)


def against_base_table(rows: list[dict]) -> str:
    """Per arm its estimate over seeds; then per option (the part after '+' of an arm
    '<base>+<option>') the paired differences '<base>+<option>' − '<base>', Holm-corrected over
    that option's comparisons alone, the exact sign-flip p beside each."""
    arm, value = (
        'arm' if 'arm' in rows[0] else 'point',
        [k for k in rows[0] if k not in ('arm', 'point', 'seed')],
    )
    if len(value) != 1:
        raise ValueError(f'against_base: one value column expected, got {value}')
    values: dict[str, dict[int, float]] = {}
    for r in rows:
        values.setdefault(r[arm], {})[int(r['seed'])] = float(r[value[0]])
    options: dict[str, list[tuple[str, str]]] = {}
    for name in values:
        base, plus, option = name.partition('+')
        if plus and base not in values:
            raise ValueError(f'against_base: arm {name!r} has no base arm {base!r}')
        if plus:
            options.setdefault(option, []).append((name, base))
    if not options:
        raise ValueError("against_base: no arm named '<base>+<option>'")
    lines = [f'| arm | {value[0]} (mean ± std) | 95% CI | seeds |', '|---|---|---|---|']
    lines += [f'| {name} | {summary.cell(v)} | {len(v)} |' for name, v in values.items()]
    for option, pairs in options.items():
        tests = [(values[a], values[b]) for a, b in pairs]
        family, flips = summary.family(tests), summary.sign_flips(tests)
        seeds = min((d.n for d, _, _ in family if d.n > 1), default=None)
        size = stats.family_size([p for _, p, _ in family])
        note = summary.family_note(size, seeds, family=option)
        lines += ['', f'{option}:', '', note, '']
        lines += ['| a | b | Δ a − b (95% CI), p (Holm) | ordering |', '|---|---|---|---|']
        for (a, b), (d, _, adj), flip in zip(pairs, family, flips, strict=True):
            order = stats.ordering(a, b, d, summary.holm_resolved(adj))
            lines.append(f'| {a} | {b} | {summary.diff_cell(d, adj, flip_holm=flip)} | {order} |')
    return '\n'.join(lines)


def rows_table(rows: list[dict]) -> str:
    """The CSV as a table: its columns across, its rows down, values as written."""
    lines = [f'| {" | ".join(rows[0])} |', '|' + '---|' * len(rows[0])]
    return '\n'.join(lines + [f'| {" | ".join(r.values())} |' for r in rows])


def curve_table(rows: list[dict]) -> str:
    """Steps down, runs across: each run's first metric at each step it was measured."""
    metric = rows[0]['metric']
    rows = [r for r in rows if r['metric'] == metric]
    runs = list(dict.fromkeys(r['run'] for r in rows))
    at = {(r['run'], int(r['step'])): float(r['value']) for r in rows}
    steps = sorted({s for _, s in at})
    lines = [f'| step | {" | ".join(runs)} |', '|---|' + '---|' * len(runs)]
    for s in steps:
        cells = [f'{at[(r, s)]:.3f}' if (r, s) in at else '' for r in runs]
        lines.append(f'| {s} | {" | ".join(cells)} |')
    return f'{metric} by step:\n\n' + '\n'.join(lines)


def last_step_table(rows: list[dict]) -> str:
    """Runs down, metrics across: each run's values at its last step."""
    last = {}
    for r in rows:
        last[r['run']] = max(last.get(r['run'], 0), int(r['step']))
    metrics = list(dict.fromkeys(r['metric'] for r in rows))
    at = {
        (r['run'], r['metric']): float(r['value']) for r in rows if int(r['step']) == last[r['run']]
    }
    lines = [f'| run | step | {" | ".join(metrics)} |', '|---|---|' + '---|' * len(metrics)]
    for run, step in last.items():
        cells = [f'{at[(run, m)]:.3f}' if (run, m) in at else '' for m in metrics]
        lines.append(f'| {run} | {step} | {" | ".join(cells)} |')
    return '\n'.join(lines)


def seed_curve_table(rows: list[dict]) -> str:
    """A sweep's learning curves (runs named <arm>_s<seed>, or <arm> for one seed): per metric
    of the CSV, steps down, arms across, each cell the arm's mean ± sample std over its seeds at
    that step."""
    metrics = list(dict.fromkeys(r['metric'] for r in rows))
    return '\n\n'.join(_seed_curve([r for r in rows if r['metric'] == m]) for m in metrics)


def _seed_curve(rows: list[dict]) -> str:
    """`seed_curve_table` of one metric's rows."""
    at: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        arm, seed = arm_and_seed(r['run'])
        at.setdefault((arm, int(r['step'])), {})[seed] = float(r['value'])
    arms = list(dict.fromkeys(a for a, _ in at))
    steps = sorted({s for _, s in at})
    lines = [f'| step | {" | ".join(arms)} |', '|---|' + '---|' * len(arms)]
    for s in steps:
        cells = [summary.spread(at[(a, s)], 3) if (a, s) in at else '' for a in arms]
        lines.append(f'| {s} | {" | ".join(cells)} |')
    return f'{rows[0]["metric"]} by step (mean ± std over seeds):\n\n' + '\n'.join(lines)


KINDS: dict[str, Callable[[list[dict]], str]] = {
    'seeds': summary.seeds_table,
    'within': summary.within_table,
    'against_base': against_base_table,
    'intervals': intervals_table,
    'ablation': ablation_doc_tables.ablation_table,
    'targets': ablation_doc_tables.targets_table,
    'rows': rows_table,
    'curve': curve_table,
    'last_step': last_step_table,
    'seed_curve': seed_curve_table,
    'learned': recall_tables.learned_table,
    'recall_pairs': recall_tables.recall_pairs_table,
    'lr_grid': ablation_doc_tables.lr_grid_table,
    'lr_screen': recall_tables.lr_screen_table,
    'steps_to': recall_tables.steps_to_table,
    'capacity': capacity.capacity_table,
    'trend': trend.trend_table,
}


def check_seeds(rows: list[dict], path: str) -> None:
    """One line naming `path` and the line of a seed that is not a whole number."""
    for line, r in enumerate(rows, 2):
        if 'seed' in r and not r['seed'].isdigit():
            raise ValueError(f'{path} line {line}: seed {r["seed"]!r} is not a whole number')


def seed_rows_between(rows: list[dict], first: int, last: int, path: str) -> list[dict]:
    """The rows of seeds first..last of a CSV with a 'seed' column (one line naming `path`
    otherwise, or when no row is left)."""
    if 'seed' not in rows[0]:
        raise ValueError(f'{path}: a table of seeds {first}-{last} needs a seed column')
    kept = [r for r in rows if first <= int(r['seed']) <= last]
    if not kept:
        raise ValueError(f'{path}: no row of seeds {first}-{last}')
    return kept


def stated_pairs(spec: str, path: str) -> summary.PairPicker:
    """'a:b,c:d' -> the picker of those pairs (a − b, c − d), refusing in one line naming
    `path` a pair not written a:b or an arm the CSV lacks."""
    pairs = [tuple(p.split(':')) for p in spec.split(',')]
    bad = [':'.join(p) for p in pairs if len(p) != 2 or not all(p) or p[0] == p[1]]
    if bad:
        raise ValueError(f'{path}: pairs {bad} must each be written a:b (two different arms)')
    if len({frozenset(p) for p in pairs}) < len(pairs):
        raise ValueError(f'{path}: pairs {spec} compare two arms twice (each pair once)')

    def pick(names: list[str]) -> list[tuple[str, str]]:
        missing = sorted({arm for p in pairs for arm in p} - set(names))
        if missing:
            raise ValueError(f'{path}: pairs name arm(s) {missing} it lacks; arms: {names}')
        return pairs

    return pick


def render(text: str, results_dir: str) -> str:
    """`text` (a doc) with every marked region replaced by its generated table."""

    def table(match: re.Match) -> str:
        kind, name = match[2], match[3]
        if kind not in KINDS:
            raise ValueError(f'table marker {match[1].strip()}: kind must be one of {list(KINDS)}')
        path = os.path.join(results_dir, f'{name}.csv')
        rows = read_csv(path)
        check_seeds(rows, path)
        if match[4] is not None:  # `seeds A-B`: the rows of those seeds alone
            rows = seed_rows_between(rows, int(match[4]), int(match[5]), path)
        if match[6] is not None and kind != 'seeds':
            raise ValueError(
                f'table marker {match[1].strip()}: pairs work with the seeds kind only'
            )
        made = made_table(kind, rows, path, match[6])
        if match['described']:
            made = described(made)
        return f'{match[1]}{made}\n{match["close"]}'

    return MARKER.sub(table, text)


def described(table: str) -> str:
    """A generated table shown as a description (a marker's `described`): its ✓ marks dropped
    and the family note's key to them replaced by DESCRIBED_NOTE."""
    return '\n'.join(
        line.replace(RESOLVED_NOTE, DESCRIBED_NOTE)
        if RESOLVED_NOTE in line
        else line.replace(' ✓', '')
        for line in table.split('\n')
    )


def made_table(kind: str, rows: list[dict], path: str, pairs: str | None) -> str:
    """The table of `kind` from the CSV `path`'s rows (the 'seeds' kind over the stated `pairs`
    alone when given); one line naming `path` for a column the kind needs that the CSV lacks,
    or two arms compared that share no seed."""
    try:
        if pairs is None:
            made = KINDS[kind](rows)
        else:
            made = summary.seeds_table(rows, stated_pairs(pairs, path))
    except KeyError as e:
        raise ValueError(f'{path}: lacks the column {e} that a {kind!r} table needs') from None
    if stats.UNPAIRED in made:
        raise ValueError(f'{path}: two arms it compares share no seed (pairs are matched by seed)')
    return made


def rendered_docs(docs_dir: str, results_dir: str) -> dict[str, str]:
    """{path: new text} of every docs_dir/*.md whose tables differ from their CSVs; markers
    and CSVs are checked first (`check_markers`, `read_csv`), so damage raises before any doc
    is written."""
    changed = {}
    for name in sorted(os.listdir(docs_dir)):
        if not name.endswith('.md'):
            continue
        path = os.path.join(docs_dir, name)
        text = read_text(path, 'a Markdown page')
        check_markers(text, path)
        try:
            new = render(text, results_dir)
        except ValueError as e:
            raise ValueError(f'{path}: {e}') from None
        if new != text:
            changed[path] = new
    return changed


def write_docs(changed: dict[str, str]) -> None:
    """Writes each doc's new text (from `rendered_docs`), atomically."""
    for path, text in changed.items():
        with open(path + '.tmp', 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(path + '.tmp', path)


def update_docs(docs_dir: str, results_dir: str, write: bool = True) -> list[str]:
    """Regenerates the tables of every docs_dir/*.md; returns the docs that changed (written
    unless `write` is False, and only once every doc rendered)."""
    changed = rendered_docs(docs_dir, results_dir)
    if write:
        write_docs(changed)
    return list(changed)
