"""Where a compiled program's time goes: the ops of a `jax.profiler` trace, each put in a
category by what its fused computation contains and traced back to the JAX operation it came
from (used by scripts/profile_train.py and scripts/bench_decode.py --profile_top).

On a CPU the trace holds one event per XLA op, named as in the HLO (`loop_add_fusion.3`). On a
GPU it holds the kernels on the device's streams: XLA's own kernels carry the op's name with
`_` for `.` (`loop_add_fusion_3`), and library kernels (cuBLAS, cuDNN) carry the library's
name; those are counted as 'library' (matrix products and fused attention).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re

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


def categorise(ops: list[str]) -> str:
    """The category of a fused computation from the HLO ops it contains."""
    if any(o in ('dot', 'convolution', 'custom-call') for o in ops):
        return 'matmul'
    if any(o in TRANSCENDENTAL for o in ops):
        return 'transcendental'
    if ops and all(o in ('copy', 'transpose', 'bitcast', 'parameter', 'reshape') for o in ops):
        return 'layout'
    if any(o in ('reduce', 'reduce-window') for o in ops):
        return 'reduction'
    return 'elementwise'


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
    `transpose(jvp(...))` marks the backward pass, `jvp(...)` the forward). A fusion without
    metadata takes its fused computation's matmul's (else its first op's) source."""
    names, bodies, calls = {}, {}, {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r'^\s*%?([\w.\-]+)\s.*\{\s*$', line)
        if head and '=' not in line.split('{')[0]:
            current = bodies.setdefault(head.group(1), [])
            continue
        m = re.search(r'%?([\w.\-]+)\s*=.*?\s([a-z\-]+)\(', line)
        if not m:
            continue
        source = re.search(r'op_name="([^"]+)"', line)
        if source:
            names[m.group(1)] = re.sub(r'^jit\(\w+\)/', '', source.group(1))
            if current is not None:
                current.append((m.group(2), names[m.group(1)]))
        elif called := re.search(r'calls=%?([\w.\-]+)', line):
            calls[m.group(1)] = called.group(1)
    for name, called in calls.items():
        body = bodies.get(called, [])
        dots = [src for op, src in body if op in ('dot', 'convolution')]
        if dots or body:
            names[name] = (dots or [src for _, src in body])[0]
    return names


@dataclasses.dataclass
class Profile:
    """Per-op time of a trace, in ms per step. `device`: the events are a GPU's kernels."""

    ms: collections.Counter  # op (or library kernel) name -> ms per step
    category: dict[str, str]
    source: dict[str, str]
    device: bool

    @property
    def busy(self) -> float:
        return sum(self.ms.values())

    def by_category(self) -> collections.Counter:
        out = collections.Counter()
        for name, ms in self.ms.items():
            out[self.category[name]] += ms
        return out

    def by_source(self) -> collections.Counter:
        out = collections.Counter()
        for name, ms in self.ms.items():
            out[(self.category[name], self.source.get(name, '?'))] += ms
        return out


def newest_trace(trace_dir: str) -> str:
    """The newest `*.trace.json.gz` under `trace_dir` (where jax.profiler writes it)."""
    paths = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
    if not paths:
        raise FileNotFoundError(f'no *.trace.json.gz under {trace_dir}')
    return max(paths, key=os.path.getmtime)


def device_kernels(events: list[dict]) -> list[dict]:
    """The complete events on an accelerator's streams ([] for a CPU-only trace)."""
    process = {
        e['pid']: e['args'].get('name', '')
        for e in events
        if e.get('ph') == 'M' and e.get('name') == 'process_name'
    }
    thread = {
        (e['pid'], e.get('tid')): e['args'].get('name', '')
        for e in events
        if e.get('ph') == 'M' and e.get('name') == 'thread_name'
    }
    return [
        e
        for e in events
        if e.get('ph') == 'X'
        and process.get(e['pid'], '').startswith('/device:')
        and thread.get((e['pid'], e.get('tid')), '').startswith('Stream')
    ]


def profile(events: list[dict], hlo: str, steps: int) -> Profile:
    """Op times per step of a trace's events (`traceEvents`) for the program `hlo`."""
    categories, sources = fusion_categories(hlo), op_names(hlo)
    kernels = device_kernels(events)
    ms, category = collections.Counter(), {}
    for e in kernels or [e for e in events if e.get('ph') == 'X']:
        name = e['name']
        if kernels and name not in categories:
            name = re.sub(r'_(\d+)$', r'.\1', name)  # XLA's kernel name for op `name`
        if name in categories:
            category[name] = categories[name]
        elif kernels:
            name, category[e['name']] = e['name'], 'library'
        else:
            continue  # host-side events that are not ops of the program
        ms[name] += e['dur'] / 1e3 / steps
    return Profile(ms, category, sources, bool(kernels))


def load_profile(trace_dir: str, hlo: str, steps: int) -> Profile:
    """`profile` of the newest trace under `trace_dir`."""
    with gzip.open(newest_trace(trace_dir)) as f:
        events = json.load(f)['traceEvents']
    return profile(events, hlo, steps)


def print_profile(p: Profile, top: int) -> None:
    """Tables: time per category, the `top` ops, the `top` JAX operations (when the profile
    knows where its ops came from)."""
    busy = p.busy
    print('| category | ms/step | share of op time |')
    print('|---|---|---|')
    for cat, ms in p.by_category().most_common():
        print(f'| {cat} | {ms:.3f} | {ms / busy:.0%} |')
    print(f'\ntop {top} ops:')
    for name, ms in p.ms.most_common(top):
        print(f'  {ms:7.3f} ms  {p.category[name]:<14} {name[:100]}')
    if not p.source:
        return
    print(f'\ntop {top} JAX operations (ops grouped by the operation they came from):')
    for (cat, source), ms in p.by_source().most_common(top):
        print(f'  {ms:7.3f} ms  {cat:<14} {source[:100]}')
