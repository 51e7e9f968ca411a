"""The entry points' flags (lm.cli's half that parses them): config-file flags (`--config=FILE`,
`--config.KEY=VALUE`) checked before absl parses them, so a bad file, key or value is one line,
and the benchmarks' recipe flags."""

from __future__ import annotations

import gc
import os
import re
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from lm.config import check_config_file, first_line, get_key, with_overrides

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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

    def config(self, variant: str, flag: str = '--variant') -> ml_collections.ConfigDict:
        """`get_config(variant)` with config.data.path set (source 'text'), then --set; `flag`
        is the script's flag that named the variant, for a variant the file refuses."""
        try:  # a one-line error naming the file (a config that takes no variant, say)
            config = check_config_file(f'{self._file.value}:{variant}')
        except ValueError as e:
            if 'takes no argument' not in str(e):  # the variant itself is refused: name its flag
                raise ValueError(f'{flag}={variant}: {e}') from None
            raise ValueError(
                f'{e} (the script builds the variant {variant!r} it times as get_config('
                f'{variant!r}): give a --config whose get_config takes a variant name, as '
                'configs/shakespeare_char.py and configs/gpt125m.py do)'
            ) from None
        if config.data.source == 'text':  # the one source that needs a file
            config.data.path = self._data.value
        return with_overrides(config, self._set.value)


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
