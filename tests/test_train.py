"""The main job end to end at tiny size: train, log, checkpoint, resume, evaluate."""

import dataclasses
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    ENV,
    ROOT,
    entry_command,
    read_scalars,
    sigterm_while_training,
    simulated_devices_env,
    stdlib_text,
    tiny_config,
    tiny_train_config,
    write_config_file,
)
from conftest import run_entry as run_cli
from tensorboard.backend.event_processing import event_accumulator

from lm.config import with_values
from lm.train.checkpoint import Checkpointer, saved_steps
from lm.train.loop import call_sizes, train
from lm.train.run import assemble, check_config
from lm.train.step import init_state, make_train_step
from lm.train.stored import finished_step, restore, result_step, stored_config
from lm.train.workdir import RunError


@pytest.mark.slow
def test_eval_at_start_false_skips_the_step_0_evaluation_only(tmp_path, small_text):
    """config.eval_at_start=False: no eval_init scalars; the run trains and evaluates as one
    with it (same final loss, bitwise: the step-0 evaluation changes no state)."""
    ends = {}
    for at_start in (True, False):
        config = with_values(tiny_train_config(tmp_path, small_text), {'eval_at_start': at_start})
        workdir = tmp_path / f'run_{at_start}'
        ends[at_start] = train(config, str(workdir))['eval']['loss']
        tags = read_scalars(workdir / 'tb', 'eval/loss')
        assert sorted(tags) == [4, 8]
        if at_start:
            assert list(read_scalars(workdir / 'tb', 'eval_init/loss')) == [0]
        else:
            with pytest.raises(KeyError):
                read_scalars(workdir / 'tb', 'eval_init/loss')
    assert ends[True] == ends[False]


