"""A sweep's finished models evaluated again: what a quantized KV cache costs them (each run of
some points with its windows decoded through caches stored as int8 / kivi4,
lm/infer/cached_eval.py, paired by seed with the sweep's own losses: `point+int8` beside
`point`), and every run on other data (`heldout_rows`, e.g. a second held-out set), as per-seed
rows that lm/experiments/tables.py's 'seeds' tables read."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable

import ml_collections
from flax import nnx

from lm.data.corpus import check_same_tokenizer
from lm.data.files import split_paths
from lm.experiments.runner import arm_and_seed, read_result
from lm.infer.cached_eval import make_cached_eval_step
from lm.infer.decode import Decoder
from lm.model.accounting import kv_cache_bytes_per_context_token
from lm.model.kv_cache import KV_CACHE_DTYPES, check_storage
from lm.model.transformer import model_config
from lm.train.evaluation import eval_batch_size, evaluate
from lm.train.interrupt import StopRequest
from lm.train.run import Run, assemble
from lm.train.step import make_eval_step
from lm.train.stored import result_step, stored_config
from lm.train.workdir import A_RUN, directory_kind


def evaluate_run(
    run: Run,
    split: str = 'validation',
    stop: StopRequest | None = None,
    kv_cache_dtype: str = '',
) -> dict[str, float]:
    """`lm.train.evaluation.evaluate` of a restored run (`assemble(..., state='params',
    data=True)`) on `split` under the run's own protocol: by the training forward, or with a
    `kv_cache_dtype` each window decoded through caches stored so. A signal `stop` has seen
    raises `Interrupted` between batches, and within a token of a cached batch."""
    step, params = make_eval_step(run.ctx), run.state['params']
    if kv_cache_dtype:
        model = nnx.merge(run.ctx.graphdef, params)
        decoder = Decoder(model, kv_cache_dtype=kv_cache_dtype)
        stopped = None if stop is None else stop.arrived
        step, params = make_cached_eval_step(decoder, run.mesh, stopped), decoder.params
    metrics = _evaluate(run, split, step, params, stop)
    if stop is not None:
        stop.check()  # a batch cut short is not a result
    return metrics


def _evaluate(run: Run, split: str, step: Callable, params, stop: StopRequest | None) -> dict:
    return evaluate(
        step,
        params,
        run.corpus,
        split,
        batch_size=eval_batch_size(run.config),
        seq_len=run.config.data.seq_len,
        eval_tokens=run.config.eval_tokens,
        batch_sharding=run.ctx.batch_sharding,
        stop=None if stop is None else stop.check,
    )


SEED_COLUMNS = ('point', 'seed', 'eval_loss')  # what summary_seeds.csv holds, at least


def sweep_seeds(sweep_dir: str) -> list[dict]:
    """The sweep's per-seed losses (<sweep_dir>/summary_seeds.csv) as rows arm, seed, eval_loss;
    a one-line error naming the file for one without `SEED_COLUMNS`, without rows, or with a
    seed that is not a whole number or a loss that is not a number."""
    path = os.path.join(sweep_dir, 'summary_seeds.csv')
    if not os.path.isfile(path):
        raise FileNotFoundError(f'--sweep_dir: {path} does not exist (run the sweep first)')
    expected = f'expected the header {",".join(SEED_COLUMNS)} and a row per finished run'
    rerun = 'repeating the sweep command rewrites it'
    rows = []
    with open(path, newline='', errors='replace') as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if missing := [c for c in SEED_COLUMNS if c not in header]:
            got = f'has the header {",".join(header)}, without {",".join(missing)}'
            raise ValueError(
                f'--sweep_dir: {path} {got if header else "is empty"}: {expected}; {rerun}'
            )
        for r in reader:
            rows.append(_seed_row(r, f'{path} line {reader.line_num}'))
    if not rows:
        raise ValueError(f'--sweep_dir: {path} holds no rows: {expected}; {rerun}')
    return rows


def _seed_row(row: dict, where: str) -> dict:
    """One row of summary_seeds.csv as arm, seed, eval_loss; a one-line error naming `where`
    (the file and line) for a missing value, a seed that is not a whole number or a loss that
    is not a number."""
    if missing := [c for c in SEED_COLUMNS if not row[c]]:  # empty, or the row ends before it
        raise ValueError(f'--sweep_dir: {where}: no {missing[0]}')
    point, seed, loss = (row[c] for c in SEED_COLUMNS)
    try:
        seed = int(seed)
    except ValueError:
        raise ValueError(f'--sweep_dir: {where}: seed {seed!r} is not a whole number') from None
    try:
        loss = float(loss)
    except ValueError:
        raise ValueError(f'--sweep_dir: {where}: eval_loss {loss!r} is not a number') from None
    return {'arm': point, 'seed': seed, 'eval_loss': loss}


def point_runs(sweep_dir: str, point: str) -> dict[int, str]:
    """{seed: workdir} of the point's finished runs (`finished_runs`)."""
    return {seed: workdir for (arm, seed), workdir in finished_runs(sweep_dir) if arm == point}


