"""Shared command-line plumbing for the entry points (train.py, eval.py, scripts/)."""

from __future__ import annotations

import collections
import gc
import logging as pylogging
import os
import re
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
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from lm.config import check_config_file, first_line, get_key, with_overrides
from lm.distributed import initialize_distributed
from lm.sharding import check_same_config, set_cpu_devices
from lm.train import EntryPointStop, Interrupted, RunError, StopRequest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
            "Text file for config.data.path of a source='text' config (get_data.py fetches it).",
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
        """`get_config(variant)` with config.data.path set (source 'text'), then --set."""
        try:  # a one-line error naming the file (a config that takes no variant, say)
            config = check_config_file(f'{self._file.value}:{variant}')
        except ValueError as e:
            if 'takes no argument' not in str(e):  # the variant itself is refused: say only that
                raise
            raise ValueError(
                f'{e} (the script builds the variant {variant!r} it times as get_config('
                f'{variant!r}): give a --config whose get_config takes a variant name, as '
                'configs/shakespeare_char.py and configs/gpt125m.py do)'
            ) from None
        if config.data.source == 'text':  # the one source that needs a file
            config.data.path = self._data.value
        return with_overrides(config, self._set.value)


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


def _argv_values(argv: list[str], name: str) -> list[str]:
    """Values given to flag `name` in argv (`--name=v` or `--name v`)."""
    values = []
    for i, a in enumerate(argv[1:], 1):
        if a == '--':
            break
        for prefix in (f'--{name}=', f'-{name}='):
            if a.startswith(prefix):
                values.append(a[len(prefix) :])
        if a in (f'--{name}', f'-{name}') and i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def _check_override_keys(config: ml_collections.ConfigDict, name: str, argv: list[str]) -> None:
    """One-line ValueError for a `--<name>.<key>=value` whose key is not in `config`."""
    for arg in argv[1:]:
        if arg == '--':
            break
        if arg.startswith(f'--{name}.'):
            get_key(config, arg[len(name) + 3 :].partition('=')[0], f'--{name}.*')


def define_config_file(default: str, help_text: str) -> flags.FlagHolder:
    """`--config`, a config file flag with a `default` file. ml_collections parses the default
    and applies argv's `--config.KEY` overrides when the flag is defined (the entry point's
    import), where an unknown KEY would be a traceback: with no --config given, the overrides'
    keys are checked against the default file first, one line and exit 1."""
    if not _argv_values(sys.argv, 'config'):
        try:
            _check_override_keys(check_config_file(default, '--config'), 'config', sys.argv)
        except ValueError as e:
            print(f'error: {e}', file=sys.stderr)
            sys.exit(1)
    return config_flags.DEFINE_config_file('config', default, help_text)


