"""What a stage tells its user: one line at a time on stderr, and errors to act on.

Exit codes (docs/reliability.md): 0 done; 2 a usage or input error (fix the input); 1 a
failure (a mirror, the tracking server, memory, a bug: the input was fine); 130 interrupted;
141 the reader of the output went away. `accelbench doctor` adds 3 (CPU only).
"""

from __future__ import annotations

import errno
import re
import reprlib
import sys
import threading
import traceback
from collections.abc import Callable

EXIT_FAILURE = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader went away
DEBUG_ENV = "ACCELBENCH_DEBUG"
MAX_LINE = 500  # characters of an error line
ECHO_CHARS = 80  # characters of a value a message quotes: a 5 MB value is no 5 MB error line
# A full disk (or quota, or `ulimit -f`): the machine's state, not a bad input nor a bug.
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


# OS errors that mean "this path is not what it must be": the user fixes the input.
INPUT_ERRNOS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.EROFS,
    errno.EEXIST,
    errno.ENAMETOOLONG,
}
# Words of an error (or its cause) that mean the machine or the process's limits ran out.
_EXHAUSTED = ("failed to map segment", "cannot allocate memory", "can't start new thread")


def _exhausted(exc: BaseException) -> BaseException | None:
    """The innermost error in `exc`'s chain that says memory or threads ran out, if any."""
    found, seen = None, exc
    while seen is not None:
        words = str(seen).lower()
        if isinstance(seen, MemoryError) or (
            isinstance(seen, ImportError | OSError | RuntimeError)
            and any(w in words for w in _EXHAUSTED)
        ):
            found = seen
        seen = seen.__cause__ or seen.__context__
    return found


def error_message(exc: BaseException) -> tuple[str, int]:
    """The message and exit code for an error, as the CLI and the scripts report it: ours say
    what to do, an OS error names its path, exhaustion is the machine's, the rest a bug's."""
    if isinstance(exc, AccelbenchError):
        return str(exc), exc.exit_code
    if (cause := _exhausted(exc)) is not None:
        return (
            f"out of memory or threads ({first_sentence(cause, 120)}): the machine's free "
            "memory or this process's limits (ulimit -v, ulimit -u, a container's memory or "
            "pids limit) are too small for this stage; free memory or raise the limit and run "
            "again",
            EXIT_FAILURE,
        )
    if isinstance(exc, OSError) and (exc.filename is not None or exc.errno in DISK_FULL_ERRNOS):
        what = exc.strerror or type(exc).__name__
        code = EXIT_INPUT if exc.errno in INPUT_ERRNOS else EXIT_FAILURE
        advice = (
            "check the path and its permissions"
            if code == EXIT_INPUT
            else "free some space, or raise the quota or `ulimit -f`, and run again"
            if exc.errno in DISK_FULL_ERRNOS
            else f"run again with --debug or {DEBUG_ENV}=1 for details"
        )
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{what} ({advice})", code
    detail = clip(str(exc).strip().splitlines()[0], 200) if str(exc).strip() else ""
    return (
        f"unexpected {type(exc).__name__}{': ' + detail if detail else ''} "
        f"(run again with --debug or {DEBUG_ENV}=1 for the traceback, and report it)",
        EXIT_FAILURE,
    )


def print_error(who: str, message: str) -> None:
    """`who: error: message` on stderr, its URIs' secrets masked (`redact`), every line cut at
    MAX_LINE whatever it quotes."""
    lines = "\n".join(clip(line, MAX_LINE) for line in redact(message).splitlines())
    print(f"{who}: error: {lines}", file=sys.stderr)


def script_main(main: Callable[[], int], name: str) -> int:
    """A script's entry point (benchmarks/, tools/): our errors, and OS errors naming a file or
    a full disk, end as the CLI's do; any other error's traceback is masked."""
    redact_tracebacks()
    try:
        return main()
    except (AccelbenchError, OSError) as exc:
        if isinstance(exc, OSError) and exc.filename is None and exc.errno not in DISK_FULL_ERRNOS:
            raise
        message, code = error_message(exc)
    print_error(name, message)
    return code


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` with its URIs' secrets masked (`redact`), then cut to `limit` characters with a
    trailing "…" (a password's "@" may lie past the cut); a cut inside a URI's host part keeps
    its `scheme://` only."""
    text = redact(text)
    return text if len(text) <= limit else _CUT_AUTHORITY.sub("", text[: limit - 1]) + "…"


