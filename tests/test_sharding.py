"""Sharded training on simulated 8-device meshes and across two local processes.

Each multi-device case runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count
set before JAX starts. Losses are compared to a single-device run with rtol 1e-5: the same maths
in float32, only the reduction order across devices differs.
"""

import json
import shutil
import socket
import subprocess

import numpy as np
import pytest
from conftest import (
    ROOT,
    entry_command,
    read_scalars,
    run_entry,
    simulated_devices_env,
    stdlib_text,
    tiny_train_config,
    write_config_file,
)

from lm.sharding import config_digests, first_difference, fit_mesh, mesh_shape, rules_table

RTOL = 1e-5
VARIANTS = {
    'mha': {'attention': 'mha', 'num_kv_heads': 0},
    'gqa2': {'attention': 'gqa', 'num_kv_heads': 2},
    'mqa': {'attention': 'mqa', 'num_kv_heads': 0},
    'mla': {'attention': 'mla', 'num_kv_heads': 0},
}
# (variant, mesh) pairs run on 8 devices: every mesh and every variant, each variant under
# a mesh that splits its heads (tensor) and its weights (fsdp); not all 16 (compiles dominate).
CASES = [
    ('gqa2', (8, 1, 1)),
    ('gqa2', (1, 8, 1)),
    ('gqa2', (2, 2, 2)),
    ('mha', (2, 2, 2)),
    ('mqa', (1, 2, 4)),
    ('mla', (1, 2, 4)),
]