def test_train_logs_checkpoints_and_learns(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    result = train(config, str(tmp_path / 'run'))
    assert result['step'] == 8
    assert Checkpointer(str(tmp_path / 'run')).steps() == [4, 8]
    tb = tmp_path / 'run' / 'tb'
    assert sorted(read_scalars(tb, 'train/loss')) == list(range(1, 9))
    for tag in ('train/lr', 'train/grad_norm', 'perf/tokens_per_sec', 'perf/step_time'):
        assert read_scalars(tb, tag), tag
    if jax.devices()[0].platform == 'cpu':  # no stated peak, so no MFU (never a timed guess)
        with pytest.raises(KeyError):
            read_scalars(tb, 'perf/mfu')
    else:  # an accelerator in the peak table (a GPU run of the fast tier)
        assert all(0 < v <= 1 for v in read_scalars(tb, 'perf/mfu').values())
    evals, init = read_scalars(tb, 'eval/loss'), read_scalars(tb, 'eval_init/loss')
    assert sorted(evals) == [4, 8] and list(init) == [0]  # step 0 apart: it sets no y-range
    assert evals[8] < init[0] - 0.2
    np.testing.assert_allclose(
        read_scalars(tb, 'eval_init/perplexity')[0], np.exp(init[0]), rtol=1e-5
    )
    ppl, bpb = read_scalars(tb, 'eval/perplexity'), read_scalars(tb, 'eval/bits_per_byte')
    np.testing.assert_allclose(ppl[8], np.exp(evals[8]), rtol=1e-5)
    np.testing.assert_allclose(bpb[8], evals[8] / np.log(2), rtol=1e-3)  # bytes: 1 token/byte
    lrs = read_scalars(tb, 'train/lr')
    np.testing.assert_allclose([lrs[1], lrs[2], lrs[3]], [0, 1.5e-3, 3e-3], rtol=1e-5)
    # one event file per checkpoint (flushed before each save) and the HParams entry, read by
    # TensorBoard as one run (above); docs/experiments.md says so
    events = sorted(p.name for p in tb.iterdir() if 'tfevents' in p.name)
    assert len(events) == 2 + 1 and events[0] == 'events.out.tfevents.0.hparams', events
    assert 'one event file per checkpoint' in (ROOT / 'docs' / 'experiments.md').read_text()

    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    assert 'config/text_summary' in acc.Tags()['tensors']
    assert '_hparams_/session_start_info' in acc.PluginTagToContent('hparams')
    results = json.loads((tmp_path / 'run' / 'results.json').read_text())
    assert results['step'] == 8 and results['tokens_per_sec'] > 0
    head = subprocess.run(['git', '-C', str(ROOT), 'rev-parse', 'HEAD'], capture_output=True)
    by = results['trained_by']  # what trained it: this checkout, this JAX, this process's -O0
    assert by['commit'].partition('+')[0] == (
        head.stdout.decode().strip() if not head.returncode else ''
    )
    assert (by['jax'], by['backend'], by['optimized']) == (jax.__version__, 'cpu', False)
    assert by['devices'].startswith(f'{jax.device_count()} x ')
    np.testing.assert_allclose(results['eval']['loss'], evals[8], rtol=1e-6)
    # the run's own config decides the model
    restored = assemble(str(tmp_path / 'run'), state='restore')
    assert restored.step == 8 and restored.model_cfg.num_kv_heads == 2
    for a, b in zip(
        jax.tree.leaves(result['state']['params']),
        jax.tree.leaves(restored.state['params']),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    hparams = read_hparams(acc)
    num_params = sum(x.size for x in jax.tree.leaves(result['state']['params']))
    assert hparams == {  # few columns, what runs are compared by (the config is under Text)
        'attention': ('string_value', 'gqa'),
        'num_heads': ('number_value', 4),
        'num_kv_heads': ('number_value', 2),
        # 2 layers x (K and V) x 2 heads x 8 wide x 2 bytes (bfloat16)
        'kv_cache_bytes_per_token': ('number_value', 2 * 2 * 2 * 8 * 2),
        'params': ('number_value', num_params),
        'seed': ('number_value', 0),
        'lr': ('number_value', 3e-3),
        'steps': ('number_value', 8),
    }
    # the metric columns the dashboard shows: the final eval perplexity first
    assert read_metrics(acc)[:2] == ['eval/perplexity', 'eval/loss']


def read_metrics(acc) -> list[str]:
    """The metric columns of the run's experiment summary, in order."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent('hparams')['_hparams_/experiment']
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    return [m.name.tag for m in experiment.metric_infos]


def read_hparams(acc) -> dict:
    """The run's HParams as TensorBoard reads them: {name: (kind, value)} in logged order."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent('hparams')['_hparams_/session_start_info']
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent('hparams')['_hparams_/experiment']
    ).experiment
    out = {}
    for h in experiment.hparam_infos:
        value = info.hparams[h.name]
        kind = value.WhichOneof('kind')
        out[h.name] = (kind, getattr(value, kind))
    return out


@pytest.mark.slow
def test_grad_accumulation_matches_one_big_batch(tmp_path, small_text):
    exps = [
        assemble(
            tiny_train_config(tmp_path, small_text, **{'train.grad_accum_steps': a}), data=True
        )
        for a in (1, 2)
    ]
    batch = np.asarray(exps[0].corpus.tokens['train'][: 4 * 17], np.int32).reshape(4, 17)
    outs = []
    for exp, accum in zip(exps, (1, 2), strict=True):
        state = init_state(exp.ctx, exp.model_cfg, 0)
        outs.append(make_train_step(exp.ctx, accum)(state, batch))
    (s1, m1), (s2, m2) = outs
    # Mean of two half-batch means equals the full-batch mean: same to float32 rounding.
    np.testing.assert_allclose(m1['loss'], m2['loss'], rtol=1e-6)
    np.testing.assert_allclose(m1['grad_norm'], m2['grad_norm'], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s1['params']), jax.tree.leaves(s2['params']), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_call_sizes_end_a_call_at_every_boundary():
    sizes = list(call_sizes(0, 23, 4, (10,)))
    assert sizes == [4, 4, 1, 1, 4, 4, 1, 1, 1, 1, 1]
    ends = set(np.cumsum(sizes))
    assert {10, 20, 23} <= ends
    assert list(call_sizes(3, 12, 5, (6, 12))) == [1, 1, 1, 5, 1]  # resumed mid-interval
    assert list(call_sizes(0, 6, 1, (4,))) == [1] * 6
    assert list(call_sizes(8, 8, 4, (4,))) == []
    # one call size when a smaller one fits every boundary: one compiled step
    assert list(call_sizes(0, 15, 10, (5, 15))) == [5, 5, 5]
    assert list(call_sizes(2000, 2015, 10, (50, 200, 500))) == [5, 5, 5]  # an uptraining run
    assert list(call_sizes(0, 30, 10, (10, 20))) == [10, 10, 10]


@pytest.mark.slow
def test_fifteen_steps_at_ten_per_call_compile_one_train_step(tmp_path, small_text, caplog):
    overrides = {'train.steps': 15, 'train.steps_per_call': 10, 'log_every': 5}
    overrides.update(eval_every=15, checkpoint_every=15)
    caplog.set_level('INFO')
    result = train(tiny_train_config(tmp_path, small_text, **overrides), str(tmp_path / 'run'))
    assert result['step'] == 15
    compiled = [r.getMessage() for r in caplog.records if 'compiled the train step' in r.message]
    assert len(compiled) == 1 and '(5 step(s) per call)' in compiled[0], compiled


@pytest.mark.slow
def test_several_steps_per_call_train_the_same_run(tmp_path, small_text):
    runs = {}
    for k in (1, 3):  # k = 3 also accumulates 2 micro-batches: a scan inside the step scan
        config = tiny_train_config(
            tmp_path, small_text, **{'train.steps_per_call': k, 'train.grad_accum_steps': min(k, 2)}
        )
        result = train(config, str(tmp_path / f'k{k}'))
        assert result['step'] == 8
        assert Checkpointer(str(tmp_path / f'k{k}')).steps() == [4, 8]
        runs[k] = result, read_scalars(tmp_path / f'k{k}' / 'tb', 'train/loss')
    (r1, loss1), (r3, loss3) = runs[1], runs[3]
    assert sorted(loss3) == sorted(loss1) == list(range(1, 9))  # one point per step
    # A lax.scan over steps may fuse differently: equal to float32 rounding, not bitwise.
    np.testing.assert_allclose(
        [loss3[s] for s in range(1, 9)], [loss1[s] for s in range(1, 9)], rtol=1e-5
    )
    np.testing.assert_allclose(r3['eval']['loss'], r1['eval']['loss'], rtol=1e-5)
    for a, b in zip(
        jax.tree.leaves(r1['state']['params']), jax.tree.leaves(r3['state']['params']), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_kill9_then_resume_is_bitwise_identical(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 200, 'checkpoint_every': 25, 'eval_every': 100, 'log_every': 50},
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    ref = run_cli('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "ref"}')
    assert ref.returncode == 0, ref.stderr[-2000:]

    cmd = entry_command('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "run"}')
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while not (tmp_path / 'run' / 'checkpoints' / '25').exists():
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.kill()  # SIGKILL, mid-way
    proc.wait()
    assert not (tmp_path / 'run' / 'checkpoints' / '200').exists(), 'run finished before kill'
    resumed = run_cli('train.py', *cmd[2:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert 'resumed from' in resumed.stderr
    want = read_scalars(tmp_path / 'ref' / 'tb', 'train/loss')
    got = read_scalars(tmp_path / 'run' / 'tb', 'train/loss')
    assert sorted(got) == sorted(want) == list(range(1, 201))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(want)]  # bitwise


@pytest.mark.slow
def test_sigterm_saves_current_step_and_exits_cleanly(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 100_000, 'checkpoint_every': 50_000, 'eval_every': 50_000},
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    code, err = sigterm_while_training(
        'train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "run"}'
    )
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert 'SIGTERM at step' in err and 'Traceback' not in err
    steps = Checkpointer(str(tmp_path / 'run')).steps()
    assert len(steps) == 1 and 0 < steps[0] < 100_000
    assert max(read_scalars(tmp_path / 'run' / 'tb', 'train/loss')) == steps[0]


@pytest.fixture
def big_validation(tmp_path):
    """1.5 MB of standard-library source: a validation split of ~150k tokens, whose whole-split
    evaluation takes ~2 s with the tiny model alone (4x the 0.5 s after which the tests stop it;
    longer beside other tests)."""
    path = tmp_path / 'big.txt'
    path.write_text(stdlib_text(1_500_000))
    return path


@pytest.mark.slow
@pytest.mark.parametrize('evaluation', ['first', 'at_step_4', 'at_the_last_step'])
def test_sigterm_during_evaluation_saves_the_step_and_exits_at_once(
    tmp_path, big_validation, evaluation
):
    """A stop during an evaluation saves the step and exits; resuming repeats that evaluation
    (the checkpoint says it was cut short) and, at the last step, writes results.json: before,
    a stop during the final evaluation left a run that could never finish."""
    first = evaluation == 'first'  # else no step-0 evaluation: one long evaluation less
    config = tiny_train_config(
        tmp_path,
        big_validation,
        **{'train.steps': 8, 'eval_every': 4, 'checkpoint_every': 8, 'eval_tokens': 0},
        eval_at_start=first,
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    t = time.time()
    args = (f'--config={cfg_file}', f'--workdir={tmp_path / "run"}')
    times = {'first': 1, 'at_step_4': 1, 'at_the_last_step': 2}[evaluation]
    code, err = sigterm_while_training(
        'train.py', *args, marker='evaluating the validation split', times=times, delay=0.5
    )  # the step-0 eval, the one at step 4 or the final one at step 8
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert 'Traceback' not in err
    if first:
        assert 'stopped by SIGTERM during the first evaluation: nothing trained' in err
        assert Checkpointer(str(tmp_path / 'run')).steps() == []
        return
    step = 4 if evaluation == 'at_step_4' else 8
    assert f'SIGTERM at step {step}: checkpoint saved' in err
    assert Checkpointer(str(tmp_path / 'run')).steps() == [step]  # the latest completed step
    assert not (tmp_path / 'run' / 'results.json').exists()
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', '--eval_tokens=64')
    assert out.returncode == 0, out.stderr[-2000:]  # the saved step restores
    run_cli('train.py', *args, check=True)
    evals = read_scalars(tmp_path / 'run' / 'tb', 'eval/loss')
    assert sorted(evals) == [4, 8]  # the cut evaluation repeated on resume
    results = json.loads((tmp_path / 'run' / 'results.json').read_text())
    assert results['step'] == 8 and results['eval']['loss'] == pytest.approx(evals[8], rel=1e-6)
    again = run_cli('train.py', *args, check=True)  # finished: nothing to do
    assert 'is already at train.steps=8: nothing to do' in again.stdout
    assert time.time() - t < 400


@pytest.mark.slow
def test_sigterm_stops_eval_py_between_batches_writing_nothing(tmp_path, big_validation):
    config = tiny_train_config(tmp_path, big_validation, **{'train.steps': 2, 'eval_tokens': 64})
    train(config, str(tmp_path / 'run'))
    events = sorted((tmp_path / 'run' / 'tb').iterdir())
    code, err = sigterm_while_training(
        'eval.py',
        f'--workdir={tmp_path / "run"}',
        '--eval_tokens=0',
        marker='evaluating the validation split',
        delay=0.5,
    )
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == 'stopped by SIGTERM; nothing written'
    assert sorted((tmp_path / 'run' / 'tb').iterdir()) == events


@pytest.mark.slow
def test_truncated_latest_checkpoint_falls_back(tmp_path, small_text, caplog):
    config = tiny_train_config(tmp_path, small_text)
    workdir = str(tmp_path / 'run')
    first = train(config, workdir)
    state_dir = tmp_path / 'run' / 'checkpoints' / '8' / 'state'
    for f in state_dir.rglob('*'):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncate every file
    exp = assemble(config, data=True)
    step, state, _ = restore(Checkpointer(workdir), exp.ctx)
    assert step == 4 and 'unreadable' in caplog.text
    # Resuming trains 4 -> 8 again and lands on the same parameters as before.
    again = train(config, workdir)
    for a, b in zip(
        jax.tree.leaves(first['state']['params']),
        jax.tree.leaves(again['state']['params']),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_nonfinite_loss_stops_naming_the_step_and_saves_nothing(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, **{'train.lr': 1e30, 'train.grad_clip': 0.0})
    with pytest.raises(FloatingPointError, match=r'non-finite .* at step \d+; stopping without'):
        train(config, str(tmp_path / 'run'))
    assert Checkpointer(str(tmp_path / 'run')).steps() == []


@pytest.mark.slow
def test_eval_py_matches_training_eval_and_logs_to_the_run(tmp_path, small_text):
    """eval.py is the run's own evaluation on its own data; other token counts, windows, splits
    and a text read as another file (a relative path from elsewhere, a file changed since) are
    logged under their own tags, never the run's eval."""
    text = tmp_path / 'text.txt'
    text.write_text(small_text.read_text())
    config = tiny_train_config(tmp_path, text)
    train(config, str(tmp_path / 'run'), str(tmp_path / 'tb'))  # a shared TensorBoard directory
    logdir = tmp_path / 'tb' / 'run'  # eval.py logs there too: one run shows up once
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}')
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # One evaluation protocol (lm.train.evaluation): eval.py on the run's own validation split is
    # the
    # same measurement as the in-training eval, so it writes the same tag and value.
    assert result['step'] == 8 and result['tag'] == 'eval'
    for noise in ('libtpu', 'read only'):  # startup noise is gone
        assert noise not in out.stderr, out.stderr
    tb = read_scalars(logdir, 'eval/loss')
    np.testing.assert_allclose(result['loss'], tb[8], rtol=1e-6)
    final = json.loads((tmp_path / 'run' / 'results.json').read_text())['eval']
    assert result['tokens'] == final['tokens']  # the whole split, as in training
    np.testing.assert_allclose(result['loss_stderr'], final['loss_stderr'], rtol=1e-6)
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', '--eval_tokens=32')  # another set
    assert out.returncode == 0, out.stderr[-2000:]
    other = json.loads(out.stdout.strip().splitlines()[-1])
    assert other['tag'] == 'eval_tokens32' and other['tokens'] == 32
    np.testing.assert_allclose(
        read_scalars(logdir, 'eval_tokens32/loss')[8], other['loss'], rtol=1e-6
    )
    assert read_scalars(logdir, 'eval/loss') == tb  # training's curve untouched
    shorter = write_config_file(with_values(config, {'data.seq_len': 8}), tmp_path / 'seq8.py')
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', f'--config={shorter}')
    assert out.returncode == 0, out.stderr[-2000:]  # the same tokens in shorter windows
    assert json.loads(out.stdout.strip().splitlines()[-1])['tag'] == 'eval_seq_len8'
    assert read_scalars(logdir, 'eval/loss') == tb
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', '--step=4', '--split=train')
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result['step'] == 4 and result['tag'].endswith('_train')
    assert read_scalars(logdir, f'{result["tag"]}/perplexity')[4] > 1
    assert not (tmp_path / 'run' / 'tb').exists()
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', f'--tb_dir={tmp_path / "tb2"}')
    assert out.returncode == 0, out.stderr[-2000:]  # another shared tb_dir: its run claimed there
    owner = json.loads((tmp_path / 'tb2' / 'run' / 'workdir.json').read_text())
    assert owner['workdir'] == str((tmp_path / 'run').resolve())
    text.write_text(small_text.read_text()[::-1])  # the run's data config, another text
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}')
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result['tag'].startswith('eval_text_') and result['tag'].endswith('_validation')
    assert "warning: the run's data as read here" in out.stderr
    assert 'logged as other data' in out.stderr
    assert read_scalars(logdir, 'eval/loss') == tb
    # training on from it would mix two texts in one run: refused unless asked for
    out = run_cli('train.py', f'--workdir={tmp_path / "run"}', '--config.train.steps=12')
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith(
        f'error: --workdir: {tmp_path / "run"} trained to step 8 on other data than it reads '
        'here (fingerprint '
    ), out.stderr[-2000:]
    assert saved_steps(str(tmp_path / 'run'))[-1] == 8


@pytest.mark.slow
def test_checkpoints_saved_under_an_older_config_schema_still_load(tmp_path, small_text):
    """Checkpoint side-cars rewritten to hold only the keys of the frozen v1 config (what a
    checkpoint of that version saved): resume, restore and eval.py all still work."""
    old = json.loads((ROOT / 'tests' / 'old_configs' / 'v1.json').read_text())

    def keep_old_keys(saved, frozen):
        return {
            k: keep_old_keys(v, frozen[k]) if isinstance(v, dict) else v
            for k, v in saved.items()
            if k in frozen
        }

    config = tiny_train_config(tmp_path, small_text, **{'train.steps_per_call': 2})
    train(config, str(tmp_path / 'run'))
    for meta_file in (tmp_path / 'run' / 'checkpoints').glob('*/meta/metadata'):
        meta = json.loads(meta_file.read_text())
        meta['config'] = keep_old_keys(meta['config'], old)
        assert 'steps_per_call' not in meta['config']['train']
        meta['config']['eval_batches'] = 1  # replaced by eval_tokens
        del meta['meta_checksum']  # v1 side-cars had none
        meta_file.write_text(json.dumps(meta))
    saved = stored_config(str(tmp_path / 'run'))
    assert saved.train.steps_per_call == 1 and saved.compilation_cache_dir == ''
    assert saved.eval_tokens == 1 * 4 * 16 and 'eval_batches' not in saved  # same cost, spread
    assert assemble(str(tmp_path / 'run'), state='restore').step == 8
    assert train(saved, str(tmp_path / 'run'))['step'] == 8  # resume path, nothing left to do
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}', '--eval_tokens=64')
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow
def test_second_launch_loads_compiled_steps_from_the_cache(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, compilation_cache_dir=str(tmp_path / 'xla'))
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    tallies = []
    for run in ('first', 'second'):
        out = run_cli('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / run}')
        assert out.returncode == 0, out.stderr[-2000:]
        line = [ln for ln in out.stderr.splitlines() if 'persistent compilation cache' in ln][-1]
        tallies.append(tuple(map(int, re.search(r'(\d+) hits, (\d+) misses', line).groups())))
    (hits1, misses1), (hits2, misses2) = tallies
    assert hits1 == 0 and misses1 > 0
    assert misses2 == 0 and hits2 == misses1  # every compile of the relaunch came from disk
    assert any((tmp_path / 'xla').glob('jit_step-*'))


def one_line_error(proc):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    return lines[-1]


@pytest.mark.slow
def test_cli_errors_are_one_line_and_early(tmp_path, small_text):
    def run(config, *extra, env=None):
        cfg_file = write_config_file(config, tmp_path / 'cfg.py')
        return one_line_error(
            run_cli(
                'train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "w"}', *extra, env=env
            )
        )

    base = tiny_train_config(tmp_path, small_text)
    missing = tiny_train_config(tmp_path, tmp_path / 'nope.txt')
    assert run(missing) == f"error: config.data.path: '{tmp_path / 'nope.txt'}' does not exist"
    (tmp_path / 'empty.txt').write_text('')
    assert 'is empty' in run(tiny_train_config(tmp_path, tmp_path / 'empty.txt'))
    (tmp_path / 'tiny.txt').write_text('x' * 60)  # 54 + 1 training tokens: a batch needs 65
    assert 'train split has 55 tokens, fewer than one batch' in run(
        tiny_train_config(tmp_path, tmp_path / 'tiny.txt')
    )
    assert 'nonexistent' in run(base, '--config.model.nonexistent=1')
    assert 'attention must be one of' in run(base, '--config.model.attention=linear')
    assert run(base, '--config.train.steps_per_call=0') == (
        'error: config.train.steps_per_call must be > 0, got 0'
    )
    (tmp_path / 'a_file').write_text('')
    assert run(base, f'--config.compilation_cache_dir={tmp_path / "a_file" / "xla"}').startswith(
        f"error: config.compilation_cache_dir='{tmp_path / 'a_file' / 'xla'}' cannot be created"
    )
    assert run(base, f'--config.compilation_cache_dir={tmp_path / "a_file"}') == (
        f"error: config.compilation_cache_dir='{tmp_path / 'a_file'}' is a file, not a directory"
    )
    odd = tiny_train_config(tmp_path, small_text, **{'train.batch_size': 3})
    two_devices = simulated_devices_env(2)
    assert 'must be divisible by the data-parallel size 2' in run(odd, env=two_devices)
    train(base, str(tmp_path / 'w'))
    wider = tiny_train_config(tmp_path, small_text, **{'model.d_model': 48})
    assert run(wider).startswith(  # refused as a config change first (tests/test_integrity.py)
        f'error: the checkpoint in {tmp_path / "w" / "checkpoints"} was trained with a different'
    )
    msg = run(wider, '--allow_config_change')
    assert msg.startswith('error: the checkpoint in') and (
        'parameter blocks/0/attn/k_proj/kernel has shape (32, 2, 8) there but (48, 2, 12)' in msg
    )
    assert Checkpointer(str(tmp_path / 'w')).steps() == [4, 8]  # nothing lost


@pytest.mark.slow
def test_two_cpu_devices_train_and_evaluate_a_whole_split(tmp_path, small_text):
    """config.mesh.cpu_devices=2: data parallel over two CPU devices, and eval.py over every
    validation batch (many multi-device executions in a row) finishes."""
    config = tiny_train_config(tmp_path, small_text, **{'mesh.cpu_devices': 2, 'train.steps': 4})
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    out = run_cli('train.py', f'--config={cfg_file}', f'--workdir={tmp_path / "run"}')
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'on 2 devices' in out.stderr
    out = run_cli('eval.py', f'--workdir={tmp_path / "run"}')
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])['loss'] > 0