def check_request(rows: list[dict], points: list[str], dtypes: list[str]) -> None:
    """One-line errors for cache dtypes that do not exist and points the sweep lacks (the dtypes
    first: --points has a default)."""
    if bad := [d for d in dtypes if d not in KV_CACHE_DTYPES or d == 'float']:
        raise ValueError(
            f'--kv_cache_dtypes: {bad} is not a quantized cache; choose from '
            f'{[d for d in KV_CACHE_DTYPES if d != "float"]}'
        )
    known = sorted({r['arm'] for r in rows})
    if unknown := [p for p in points if p not in known]:
        raise ValueError(f"--points: {unknown} not among the sweep's points {known}")


def quantized_rows(
    sweep_dir: str,
    points: list[str],
    dtypes: list[str],
    log: Callable[[str], None] = print,
    stop: StopRequest | None = None,
) -> list[dict]:
    """The sweep's rows, then for each point, seed and dtype the run's validation loss through
    that cache (arm `point+dtype`); the sweep's own runs, protocol and seeds."""
    rows = sweep_seeds(sweep_dir)
    check_request(rows, points, dtypes)
    todo = _requested_runs(sweep_dir, rows, points, dtypes)
    out = list(rows)
    for point, seed, workdir in todo:
        restored = assemble(workdir, state='params', step=result_step(workdir), data=True)
        for dtype in dtypes:
            loss = evaluate_run(restored, stop=stop, kv_cache_dtype=dtype)['loss']
            out.append({'arm': f'{point}+{dtype}', 'seed': seed, 'eval_loss': loss})
            log(f'{point} seed {seed} {dtype}: eval loss {loss:.4f}')
    return out


def _requested_runs(
    sweep_dir: str, rows: list[dict], points: list[str], dtypes: list[str]
) -> list[tuple[str, int, str]]:
    """[(point, seed, workdir)] of every run to evaluate, after checking (from the runs' saved
    configs, before any is evaluated) that each exists and decodes with every cache dtype."""
    todo = []
    for point in points:
        runs = point_runs(sweep_dir, point)
        for seed in sorted({r['seed'] for r in rows if r['arm'] == point}):
            if seed not in runs:
                raise FileNotFoundError(f'--sweep_dir: no finished run of {point} seed {seed}')
            config = stored_config(runs[seed], step=result_step(runs[seed]))
            cfg, window = model_config(config.model), 'a window of config.data.seq_len'
            for dtype in dtypes:
                try:
                    check_storage(cfg, dtype, config.data.seq_len, window)
                except ValueError as e:
                    where = f'--points: {point} ({runs[seed]}) with --kv_cache_dtypes={dtype}'
                    raise ValueError(f'{where}: {e}') from None
            todo.append((point, seed, runs[seed]))
    return todo


def finished_runs(sweep_dir: str) -> list[tuple[tuple[str, int], str]]:
    """[((arm, seed), workdir)] of the sweep's finished runs: the arm from the run's name
    (`runner.arm_and_seed`), the seed its config trained with (the fingerprint's, as the sweep's
    summary_seeds.csv pairs by: base `config.seed` + k for run `<arm>_s<k>`), by arm (in the
    order of summary_seeds.csv where there is one, then by name) and seed; a one-line error if
    there are none."""
    path = os.path.join(sweep_dir, 'summary_seeds.csv')
    order = [r['arm'] for r in sweep_seeds(sweep_dir)] if os.path.isfile(path) else []
    rank = {arm: i for i, arm in reversed(list(enumerate(order)))}  # each arm's first place
    found = []
    for name in os.listdir(sweep_dir):
        workdir = os.path.join(sweep_dir, name)
        if os.path.isdir(workdir) and (result := read_result(workdir)):
            found.append(((arm_and_seed(name)[0], _seed(result, workdir)), workdir))
    runs = sorted(found, key=lambda run: (rank.get(run[0][0], len(order)), run[0]))
    if not runs:
        run = directory_kind(sweep_dir) == A_RUN
        what = f' (it is {A_RUN}, not a sweep directory)' if run else ''
        raise FileNotFoundError(
            f'--sweep_dir: {sweep_dir} holds no finished run <arm>_s<seed>{what}'
        )
    return runs