def worker(devices, spec):
    out = run_entry(
        'tests/mesh_worker.py',
        json.dumps(spec),
        env=simulated_devices_env(devices),
        timeout=900,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    runs = {r['name']: r for r in result['runs']}
    return runs, out.stderr


@pytest.fixture(scope='module')
def mesh_runs(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp('mesh')
    text = tmp / 'small.txt'
    text.write_text(stdlib_text(60_000), encoding='utf-8')
    base = {'text': str(text), 'tmp': str(tmp), 'steps': 5}
    single, _ = worker(
        1,
        {
            **base,
            'runs': [{'name': v, 'model': m, 'mesh': [-1, 1, 1]} for v, m in VARIANTS.items()],
        },
    )
    multi, log = worker(
        8,
        {
            **base,
            'runs': [
                {'name': f'{v}@{mesh}', 'model': VARIANTS[v], 'mesh': list(mesh)}
                for v, mesh in CASES
            ],
        },
    )
    return single, multi, log


@pytest.mark.parametrize(('variant', 'mesh'), CASES, ids=[f'{v}-{m}' for v, m in CASES])
@pytest.mark.slow
def test_sharded_losses_match_single_device(mesh_runs, variant, mesh):
    single, multi, _ = mesh_runs
    run = multi[f'{variant}@{mesh}']
    assert run['devices'] == 8
    np.testing.assert_allclose(run['losses'], single[variant]['losses'], rtol=RTOL)


@pytest.mark.slow
def test_parameters_are_sharded_as_the_rules_say(mesh_runs):
    _, multi, _ = mesh_runs
    dp = multi['gqa2@(8, 1, 1)']['specs']
    assert all(all(a is None for a in spec) for spec in dp.values())  # pure data parallel
    fsdp = multi['gqa2@(1, 8, 1)']['specs']
    assert fsdp['blocks/0/attn/q_proj/kernel'] == ['fsdp', None, None]
    assert fsdp['embed'] == [None, 'fsdp'] and fsdp['final_norm/scale'] == [None]
    both = multi['gqa2@(2, 2, 2)']['specs']
    assert both['blocks/0/attn/q_proj/kernel'] == ['fsdp', 'tensor', None]
    assert both['blocks/0/attn/k_proj/kernel'] == ['fsdp', 'tensor', None]
    assert both['blocks/1/attn/o_proj/kernel'] == ['tensor', None, 'fsdp']
    assert both['blocks/0/mlp/gate_proj/kernel'] == ['fsdp', 'tensor']
    assert both['blocks/0/mlp/down_proj/kernel'] == ['tensor', 'fsdp']
    assert both['embed'] == ['tensor', 'fsdp']  # vocab 258 splits in two
    mla = multi['mla@(1, 2, 4)']['specs']
    assert mla['blocks/0/attn/kv_b_proj/kernel'] == [None, 'tensor', None]
    assert mla['blocks/0/attn/kv_a_proj_with_mqa/kernel'] == ['fsdp', None]


@pytest.mark.slow
def test_mqa_on_tensor_axis_4_replicates_kv_with_a_log_line(mesh_runs):
    _, multi, log = mesh_runs
    specs = multi['mqa@(1, 2, 4)']['specs']
    assert specs['blocks/0/attn/k_proj/kernel'] == ['fsdp', None, None]
    assert specs['blocks/0/attn/v_proj/kernel'] == ['fsdp', None, None]
    assert specs['blocks/0/attn/q_proj/kernel'] == ['fsdp', 'tensor', None]
    assert (
        "sharding: kv_heads=1 does not divide over mesh axes ('tensor',) (size 4); "
        'replicating it in 4 parameter(s)'
    ) in log


def train_cli(cfg_file, workdir, devices, *extra):
    out = run_entry(
        'train.py',
        f'--config={cfg_file}',
        f'--workdir={workdir}',
        *extra,
        env=simulated_devices_env(devices),
        check=True,
    )
    return out


@pytest.mark.slow
def test_checkpoint_restores_on_other_meshes(tmp_path, small_text):
    overrides = {'train.steps': 8, 'train.batch_size': 8, 'checkpoint_every': 4}
    config = tiny_train_config(
        tmp_path, small_text, **overrides, **{'mesh.data': 2, 'mesh.fsdp': 2, 'mesh.tensor': 2}
    )
    train_cli(write_config_file(config, tmp_path / 'a.py'), tmp_path / 'a', 8)
    want = read_scalars(tmp_path / 'a' / 'tb', 'train/loss')
    for name, devices, mesh in [('b', 8, (8, 1, 1)), ('c', 1, (1, 1, 1))]:
        shutil.copytree(tmp_path / 'a' / 'checkpoints' / '4', tmp_path / name / 'checkpoints' / '4')
        config = tiny_train_config(
            tmp_path,
            small_text,
            **overrides,
            **dict(zip(('mesh.data', 'mesh.fsdp', 'mesh.tensor'), mesh, strict=True)),
        )
        out = train_cli(
            write_config_file(config, tmp_path / f'{name}.py'), tmp_path / name, devices
        )
        assert 'resumed from' in out.stderr
        got = read_scalars(tmp_path / name / 'tb', 'train/loss')
        assert sorted(got) == [5, 6, 7, 8]
        np.testing.assert_allclose(
            [got[s] for s in range(5, 9)], [want[s] for s in range(5, 9)], rtol=RTOL
        )
    # Read on fewer devices than it was trained on (an 8-GPU run evaluated on one GPU): its
    # mesh is refitted to the devices there, and the loss is the one training logged.
    out = run_entry(
        'eval.py',
        f'--workdir={tmp_path / "a"}',
        env=simulated_devices_env(1),
        timeout=300,
        check=True,
    )
    assert "the run's config.mesh {'data': 2, 'fsdp': 2, 'tensor': 2} needs 8" in out.stderr
    np.testing.assert_allclose(
        json.loads(out.stdout.strip().splitlines()[-1])['loss'],
        read_scalars(tmp_path / 'a' / 'tb', 'eval/loss')[8],
        rtol=RTOL,
    )


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def two_processes(cfg_file, workdir, extra: list[list[str]]) -> list[subprocess.Popen]:
    """train.py as the 2 processes (4 CPU devices each) of one run on loopback, process i
    given `extra[i]` flags too."""
    port = free_port()
    return [
        subprocess.Popen(
            entry_command(
                'train.py',
                f'--config={cfg_file}',
                f'--workdir={workdir}',
                *flags,
                f'--coordinator_address=127.0.0.1:{port}',
                '--num_processes=2',
                f'--process_id={i}',
            ),
            cwd=ROOT,
            env=simulated_devices_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, flags in enumerate(extra)
    ]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, small_text):
    config = tiny_train_config(
        tmp_path,
        small_text,
        **{
            'train.steps': 3,
            'train.batch_size': 8,
            'train.steps_per_call': 2,  # calls of 2 steps, then 1: [2, B, T+1] batches per host
            'eval_every': 3,
            'checkpoint_every': 3,
        },
    )
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    train_cli(cfg_file, tmp_path / 'one', 8)
    procs = two_processes(cfg_file, tmp_path / 'two', [[], []])
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    want = read_scalars(tmp_path / 'one' / 'tb', 'train/loss')
    got = read_scalars(tmp_path / 'two' / 'tb', 'train/loss')
    assert sorted(got) == [1, 2, 3]
    np.testing.assert_allclose([got[s] for s in (1, 2, 3)], [want[s] for s in (1, 2, 3)], rtol=RTOL)
    np.testing.assert_allclose(
        read_scalars(tmp_path / 'two' / 'tb', 'eval/loss')[3],
        read_scalars(tmp_path / 'one' / 'tb', 'eval/loss')[3],
        rtol=RTOL,
    )


@pytest.mark.slow
def test_processes_with_different_configs_stop_in_one_line_before_any_work(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, **{'train.batch_size': 8})
    cfg_file = write_config_file(config, tmp_path / 'cfg.py')
    lrs = [[f'--config.train.lr={lr}'] for lr in (0.003, 0.005)]
    procs = two_processes(cfg_file, tmp_path / 'two', lrs)
    outs = [p.communicate(timeout=300) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 1 and 'Traceback' not in err, err[-3000:]
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(
                'error: config.train.lr differs between process 0 and process 1 of this multi-host '
                f'run ({(0.003, 0.005)[i]} on process {i})'
            )
        )
    assert not (tmp_path / 'two').exists()


def test_the_first_setting_that_differs_between_processes_is_named():
    keys, a = config_digests(tiny_train_config(ROOT, 'a.txt'))
    _, same = config_digests(tiny_train_config(ROOT, 'a.txt', **{'data.cache_dir': '/elsewhere'}))
    _, lr = config_digests(tiny_train_config(ROOT, 'a.txt', **{'train.lr': 0.5}))
    _, heads = config_digests(tiny_train_config(ROOT, 'a.txt', **{'model.num_heads': 2}))
    assert first_difference(keys, np.stack([a, same, a])) is None  # a host's own cache
    assert first_difference(keys, np.stack([a, same, lr])) == ('config.train.lr', 2)
    assert first_difference(keys, np.stack([a, lr, heads])) == ('config.model.num_heads', 2)
    config = tiny_train_config(ROOT, 'a.txt')
    names, here = config_digests(config, {'--workdir': 'runs/a'})
    _, there = config_digests(config, {'--workdir': 'runs/b'})
    assert first_difference(names, np.stack([here, there])) == ('--workdir', 1)


def mesh_config(**sizes):
    config = tiny_train_config(ROOT, 'unused.txt')
    config.mesh.update(sizes)
    return config.mesh


def test_bad_meshes_give_one_line_errors():
    with pytest.raises(ValueError, match=r'config.mesh .* needs 6 devices, but 8 are available'):
        mesh_shape(mesh_config(data=3, fsdp=2, tensor=1), 8)
    with pytest.raises(ValueError, match=r'at most one axis may be -1'):
        mesh_shape(mesh_config(data=-1, fsdp=-1), 8)
    with pytest.raises(ValueError, match=r'8 devices do not divide by the fixed axes'):
        mesh_shape(mesh_config(data=-1, tensor=3), 8)
    assert mesh_shape(mesh_config(data=-1, fsdp=2, tensor=2), 8) == (2, 2, 2)
    bad_rule = mesh_config()
    bad_rule.rules.heads = 'model'
    with pytest.raises(
        ValueError,
        match=r"config.mesh.rules.heads='model' names unknown mesh "
        r"axis 'model'",
    ):
        rules_table(bad_rule)
    bad_rule.rules.heads = 'tensor'
    bad_rule.rules.batch = 'data,data'  # a NamedSharding's DuplicateSpecError otherwise
    with pytest.raises(ValueError, match=r"rules.batch='data,data' names a mesh axis twice"):
        rules_table(bad_rule)


def test_a_mesh_that_does_not_fit_the_devices_here_is_refitted_for_reading():
    trained = mesh_config(data=2, fsdp=2, tensor=2)
    assert fit_mesh(trained, 8) is trained
    fitted = fit_mesh(trained, 1)
    assert mesh_shape(fitted, 1) == (1, 1, 1) and mesh_shape(fit_mesh(trained, 3), 3) == (3, 1, 1)
    assert fitted.rules == trained.rules and (trained.data, trained.fsdp) == (2, 2)
    # the parameter sharding is kept as far as the devices allow: tensor first, then fsdp
    assert mesh_shape(fit_mesh(trained, 4), 4) == (1, 2, 2)
    assert mesh_shape(fit_mesh(trained, 6), 6) == (3, 1, 2)
    fsdp8 = mesh_config(data=1, fsdp=8, tensor=1)
    assert mesh_shape(fit_mesh(fsdp8, 4), 4) == (1, 4, 1)
    assert mesh_shape(fit_mesh(fsdp8, 12), 12) == (3, 4, 1)
    assert mesh_shape(fit_mesh(mesh_config(data=-1, fsdp=1, tensor=4), 2), 2) == (1, 1, 2)


@pytest.mark.slow
def test_batch_not_divisible_by_8_devices_is_a_one_line_error(tmp_path, small_text):
    config = tiny_train_config(tmp_path, small_text, **{'train.batch_size': 12})
    out = run_entry(
        'train.py',
        f'--config={write_config_file(config, tmp_path / "c.py")}',
        f'--workdir={tmp_path / "w"}',
        env=simulated_devices_env(8),
        timeout=300,
    )
    assert out.returncode == 1 and 'Traceback' not in out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            'error: config.train.batch_size=12 (/ grad_accum_steps = 12 per micro-batch) must be '
            'divisible by the data-parallel size 8'
        )
    )
