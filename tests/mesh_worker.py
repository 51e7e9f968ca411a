"""Subprocess helper for tests/test_sharding.py: trains a few steps for each requested
(variant, mesh) on however many devices XLA_FLAGS gives this process and prints one JSON line.

usage: python tests/mesh_worker.py '<json spec>'
spec: {"text": path, "tmp": dir, "steps": n,
       "runs": [{"name": str, "model": {...}, "mesh": [data, fsdp, tensor]}]}
"""

import json
import pathlib
import sys

import jax
from conftest import tiny_train_config

from lm.data.corpus import train_batch
from lm.sharding import global_batch
from lm.train.run import assemble
from lm.train.step import make_train_step


def run(spec: dict, run_spec: dict) -> dict:
    d, f, t = run_spec['mesh']
    overrides = {'mesh.data': d, 'mesh.fsdp': f, 'mesh.tensor': t, 'train.batch_size': 8}
    overrides.update({f'model.{k}': v for k, v in run_spec['model'].items()})
    config = tiny_train_config(pathlib.Path(spec['tmp']), spec['text'], **overrides)
    exp = assemble(config, state='init', data=True)
    losses = []
    with jax.set_mesh(exp.ctx.mesh):
        state = exp.state
        step_fn = make_train_step(exp.ctx, 1)
        for s in range(spec['steps']):
            batch = train_batch(
                exp.corpus.tokens['train'],
                seed=config.seed,
                step=s,
                batch_size=8,
                seq_len=config.data.seq_len,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
            )
            state, metrics = step_fn(state, global_batch(batch, exp.ctx.batch_sharding))
            losses.append(float(metrics['loss']))
    specs = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state['params'])[0]:
        name = '/'.join(str(getattr(k, 'key', k)) for k in path)
        specs[name] = [list(a) if isinstance(a, tuple) else a for a in leaf.sharding.spec]
    return {
        'name': run_spec['name'],
        'losses': losses,
        'specs': specs,
        'devices': jax.device_count(),
    }


if __name__ == '__main__':
    spec = json.loads(sys.argv[1])
    print(json.dumps({'runs': [run(spec, r) for r in spec['runs']]}))
