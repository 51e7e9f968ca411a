"""Shared command-line plumbing for the entry points (train.py, eval.py, scripts/)."""

from __future__ import annotations

import collections
import logging as pylogging
import os
import sys
from collections.abc import Callable

import jax
import ml_collections
from absl import app, flags, logging

from lm.config import load_config_file
from lm.sweep import with_overrides

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Errors that mean "the user asked for something that cannot work": reported in one line.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError)


class _QuietLibraries(pylogging.Filter):
    """Drops orbax's per-save INFO chatter; its warnings and errors still show."""

    def filter(self, record: pylogging.LogRecord) -> bool:
        return record.levelno >= pylogging.WARNING or '/orbax/' not in record.pathname


class RecipeFlags:
    """--config, --data_path and --set of the benchmark scripts (create once, at import, with
    the script's `__name__`, so `--help` lists them): a config file whose `get_config(variant)`
    takes a variant name (default: the shakespeare_char recipe), the text file it trains on,
    and key=value overrides."""

    def __init__(self, module_name: str):
        if module_name == '__main__':
            module_name = sys.argv[0]  # how absl names the main module's flags
        self._file = flags.DEFINE_string(
            'config',
            os.path.join(REPO_ROOT, 'configs', 'shakespeare_char.py'),
            'Config file whose get_config(variant) takes a variant name.',
            module_name=module_name,
        )
        self._data = flags.DEFINE_string(
            'data_path',
            os.path.join(REPO_ROOT, 'data', 'tinyshakespeare.txt'),
            'Text file for config.data.path (python scripts/get_data.py tinyshakespeare).',
            module_name=module_name,
        )
        self._set = flags.DEFINE_multi_string(
            'set',
            [],
            'Config override key=value, e.g. model.dtype=bfloat16.',
            module_name=module_name,
        )

    @property
    def name(self) -> str:
        """The config file, relative to the repository."""
        return os.path.relpath(self._file.value, REPO_ROOT)

    def config(self, variant: str) -> ml_collections.ConfigDict:
        """`get_config(variant)` with config.data.path set, then the --set overrides."""
        config = load_config_file(self._file.value, variant)
        config.data.path = self._data.value
        return with_overrides(config, self._set.value)


def define_distributed_flags() -> None:
    """Flags for multi-host runs; each process of a job runs the same command."""
    flags.DEFINE_string('coordinator_address', '', 'host:port of process 0, for multi-host runs.')
    flags.DEFINE_integer('num_processes', 0, 'Number of processes in a multi-host run.')
    flags.DEFINE_integer('process_id', -1, "This process's index in a multi-host run.")
    flags.DEFINE_bool(
        'distributed',
        False,
        'Join a multi-host run, detecting coordinator and '
        'process index from the cluster (TPU pods, SLURM, Open MPI, Kubernetes).',
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
        jax.distributed.initialize(f.coordinator_address, f.num_processes, f.process_id)
    elif f.distributed:
        jax.distributed.initialize()


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
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f'config.compilation_cache_dir={path!r} cannot be created: {e}') from e
    jax.config.update('jax_compilation_cache_dir', path)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    jax.monitoring.register_event_listener(_count_cache_event)
    _CACHE_EVENTS['on'] = 1


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing (pass as `app.run(main, flags_parser=parse_flags)`) where a bad flag or
    `--config.*` override is one line on stderr, not a traceback."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f'error: {e}', file=sys.stderr)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        print(
            f'error: a --config.* override does not fit the config ({type(e).__name__}: {e}); '
            'check the key exists and the value has its type',
            file=sys.stderr,
        )
    sys.exit(1)


def run_reporting_errors(main: Callable[[], int | None]) -> None:
    """Runs `main`; a user error becomes one line on stderr and exit status 1."""
    logging.get_absl_handler().addFilter(_QuietLibraries())
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
    sys.exit(code or 0)


def run_app(run: Callable[[], int | None]) -> None:
    """The whole `if __name__ == '__main__'` of an entry point: absl flag parsing with one-line
    errors, then `run()` with user errors reported in one line."""
    app.run(lambda argv: run_reporting_errors(run), flags_parser=parse_flags)
