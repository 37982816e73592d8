"""`accelbench server`: a team's MLflow tracking server, its runs in PostgreSQL, its artifacts
proxied (docs/teams.md). A launcher: it refuses in one line (exit 2) what would fail or undo
its settings, then *becomes* `mlflow server --serve-artifacts` (exec).

The database URI reaches MLflow through its own environment variable, never the command line,
so `ps` shows no password in it; messages mask its user info (`redact`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

from accelbench.core.console import EXIT_INPUT, InputError, clip, print_error, redact

DATABASE_ENV = "MLFLOW_BACKEND_STORE_URI"  # MLflow's own names: `mlflow server` reads both
ARTIFACTS_ENV = "MLFLOW_ARTIFACTS_DESTINATION"
JOBS_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
ALLOWED_HOSTS_ENV = "MLFLOW_SERVER_ALLOWED_HOSTS"
# MLflow's own switch and the cross-tool one (both read by mlflow.telemetry.utils)
TELEMETRY_OFF = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")
# `make ui`'s filter too (system/ui.py): Starlette's deprecation of the WSGI middleware MLflow
# mounts, once per worker; a user's own PYTHONWARNINGS, after it, wins.
UI_WARNINGS = "ignore:starlette.middleware.wsgi is deprecated:UserWarning"
DEFAULT_HOST = "127.0.0.1"  # this machine only, unless --host says otherwise
DEFAULT_PORT = 5000
CONNECT_TIMEOUT_S = 5
POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2")
# `mlflow server` options this launcher sets itself, and the option of ours that sets each.
OWN_OPTIONS = {
    "--backend-store-uri": "--database",
    "--artifacts-destination": "--artifacts",
    "--default-artifact-root": "--artifacts (artifacts are proxied: clients never see it)",
    "--no-serve-artifacts": "nothing: artifacts are always proxied",
    "--artifacts-only": "nothing: this is the tracking server",
    **dict.fromkeys(("--host", "-h"), "--host before `--`"),
    **dict.fromkeys(("--port", "-p"), "--port before `--`"),
}


def check_database_uri(uri: str | None) -> str:
    """The URI, if it names a PostgreSQL database; else InputError saying what to write."""
    if not uri:
        raise InputError(
            f"no database: pass --database postgresql://USER@HOST:5432/DB or set {DATABASE_ENV}"
        )
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in POSTGRES_SCHEMES:
        hint = {
            "postgres": "write postgresql:// (SQLAlchemy does not read postgres://)",
            "sqlite": "SQLite is a checkout's own store (`make ui` serves it); a team's runs "
            "live in PostgreSQL",
        }.get(scheme.split("+", 1)[0], "write postgresql://USER@HOST:5432/DB")
        raise InputError(f"--database {redact(uri)}: not a postgresql:// URI; {hint}")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise InputError(f"--database {redact(uri)}: not a database URI ({exc})") from None
    if not url.database:
        raise InputError(
            f"--database {redact(uri)}: names no database; add it: postgresql://USER@HOST:5432/DB"
        )
    return uri


def check_artifacts(destination: str | None) -> str:
    """A local folder (created, and writable) as a file:// URI; s3://, gs://... as given."""
    if not destination:
        raise InputError(
            f"no artifact store: pass --artifacts FOLDER (or s3://BUCKET/PATH) or set {ARTIFACTS_ENV}"
        )
    if (parts := urlsplit(destination)).password is not None:
        raise InputError(
            f"--artifacts {redact(destination)}: holds a password, which `mlflow "
            "server`'s command line would show to everyone on this host (ps); leave them out and "
            "give the store's client its credentials (AWS_* or GOOGLE_* variables, "
            "~/.ssh/config and a key for sftp://)"
        )
    if len(parts.scheme) > 1 and parts.scheme != "file":
        return destination
    folder = Path(parts.path if parts.scheme == "file" else destination).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--artifacts {folder}: not a folder; name a folder (it is created)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"--artifacts {folder}: cannot create it ({exc.strerror}); name a folder this user "
            "can write"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"--artifacts {folder}: not writable by this user; name one that is")
    return folder.resolve().as_uri()


