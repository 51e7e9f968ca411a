"""The one evaluation protocol: every validation target scored once, against an unpadded
per-window reference; train.py's final eval equals eval.py's on the same checkpoint."""

import json
import math

import jax
import numpy as np
import pytest
from conftest import ROOT, read_scalars, tiny_train_config

from lm.config_migration import upgrade_config
from lm.data.corpus import eval_windows, window_targets
from lm.train.evaluation import batch_for_windows, eval_batch_size, evaluate, ratio_stderr
from lm.train.loop import train
from lm.train.run import assemble
from lm.train.step import init_state, make_eval_step, token_losses

WORDS = 'the of and to a in that is was he for it with as his on be at by I'.split()


@pytest.fixture
def words_text(tmp_path):
    """~40 kB of seeded random words; its 10% validation split ends in a partial window and a
    partial batch (checked below)."""
    rng = np.random.default_rng(0)
    path = tmp_path / 'words.txt'
    path.write_text(' '.join(rng.choice(WORDS, 10_001)) + '\n')
    return path


@pytest.mark.slow
def test_evaluate_matches_an_unpadded_per_window_reference(tmp_path, words_text):
    config = tiny_train_config(tmp_path, words_text, eval_batch_size=8)
    exp = assemble(config, data=True)
    val = exp.corpus.tokens['validation']
    starts = eval_windows(len(val), 16, 0)
    assert (len(val) - 1) % 16 and len(starts) % 8  # a partial window and a partial batch
    params = init_state(exp.ctx, exp.model_cfg, 0)['params']
    with jax.set_mesh(exp.ctx.mesh):
        got = evaluate(
            make_eval_step(exp.ctx),
            params,
            exp.corpus,
            'validation',
            batch_size=eval_batch_size(exp.config),
            seq_len=16,
            eval_tokens=0,
            batch_sharding=exp.ctx.batch_sharding,
        )
        # Reference: each window on its own, at its own length, no padding and no weights
        # (jitted: one program per length, not op by op per window).
        loss_sum = jax.jit(lambda p, tokens: token_losses(exp.ctx, p, tokens).sum())
        sums = np.array(
            [
                float(loss_sum(params, np.asarray(val[s : s + c + 1])[None]))
                for s, c in zip(starts, window_targets(len(val), starts, 16), strict=True)
            ]
        )
    counts = window_targets(len(val), starts, 16)
    assert got['tokens'] == counts.sum() == len(val) - 1
    np.testing.assert_allclose(got['loss'], sums.sum() / (len(val) - 1), rtol=1e-5)
    means = sums / counts
    w = len(sums)
    resid = sums - sums.sum() / counts.sum() * counts
    stderr = math.sqrt(w / (w - 1) * (resid**2).sum()) / counts.sum()
    np.testing.assert_allclose(got['loss_stderr'], stderr, rtol=1e-4)
    assert got['loss_stderr'] < np.std(means, ddof=1)  # a standard error, not the spread
    with jax.set_mesh(exp.ctx.mesh):  # a batch far past the windows: one batch of them all
        big = evaluate(
            make_eval_step(exp.ctx),
            params,
            exp.corpus,
            'validation',
            batch_size=2**20,  # 2**20 padded rows would take about 17 GB of logits
            seq_len=16,
            eval_tokens=0,
            batch_sharding=exp.ctx.batch_sharding,
        )
    np.testing.assert_allclose(big['loss'], got['loss'], rtol=1e-6)
    assert big['tokens'] == got['tokens']