def test_mfu_is_against_a_stated_peak_and_never_over_100_percent(monkeypatch):
    from lm.train import perf

    cpu = type('D', (), {'platform': 'cpu', 'device_kind': 'cpu'})()
    with monkeypatch.context() as m:  # a CPU has no stated peak (on any machine running this)
        m.setattr(jax, 'devices', lambda: [cpu])
        assert perf.peak_flops()[0] == 0.0 and 'config.train.peak_flops' in perf.peak_flops()[1]
    total, source = perf.peak_flops(2e9)
    assert total == 2e9 * jax.device_count() and source.startswith('stated 2e+09 FLOP/s')
    assert perf.mfu(100.0, 1e6, 1e9) == pytest.approx(0.1, rel=1e-12)  # 1e8 / 1e9
    assert perf.mfu(100.0, 1e6, 0.0) is None  # no stated peak
    assert perf.mfu(100.0, 1e6, 5e7) is None  # 200%: the stated peak is wrong
    monkeypatch.setattr(
        jax,
        'devices',
        lambda: [type('D', (), {'platform': 'gpu', 'device_kind': 'NVIDIA H100 80GB HBM3'})()],
    )
    monkeypatch.setattr(jax, 'device_count', lambda: 8)
    assert perf.peak_flops() == (8 * 989e12, 'table: NVIDIA H100 80GB HBM3 x 8')


