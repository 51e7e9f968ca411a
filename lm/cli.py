"""Shared command-line plumbing for the entry points (train.py, eval.py, scripts/)."""

from __future__ import annotations

import logging as pylogging
import sys
from collections.abc import Callable

from absl import flags, logging

# Errors that mean "the user asked for something that cannot work": reported in one line.
USER_ERRORS = (ValueError, FileNotFoundError, FloatingPointError)


class _QuietLibraries(pylogging.Filter):
    """Drops orbax's per-save INFO chatter; its warnings and errors still show."""

    def filter(self, record: pylogging.LogRecord) -> bool:
        return record.levelno >= pylogging.WARNING or '/orbax/' not in record.pathname


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
    except USER_ERRORS as e:
        logging.flush()
        print(f'error: {e}', file=sys.stderr)
        sys.exit(1)
    sys.exit(code or 0)
