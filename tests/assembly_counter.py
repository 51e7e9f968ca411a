"""Counts the calls of the steps a run is assembled from (`COUNTED`), in-process or around an
entry point run as a script.

  counts = count_calls()                                    # in-process, from here on
  python tests/assembly_counter.py OUT.json SCRIPT ARGS...  # SCRIPT as __main__; counts to OUT

Every lm module's reference to a counted function is replaced by a counting wrapper, so a call
is counted whichever module it comes from (`from lm.sharding import make_mesh` included: the
entry point imports the names after they are replaced). `restore_calls` puts the originals back.
"""

import collections
import importlib
import json
import os
import runpy
import sys

COUNTED = {
    'check_config': 'lm.train.run',
    'set_cpu_devices': 'lm.sharding',
    'make_mesh': 'lm.sharding',
    'rules_table': 'lm.sharding',
}
# Modules that hold references to counted functions (imported first, so they are replaced).
MODULES = (
    'lm.cli',
    'lm.train.loop',
    'lm.convert.hf_io',
    'lm.convert.uptrain',
    'lm.analysis.report',
)
_ORIGINALS: dict[str, object] = {}


def _lm_modules():
    return [m for n, m in list(sys.modules.items()) if m is not None and n.split('.')[0] == 'lm']


def count_calls() -> collections.Counter:
    """A Counter of calls by function name, counting from now until `restore_calls`."""
    for name in MODULES:
        importlib.import_module(name)
    counts: collections.Counter = collections.Counter({name: 0 for name in COUNTED})
    for name, home in COUNTED.items():
        original = _ORIGINALS.setdefault(name, getattr(importlib.import_module(home), name))

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        for module in _lm_modules():
            if getattr(vars(module).get(name), '__wrapped__', vars(module).get(name)) is original:
                setattr(module, name, counted)
        counted.__wrapped__ = original
    return counts


def restore_calls() -> None:
    """Puts the original functions back in every lm module."""
    for name, original in _ORIGINALS.items():
        for module in _lm_modules():
            if getattr(vars(module).get(name), '__wrapped__', None) is original:
                setattr(module, name, original)


if __name__ == '__main__':
    out, script, *args = sys.argv[1:]
    counts = count_calls()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    try:
        runpy.run_path(script, run_name='__main__')
    finally:
        with open(out, 'w') as f:
            json.dump(counts, f)