_HELP = {'--help', '-help', '-?', '--helpshort', '--helpfull', '--helpxml'}


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing (pass as `app.run(main, flags_parser=parse_flags)`) where a bad flag,
    config file or `--config.*` override is one line on stderr, not a traceback; an exit here
    (an error, or --help) skips the final collection as `run_reporting_errors` does."""
    try:
        return _parse_flags(argv)
    except SystemExit:
        gc.freeze()
        raise


# Config-file flags of entry points that read a run's saved config when no file is given
# (train.py resuming a workdir): their `--NAME.KEY=VALUE` overrides, taken out of argv at parse
# time, as ['KEY=VALUE', ...] for the entry point to apply to that config.
_SAVED_CONFIG_OVERRIDES: dict[str, list[str]] = {}


def saved_config_overrides(name: str = 'config') -> list[str]:
    """Lets `--NAME.KEY=VALUE` overrides come without `--NAME=FILE` (a flag with no default
    file): the list they are put in when argv is parsed, for the entry point to apply to the
    config it reads instead (`lm.config.with_overrides`). Call it where the flag is defined."""
    return _SAVED_CONFIG_OVERRIDES.setdefault(name, [])


def _take_saved_overrides(argv: list[str], name: str) -> list[str]:
    """`argv` without its `--NAME.KEY=VALUE` items, which go to `saved_config_overrides`."""
    kept, taken = [], _SAVED_CONFIG_OVERRIDES[name]
    for i, a in enumerate(argv):
        if i and a.startswith(f'--{name}.') and '--' not in argv[1:i]:
            key, sep, value = a[len(name) + 3 :].partition('=')
            if not sep:
                raise ValueError(f'--{name}.{key}: give the value as --{name}.{key}=VALUE')
            taken.append(f'{key}={value}')
        else:
            kept.append(a)
    return kept


def _check_given_once(argv: list[str], name: str) -> None:
    """A config-file flag given more than once (absl would keep the last file and then fail on
    its overrides as flags 'defined twice'): a one-line error naming the files."""
    values = _argv_values(argv, name)
    if len(values) > 1:
        raise ValueError(
            f'--{name} is given {len(values)} times ({", ".join(values)}): give one config file '
            f'and change its keys with --{name}.KEY=VALUE'
        )


def _check_overrides_have_a_file(argv: list[str], name: str) -> None:
    """A `--<name>.key=value` override without `--<name>=FILE` when the flag has no default
    file (absl would call it an unknown flag): a one-line error saying what it needs."""
    given = [a.split('=', 1)[0] for a in argv[1:] if a.startswith(f'--{name}.')]
    if given and not _argv_values(argv, name) and flags.FLAGS[name].default is None:
        raise ValueError(
            f'{given[0]} overrides a key of --{name}=FILE, which is not given: pass the config '
            "file with it (without both, a run's workdir supplies its saved config)"
        )


def _override_hint(e: flags.Error) -> str:
    """For an unknown flag that is the other entry points' override syntax, how this one takes
    overrides: run configs (train.py, eval.py, sweep.py, ...) as --config.KEY=VALUE, the
    benchmarks' recipes as --set=KEY=VALUE."""
    name = getattr(e, 'flagname', '')
    files = [n for n in flags.FLAGS if isinstance(flags.FLAGS[n].parser, ConfigFileFlagParser)]
    if name.partition('.')[2] and 'set' in flags.FLAGS and not files:
        return f'; this script takes config overrides as --set={name.partition(".")[2]}=VALUE'
    if name == 'set' and files:
        return f'; this script takes config overrides as --{files[0]}.KEY=VALUE'
    return ''


def _flag_error(e: flags.Error) -> str:
    """absl's message for a flag error in one line; required flags left out say so, with each
    flag's help (absl's own, a line per flag: 'flag --workdir=None: Flag --workdir must have a
    value other than None.')."""
    absl_missing = r'flag --(\w+)=None: Flag --\1 must have a value other than None\.'
    missing = [re.fullmatch(absl_missing, line) for line in str(e).strip().splitlines()]
    if missing and all(m and m[1] in flags.FLAGS for m in missing):
        names = [m[1] for m in missing]
        if len(names) == 1:
            return f'--{names[0]} is required: {flags.FLAGS[names[0]].help}'
        helps = '; '.join(f'--{n}: {flags.FLAGS[n].help}' for n in names)
        return f'{" and ".join(f"--{n}" for n in names)} are required ({helps})'
    return first_line(e) if 'Traceback' in str(e) else str(e)


def _parse_flags(argv: list[str]) -> list[str]:
    """`parse_flags`' work: the config files and overrides checked, then absl's parse."""
    try:
        for name in list(flags.FLAGS):
            if isinstance(flags.FLAGS[name].parser, ConfigFileFlagParser):
                _check_given_once(argv, name)
                for value in _argv_values(argv, name)[-1:]:
                    _check_override_keys(check_config_file(value, f'--{name}'), name, argv)
                if name in _SAVED_CONFIG_OVERRIDES and not _argv_values(argv, name):
                    argv = _take_saved_overrides(argv, name)
                _check_overrides_have_a_file(argv, name)
    except ValueError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(1)
    try:
        return flags.FLAGS(argv)
    except SystemExit:
        if set(argv[1:]) & _HELP:  # absl exits 1 after printing help; asking is no error
            sys.exit(0)
        raise
    except flags.Error as e:
        hint = _override_hint(e)
        print(f'error: {_flag_error(e)}{hint}', file=sys.stderr)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        print(
            f'error: a --config.* override does not fit the config ({type(e).__name__}: {e}); '
            'check the key exists and the value has its type',
            file=sys.stderr,
        )
    sys.exit(1)


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
