"""Entry-point plumbing in-process: one-line user errors and the bootstrap."""

import pytest
from conftest import tiny_config

from lm.cli import bootstrap, run_reporting_errors


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


def test_bootstrap_checks_device_settings_first():
    config = tiny_config()
    bootstrap(config)  # 0 CPU devices (JAX's default) and no compilation cache: nothing to do
    config.mesh.cpu_devices = -2
    with pytest.raises(ValueError, match=r'config.mesh.cpu_devices must be >= 0, got -2'):
        bootstrap(config)
