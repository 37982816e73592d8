"""`accelbench ui` (`make ui`): the MLflow UI over this checkout's own store.

After its checks (`ui_intro`) it prints the link to the newest pipeline's variants and
*becomes* `mlflow server` over `mlflow.db` (exec) with one worker, plenty for one browser.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from accelbench.core.console import log
from accelbench.system.server import mlflow_server_env, port_problem
from accelbench.system.tracking.store import STORE, is_server, sqlite_path
from accelbench.system.tracking.view import server_view_url, training_view


def _ui_address_problem(host: str, port: str) -> str | None:
    """Why `make ui` cannot serve on HOST:PORT, with what to pass instead; None if it can."""
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"PORT={port!r} is not a port number (1-65535): make ui PORT=5000"
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"HOST={host!r} is not an address to serve on ({exc}): make ui HOST=127.0.0.1"
    if problem := port_problem(host, int(port)):
        return f"{problem}; stop it, or choose another port: make ui PORT={int(port) + 1}"
    return None


def ui_intro(host: str, port: str, store: Path) -> int:
    """`make ui`'s first step: refuse (one line, exit 1) a port in use or a MLFLOW_TRACKING_URI
    that is not `store`; else print the link."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if is_server(uri):
        log(
            f"make ui: MLFLOW_TRACKING_URI is {uri}: the runs are on that server, open "
            f"{server_view_url(uri)} (or run `accelbench runs`); `MLFLOW_TRACKING_URI= make ui` "
            "serves this checkout's own store"
        )
        return 1
    elsewhere = sqlite_path(uri)
    if uri and (elsewhere is None or elsewhere.resolve() != store.resolve()):
        log(
            f"make ui: MLFLOW_TRACKING_URI is {uri}, not this checkout's store {store}: serve "
            f"it with `mlflow server --backend-store-uri {uri}`; `MLFLOW_TRACKING_URI= make ui` "
            "serves this checkout's own"
        )
        return 1
    if problem := _ui_address_problem(host, port):
        log(f"make ui: {problem}")
        return 1
    url, what = training_view(f"http://{host}:{port}", store)
    print("Open", url, f"({what})")
    return 0


def main(argv: list[str]) -> int:
    """Check, print the link, then replace this process with MLflow's server."""
    parser = argparse.ArgumentParser(prog="accelbench ui", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
    parser.add_argument("--port", default="5000", help="port to serve on")
    args = parser.parse_args(argv)
    store = Path.cwd() / STORE
    if code := ui_intro(args.host, args.port, store):
        return code
    sys.stdout.flush()  # the link, before exec replaces this process and its buffers
    command = [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store}",
        "--host", args.host, "--port", args.port, "--workers", "1",
    ]  # fmt: skip
    os.execve(command[0], command, mlflow_server_env())
    return 1  # not reached: execve replaced this process
