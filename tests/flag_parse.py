"""Parses the flags of many entry-point invocations in one Python: imports every module of `lm`
once, then forks one child per invocation, which runs the entry point as `python` would
(`__main__`, its sys.argv, its directory on sys.path) up to `absl.app.run`, where it parses the
flags with the entry point's own parser (a trailing `--help` dropped, so an unknown flag is an
error, as it is not beside `--help`), prints PARSED and exits 0 instead of running. Used by
tests/test_doc_flags.py: each child pays for its entry point's own imports only, not for JAX's.

stdin: JSON list of {"cwd": ..., "argv": [script or "-m", ...]}; with "run": true the entry
point runs on past its flags, JAX work included (tests/test_bad_inputs.py's refusals, one fork
each: the parent holds no thread and no JAX backend when it forks, so each child starts its
own). stdout: JSON list of {"code": exit status, "out": stdout and stderr}, in the same order.
Modules of `lm` define no flags when imported (entry points define them), so importing them all
changes no parse.
"""

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import threading

from absl import app, flags
from fork_server import run_as_main

import lm

PARSED = 'flags parsed'


def parse_only(main, argv=None, flags_parser=None, **_) -> None:
    """Stands in for absl.app.run: the entry point's flag parsing, then exit 0."""
    argv = list(sys.argv if argv is None else argv)
    if argv[-1] == '--help':
        argv.pop()
    (flags_parser or flags.FLAGS)(argv)
    print(PARSED)
    sys.exit(0)


def child(cwd: str, argv: list[str], out_fd: int, run: bool = False) -> None:
    """In the forked child: the invocation, then os._exit with its exit status."""
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    code = 0
    if not run:
        app.run = parse_only
    try:
        os.chdir(cwd)
        run_as_main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001  (reported to the test as the exit status)
        print(f'{type(e).__name__}: {e}', file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(cwd: str, argv: list[str], run: bool = False) -> dict:
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            child(cwd, argv, out.fileno(), run)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        text = out.read().decode(errors='replace')
    return {'code': os.waitstatus_to_exitcode(status), 'out': text}


def in_one_python(calls: list[dict], cwd, env: dict) -> list[dict]:
    """The results of `calls` (this file's stdin format), from one Python started by the tests
    (a failure of that Python itself fails the test, showing its stderr)."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        input=json.dumps(calls),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def main() -> None:
    calls = json.load(sys.stdin)
    for module in pkgutil.walk_packages(lm.__path__, 'lm.'):
        importlib.import_module(module.name)
    assert threading.active_count() == 1, 'a thread before fork: children could deadlock'
    results = [run(c['cwd'], c['argv'], c.get('run', False)) for c in calls]
    json.dump(results, sys.stdout)


if __name__ == '__main__':
    main()
