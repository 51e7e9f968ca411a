"""Evaluation through the decoding cache (lm/infer/cached_eval.py, eval.py --kv_cache_dtype):
token-by-token decoding of each window equals the training forward with a float cache, and an
int8 cache changes the loss by a little, not by nothing."""

import csv
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import read_scalars, run_entry, tiny_config, tiny_train_config

from lm.infer.cached_eval import cached_token_losses
from lm.infer.decode import Decoder
from lm.model.kv_cache import KV_CACHE_DTYPES
from lm.model.transformer import build_model, model_config


def forward_losses(model, batch_BT1: np.ndarray) -> np.ndarray:
    """[B, T] next-token nats from the full forward, log-softmax in float64 NumPy."""
    logits = np.asarray(model(jnp.asarray(batch_BT1[:, :-1])), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, batch_BT1[:, 1:, None], axis=-1)[..., 0]


@pytest.mark.parametrize(
    'overrides',
    [
        pytest.param({'attention': 'gqa', 'num_kv_heads': 2}, id='gqa2', marks=pytest.mark.slow),
        pytest.param({'attention': 'mla'}, id='mla', marks=pytest.mark.slow),
        pytest.param(
            {'attention': 'mha', 'sliding_window': 4, 'layer_pattern': 'LG'},
            id='mha_local',
            marks=pytest.mark.slow,
        ),
    ],
)
def test_float_cache_equals_the_forward_and_int8_differs_a_little(overrides):
    cfg = model_config(tiny_config(**overrides).model)
    model = build_model(cfg, seed=3)
    batch = np.asarray(jax.random.randint(jax.random.key(1), (3, 13), 0, cfg.vocab_size))
    want = forward_losses(model, batch)
    fl = Decoder(model, kv_cache_dtype='float')
    got = np.asarray(jax.jit(cached_token_losses, static_argnums=0)(fl, fl.params, batch))
    np.testing.assert_allclose(got, want, atol=2e-5)  # float32 forward vs float32 decoding
    q = Decoder(model, kv_cache_dtype='int8')
    quant = np.asarray(jax.jit(cached_token_losses, static_argnums=0)(q, q.params, batch))
    delta = np.abs(quant - want)
    assert delta.max() < 0.05 and delta[:, 1:].max() > 0  # token 0 attends only itself


@pytest.mark.slow
def test_a_stop_signal_cuts_a_cached_batch_short_within_a_token():
    """`stopped` (asked before each token) first True at token 5 of 12: the losses before it are
    the uninterrupted ones, those from it on are skipped (0), so a batch of long windows ends
    within a token of SIGTERM instead of after the whole batch."""
    cfg = model_config(tiny_config(attention='mha').model)
    model = build_model(cfg, seed=3)
    d = Decoder(model, kv_cache_dtype='float')
    batch = np.asarray(jax.random.randint(jax.random.key(1), (2, 13), 0, cfg.vocab_size))
    asked = []

    def stopped():
        asked.append(1)
        return len(asked) > 5

    cut = np.asarray(
        jax.jit(cached_token_losses, static_argnums=(0, 3))(d, d.params, batch, stopped)
    )
    np.testing.assert_allclose(cut[:, :5], forward_losses(model, batch)[:, :5], atol=2e-5)
    assert not cut[:, 5:].any() and len(asked) == 12


def test_kivi4_cache_costs_more_than_int8_and_its_residual_nothing():
    """GQA with groups of 4 tokens: 12 positions decode through 4-bit keys and values once
    their group is complete (the first 3 positions attend the float residual only, exactly)."""
    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2, kv_quant_group=4).model)
    model = build_model(cfg, seed=3)
    batch = np.asarray(jax.random.randint(jax.random.key(2), (3, 13), 0, cfg.vocab_size))
    want = forward_losses(model, batch)
    deltas = {}
    for dtype in ('int8', 'kivi4'):
        d = Decoder(model, kv_cache_dtype=dtype)
        got = np.asarray(jax.jit(cached_token_losses, static_argnums=0)(d, d.params, batch))
        deltas[dtype] = np.abs(got - want)
    np.testing.assert_allclose(deltas['kivi4'][:, :3], 0, atol=2e-5)  # group 0 not yet full
    assert deltas['kivi4'].max() < 0.3 and deltas['kivi4'].mean() > deltas['int8'].mean()


