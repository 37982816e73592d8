"""What a stage tells its user: one line at a time on stderr, and errors to act on.

Exit codes (docs/reliability.md): 0 done; 2 a usage or input error (bad
arguments, params.yaml, a missing, unreadable or wrong kind of file: fix the input); 1 a
failure (every mirror failed, the tracking server is unreachable, out of memory, a bug:
the input was fine); 130 interrupted. `accelbench doctor` adds 3 (CPU only).
"""

from __future__ import annotations

import sys

EXIT_FAILURE = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "ACCELBENCH_DEBUG"


class AccelbenchError(Exception):
    """A failure the user can act on: the CLI prints the message (what happened, what was
    expected, what to do) without a traceback and exits with `exit_code`."""

    exit_code = EXIT_FAILURE


class InputError(AccelbenchError, ValueError):
    """An input (an argument, a file, a value) is missing, unreadable or not what it must be."""

    exit_code = EXIT_INPUT


class StageError(AccelbenchError, RuntimeError):
    """A stage cannot do what it was asked; the message says why and what to do."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
