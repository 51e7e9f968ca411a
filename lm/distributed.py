"""Joining a multi-host job: the entry points' flags for it, and `jax.distributed.initialize`
called only after the coordinator's port is checked (a taken port, or a coordinator that never
answers, is a one-line error here; JAX itself would abort the process natively)."""

from __future__ import annotations

import socket
import sys
import time

import jax
from absl import flags, logging


def define_distributed_flags() -> None:
    """Flags for multi-host runs; each process of a job runs the same command. Defined as the
    entry point's own flags, so its `--help` lists them."""
    main = sys.argv[0]  # how absl names the main module's flags
    flags.DEFINE_string(
        'coordinator_address', '', 'host:port of process 0, for multi-host runs.', module_name=main
    )
    flags.DEFINE_integer(
        'num_processes', 0, 'Number of processes in a multi-host run.', module_name=main
    )
    flags.DEFINE_integer(
        'process_id', -1, "This process's index in a multi-host run.", module_name=main
    )
    flags.DEFINE_bool(
        'distributed',
        False,
        'Join a multi-host run, detecting coordinator and '
        'process index from the cluster (TPU pods, SLURM, Open MPI, Kubernetes).',
        module_name=main,
    )
    flags.DEFINE_integer(
        'distributed_timeout',
        300,
        'Seconds a multi-host process waits for the coordinator and every other process.',
        module_name=main,
    )


def initialize_distributed() -> None:
    """`jax.distributed.initialize` from the flags above (explicit values, or auto-detection)."""
    f = flags.FLAGS
    if f.coordinator_address:
        if f.num_processes < 1 or not 0 <= f.process_id < f.num_processes:
            raise ValueError(
                '--coordinator_address needs --num_processes >= 1 and '
                f'0 <= --process_id < num_processes, got {f.num_processes}, '
                f'{f.process_id}'
            )
        if f.distributed_timeout < 1:
            raise ValueError(f'--distributed_timeout must be >= 1 s, got {f.distributed_timeout}')
        host, port = _host_port(f.coordinator_address)
        if f.process_id == 0:
            _check_port_free(f.coordinator_address, port)
        else:
            _wait_for_coordinator(f.coordinator_address, host, port, f.distributed_timeout)
        logging.info(
            'joining a %d-process job at %s as process %d: waiting up to %d s for the others',
            f.num_processes,
            f.coordinator_address,
            f.process_id,
            f.distributed_timeout,
        )
        jax.distributed.initialize(
            f.coordinator_address,
            f.num_processes,
            f.process_id,
            initialization_timeout=f.distributed_timeout,
        )
    elif f.distributed:
        jax.distributed.initialize(initialization_timeout=f.distributed_timeout)


def _host_port(address: str) -> tuple[str, int]:
    """(host, port) of a `host:port` coordinator address ('[v6]:port' too); a one-line error
    for another form."""
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f'--coordinator_address={address!r}: expected host:port with a port in 1..65535'
        )
    return host.strip('[]'), int(port)


def _check_port_free(address: str, port: int) -> None:
    """Process 0 serves the job at `port` of this host: a one-line error when another process
    listens there already (JAX would abort natively)."""
    with socket.socket(socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(('', port))
        except OSError as e:
            raise ValueError(
                f'--coordinator_address={address}: process 0 cannot serve the job at port '
                f'{port} of this host ({e.strerror}); choose another port for every process'
            ) from None


def _wait_for_coordinator(address: str, host: str, port: int, timeout: int) -> None:
    """Waits until process 0's coordinator at `host`:`port` accepts connections; after
    `timeout` seconds a one-line error (JAX would abort natively)."""
    deadline, why = time.monotonic() + timeout, ''
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            why = e.strerror or str(e)
            time.sleep(0.2)
    raise ValueError(
        f'--coordinator_address={address}: no coordinator answered in {timeout} s ({why}); '
        'start process 0 (--process_id=0) with the same address, or check its host and port'
    )
