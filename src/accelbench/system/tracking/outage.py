"""Tracking that is down costs a stage one warning line, never its outputs.

A tracking call that fails with an error of MLflow, its store, the network or the file
system (`tracking_errors`) is reported once, with what to do, and the rest of the process
tracks nothing. Any other error is a bug, ours or MLflow's, and raises.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import mlflow
from mlflow.exceptions import MlflowException
from requests.exceptions import RequestException

from accelbench.core import phases
from accelbench.core.console import clip, log, redact
from accelbench.system.tracking.store import is_server, sqlite_path

T = TypeVar("T")
_outage: str | None = None  # set once tracking failed: the rest of this process skips it


def tracking_errors() -> tuple[type[BaseException], ...]:
    """What the outside of tracking raises: MLflow, the network, a file or lock, SQLite, a
    proxy's HTML page for JSON, and SQLAlchemy (only where a store loaded it: 0.25 s)."""
    named = (MlflowException, RequestException, OSError, sqlite3.Error, json.JSONDecodeError)
    sql = sys.modules.get("sqlalchemy.exc")
    return named if sql is None else (*named, sql.SQLAlchemyError)


def describe_failure(exc: BaseException) -> str:
    """What went wrong, in a few words, from the innermost cause ("OperationalError: database
    is locked"), which MLflow's own exception wraps in SQLAlchemy advice."""
    root, seen = exc, {id(exc)}
    while (cause := root.__cause__ or root.__context__) is not None and id(cause) not in seen:
        root = cause
        seen.add(id(root))
    first_line = (str(root).strip().splitlines() or [""])[0]
    whose = "" if root is exc else f" from {type(root).__name__}"
    return clip(f"{type(exc).__name__}{whose}: {first_line}", 300)


def remedy(uri: str, exc: BaseException) -> str:
    """What to do about tracking at `uri` failing with `exc`."""
    # by hand, not urlsplit: a malformed URI (http://[::1) is advised on, not a crash
    scheme, _, rest = uri.partition(":")
    host = rest.lstrip("/").split("/")[0].rpartition("@")[2]  # host:port, no user info
    failure = describe_failure(exc)
    if "Unsupported" in failure:  # MLflow's Unsupported...StoreURIException
        return (
            f"MLflow has no tracking store for the scheme {scheme!r}: set MLFLOW_TRACKING_URI "
            "to http(s)://…, sqlite:///…, postgresql://… (or mysql, mssql), file:… or a folder"
        )
    if not is_server(uri) and sqlite_path(uri) is None:  # a database server: postgresql://
        return "check that the database runs and MLFLOW_TRACKING_URI names it"
    if "file is not a database" in failure:
        return (
            "that file is no SQLite database (damaged, or not a store at all): move it aside, "
            "and a new store starts cleanly, or set MLFLOW_TRACKING_URI to another store"
        )
    if not is_server(uri):
        return (
            "try again once no stage writes to it (locked); if it stays unreadable, move it "
            "aside, or set MLFLOW_TRACKING_URI to another store"
        )
    if "Invalid Host header" in failure or "Invalid Host header" in str(exc):
        return (
            f"the server runs but refuses the host name {host}: use a name it allows, or add "
            "this one to MLFLOW_SERVER_ALLOWED_HOSTS on the server (docs/teams.md)"
        )
    if re.search(r"(too many|error code) 5\d\d", f"{failure} {exc}"):  # its store failed
        return (
            "the server runs but fails (HTTP 5xx): its database or artifact store may be "
            "down; see the server's log"
        )
    return "start the server, or set MLFLOW_TRACKING_URI to one that runs"


def report(exc: BaseException) -> None:
    """Say once, in one line, that tracking failed and what to do; track nothing more."""
    global _outage
    if _outage is not None:
        return
    _outage = describe_failure(exc)
    uri = mlflow.get_tracking_uri()
    log(
        f"accelbench: WARNING: MLflow tracking at {uri} failed ({_outage}). The stage goes "
        "on and writes its DVC outputs; this process logs nothing more to MLflow. "
        f"Before the next run: {remedy(uri, exc)}."
    )


class _HeldBack(logging.Filter):
    """On MLflow's log handlers: its warnings and errors (a traceback each) wait while a
    tracking call runs (`logs_held`) and are dropped once it failed: the outage is one line.
    Those of MLflow's own threads go at once. Every line shown has its secrets masked."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        # MLflow's lines quote the tracking URI, password and all, as ours would (`redact`)
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.levelno < logging.WARNING:
            return True
        if _outage is not None or record.thread != threading.main_thread().ident:
            return False
        if _held is not None:
            _held.append((self.handler, record))
            return False
        return True


_held: list[tuple[logging.Handler, logging.LogRecord]] | None = None


@contextmanager
def logs_held() -> Iterator[None]:
    """MLflow's warnings and errors during the body: dropped if it fails, else shown."""
    global _held
    for handler in logging.getLogger("mlflow").handlers:
        if not any(isinstance(f, _HeldBack) for f in handler.filters):
            handler.addFilter(_HeldBack(handler))
    if _held is not None:  # within another tracking call: the outermost decides
        yield
        return
    _held = []
    try:
        yield
    except BaseException:
        _held = None
        raise
    records, _held = _held, None
    for handler, record in records:
        handler.handle(record)


@contextmanager
def reported() -> Iterator[None]:
    """A tracking step (timed as MLflow's), its failure reported (`report`), not raised."""
    try:
        with phases.phase("mlflow"), logs_held():
            yield
    except tracking_errors() as exc:
        report(exc)


def tolerant(function: Callable[..., T]) -> Callable[..., T | None]:
    """Run a tracking call unless tracking already failed; a failure is reported: None."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        if _outage is not None:
            return None
        with reported():
            return function(*args, **kwargs)
        return None  # reported

    return wrapper
