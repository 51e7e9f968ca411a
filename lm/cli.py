"""Shared command-line plumbing for the entry points (train.py, eval.py, scripts/): a process
started in the one order that works (`bootstrap`), user errors and stop signals reported in one
line (`run_app`), checks of paths, and the flags of lm.cli_flags (re-exported here)."""

from __future__ import annotations

import collections
import gc
import logging as pylogging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from lm.cli_flags import (
    REPO_ROOT,
    RecipeFlags,
    define_config_file,
    parse_flags,
    saved_config_overrides,
)
from lm.distributed import initialize_distributed
from lm.model import inactive_sections
from lm.sharding import check_same_config, set_cpu_devices
from lm.train import EntryPointStop, Interrupted, RunError, StopRequest

__all__ = [  # REPO_ROOT, RecipeFlags and the config-file flags are lm.cli_flags'
    'REPO_ROOT',
    'USER_ERRORS',
    'RecipeFlags',
    'bootstrap',
    'check_data_overrides',
    'check_inactive_overrides',
    'check_writable_dir',
    'define_config_file',
    'parse_flags',
    'run_app',
    'run_reporting_errors',
    'runs_devices',
    'saved_config_overrides',
    'use_compilation_cache',
]

# Errors that mean "the user asked for something that cannot work": reported in one line.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, RunError)


class _QuietLibraries(pylogging.Filter):
    """Drops orbax's per-save INFO chatter, its errors (each failure also raises, and the caller
    reports it in one line: `lm.train.checkpoint.Checkpointer` names the step and cause) and
    its "read only" warning (eval.py and generate.py open checkpoints read-only on purpose),
    and JAX's INFO line about a TPU backend (libtpu) it could not open on a machine without
    TPUs; other warnings and errors still show, orbax's warnings one line each (without
    tracebacks)."""

    def filter(self, record: pylogging.LogRecord) -> bool:
        if '/orbax/' in record.pathname:
            if record.levelno != pylogging.WARNING:
                return False
            record.exc_info, record.exc_text = None, None
            return not str(record.msg).startswith('Given directory is read only')
        if record.levelno < pylogging.WARNING and record.pathname.endswith('xla_bridge.py'):
            return "backend 'tpu'" not in record.getMessage()
        return True


# Persistent-cache events of this process (JAX's cache is process-wide, like this tally).
_CACHE_EVENTS: collections.Counter = collections.Counter()


def _count_cache_event(event: str, **kwargs) -> None:
    if event.startswith('/jax/compilation_cache/cache_'):
        _CACHE_EVENTS[event.rsplit('_', 1)[1]] += 1  # 'hits' / 'misses'


def use_compilation_cache(path: str) -> None:
    """Turns on JAX's persistent compilation cache in `path` (config.compilation_cache_dir;
    '' = off): a relaunch with the same shapes and flags loads its compiled steps from disk.
    Process-wide, so entry points call it once, before anything is compiled; the tally of hits
    and misses is logged when the entry point ends."""
    if not path:
        return
    path = os.path.expanduser(path)
    check_writable_dir(path, 'config.compilation_cache_dir')
    os.makedirs(path, exist_ok=True)
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    jax.monitoring.register_event_listener(_count_cache_event)
    _CACHE_EVENTS['on'] = 1


def bootstrap(
    config: ml_collections.ConfigDict,
    compilation_cache: bool = True,
    shared: dict[str, str] | None = None,
) -> None:
    """Starts an entry point's process for a run of `config`, in the one order that works:
    CPU devices (`config.mesh.cpu_devices`, before any JAX backend starts), the persistent
    compilation cache (`config.compilation_cache_dir`; benchmarks that time compiles pass
    `compilation_cache=False`), then joining a multi-host job when the entry point defined the
    distributed flags (`define_distributed_flags`), whose processes must share one config and
    the `shared` flags ({'--workdir': path})."""
    set_cpu_devices(config.mesh)
    if compilation_cache:
        use_compilation_cache(config.compilation_cache_dir)
    if 'coordinator_address' in flags.FLAGS:
        initialize_distributed()
        check_same_config(config, shared)


def runs_devices() -> tuple[str, int]:
    """The JAX backend ('cpu', 'gpu', 'tpu') and device count that a new process of this Python
    gets, asked of a process of its own: for a driver (scripts/sweep.py) that starts the runs'
    processes and must not start an accelerator itself (a GPU's memory belongs to those runs).
    A run's config.mesh.cpu_devices, applied in its own process, changes the CPU count."""
    code = 'import jax; print(jax.default_backend(), jax.device_count())'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    if out.returncode:
        tail = (out.stderr.strip().splitlines() or ['no output'])[-1]
        raise RuntimeError(f'a new Python process could not start JAX: {tail}')
    backend, count = out.stdout.split()[-2:]
    return backend, int(count)


