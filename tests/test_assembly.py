"""A run is assembled once: the config checked, the CPU devices set, the sharding rules and the
mesh made exactly once per training run, evaluation, generation, analysis, export and uptraining
(tests/assembly_counter.py counts the calls)."""

import json

import pytest
from assembly_counter import COUNTED, count_calls, restore_calls
from conftest import ROOT, run_entry, tiny_train_config, write_config_file

from lm.cli import bootstrap
from lm.train.loop import train
from lm.train.run import assemble

ONCE = dict.fromkeys(COUNTED, 1)


@pytest.fixture
def counts():
    counter = count_calls()
    yield counter
    restore_calls()


@pytest.mark.slow
def test_training_and_restoring_in_process_assemble_once(tmp_path, small_text, counts):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'train.steps': 2, 'eval_every': 2, 'checkpoint_every': 2, 'train.peak_flops': 1e12},
    )
    config.compilation_cache_dir = ''  # the pytest worker's own JAX keeps no persistent cache
    bootstrap(config)  # what train.py does first
    train(config, str(tmp_path / 'run'))
    assert counts == ONCE
    counts.update({name: -n for name, n in ONCE.items()})  # from zero again
    restored = assemble(str(tmp_path / 'run'), state='restore')
    assert counts == {**ONCE, 'set_cpu_devices': 0}  # devices are the entry point's
    assert restored.step == 2 and restored.mesh is restored.ctx.mesh
    assert restored.ctx.document_eos is None  # no data read, nothing computes its losses


def test_assemble_refuses_an_unknown_state_and_a_restore_without_a_workdir(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text)
    with pytest.raises(ValueError, match=r"state must be one of .*, got 'fresh'"):
        assemble(config, state='fresh')
    with pytest.raises(ValueError, match="state='restore' needs a workdir"):
        assemble(config, state='restore')


def counted(tmp_path, script, *args):
    """The call counts of `script` run with `args` (it must succeed)."""
    out = tmp_path / f'counts_{len(list(tmp_path.glob("counts_*")))}.json'
    run_entry('tests/assembly_counter.py', out, ROOT / script, *args, check=True)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_entry_point_assembles_its_run_once(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, **{'train.steps': 2, 'eval_every': 2})
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    run, workdir = tmp_path / 'run', f'--workdir={tmp_path / "run"}'
    assert counted(tmp_path, 'train.py', f'--config={cfg_file}', workdir) == ONCE
    assert counted(tmp_path, 'eval.py', workdir) == ONCE
    generate = ('--prompt=def', '--max_new_tokens=4')
    assert counted(tmp_path, 'scripts/generate.py', workdir, *generate) == ONCE
    analyse = ('--batch=2', '--max_batches=1', '--num_random=4', f'--out={tmp_path / "heads"}')
    assert counted(tmp_path, 'scripts/analyze_heads.py', workdir, *analyse) == ONCE
    export = ('export', workdir, f'--hf_dir={tmp_path / "hf"}')
    assert counted(tmp_path, 'scripts/convert_hf.py', *export) == ONCE
    uptrain = (f'--src={run}', f'--dst={tmp_path / "up"}', '--num_kv_heads=1', '--steps=2')
    assert counted(tmp_path, 'scripts/uptrain.py', *uptrain) == ONCE
