"""Where a train step's time goes: a jax.profiler trace of --steps steps, with every XLA op
(fusion) attributed to a category by what its fused computation contains.

  python scripts/profile_train.py                    # shakespeare_char, MHA
  python scripts/profile_train.py --variant=mla --top=25 --set=model.dtype=bfloat16

Categories: matmul (contains a dot or convolution), transcendental (exp, log, logistic, tanh,
rsqrt, ...), layout (copy / transpose only), reduction, elementwise; then the ops grouped by
the JAX operation they came from (HLO op_name). The trace itself stays in
--trace_dir for TensorBoard's profile plugin or Perfetto.
"""

import collections
import glob
import gzip
import json
import os
import re
import time

import jax
from absl import flags

from lm.cli import RecipeFlags, bootstrap, check_writable_dir, run_app
from lm.data.corpus import train_batch
from lm.sharding import global_batch
from lm.train.run import assemble
from lm.train.step import make_train_step

RECIPE = RecipeFlags(__name__)
_VARIANT = flags.DEFINE_string('variant', 'mha', 'Attention variant.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Profiled steps.')
_TOP = flags.DEFINE_integer('top', 15, 'Individual ops to list.')
_TRACE = flags.DEFINE_string('trace_dir', '/tmp/lm_profile', 'Where the trace is written.')

TRANSCENDENTAL = (
    'exponential',
    'log',
    'logistic',
    'tanh',
    'rsqrt',
    'sqrt',
    'power',
    'sine',
    'cosine',
    'divide',
    'erf',
)


def fusion_categories(hlo: str) -> dict[str, str]:
    """{op name: category} from compiled HLO text."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r'^\s*%?([\w.\-]+)\s.*\{\s*$', line)
        if head and '=' not in line.split('{')[0]:
            current = head.group(1)
            bodies[current] = []
        elif current is not None:
            op = re.search(r'=\s*[\w\[\]{}:,.\s/*]*?\s([a-z\-]+)\(', line)
            if op:
                bodies[current].append(op.group(1))
    categories = {}
    for line in hlo.splitlines():
        m = re.search(r'%?([\w.\-]+)\s*=.*?\s(fusion|custom-call|dot|convolution)\(', line)
        if not m:
            continue
        name, kind = m.group(1), m.group(2)
        calls = re.search(r'calls=%?([\w.\-]+)', line)
        called = calls.group(1) if calls else None
        ops = bodies.get(called, []) if called else [kind]
        categories[name] = categorise(ops)
    return categories


def op_names(hlo: str) -> dict[str, str]:
    """{op name: the JAX operation it came from} (HLO `op_name` metadata, `jit(step)/` dropped;
    `transpose(jvp(...))` marks the backward pass, `jvp(...)` the forward)."""
    names = {}
    for line in hlo.splitlines():
        m = re.search(r'%?([\w.\-]+)\s*=.*?\s[a-z\-]+\(', line)
        source = re.search(r'op_name="([^"]+)"', line)
        if m and source:
            names[m.group(1)] = re.sub(r'^jit\(\w+\)/', '', source.group(1))
    return names


def categorise(ops: list[str]) -> str:
    if any(o in ('dot', 'convolution', 'custom-call') for o in ops):
        return 'matmul'
    if any(o in TRANSCENDENTAL for o in ops):
        return 'transcendental'
    if ops and all(o in ('copy', 'transpose', 'bitcast', 'parameter', 'reshape') for o in ops):
        return 'layout'
    if any(o in ('reduce', 'reduce-window') for o in ops):
        return 'reduction'
    return 'elementwise'


def run() -> int:
    check_writable_dir(_TRACE.value, '--trace_dir')
    config = RECIPE.config(_VARIANT.value)
    bootstrap(config, compilation_cache=False)
    exp = assemble(config, state='init', data=True)
    c = exp.config
    with jax.set_mesh(exp.ctx.mesh):
        state = exp.state
        batch = global_batch(
            train_batch(
                exp.corpus.tokens['train'],
                seed=c.seed,
                step=0,
                batch_size=c.train.batch_size,
                seq_len=c.data.seq_len,
            ),
            exp.ctx.batch_sharding,
        )
        compiled = make_train_step(exp.ctx, c.train.grad_accum_steps).lower(state, batch).compile()
        for _ in range(5):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        t = time.perf_counter()
        for _ in range(_STEPS.value):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        wall = (time.perf_counter() - t) / _STEPS.value
        jax.profiler.start_trace(_TRACE.value)
        for _ in range(_STEPS.value):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
    categories = fusion_categories(compiled.as_text())
    trace = sorted(
        glob.glob(os.path.join(_TRACE.value, '**', '*.trace.json.gz'), recursive=True),
        key=os.path.getmtime,
    )[-1]
    with gzip.open(trace) as f:
        events = [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']
    per_op = collections.Counter()
    for e in events:
        if e['name'] in categories:
            per_op[e['name']] += e['dur'] / 1e3 / _STEPS.value  # ms per step
    per_cat = collections.Counter()
    for name, ms in per_op.items():
        per_cat[categories[name]] += ms
    busy = sum(per_op.values())
    print(
        f'{_VARIANT.value}: {wall * 1e3:.1f} ms/step wall (mean of {_STEPS.value}); '
        f'ops traced: {busy:.1f} ms/step of op time (ops on 2 threads can overlap)'
    )
    print('| category | ms/step | share of op time |')
    print('|---|---|---|')
    for cat, ms in per_cat.most_common():
        print(f'| {cat} | {ms:.2f} | {ms / busy:.0%} |')
    print(f'\ntop {_TOP.value} ops:')
    for name, ms in per_op.most_common(_TOP.value):
        print(f'  {ms:6.2f} ms  {categories[name]:<14} {name}')
    sources = op_names(compiled.as_text())
    per_source = collections.Counter()
    for name, ms in per_op.items():
        per_source[(categories[name], sources.get(name, '?'))] += ms
    print(f'\ntop {_TOP.value} JAX operations (ops grouped by the operation they came from):')
    for (cat, source), ms in per_source.most_common(_TOP.value):
        print(f'  {ms:6.2f} ms  {cat:<14} {source}')
    return 0


if __name__ == '__main__':
    run_app(run)