class _Sharded:
    """A batch sharding over `shards` data-parallel shards (its `shard_shape` alone)."""

    def __init__(self, shards: int):
        self.shards = shards

    def shard_shape(self, shape):
        return (shape[0] // self.shards, *shape[1:])


@pytest.mark.parametrize(
    ('batch', 'windows', 'shards', 'expected'),
    [
        (2**20, 37, 1, 37),  # the windows alone
        (2**20, 37, 4, 40),  # rounded up to divide over the shards
        (8, 37, 4, 8),  # fewer rows than windows: unchanged
        (40, 40, 8, 40),
    ],
)
def test_an_eval_batch_past_the_windows_is_cut_to_them(batch, windows, shards, expected):
    assert batch_for_windows(batch, windows, _Sharded(shards), 16) == expected


def test_ratio_stderr_is_the_plain_stderr_for_equal_windows():
    sums = np.array([2.0, 4.0, 3.0, 7.0])
    # equal counts of 2: window means 1, 2, 1.5, 3.5; sample std 1.0801, / sqrt 4 = 0.54006
    np.testing.assert_allclose(ratio_stderr(sums, np.full(4, 2.0)), 0.5400617, rtol=1e-6)
    assert math.isnan(ratio_stderr(sums[:1], np.ones(1)))


@pytest.mark.slow
def test_train_final_eval_covers_the_whole_split(tmp_path, words_text):
    config = tiny_train_config(tmp_path, words_text, eval_batch_size=8)
    result = train(config, str(tmp_path / 'run'))
    final = json.loads((tmp_path / 'run' / 'results.json').read_text())['eval']
    assert final == result['eval']
    val_tokens = len(assemble(config, data=True).corpus.tokens['validation'])
    assert final['tokens'] == val_tokens - 1  # the whole split, every target once
    tb = tmp_path / 'run' / 'tb'
    assert sorted(read_scalars(tb, 'eval/loss_stderr')) == [4, 8]
    assert sorted(read_scalars(tb, 'eval_init/loss_stderr')) == [0]
    assert read_scalars(tb, 'eval/tokens')[8] == val_tokens - 1


def test_old_eval_batches_becomes_eval_tokens_of_the_same_cost():
    old = json.loads((ROOT / 'tests' / 'old_configs' / 'v1.json').read_text())
    old.update(eval_batches=3, train={**old['train'], 'batch_size': 4})
    old['data']['seq_len'] = 16
    config = upgrade_config(old)
    assert 'eval_batches' not in config and config.eval_tokens == 3 * 4 * 16
    assert upgrade_config({**old, 'eval_batches': 0}).eval_tokens == 0  # whole split stays
    assert config.eval_batch_size == 0


@pytest.mark.parametrize('key', ['eval_tokens', 'eval_batch_size'])
def test_negative_eval_settings_are_refused(tmp_path, words_text, key):
    with pytest.raises(ValueError, match=rf'^config.{key} must be >= 0, got -1$'):
        assemble(tiny_train_config(tmp_path, words_text, **{key: -1}), data=True)


def test_an_old_config_file_with_eval_batches_still_runs(tmp_path, words_text):
    config = tiny_train_config(tmp_path, words_text)
    config.eval_batches = 2  # as an old config file built on configs/base.py would set it
    exp = assemble(config, data=True)
    assert exp.config.eval_tokens == 2 * 4 * 16 and 'eval_batches' not in exp.config
    config.eval_tokens = 48  # an explicit eval_tokens wins
    assert assemble(config, data=True).config.eval_tokens == 48


@pytest.mark.slow
def test_eval_py_refuses_a_non_finite_loss(tmp_path, words_text):
    """A checkpoint whose parameters hold NaN (checksummed as saved: nothing is damaged) gives
    eval.py exit 1 and one line, not 'loss NaN' with exit 0 and invalid JSON."""
    from conftest import run_entry

    from lm.train.checkpoint import Checkpointer
    from lm.train.stored import checkpoint_meta

    config = tiny_train_config(tmp_path, words_text, **{'train.steps': 2})
    workdir = str(tmp_path / 'run')
    state = train(config, workdir)['state']
    run = assemble(workdir, state='restore')
    state = {**state, 'params': jax.tree.map(lambda p: p * np.nan, state['params'])}
    meta = checkpoint_meta(
        run.config, run.meta['data_fingerprint'], 3, run.ctx.abstract_state['params']
    )
    ckpt = Checkpointer(workdir)
    ckpt.save(3, state, meta)
    ckpt.wait()
    out = run_entry('eval.py', f'--workdir={workdir}')
    assert out.returncode == 1, out.stdout[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f'error: --workdir={workdir}: the loss of step 3 is nan (non-finite parameters or '
        'activations); nothing written'
    )
    assert not out.stdout.strip()  # no JSON line with NaN
