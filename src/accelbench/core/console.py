"""What a stage tells its user: one line at a time on stderr, and errors to act on.

Exit codes (docs/reliability.md): 0 done; 2 a usage or input error (bad
arguments, params.yaml, a missing, unreadable or wrong kind of file: fix the input); 1 a
failure (every mirror failed, the tracking server is unreachable, out of memory, a bug:
the input was fine); 130 interrupted; 141 the reader of the output went away. `accelbench
doctor` adds 3 (CPU only).
"""

from __future__ import annotations

import errno
import reprlib
import sys
from collections.abc import Callable

EXIT_FAILURE = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader went away
DEBUG_ENV = "ACCELBENCH_DEBUG"
# A write that failed because the disk (or a quota, or `ulimit -f`) is full: the machine's
# state, not a bad input or a bug; whoever meets one stops at once and says so.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class AccelbenchError(Exception):
    """A failure the user can act on: the CLI prints the message (what happened, what was
    expected, what to do) without a traceback and exits with `exit_code`."""

    exit_code = EXIT_FAILURE


class InputError(AccelbenchError, ValueError):
    """An input (an argument, a file, a value) is missing, unreadable or not what it must be."""

    exit_code = EXIT_INPUT


class StageError(AccelbenchError, RuntimeError):
    """A stage cannot do what it was asked; the message says why and what to do."""


def script_main(main: Callable[[], int], name: str) -> int:
    """A script's entry point (benchmarks/, tools/): its AccelbenchErrors, and OS errors that
    name a file, end as the CLI's do, one line on stderr (at most 500 characters a line)
    with the error's exit code, not in a traceback."""
    try:
        return main()
    except AccelbenchError as exc:
        message, code = str(exc), exc.exit_code
    except OSError as exc:
        if exc.filename is None:
            raise
        message, code = f"{exc.filename}: {exc.strerror or type(exc).__name__}", EXIT_INPUT
    first, *rest = message.splitlines() or [""]
    for line in [f"{name}: error: {first}", *rest]:  # a list of problems follows, indented
        print(clip(line, 500), file=sys.stderr)
    return code


# Values echoed in messages are cut to this many characters: a 5 MB value must not become a
# 5 MB error line.
ECHO_CHARS = 80


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, cut to `limit` characters with a trailing "…" when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# reprlib looks at a bounded part of a value: a huge or deeply shared structure costs nothing.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A value as an error message quotes it (`repr`), cut to `limit` characters."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])  # a longer one is cut anyway
    elif isinstance(value, int) and value.bit_length() > 256:  # repr refuses > 4300 digits
        text = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    else:
        try:
            text = _SHORT_REPR.repr(value)
        except ValueError:  # a huge integer inside
            text = f"<a {type(value).__name__}>"
    return clip(text, limit)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
