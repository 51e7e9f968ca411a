"""tests/fork_server.py: a run served by the fork server is what a fresh Python gives."""

import fcntl
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
def test_a_run_the_server_cannot_serve_is_left_to_a_fresh_python(tmp_path):
    """Another environment, or the server busy with another run: not served (None)."""
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    assert FORK_SERVER.run([str(probe), '0'], ROOT, {**ENV, 'LM_OTHER': '1'}, 60) is None
    assert FORK_SERVER.start()
    with open(FORK_SERVER.path + '.lock', 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert FORK_SERVER.run([str(probe), '0'], ROOT, ENV, 60) is None
    assert FORK_SERVER.run([str(probe), '0'], ROOT, ENV, 60).returncode == 0


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