def test_the_decode_roofline_never_passes_its_reference():
    """add_roofline by hand: GB/s = bytes / time; a row faster than the measured reference raises
    it to that row's rate (so the fastest reads at 100%, none above); speedups and bytes ratios
    against the baseline row of the same batch and context, None where there is none."""
    from lm.train import perf

    def row(variant, context, ms, read):
        return {
            'variant': variant,
            'context': context,
            'batch': 1,
            'ms_per_step': ms,
            'bytes_per_step': read,
        }

    reference = {'copy': 2e9, 'read': 1e9, 'reference': 2e9, 'spec': None}
    rows = [row('base', 8, 4.0, 4e6), row('small', 8, 2.5, 1e6), row('small', 16, 1.0, 3e6)]
    used = perf.add_roofline(rows, reference, baseline='base')
    assert [r['achieved_GBps'] for r in rows] == pytest.approx([1.0, 0.4, 3.0])
    assert used['reference'] == pytest.approx(3e9) and used['raised_by'] == ('small', 16, 1)
    assert [r['fraction_of_bandwidth'] for r in rows] == pytest.approx([1 / 3, 0.4 / 3, 1.0])
    assert rows[1]['speedup_vs_mha'] == pytest.approx(1.6)  # 4.0 / 2.5 ms
    assert rows[1]['predicted_speedup'] == pytest.approx(4.0)  # 4e6 / 1e6 bytes
    assert rows[1]['fraction_of_predicted'] == pytest.approx(0.4)
    assert rows[2]['speedup_vs_mha'] is None  # no baseline row at context 16
    assert 'raised to the small row at context 16, batch 1' in perf.reference_text(used)
    slow = [row('base', 8, 40.0, 4e6)]  # 0.1 GB/s: the measured reference stands
    used = perf.add_roofline(slow, reference, baseline='base')
    assert used['raised_by'] is None and slow[0]['fraction_of_bandwidth'] == pytest.approx(0.05)
    assert 'raised' not in perf.reference_text(used)


