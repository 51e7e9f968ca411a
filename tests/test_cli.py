"""Entry-point plumbing in-process: one-line user errors and the bootstrap."""

import gc
import os
import signal
import subprocess
import sys
import time

import jax
import pytest
from conftest import ENV, ROOT, tiny_config

from lm.cli import bootstrap, parse_flags, run_reporting_errors, runs_devices
from lm.train import Interrupted, StopRequest


@pytest.fixture(autouse=True)
def collect_as_usual():
    """run_reporting_errors and parse_flags freeze the heap on exit; the worker goes on."""
    yield
    gc.unfreeze()


def test_user_errors_are_one_line_with_exit_status_1(capsys):
    def main():
        raise ValueError('config.train.steps must be >= 0, got -1')

    with pytest.raises(SystemExit) as e:
        run_reporting_errors(main)
    assert e.value.code == 1
    assert capsys.readouterr().err == 'error: config.train.steps must be >= 0, got -1\n'
    with pytest.raises(SystemExit) as e:
        run_reporting_errors(lambda: 3)
    assert e.value.code == 3


def test_ctrl_c_where_no_stop_request_listens_is_one_line_with_exit_130(capsys):
    def main():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        run_reporting_errors(main)
    assert e.value.code == 130
    assert capsys.readouterr().err == 'stopped by SIGINT (Ctrl-C)\n'


def test_entry_points_exit_without_the_final_collection(capsys):
    """Every exit of an entry point (its run's, or flag parsing's) freezes the objects alive, so
    the interpreter's last collection (about a second with JAX and Flax loaded) skips them."""
    for exit_now, raises in (
        (lambda: run_reporting_errors(lambda: 0), SystemExit),
        (lambda: run_reporting_errors(lambda: [][0]), IndexError),  # a crash, not a user error
        (lambda: parse_flags(['prog', '--no_such_flag']), SystemExit),
    ):
        gc.unfreeze()
        with pytest.raises(raises):
            exit_now()
        assert gc.get_freeze_count() > 0
    assert 'no_such_flag' in capsys.readouterr().err


def test_bootstrap_checks_device_settings_first():
    config = tiny_config()
    config.compilation_cache_dir = ''  # the pytest worker's own JAX keeps no persistent cache
    bootstrap(config)  # 0 CPU devices (JAX's default) and no compilation cache: nothing to do
    config.mesh.cpu_devices = -2
    with pytest.raises(ValueError, match=r'config.mesh.cpu_devices must be in \[0, 4096\].*got -2'):
        bootstrap(config)
    config.mesh.cpu_devices = 100_000  # XLA would abort the process making their threads
    with pytest.raises(ValueError, match=r'config.mesh.cpu_devices must be in .*got 100000'):
        bootstrap(config)


def test_a_config_written_before_keys_were_added_gets_their_recorded_values(caplog):
    """A sweep's per-run config written by the code it started with, read by train.py after an
    update added keys: the added keys take their recorded values (lm.config_migration), with a
    warning; a key that is neither in the config nor recorded is still refused."""
    from lm.config import check_config_keys, load_config_file

    config = load_config_file(str(ROOT / 'configs' / 'base.py'))
    del config.data['document_mask']
    del config.uptrain['grouping']
    config.lock()
    check_config_keys(config)
    assert config.data.document_mask is False and config.uptrain.grouping == 'contiguous'
    assert (
        '--config: keys added since the config was written, set as before: '
        "data.document_mask=False, uptrain.grouping='contiguous'" in caplog.text
    )
    with config.unlocked():
        del config.train['lr']
    with pytest.raises(ValueError, match=r'--config: the config lacks train.lr; start it from'):
        check_config_keys(config)


@pytest.mark.slow
def test_the_runs_backend_is_asked_of_a_new_process(monkeypatch):
    """scripts/sweep.py --ensemble: the backend and device count a new process gets (this one's
    here), and a one-line error when JAX cannot start there."""
    assert runs_devices() == (jax.default_backend(), jax.device_count())
    monkeypatch.setenv('JAX_PLATFORMS', 'no_such_platform')
    with pytest.raises(RuntimeError, match=r'^a new Python process could not start JAX: \S'):
        runs_devices()


def test_a_stop_inside_at_once_is_not_swallowed_by_except_exception():
    """A library's `except Exception` around a read (a restore's fallback, JAX's compilation
    cache) must not swallow a stop raised at once, nor turn it into another error."""
    with StopRequest() as stop, pytest.raises(Interrupted, match=r'^stopped by SIGINT$'):
        with stop.at_once():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here, as soon as Python runs again
            except Exception:  # noqa: BLE001 - what the libraries do
                pytest.fail('the stop was caught as an Exception')


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_stop_where_no_stop_request_listens_exits_in_one_line(signum, capsys):
    """SIGTERM before any phase listens (start-up, a restore, compiling) stops an entry point
    as Ctrl-C does: `with` blocks unwind, one line, exit 143 (was: killed silently, -15)."""
    unwound = []

    def main():
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises here
        finally:
            unwound.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        run_reporting_errors(main)
    gc.unfreeze()
    assert exited.value.code == 128 + signum and unwound == [True]
    said = 'stopped by SIGTERM' if signum == signal.SIGTERM else 'stopped by SIGINT (Ctrl-C)'
    assert capsys.readouterr().err.splitlines() == [said]
    assert signal.getsignal(signal.SIGTERM) is before  # given back


