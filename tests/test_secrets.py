"""Secrets in URIs (issue 41): a password or token in MLFLOW_TRACKING_URI or a mirror's URL
is never printed, by the real commands, while the host it names still is."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from accelbench.core.console import clip, echo, redact
from accelbench.system import tracking
from helpers import REPO, write_params

sys.path.insert(0, str(REPO / "tools"))
import mlflow_ui

ACCELBENCH = str(Path(sys.executable).parent / "accelbench")
SECRET = "Pa55-s3cret"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return {**env, **extra}


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    return result.stdout + result.stderr


def _assert_hidden(output: str, host: str) -> None:
    assert SECRET not in output, output
    assert host in output, output


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (f"http://alice:{SECRET}@mlbox:5000/x", "http://***@mlbox:5000/x"),
        (f"https://{SECRET}@mlbox", "https://***@mlbox"),
        (f"postgresql://u:p@{SECRET}@db:5432/m", "postgresql://***@db:5432/m"),
        (f"https://h/a?X-Amz-Credential={SECRET}&X-Amz-Date=1&X-Amz-Signature={SECRET}",
         "https://h/a?X-Amz-Credential=***&X-Amz-Date=1&X-Amz-Signature=***"),
        (f"https://h/?access_token={SECRET}#/runs?viewStateShareKey=v",
         "https://h/?access_token=***#/runs?viewStateShareKey=v"),
        (f"x http://[::1 y ?sig={SECRET}", "x http://[::1 y ?sig=***"),
        (f"http://alice:{SECRET}/x@mlbox", "http://***@mlbox"),
        ("sqlite:////home/me@corp/mlflow.db", "sqlite:////home/me@corp/mlflow.db"),
        (f"https://h/?accessToken={SECRET}&Authorization={SECRET}&apiKey={SECRET}&page=2",
         "https://h/?accessToken=***&Authorization=***&apiKey=***&page=2"),
        (f"host=db user=u password={SECRET} dbname=m", "host=db user=u password=*** dbname=m"),
    ],
)  # fmt: skip
def test_redact_masks_user_info_and_secret_query_values(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_a_message_cut_short_shows_no_part_of_a_long_password() -> None:
    """An error line cut a mirror's URL to 80 characters before masking it: the "@" lay past
    the cut, and the start of a long token was printed."""
    token = "github_pat_11ABCDEFG0" + SECRET * 8
    mirror = f"https://ci-bot:{token}@mirror.example/mnist/"
    for shown in (clip(mirror), echo(mirror), clip(f"mirror {mirror} refused: 403 Forbidden")):
        assert "ci-bot" not in shown and token[:6] not in shown, shown


def test_redact_takes_linear_time_on_crafted_text() -> None:
    """A run of characters without "@" after many "scheme://" took 7 minutes for 1 MB."""
    started = time.monotonic()
    for crafted in ("a://" * 250_000, "?" * 1_000_000, "&x" * 500_000, "x" * 1_000_000):
        clip(crafted)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "[::1"])  # the second: malformed
def test_runs_hides_the_password_of_an_unreachable_tracking_server(tmp_path, host) -> None:
    host = host.format(port=_closed_port())
    write_params(tmp_path)
    env = _env(MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@{host}")
    named = "MLFLOW_TRACKING_URI is not a valid URI" if host == "[::1" else host  # refused first
    _assert_hidden(_run([ACCELBENCH, "runs"], tmp_path, env), named)


def test_the_train_stages_outage_warning_hides_the_password(tmp_path) -> None:
    host = f"127.0.0.1:{_closed_port()}"
    code = """
        from pathlib import Path
        from accelbench.system import tracking
        with tracking.variant_run(Path('.'), 'cpu', {}, {'status': 'trained'}):
            pass
    """
    env = _env(MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@{host}", DVC_STAGE="train@cpu")
    output = _run([sys.executable, "-c", textwrap.dedent(code)], tmp_path, env)
    assert "WARNING: MLflow tracking" in output
    _assert_hidden(output, host)


def test_make_ui_hides_the_password_of_the_tracking_server(tmp_path) -> None:
    host = f"127.0.0.1:{_closed_port()}"
    env = _env(
        MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@{host}",
        ACCELBENCH_ENV=str(Path(sys.executable).parents[1]),
    )
    _assert_hidden(_run(["make", "--no-print-directory", "ui"], REPO, env), host)


@pytest.mark.slow  # a real MLflow server: 30 s
def test_runs_on_a_live_server_hides_the_token(tmp_path, monkeypatch) -> None:
    """The `MLflow:` line and the UI's link each showed the token."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path)
    with tracking.variant_run(tmp_path, "cpu", {}, {"status": "trained"}):
        tracking.log_metrics({"steady_epoch_s": 1.0})
    tracking.finish_pipeline(tmp_path, [], {})
    with mlflow_ui.mlflow_server(tmp_path / "mlflow.db") as url:
        host = url.split("//")[1]
        env = _env(MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@{host}")
        output = _run([ACCELBENCH, "runs"], tmp_path, env)
    assert "| cpu |" in output and "viewStateShareKey=" in output, output
    _assert_hidden(output, f"http://***@{host}/#/experiments/")


@pytest.fixture
def not_found_server() -> Iterator[str]:
    """host:port of an HTTP server that answers 404 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.RequestHandlerClass.do_GET = lambda self: self.send_error(404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("dataset", "variable", "mirror"),
    [
        ("mnist", "ACCELBENCH_MNIST_MIRROR", "http://bob:{secret}@{host}/"),
        ("cifar10", "ACCELBENCH_CIFAR10_MIRROR", "http://{host}/c/?token={secret}"),
    ],
)
def test_download_hides_the_mirrors_secret(tmp_path, not_found_server, dataset, variable, mirror):
    params = write_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    local = [str(tmp_path)]  # tried after the variable's mirror: no internet
    raw["data"] |= {"dataset": dataset, "mirrors": local, "cifar10_mirrors": local}
    params.write_text(yaml.safe_dump(raw))
    env = _env(**{variable: mirror.format(secret=SECRET, host=not_found_server)})
    command = [ACCELBENCH, "--params", str(params), "download", "--out", str(tmp_path / "raw")]
    output = _run(command, tmp_path, env)
    assert "404" in output and "failed" in output, output
    _assert_hidden(output, not_found_server)


@pytest.mark.parametrize("debug", [["--debug"], ["ACCELBENCH_DEBUG=1"]])
def test_debug_tracebacks_hide_the_password(tmp_path, debug) -> None:
    """`accelbench --debug runs` printed MLflow's exception, `http://alice:<password>@…`, in
    its traceback; Python's own tracebacks (an uncaught error, a thread's) are masked too."""
    host = f"127.0.0.1:{_closed_port()}"
    write_params(tmp_path)
    env = _env(MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@{host}")
    flags = [a for a in debug if a.startswith("--")]
    env |= dict(a.split("=") for a in debug if "=" in a)
    output = _run([ACCELBENCH, *flags, "runs"], tmp_path, env)
    assert "Traceback (most recent call last)" in output and "MlflowException" in output
    _assert_hidden(output, host)
    code = f"""
        import threading
        from accelbench.core.console import redact_tracebacks
        redact_tracebacks()
        def fail(): raise RuntimeError("http://alice:{SECRET}@{host}/thread")
        thread = threading.Thread(target=fail)
        thread.start()
        thread.join()
        raise RuntimeError("http://alice:{SECRET}@{host}/main")
    """
    output = _run([sys.executable, "-c", textwrap.dedent(code)], tmp_path, env)
    assert output.count("Traceback (most recent call last)") == 2, output
    assert f"http://***@{host}/thread" in output and f"http://***@{host}/main" in output
    _assert_hidden(output, host)
    # a benchmark's bug (benchmarks/ end through script_main): its traceback, masked
    code = f"""
        from accelbench.core.console import script_main
        def main(): raise RuntimeError("http://alice:{SECRET}@{host}/main")
        script_main(main, "sweep.py")
    """
    output = _run([sys.executable, "-c", textwrap.dedent(code)], tmp_path, env)
    assert output.count("Traceback (most recent call last)") == 1, output
    assert f"RuntimeError: http://***@{host}/main" in output
    _assert_hidden(output, host)