@pytest.mark.slow
def test_an_eval_at_a_checkpoint_is_on_disk_before_the_checkpoint(
    tmp_path, small_text, monkeypatch
):
    """A kill -9 right after a checkpoint is published keeps that step's eval point: the eval
    runs before the save, whose flush writes it (read from disk inside the save)."""
    seen = {}
    save = Checkpointer.save

    def spying_save(self, step, state, meta):
        seen[step] = read_scalars(tmp_path / 'run' / 'tb', 'eval/loss')
        return save(self, step, state, meta)

    monkeypatch.setattr(Checkpointer, 'save', spying_save)
    train(tiny_train_config(tmp_path, small_text), str(tmp_path / 'run'))
    assert sorted(seen) == [4, 8] and sorted(seen[4]) == [4] and sorted(seen[8]) == [4, 8]


@pytest.mark.slow
def test_rerunning_a_finished_run_does_nothing_at_once(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, **{'train.steps': 4, 'checkpoint_every': 4})
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    work = tmp_path / 'run'
    train(config, str(work))
    before = sorted((p.relative_to(work), p.stat().st_mtime_ns) for p in work.rglob('*'))
    out = run_cli('train.py', f'--config={cfg_file}', f'--workdir={work}')
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        out.stdout.strip().splitlines()[-1] == f'{work} is already at train.steps=4: nothing to do'
    )
    assert 'compiled' not in out.stderr  # no restore, no compile
    assert sorted((p.relative_to(work), p.stat().st_mtime_ns) for p in work.rglob('*')) == before
    assert finished_step(config, str(work)) == 4
    assert finished_step(with_values(config, {'eval_every': 2}), str(work)) == 4  # resumable key
    assert finished_step(with_values(config, {'train.lr': 0.5}), str(work)) is None  # refused later
    assert finished_step(with_values(config, {'train.steps': 6}), str(work)) is None  # goes on
    results = json.loads((work / 'results.json').read_text())
    (work / 'results.json').write_text(json.dumps({**results, 'step': 2}))  # a shorter run's
    assert finished_step(config, str(work)) is None  # its final evaluation is owed