def first_sentence(exc: BaseException, limit: int) -> str:
    """An error's type and the first sentence of its words, cut to `limit` characters: torch's
    weights-only refusal goes on for a page, and a bare KeyError says only "101"."""
    first = redact(" ".join(str(exc).split())).split(". ")[0][:limit]  # masked, then cut
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# reprlib looks at a bounded part of a value: a huge or deeply shared structure costs nothing.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A value as an error message quotes it (`repr`), cut to `limit` characters."""
    if isinstance(value, str):
        text = repr(redact(value)[: limit + 1])  # masked, then cut (clip cuts a longer one)
    elif isinstance(value, int) and value.bit_length() > 256:  # repr refuses > 4300 digits
        text = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    else:
        try:
            text = _SHORT_REPR.repr(value)
        except ValueError:  # a huge integer inside
            text = f"<a {type(value).__name__}>"
    return clip(text, limit)


# A URI's user info: in a run of characters a URI may hold, from its first "scheme://" (not
# "scheme:///": sqlite:////home/me@corp is a path) up to the run's last "@" (a password may
# hold "@" or "/"). Query or fragment parameters whose name ends in a secret's word
# (X-Amz-Signature, access_token, accessToken, sig) and libpq's `password=`. Every pattern
# is matched in one pass: a crafted text of megabytes costs milliseconds.
_URI_RUN = re.compile(r"[^\s'\"<>]+")
_SCHEME = re.compile(r"[\w+.-]://(?!/)")
_PARAM = re.compile(r"([?&;#])([^=&;#?\s'\"<>]*)=([^&;#\s'\"<>]*)")
_NAME_PARTS = re.compile(r"[-_.]|(?<=[a-z])(?=[A-Z])")  # access_token, X-Amz-Signature, apiKey
_SECRET_WORDS = {
    *("token", "key", "apikey", "secret", "password", "passwd", "pwd", "pass", "sig", "signature"),
    *("credential", "credentials", "auth", "authorization", "session", "sessionid", "jwt"),
}
_NOT_SECRET = frozenset({"viewStateShareKey"})  # the MLflow UI's saved view, in our links
_LIBPQ_PASSWORD = re.compile(r"(?i)(?<![\w.-])(password=)[^\s'\"<>]*")
_CUT_AUTHORITY = re.compile(r"(?<=://)[^\s'\"<>/]*$")  # a cut text ending in a URI's host part


def _mask_user_info(run: re.Match[str]) -> str:
    text = run.group()
    at = text.rfind("@")
    scheme = _SCHEME.search(text) if at > 0 else None
    if scheme is None or at < scheme.end():
        return text
    return text[: scheme.end()] + "***" + text[at:]


def _mask_param(param: re.Match[str]) -> str:
    start, name, _ = param.groups()
    last_word = _NAME_PARTS.split(name)[-1].lower()
    if last_word not in _SECRET_WORDS or name in _NOT_SECRET:
        return param.group()
    return f"{start}{name}=***"


def redact(text: str) -> str:
    """`text` with its URIs' user info (the host and port stay) and secret-looking parameters
    as ***. Works on any text, a malformed URI or a whole message; never raises."""
    text = _PARAM.sub(_mask_param, _URI_RUN.sub(_mask_user_info, text))
    return _LIBPQ_PASSWORD.sub(r"\1***", text)


def log(message: str) -> None:
    """`message` on stderr, its URIs' secrets masked (`redact`)."""
    print(redact(message), file=sys.stderr, flush=True)


def print_traceback(exc: BaseException, heading: str = "") -> None:
    """`exc`'s traceback on stderr, masked (`redact`): it may quote the tracking URI."""
    log(heading + "".join(traceback.format_exception(exc)).rstrip())


def redact_tracebacks() -> None:
    """Python's own tracebacks, in any thread (MLflow's too), masked as `print_traceback`."""
    sys.excepthook = lambda _type, exc, _tb: print_traceback(exc)
    threading.excepthook = lambda hook: (
        None
        if hook.exc_type is SystemExit or hook.exc_value is None
        else print_traceback(hook.exc_value, f"Exception in thread {hook.thread.name}:\n")
    )