def test_a_stop_raised_where_python_drops_it_is_still_acted_on(capsys):
    """The exception a stop raises at once can land where Python drops it (a garbage-collector
    callback: 'Exception ignored in ...', after which training ran on to exit 0). The signal is
    recorded too: a phase that starts later starts with it, and a command that still finishes
    exits with the signal's status, saying so."""
    seen = []

    def main():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - what a dropped exception amounts to
            pass
        with StopRequest() as later:  # a restore, the training loop, an evaluation
            seen.append(later.signum)
        return 0

    with pytest.raises(SystemExit) as exited:
        run_reporting_errors(main)
    gc.unfreeze()
    assert exited.value.code == 143 and seen == [signal.SIGTERM]
    said = capsys.readouterr().err.splitlines()
    assert said == ['stopped by SIGTERM (once the command had finished)']


DROPPED_AND_NOTHING_FOLLOWS = """
import os, signal, sys, time
from lm.cli import run_reporting_errors

def main():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except BaseException:  # dropped, as in a garbage-collector callback
        pass
    time.sleep(60)  # a phase that never checks (building a model of 5,000 layers)

run_reporting_errors(main)
"""


@pytest.mark.slow
def test_a_dropped_stop_with_no_phase_to_act_on_it_ends_the_process():
    """A stop dropped where no later phase listens (it ran on for 10 minutes and more) ends the
    process by the signal's default action, `EntryPointStop.DEFAULT_AFTER_S` later."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, '-c', DROPPED_AND_NOTHING_FOLLOWS], cwd=ROOT, env=ENV, timeout=50
    )
    assert done.returncode == -signal.SIGTERM
    assert time.monotonic() - start < 30


def test_a_multi_host_process_stops_in_one_line_when_the_job_cannot_form():
    """JAX aborts natively (exit 134) when the coordinator never answers or its port is taken;
    these are checked first: a process other than 0 waits for the coordinator's port up to the
    timeout, process 0 binds its port first."""
    import socket

    from lm.distributed import _check_port_free, _host_port, _wait_for_coordinator

    assert _host_port('host0:1234') == ('host0', 1234)
    assert _host_port('[::1]:80') == ('::1', 80)
    for bad in ('host0', 'host0:0', 'host0:x', ':80', 'host0:70000'):
        with pytest.raises(ValueError, match=r'^--coordinator_address=.*: expected host:port'):
            _host_port(bad)
    with socket.socket() as listener:
        listener.bind(('127.0.0.1', 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        address = f'127.0.0.1:{port}'
        with pytest.raises(ValueError, match=rf'^--coordinator_address={address}: process 0 can'):
            _check_port_free(address, port)
        _wait_for_coordinator(address, '127.0.0.1', port, 2)  # it answers: returns at once
    _check_port_free(address, port)  # free again
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf'^--coordinator_address={address}: no coordinator '):
        _wait_for_coordinator(address, '127.0.0.1', port, 1)
    assert 1 <= time.monotonic() - start < 5


def test_overrides_of_a_saved_config_are_taken_out_of_argv(monkeypatch):
    """An entry point that reads a run's saved config when no --config is given gets its
    --config.KEY=VALUE items as 'KEY=VALUE' (after `--`, arguments are left alone); one without
    a value is a one-line error."""
    import lm.cli_flags

    taken = []
    monkeypatch.setitem(lm.cli_flags._SAVED_CONFIG_OVERRIDES, 'config', taken)
    argv = [
        'train.py',
        '--workdir=w',
        '--config.train.steps=52',
        '--config.data.path=',
        '--',
        '--config.x=1',
    ]
    assert lm.cli_flags._take_saved_overrides(argv, 'config') == [
        'train.py',
        '--workdir=w',
        '--',
        '--config.x=1',
    ]
    assert taken == ['train.steps=52', 'data.path=']
    with pytest.raises(ValueError, match=r'^--config\.train\.steps: give the value as --config'):
        lm.cli_flags._take_saved_overrides(['train.py', '--config.train.steps', '52'], 'config')


def test_overrides_of_a_section_the_attention_does_not_read_are_refused():
    """`--config.model.mla.*` with attention='gqa' would do nothing: refused (the keys of a
    config file's overrides or of a resume's saved-config overrides alike); the active section,
    other keys, and MLA's latent_norm_eps (an MHA -> MLA conversion reads it) pass."""
    import ml_collections

    from lm.cli import check_inactive_overrides

    config = ml_collections.ConfigDict({'model': {'attention': 'gqa', 'mla': {'kv_lora_rank': 4}}})
    for ok in (['model.num_heads', 'train.lr'], ['model.mla.latent_norm_eps']):
        check_inactive_overrides(config, ok)
    with pytest.raises(ValueError, match=r'^--config\.model\.mla\.kv_lora_rank does nothing: '):
        check_inactive_overrides(config, ['train.lr', 'model.mla.kv_lora_rank'])
    config.model.attention = 'mla'
    check_inactive_overrides(config, ['model.mla.kv_lora_rank'])