@pytest.mark.slow
def test_the_tensorboard_writer_does_not_import_pytorch(tmp_path):
    """tensorboardX's writer imports torch where installed (seconds of every run's start-up)
    only to accept torch tensors; the run's writer gets it without. A fresh process: this one
    may hold torch from the HF tests."""
    code = (
        'import sys\n'
        'from lm.train.summary import Summary\n'
        f'Summary({str(tmp_path)!r}).scalars(0, {{"a": 1.0}})\n'
        'assert "tensorboardX" in sys.modules and "torch" not in sys.modules\n'
    )
    out = subprocess.run(
        [sys.executable, '-c', code], env=ENV, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(tmp_path.glob('events.out.tfevents.*'))


def test_xla_options_reach_the_train_steps_compile_and_unknown_ones_are_refused_first(
    tmp_path, small_text, monkeypatch
):
    """config.train.xla_options: parsed into the step context, given to the train step's
    compile (an unknown option planted in the context fails that compile, so they reach it),
    and refused with the setting named before any data is read when malformed or unknown."""
    options = 'xla_cpu_multi_thread_eigen=false xla_gpu_enable_triton_gemm=false'
    config = tiny_train_config(tmp_path, small_text, **{'train.xla_options': options})
    ctx = assemble(config, data=True).ctx
    assert ctx.xla_options == (
        ('xla_cpu_multi_thread_eigen', False),
        ('xla_gpu_enable_triton_gemm', False),  # a GPU option: accepted, ignored on a CPU
    )
    planted = dataclasses.replace(ctx, xla_options=(('xla_no_such_option', True),))
    batch = jax.ShapeDtypeStruct((4, 17), jnp.int32, sharding=ctx.batch_sharding)
    with jax.set_mesh(ctx.mesh):
        lowered = make_train_step(planted, 1).lower(ctx.abstract_state, batch)
        with pytest.raises(Exception, match="No such compile option: 'xla_no_such_option'"):
            lowered.compile()
    for spec, pattern in (
        ('xla_no_such_option=true', r"^config.train.xla_options: .*'xla_no_such_option'"),
        ('x', r"^config.train.xla_options='x': 'x' is not key=value$"),
        ('a=1,b=2', r"^config.train.xla_options='a=1,b=2': 'a=1,b=2' holds a second option"),
    ):
        bad = with_values(config, {'train.xla_options': spec})
        monkeypatch.setattr('lm.train.run.load_corpus', lambda _: pytest.fail('data was read'))
        with pytest.raises(ValueError, match=pattern):
            assemble(bad, data=True)
    with pytest.raises(ValueError, match=r"^config.train.xla_options='x': 'x' is not key=value$"):
        check_config(with_values(config, {'train.xla_options': 'x'}))  # the form, without devices


def test_result_step_is_the_results_and_refused_when_its_checkpoint_is_gone(tmp_path):
    """Analyses of a finished run restore its results.json's step, not the newest checkpoint (a
    run resumed past its result trains on); that step's checkpoint gone: a one-line refusal."""
    (tmp_path / 'checkpoints' / '30').mkdir(parents=True)
    assert result_step(str(tmp_path)) is None  # no results.json: the newest
    (tmp_path / 'results.json').write_text(json.dumps({'step': 30}))
    assert result_step(str(tmp_path)) == 30
    (tmp_path / 'results.json').write_text(json.dumps({'step': 20}))
    with pytest.raises(FileNotFoundError, match=r'is for step 20, but its checkpoints'):
        result_step(str(tmp_path))


@pytest.mark.slow
def test_a_workdir_past_train_steps_is_refused_in_one_line(tmp_path, small_text):
    """Resuming with train.steps below the workdir's checkpoint would train nothing and leave
    its old results.json standing for a config it does not match: refused, naming both steps."""
    config = tiny_train_config(tmp_path, small_text)
    train(config, str(tmp_path / 'run'))
    with pytest.raises(RunError, match=r'holds a checkpoint at step 8, past config.train.steps=4'):
        train(with_values(config, {'train.steps': 4}), str(tmp_path / 'run'))


def test_a_resume_that_moves_the_learning_rate_is_told_how_to_keep_it():
    """Resuming a finished 200-step run for 300 steps moves the cosine's end (decay_steps 0):
    the rate at step 200 jumps from min_lr back up; the warning names both rates and the
    decay_steps that keeps the old decay, with which nothing moves."""
    from lm.train.optimizer import schedule_moved

    saved = tiny_config().train
    saved.update(steps=200, warmup_steps=100, lr=1e-3, min_lr=1e-4, decay_steps=0)
    longer = with_values(tiny_config(), {}).train
    longer.update(steps=300, warmup_steps=100, lr=1e-3, min_lr=1e-4, decay_steps=0)
    moved = schedule_moved(saved, longer, 200)
    assert moved.startswith('resuming at step 200 moves the learning rate there from 0.0001 to')
    assert 'to 0.00055 (config.train.steps 200 -> 300' in moved
    assert 'config.train.decay_steps=200 keeps the old decay' in moved
    longer.decay_steps = 200
    assert schedule_moved(saved, longer, 200) is None
    assert schedule_moved(saved, saved, 150) is None


@pytest.mark.slow
def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path, small_text):
    """A session killed past its last checkpoint logged steps its resumption logs again; the
    resumption marks where it starts (a SessionLog START), so TensorBoard shows each step once,
    the resumed values, and keeps the evaluation of the checkpoint it resumed from."""
    config = tiny_train_config(tmp_path, small_text, **{'train.steps': 10})
    train(config, str(tmp_path / 'run'))
    tb = tmp_path / 'run' / 'tb'
    before = read_scalars(tb, 'train/loss')
    shutil.rmtree(tmp_path / 'run' / 'checkpoints' / '10')  # killed after step 10's logs
    # TensorBoard reads event files in name order, named by the second each was opened: a
    # restarted process opens its first in a later second than the killed one's last
    time.sleep(1.1)
    train(config, str(tmp_path / 'run'))
    acc = event_accumulator.EventAccumulator(str(tb), size_guidance={'scalars': 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars('train/loss')] == list(range(1, 11))
    assert [e.step for e in acc.Scalars('eval/loss')] == [4, 8, 10]
    assert [e.step for e in acc.Scalars('eval_init/loss')] == [0]
    # each session's config at the step it starts from (was: every session's at step 0)
    assert [e.step for e in acc.Tensors('config/text_summary')] == [0, 8]
    assert read_hparams(acc)['attention'] == ('string_value', 'gqa')  # step 0's HParams kept
    assert read_scalars(tb, 'train/loss') == before  # bitwise on the CPU: the same values


def test_a_shared_tb_dir_run_belongs_to_one_workdir(tmp_path):
    """Two runs of one name in a shared --tb_dir would log into one TensorBoard run: the second
    is refused while the first's workdir exists; the same run again, a run moved away, or runs
    in their own <workdir>/tb are not."""
    from lm.train.summary import check_logdir_owner, claim_logdir

    tb, a, b = str(tmp_path / 'tb'), tmp_path / 'a' / 'mha', tmp_path / 'b' / 'mha'
    a.mkdir(parents=True)
    claim_logdir(str(a), tb)
    claim_logdir(str(a), tb)  # its own run again
    check_logdir_owner(str(b), '', '--tb_dir')  # its own <workdir>/tb
    with pytest.raises(ValueError, match=rf'^--tb_dir: {tb}/mha is the TensorBoard run of {a};'):
        claim_logdir(str(b), tb)
    a.rename(tmp_path / 'a' / 'gone')  # the owner moved away: its name is free
    claim_logdir(str(b), tb)
    assert json.loads((tmp_path / 'tb' / 'mha' / 'workdir.json').read_text()) == {
        'workdir': str(b.resolve()),
        'logdir': str((tmp_path / 'tb' / 'mha').resolve()),
    }


def test_event_files_of_one_second_never_overwrite_each_other(tmp_path, monkeypatch):
    """tensorboardX names an event file by the second and the host: a second writer of that
    second (eval.py right after another eval.py on one run) truncated the first's file, and its
    scalars were gone (a test saw it now and then). Each keeps its own file now."""
    import time

    from lm.train.summary import Summary

    monkeypatch.setattr(time, 'time', lambda: 1_764_576_000.5)  # one second for every file
    for tag in ('eval_cache_int8/loss', 'eval_cache_float/loss', 'eval/loss'):
        tb = Summary(str(tmp_path))
        tb.scalars(6, {tag: 1.0})
        tb.close()
        tb.scalars(7, {tag: 2.0})  # a second file of this writer, also in that second
        tb.close()
    monkeypatch.undo()
    for tag in ('eval_cache_int8/loss', 'eval_cache_float/loss', 'eval/loss'):
        assert read_scalars(tmp_path, tag) == {6: 1.0, 7: 2.0}


def test_a_resumed_run_keeps_its_tb_dir(tmp_path):
    """A resumed run given another --tb_dir is refused while the directory it logged to holds
    its curves (the same one, or none, is taken); once that directory is gone, the new one is."""
    from lm.train.summary import check_tb_dir_kept
    from lm.train.workdir import remember_tb_dir

    run, shared = tmp_path / 'run', tmp_path / 'shared'
    run.mkdir()
    check_tb_dir_kept(str(run), str(shared))  # a run that has not started: any directory
    remember_tb_dir(str(run), '')
    (run / 'tb').mkdir()
    check_tb_dir_kept(str(run), str(shared))  # nothing logged yet
    (run / 'tb' / 'events.out').write_text('curves')
    refused = rf"^--tb_dir='{shared}': the run in {run} has logged to {run}/tb so far; "
    with pytest.raises(ValueError, match=refused + r'.* \(none\) so its curves stay in one run$'):
        check_tb_dir_kept(str(run), str(shared))
    check_tb_dir_kept(str(run), '')  # the remembered one
    remember_tb_dir(str(run), str(shared))
    (shared / 'run').mkdir(parents=True)
    (shared / 'run' / 'events.out').write_text('curves')
    check_tb_dir_kept(str(run), str(shared))  # the same one
    with pytest.raises(
        ValueError, match=rf'with the --tb_dir it was trained with \(--tb_dir={shared}\)'
    ):
        check_tb_dir_kept(str(run), str(tmp_path / 'other'))
    shutil.rmtree(shared)  # moved away or deleted: the new directory is taken
    check_tb_dir_kept(str(run), str(tmp_path / 'other'))


def test_a_copied_sweep_claims_its_copied_tb_dir(tmp_path):
    """A sweep copied with its tb_dir (sweep/mha and sweep/tb/mha): the copy's run may log to
    the copy's tb_dir, whose owner file names the original, which still exists; logging to the
    original's tb_dir is still refused. An owner file from before the logdir was recorded keeps
    the old rule."""
    import shutil

    from lm.train.summary import check_logdir_owner, claim_logdir

    a = tmp_path / 'a'
    (a / 'mha').mkdir(parents=True)
    claim_logdir(str(a / 'mha'), str(a / 'tb'))
    b = tmp_path / 'b'
    shutil.copytree(a, b)
    claim_logdir(str(b / 'mha'), str(b / 'tb'))  # the copy's own
    with pytest.raises(ValueError, match=r'is the TensorBoard run of .*/a/mha;'):
        check_logdir_owner(str(b / 'mha'), str(a / 'tb'), '--tb_dir')
    c = tmp_path / 'c'
    shutil.copytree(a, c)
    (c / 'tb' / 'mha' / 'workdir.json').write_text(json.dumps({'workdir': str(a / 'mha')}))
    with pytest.raises(ValueError, match=r'is the TensorBoard run of .*/a/mha;'):
        check_logdir_owner(str(c / 'mha'), str(c / 'tb'), '--tb_dir')


@pytest.mark.slow
def test_a_run_saved_with_a_data_setting_it_never_read_reads_back_as_used(
    tmp_path, small_text, monkeypatch
):
    """A run made before such settings were refused (data.uptrain_fraction=0.2 with no
    data.split) reads back with configs/base.py's value: eval, uptraining and generation take
    its config, and resuming it (without --config, or with the setting left out) is no config
    change."""
    import lm.train.run as run_module
    from lm.train.checkpoint import read_latest_meta
    from lm.train.identity import config_changes

    config = tiny_train_config(tmp_path, small_text, **{'data.uptrain_fraction': 0.2})
    monkeypatch.setattr(run_module, 'check_idle_data', lambda *a: None)  # as before the check
    train(config, str(tmp_path / 'old'))
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r'uptrain_fraction=0\.2 does nothing'):
        check_config(config)  # a new run with it: refused
    stored = stored_config(str(tmp_path / 'old'))
    assert stored.data.uptrain_fraction == 0.1
    checked = check_config(stored)
    assert config_changes(read_latest_meta(str(tmp_path / 'old'))['config'], checked) == []
    more = with_values(stored, {'train.steps': 10})
    assert train(more, str(tmp_path / 'old'))['step'] == 10  # resumed


@pytest.mark.slow
def test_a_run_on_a_part_records_its_held_out_score_in_results_json(tmp_path, small_text):
    """A run trained on a corpus part (data.split) is scored on the held-out part at its last
    step, the score lm.data.parts calls the reported one: results.json keeps it beside eval."""
    config = tiny_train_config(tmp_path, small_text, **{'data.split': 'pretrain'})
    out = train(config, str(tmp_path / 'run'))
    saved = json.loads((tmp_path / 'run' / 'results.json').read_text())
    assert saved['heldout'] == out['heldout'] and saved['heldout']['loss'] > 0
    assert saved['eval'] == out['eval']
    plain = tiny_train_config(tmp_path, small_text)
    train(plain, str(tmp_path / 'plain'))
    assert 'heldout' not in json.loads((tmp_path / 'plain' / 'results.json').read_text())