def _seed(result: dict, workdir: str) -> int:
    """The config seed a sweep run's fingerprint (its whole config) records; a one-line error
    for a run of another kind of plan (an uptraining ablation's records its settings)."""
    saved = result.get('fingerprint', {})
    if 'seed' not in saved:
        held = ' (it holds an uptrain_ablation.py run)' if 'split' in saved else ''
        raise ValueError(
            f'--sweep_dir: {os.path.dirname(workdir)} is not a sweep directory: its run '
            f'{os.path.basename(workdir)} records no config seed{held}'
        )
    return int(saved['seed'])


# Data settings that change neither the text nor the windows a run is scored on.
NOT_SCORED = ('cache_dir', 'num_proc', 'sampling')


def check_one_task(runs: dict[str, dict], data: dict, overridden: set[str]) -> None:
    """One-line ValueError when a run (`runs`: run name -> its stored config.data as a dict)
    trained with a data setting other than `data`'s (e.g. recall pairs; NOT_SCORED aside) that
    `overridden` (the `data.<key>`s set on the command line) does not name: `data` would score
    it on another task than its own without anyone asking for it."""
    for name, got in runs.items():
        for key in sorted((set(got) | set(data)) - set(NOT_SCORED)):
            if f'data.{key}' not in overridden and not _same(key, got.get(key), data.get(key)):
                raise ValueError(
                    f'run {name} trained with data.{key}={got.get(key)!r} and --config has '
                    f'{data.get(key)!r}; set --config.data.{key} to score at that value anyway, '
                    'or give each group of runs its own --config'
                )


def _same(key: str, a: object, b: object) -> bool:
    """Whether two values of data setting `key` are one: paths name the same files however
    they are written ('configs/sweeps/../../data/x.txt' is 'data/x.txt')."""
    if key == 'path' and isinstance(a, str) and isinstance(b, str):
        return [os.path.realpath(p) for p in split_paths(a)] == [
            os.path.realpath(p) for p in split_paths(b)
        ]
    return a == b


def heldout_rows(
    runs: list[tuple[tuple[str, int], str]],
    data: ml_collections.ConfigDict,
    overridden: set[str] = frozenset(),
    log: Callable[[str], None] = print,
    stop: StopRequest | None = None,
) -> list[dict]:
    """Each of a sweep's finished runs (`finished_runs`) evaluated again with its data config
    replaced by `data` (e.g. a recall task's second held-out set, `recall_seed` 1), under the
    run's own protocol: rows point, seed, eval_loss (and eval_recall_accuracy for a recall run),
    as a sweep's summary_seeds.csv has them. A run whose own data differ from `data` outside
    `overridden` (the `data.<key>`s the caller set) is refused before any is evaluated
    (`check_one_task`)."""
    steps = [result_step(workdir) for _, workdir in runs]  # the results', not the newest
    configs = [stored_config(wd, step=step) for (_, wd), step in zip(runs, steps, strict=True)]
    names = [os.path.basename(workdir) for _, workdir in runs]
    trained = {n: c.data.to_dict() for n, c in zip(names, configs, strict=True)}
    check_one_task(trained, data.to_dict(), overridden)
    for name, config in zip(names, configs, strict=True):
        check_same_tokenizer(config.data, data, f'--config (run {name})')
    out = []
    for ((arm, seed), workdir), config, step in zip(runs, configs, steps, strict=True):
        config.data = data
        metrics = evaluate_run(
            assemble(config, state='params', workdir=workdir, step=step, data=True), stop=stop
        )
        row = {'point': arm, 'seed': seed, 'eval_loss': metrics['loss']}
        recall = metrics.get('recall_accuracy')
        if recall is not None:
            row['eval_recall_accuracy'] = recall
        out.append(row)
        log(
            f'{arm} seed {seed}: eval loss {metrics["loss"]:.4f}'
            + ('' if recall is None else f', recall accuracy {recall:.4f}')
        )
    return out


def pareto_rows(sweep_dir: str, rows: list[dict], panel: str) -> list[dict]:
    """`rows` (arm, seed, eval_loss) as per-seed rows of lm.experiments.pareto's table: each
    arm's KV-cache bytes per token of one evaluation window (bfloat16; a quantized arm's as
    stored, `kv_cache_bytes_per_context_token`), family 'float' or the cache dtype."""
    out, kv = [], {}
    for r in rows:
        point, _, cache = r['arm'].partition('+')
        if r['arm'] not in kv:
            config = stored_config(next(iter(point_runs(sweep_dir, point).values())))
            cfg, length = model_config(config.model), config.data.seq_len
            kv[r['arm']] = kv_cache_bytes_per_context_token(
                cfg, length, 'bfloat16', cache or 'float'
            )
        out.append(
            {
                'panel': panel,
                'family': cache or 'float',
                'label': r['arm'],
                'kv_cache_bytes_per_token': kv[r['arm']],
                'metric': 'eval/loss',
                'seed': r['seed'],
                'value': r['eval_loss'],
            }
        )
    return out
