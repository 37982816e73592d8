"""What a stage tells its user: one line at a time on stderr, and errors to act on."""

from __future__ import annotations

import sys


class AccelbenchError(Exception):
    """A failure the user can act on: the CLI prints the message (what happened, what was
    expected, what to do) and exits with code 2, without a traceback."""


class StageError(AccelbenchError, RuntimeError):
    """A stage cannot do what it was asked; the message says why and what to do."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