def check_mlflow_args(extra: list[str]) -> list[str]:
    """The options after `--`, for `mlflow server`, unless one would undo what this sets."""
    for option in (arg.split("=", 1)[0] for arg in extra):
        if option in OWN_OPTIONS:
            raise InputError(
                f"{option} after `--`: accelbench server sets it; use {OWN_OPTIONS[option]}"
            )
    return extra


def _advice(message: str, url) -> str:
    """What to do about a failed connection, from libpq's message."""
    if "password authentication failed" in message or "no password supplied" in message:
        return "fix the user or password (in the URI, PGPASSWORD or ~/.pgpass)"
    if "does not exist" in message and url.database and f'"{url.database}"' in message:
        # as an admin: a role made by plain `createuser` may not create databases
        return (
            f"create it, as a PostgreSQL admin (or a role with CREATEDB): createdb -h "
            f"{url.host or 'localhost'} -p {url.port or 5432} -O {url.username or '$USER'} "
            f"{url.database}"
        )
    unreachable = ("timeout", "translate host name", "resolve host", "Connection refused")
    if any(words in message for words in unreachable):
        return "start PostgreSQL there, or fix the host and port in --database"
    return "fix --database, or the database's access rules (pg_hba.conf)"


def check_connection(uri: str) -> None:
    """Log in to the database once, as MLflow will, with a short timeout; else InputError."""
    import sqlalchemy
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ImportError as exc:
        raise InputError(
            f"the PostgreSQL driver for {redact(uri)} is not installed ({exc}); the `team` "
            "extra brings psycopg, for postgresql:// (make setup installs it; or pip install "
            "'accelbench[team]')"
        ) from None
    engine = sqlalchemy.create_engine(
        uri, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
    )
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.DBAPIError as exc:
        message = " ".join(str(exc.orig).split())  # libpq's lines, as one
        raise InputError(
            f"cannot use the database {redact(uri)} ({clip(message, 200)}); "
            f"{_advice(message, engine.url)}"
        ) from None
    finally:
        engine.dispose()


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on `host:port` (another program holds it), or None."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, OverflowError) as exc:
        return f"{host}:{port} is not an address to serve on ({exc})"
    with closing(socket.socket(family, kind, proto)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind(address)
        except OSError as exc:
            return f"port {port} on {host} is in use by another program ({exc.strerror})"
    return None


def check_port(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise InputError(f"--port {port}: not a port (1-65535)")
    if problem := port_problem(host, port):
        raise InputError(
            f"{problem}; stop it, or choose another: --port {port + 1} "
            f"(make server PORT={port + 1})"
        )


def users_url(host: str, port: int) -> str:
    """What users set MLFLOW_TRACKING_URI to."""
    host = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def refused_url(allowed: str, url: str) -> str | None:
    """A warning, if the `allowed` hosts list refuses the Host header of `url`, else None."""
    from mlflow.server.security_utils import is_allowed_host_header

    host = urlsplit(url).netloc
    if is_allowed_host_header([h.strip() for h in allowed.split(",")], host):
        return None
    return (
        f"accelbench server: warning: the allowed hosts ({allowed}) refuse {host}, so "
        f"MLFLOW_TRACKING_URI={url} gets 403 Invalid Host header; add {host} to them "
        f"({ALLOWED_HOSTS_ENV} or --allowed-hosts; docs/teams.md)"
    )


def mlflow_server_env() -> dict[str, str]:
    """The environment of an MLflow server accelbench starts (`accelbench server`, `make ui`)."""
    # MLflow's job runner (GenAI evaluation jobs: eight more processes, each importing MLflow)
    # serves nothing accelbench logs. No usage data from the server, nor from the browser.
    env = {JOBS_ENV: "false", **dict.fromkeys(TELEMETRY_OFF, "true"), **os.environ}
    env["PYTHONWARNINGS"] = ",".join(filter(None, (UI_WARNINGS, env.get("PYTHONWARNINGS"))))
    return env


def server_env(database: str, extra: list[str], url: str) -> tuple[dict[str, str], str | None]:
    """The environment `mlflow server` runs in, and a warning if its allowed hosts refuse `url`.
    Where the user gives none, MLflow's defaults (which would refuse the host name users are
    told to type) plus this machine's names and the host of `url`, bare and with any port."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    env = {**mlflow_server_env(), DATABASE_ENV: database}
    # as MLflow reads them: the last --allowed-hosts after `--`, else the environment's
    allowed = None
    for i, arg in enumerate(extra):
        if arg == "--allowed-hosts" and i + 1 < len(extra):
            allowed = extra[i + 1]
        elif arg.startswith("--allowed-hosts="):
            allowed = arg.split("=", 1)[1]
    allowed = allowed or os.environ.get(ALLOWED_HOSTS_ENV)
    if not allowed:
        given = urlsplit(url).netloc.rsplit(":", 1)[0]
        names = [n for n in (socket.gethostname(), socket.getfqdn(), given) if n]
        # fnmatch reads "[" as a set: an IPv6 address's bracket is escaped, as MLflow's own are
        ours = [form for name in names for form in (name, f"{name.replace('[', '[[]', 1)}:*")]
        allowed = ",".join(dict.fromkeys([*get_default_allowed_hosts(), *ours]))
        env[ALLOWED_HOSTS_ENV] = allowed
    return env, refused_url(allowed, url)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelbench server",
        usage="accelbench server [--database URI] [--artifacts DEST] [--host HOST] [--port PORT]"
        " [-- MLFLOW_SERVER_OPTION ...]",
        description="A team's MLflow tracking server: runs in PostgreSQL, artifacts proxied "
        "through the server (docs/teams.md). Options after `--` go to `mlflow server` "
        "(e.g. -- --workers 2 --allowed-hosts mlbox:5000).",
        epilog="Exit codes: 2 refused before starting (the line says what to fix); else MLflow's.",
    )
    parser.add_argument(
        "--database",
        default=os.environ.get(DATABASE_ENV),
        metavar="URI",
        help="the PostgreSQL database that holds the runs: postgresql://USER[:PASSWORD]@HOST"
        f"[:PORT]/DB (default ${DATABASE_ENV}; a password may come from PGPASSWORD or ~/.pgpass)",
    )
    parser.add_argument(
        "--artifacts",
        default=os.environ.get(ARTIFACTS_ENV),
        metavar="DEST",
        help="where the server keeps artifacts: a folder (created if missing) or an object-store "
        f"URI such as s3://bucket/path (default ${ARTIFACTS_ENV})",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to listen on (default {DEFAULT_HOST}: this machine only; "
        "0.0.0.0 for a team)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    return parser


def main(argv: list[str]) -> int:
    """Check everything, then replace this process with MLflow's server."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser().parse_args(argv[:cut]), argv[cut + 1 :]
    try:
        extra = check_mlflow_args(extra)
        database = check_database_uri(args.database)
        artifacts = check_artifacts(args.artifacts)
        check_port(args.host, args.port)
        check_connection(database)
    except InputError as exc:
        print_error("accelbench server", str(exc))
        return EXIT_INPUT
    command = [  # the database comes through DATABASE_ENV
        sys.executable, "-m", "mlflow", "server", "--serve-artifacts", "--artifacts-destination",
        artifacts, "--host", args.host, "--port", str(args.port), *extra,
    ]  # fmt: skip
    url = users_url(args.host, args.port)
    env, warning = server_env(database, extra, url)
    print(
        f"accelbench server: runs in {redact(database)}, artifacts in {redact(artifacts)}; users set "
        f"MLFLOW_TRACKING_URI={url}",
        file=sys.stderr,
        flush=True,
    )
    if warning:
        print(warning, file=sys.stderr, flush=True)
    os.execve(command[0], command, env)
    return 1  # not reached: execve replaced this process