@pytest.mark.slow
def test_eval_py_and_cache_quality_through_quantized_caches(tmp_path, small_text):
    """A 2-seed tiny sweep; eval.py --kv_cache_dtype on one run logs its own tag (float equals
    the run's eval, int8 differs a little); scripts/cache_quality.py then pairs each seed's
    loss with its int8 one and counts each arm's cache bytes; bad requests are one line."""
    from conftest import sweep_file

    base = tiny_train_config(tmp_path, small_text, **{'train.steps': 6})
    cfg = sweep_file(tmp_path, base, [{'name': 'gqa'}, {'name': 'narrow', 'model.mlp_dim': 32}])
    sweep_dir, out = tmp_path / 'sw', tmp_path / 'seeds.csv'
    run_entry('scripts/sweep.py', f'--config={cfg}', f'--sweep_dir={sweep_dir}', '--seeds=2',
              check=True)  # fmt: skip
    _eval_py_through_the_cache(sweep_dir / 'gqa_s0')
    bad = run_entry('scripts/cache_quality.py', f'--sweep_dir={sweep_dir}', '--points=mla',
                    f'--out={out}')  # fmt: skip
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: --points: ['mla'] not among the sweep's points ['gqa', 'narrow']"
    )
    bad = run_entry('scripts/cache_quality.py', f'--sweep_dir={sweep_dir}', '--points=gqa',
                    '--kv_cache_dtypes=kivi4', f'--out={out}')  # fmt: skip
    want = (
        f'error: --points: gqa ({sweep_dir / "gqa_s0"}) with --kv_cache_dtypes=kivi4: '
        "kv_cache_dtype='kivi4' would quantise nothing: a window of config.data.seq_len (16 "
        'tokens) never completes a group'
    )
    assert bad.stderr.strip().splitlines()[-1].startswith(want)
    assert not out.exists()
    pareto = tmp_path / 'pareto.csv'
    args = ['--points=gqa', '--kv_cache_dtypes=int8', f'--out={out}', f'--pareto_table={pareto}']
    done = run_entry('scripts/cache_quality.py', f'--sweep_dir={sweep_dir}', *args, check=True)
    assert f'wrote {out}: 4 rows' in done.stdout  # those in --out, not the sweep's 'narrow' too
    rows = list(csv.DictReader(out.open()))
    assert [(r['arm'], r['seed']) for r in rows] == [
        ('gqa', '0'),
        ('gqa', '1'),
        ('gqa+int8', '0'),
        ('gqa+int8', '1'),
    ]
    loss = {(r['arm'], r['seed']): float(r['eval_loss']) for r in rows}
    for seed in ('0', '1'):
        assert 0 < abs(loss['gqa+int8', seed] - loss['gqa', seed]) < 0.02
    kv = {r['label']: int(r['kv_cache_bytes_per_token']) for r in csv.DictReader(pareto.open())}
    # 2 layers, K and V of 2 heads of 8: bf16 2 bytes each; int8 1 byte plus a bf16 scale per 8
    bf16 = 2 * 2 * 2 * 8 * 2
    assert kv == {'gqa': bf16, 'narrow': bf16, 'gqa+int8': 2 * 2 * 2 * (8 + 2)}


def _eval_py_through_the_cache(workdir) -> None:
    plain = json.loads(run_entry('eval.py', f'--workdir={workdir}', check=True).stdout)
    results = {}
    for dtype in ('float', 'int8'):
        out = run_entry('eval.py', f'--workdir={workdir}', f'--kv_cache_dtype={dtype}', check=True)
        results[dtype] = json.loads(out.stdout)
        assert results[dtype]['tag'] == f'eval_cache_{dtype}'
        assert results[dtype]['tokens'] == plain['tokens']
    assert abs(results['float']['loss'] - plain['loss']) < 1e-4
    kernel = run_entry(
        'eval.py',
        f'--workdir={workdir}',
        '--kv_cache_dtype=float',
        '--decode_kernel=xla',
        check=True,
    )
    assert json.loads(kernel.stdout)['loss'] == pytest.approx(results['float']['loss'], rel=1e-6)
    assert 0 < abs(results['int8']['loss'] - plain['loss']) < 0.02
    tb = workdir.parent / 'tb' / workdir.name
    assert read_scalars(tb, 'eval_cache_int8/loss') == {6: pytest.approx(results['int8']['loss'])}
    assert read_scalars(tb, 'eval/loss')[6] == pytest.approx(plain['loss'])
    bad = run_entry('eval.py', f'--workdir={workdir}', '--kv_cache_dtype=int3')
    assert bad.returncode != 0
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith(f"--kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got 'int3'")
    )


def test_a_sweeps_finished_runs_carry_the_seeds_they_trained_with(tmp_path):
    """cache_quality.finished_runs / point_runs: the arm from a run's name, the seed from its
    fingerprint, the seed summary_seeds.csv pairs by (here runs <arm>_s0 and _s1 trained with
    seeds 3 and 4, as sweeps named the runs of base config.seed 3 before runs were named by
    their seed), arms in summary_seeds.csv's order; unfinished runs and files left out."""
    from lm.experiments.cache_quality import finished_runs, point_runs

    for name, seed in [('mha_s0', 3), ('mha_s1', 4), ('mqa_s0', 3), ('mqa_s1', 4)]:
        (tmp_path / name).mkdir()
        result = {'eval': {'loss': 1.0}, 'fingerprint': {'seed': seed}}
        (tmp_path / name / 'result.json').write_text(json.dumps(result))
    (tmp_path / 'mla_s0').mkdir()  # started, not finished
    (tmp_path / 'summary.md').write_text('')
    rows = ['point,seed,eval_loss', 'mqa,3,1.0', 'mqa,4,1.0', 'mha,3,1.0', 'mha,4,1.0']
    (tmp_path / 'summary_seeds.csv').write_text('\n'.join(rows) + '\n')
    runs = finished_runs(str(tmp_path))
    assert [(key, os.path.basename(w)) for key, w in runs] == [
        (('mqa', 3), 'mqa_s0'),
        (('mqa', 4), 'mqa_s1'),
        (('mha', 3), 'mha_s0'),
        (('mha', 4), 'mha_s1'),
    ]
    assert point_runs(str(tmp_path), 'mha') == {
        3: str(tmp_path / 'mha_s0'),
        4: str(tmp_path / 'mha_s1'),
    }
    assert point_runs(str(tmp_path), 'mla') == {}
