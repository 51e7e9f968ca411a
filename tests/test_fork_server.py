"""tests/fork_server.py: a run served by the fork server is what a fresh Python gives."""

import subprocess

import pytest
from conftest import ENV, FORK_SERVER, ROOT, run_entry

PROBE = """
import atexit, os, sys, threading, time
import lm.config
print('argv', sys.argv, 'cwd', os.getcwd(), 'path0', sys.path[0], 'name', __name__)
print('lm imported afresh:', 'lm.train.loop' not in sys.modules)
atexit.register(lambda: print('atexit ran', flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined', flush=True))).start()
print('progress\\r', 'to stderr', file=sys.stderr)
if sys.argv[1] == 'raise':
    raise RuntimeError('boom')
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.slow
def test_a_served_run_is_what_a_fresh_python_gives(tmp_path):
    """Exit status, stdout (argv, cwd, sys.path[0], __main__, lm not pre-imported, threads
    joined and atexit run at exit) and stderr's last line (an uncaught exception's)."""
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    for arg in ('0', '3', 'raise'):
        served = FORK_SERVER.run([str(probe), arg], ROOT, ENV, 60)
        fresh = run_entry(probe, arg, fresh=True)
        assert served is not None, 'the fork server did not serve the run'
        assert served.returncode == fresh.returncode == {'0': 0, '3': 3, 'raise': 1}[arg]
        assert served.stdout == fresh.stdout, (served.stdout, fresh.stdout)
        assert 'lm imported afresh: True' in served.stdout and 'atexit ran' in served.stdout
        assert served.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
        assert ('Traceback' in served.stderr) == (arg == 'raise')


@pytest.mark.slow
def test_a_run_in_another_environment_is_left_to_a_fresh_python(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    assert FORK_SERVER.run([str(probe), '0'], ROOT, {**ENV, 'LM_OTHER': '1'}, 60) is None
    assert FORK_SERVER.run([str(probe), '0'], ROOT, ENV, 60).returncode == 0


SPAWNER = """
import os, signal, subprocess, sys
inner = sys.argv[1]
ppid = subprocess.run([sys.executable, inner], capture_output=True, text=True).stdout.strip()
print('parent of the inner run is me:', ppid == str(os.getpid()))
proc = subprocess.Popen([sys.executable, inner, 'sleep'], stdout=subprocess.PIPE, text=True)
proc.stdout.readline()  # it started
proc.send_signal(signal.SIGTERM)
print('inner exit', proc.wait())
"""
INNER = """
import os, signal, sys, time
if sys.argv[1:] == ['sleep']:  # the handler is in place before the spawner hears it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print(os.getppid(), flush=True)
if sys.argv[1:] == ['sleep']:
    time.sleep(60)
"""


@pytest.mark.slow
def test_the_runs_a_served_run_starts_are_served_beside_it(tmp_path):
    """`[sys.executable, script]` in a served run is a run of the same server, side by side with
    its starter (not its child); a SIGTERM to it reaches the run, whose exit status it gives."""
    (tmp_path / 'spawner.py').write_text(SPAWNER)
    (tmp_path / 'inner.py').write_text(INNER)
    out = FORK_SERVER.run([str(tmp_path / 'spawner.py'), str(tmp_path / 'inner.py')], ROOT, ENV, 60)
    assert out is not None and out.returncode == 0, out and out.stderr[-2000:]
    assert out.stdout.splitlines() == ['parent of the inner run is me: False', 'inner exit 143']


@pytest.mark.slow
def test_a_served_run_past_its_timeout_is_killed_and_the_server_goes_on(tmp_path):
    """As subprocess.run: TimeoutExpired, the run killed; the next run is served."""
    sleeper = tmp_path / 'sleeper.py'
    sleeper.write_text('import time\ntime.sleep(60)\n')
    with pytest.raises(subprocess.TimeoutExpired):
        FORK_SERVER.run([str(sleeper)], ROOT, ENV, 1)
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    assert FORK_SERVER.run([str(probe), '0'], ROOT, ENV, 60).returncode == 0