def check_data_overrides(entry: str, flag: str = 'config') -> None:
    """One-line error if --config overrides anything outside config.data, for an entry point that
    takes only the data from --config (the model, training and mesh are the checkpoint's)."""
    path, _, arg = config_flags.get_config_filename(flags.FLAGS[flag]).partition(':')
    if arg:  # every config file's argument picks a model (a variant, a width)
        raise ValueError(
            f"{entry} takes only the data from --{flag}; the argument ':{arg}' of {path} picks "
            "a model, which is the checkpoint's: give the file alone"
        )
    overrides = config_flags.get_override_values(flags.FLAGS[flag])
    if ignored := sorted(k for k in overrides if not k.startswith('data.')):
        raise ValueError(
            f'{entry} takes only --{flag}.data.* from --{flag}; --{flag}.{ignored[0]} would be '
            "ignored (the model, training and mesh settings are the checkpoint's)"
        )


# Keys of a section another variant owns that an MHA / GQA run still reads: the MHA -> MLA
# conversion takes the source's latent_norm_eps (lm/convert/methods.py).
READ_BY_CONVERSIONS = ('model.mla.latent_norm_eps',)


def check_inactive_overrides(config: ml_collections.ConfigDict, keys: list[str]) -> None:
    """One-line error for a `--config.KEY` override (`keys`: the KEYs given) in a `config.model`
    section the run's attention does not read, e.g. `--config.model.mla.kv_lora_rank` with a
    variant that has no latent: it would do nothing (most likely --config.model.attention was
    left out). Config files may set such sections for every point of a sweep; only overrides
    are refused."""
    inactive = inactive_sections(config.model.attention)
    for key in keys:
        section = key.split('.')[1] if key.startswith('model.') and key.count('.') > 1 else ''
        if section in inactive and key not in READ_BY_CONVERSIONS:
            raise ValueError(
                f'--config.{key} does nothing: config.model.attention='
                f'{config.model.attention!r} reads no config.model.{section} (give '
                '--config.model.attention too if that was meant; a run that saved it resumes '
                'with --workdir alone)'
            )


def check_writable_dir(path: str, setting: str) -> None:
    """One-line error unless `path` is (or can be created as) a writable directory; writes
    nothing there (a probe file in the nearest existing directory is removed at once)."""
    if '://' in path:  # object stores (gs://...) are checked by the library that writes them
        return
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f'{setting}={path!r} is a file, not a directory')
    probe = path
    while not os.path.isdir(probe):
        if os.path.exists(probe):
            raise ValueError(f'{setting}={path!r} cannot be created: {probe!r} is a file')
        probe = os.path.dirname(probe)
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        what = 'is not writable' if probe == path else f'cannot be created in {probe!r}'
        raise ValueError(f'{setting}={path!r} {what} ({e.strerror})') from None


def run_reporting_errors(main: Callable[[], int | None]) -> None:
    """Runs `main`; a user error becomes one line on stderr and exit status 1. The process then
    exits without the interpreter's final garbage collection (`gc.freeze`): with JAX and Flax
    loaded it walks every object, for 0.4 s to a second of each process, to free memory the
    exit frees anyway. Cycles left unreachable then are not finalised (Python does not promise
    it at exit); files are closed by their `with` blocks and writers by their owners before."""
    logging.get_absl_handler().addFilter(_QuietLibraries())
    try:
        _run_and_exit(main)
    finally:
        gc.freeze()


def _run_and_exit(main: Callable[[], int | None]) -> None:
    """`main()`, its exit status as SystemExit; user errors and interruptions in one line. A
    stop signal that no phase of `main` listens for stops it as Ctrl-C does (`EntryPointStop`)."""
    if threading.current_thread() is not threading.main_thread():
        return _report_and_exit(main, StopRequest())  # never entered: receives nothing
    with EntryPointStop() as stop:
        _report_and_exit(main, stop)


def _report_and_exit(main: Callable[[], int | None], stop: StopRequest) -> None:
    try:
        code = main()
        if _CACHE_EVENTS['on']:
            logging.info(
                'persistent compilation cache (%s): %d hits, %d misses',
                jax.config.jax_compilation_cache_dir,
                _CACHE_EVENTS['hits'],
                _CACHE_EVENTS['misses'],
            )
    except USER_ERRORS as e:
        logging.flush()
        print(f'error: {e}', file=sys.stderr)
        sys.exit(1)
    except Interrupted as e:  # a read-only phase stopped by SIGTERM / SIGINT: nothing written
        logging.flush()
        print(f'{e}; nothing written', file=sys.stderr)
        sys.exit(128 + e.signum)
    except KeyboardInterrupt as e:  # where no phase listens: one line, not a traceback
        logging.flush()
        signum = getattr(e, 'signum', signal.SIGINT)
        print(_stopped(signum), file=sys.stderr)
        sys.exit(128 + signum)
    if stop.signum and not code:  # raised where Python dropped it, and no phase stopped
        print(f'{_stopped(stop.signum)} (once the command had finished)', file=sys.stderr)
        sys.exit(128 + stop.signum)
    sys.exit(code or 0)


def _stopped(signum: int) -> str:
    return 'stopped by SIGINT (Ctrl-C)' if signum == signal.SIGINT else 'stopped by SIGTERM'


def run_app(run: Callable[[], int | None]) -> None:
    """The whole `if __name__ == '__main__'` of an entry point: absl flag parsing with one-line
    errors, then `run()` with user errors reported in one line."""
    app.run(lambda argv: run_reporting_errors(run), flags_parser=parse_flags)
