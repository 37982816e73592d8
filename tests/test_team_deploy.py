"""What a team deploys (docs/teams.md) says what the launcher accepts: the compose file's
server command passes `accelbench server`'s checks and names the database its `db` service
creates; `make server` runs the launcher; the image and `make setup` install the `team`
extra, the GPU hosts' wheelhouse does not; CI installs and requires the services the team
tests start. (tests/test_team_server.py runs the systemd unit's command for real.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from sqlalchemy.engine import make_url

from accelbench.system import server
from helpers import REPO, load_script

TEAM_PACKAGES = {"psycopg", "psycopg-binary", "dvc-ssh", "sshfs"}


def _launcher_args(argv: list[str]):
    assert argv[:2] == ["accelbench", "server"], argv
    own = argv[2:]
    extra = own[own.index("--") + 1 :] if "--" in own else []
    args = server.parser().parse_args(own[: own.index("--")] if "--" in own else own)
    return args, server.check_mlflow_args(extra)


def test_the_compose_files_server_uses_its_database_and_volume() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    db, mlflow = compose["services"]["db"], compose["services"]["mlflow"]
    args, _ = _launcher_args(mlflow["command"])
    assert args.host == "0.0.0.0" and args.port == 5000
    assert mlflow["ports"] == [f"{args.port}:{args.port}"]
    url = make_url(server.check_database_uri(args.database))
    assert (url.host, url.port) == ("db", 5432) and url.password is None
    assert url.username == db["environment"]["POSTGRES_USER"]
    assert url.database == db["environment"]["POSTGRES_DB"]
    assert mlflow["environment"]["PGPASSWORD"] == db["environment"]["POSTGRES_PASSWORD"]
    assert mlflow["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert f"artifacts:{args.artifacts}" in mlflow["volumes"]
    assert mlflow["image"] == "accelbench"
    assert "docker build -t accelbench ." in (REPO / "Dockerfile").read_text()


def _runtime_export(*extras: str) -> set[str]:
    command = [
        str(Path(sys.executable).parent / "uv"),
        "export",
        "--frozen",
        "--no-dev",
        "--no-emit-project",
        "--no-header",
        "--no-annotate",
        "--project",
        str(REPO),
        *(f"--extra={extra}" for extra in extras),
    ]
    lines = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return {line.split("==")[0].lower() for line in lines.splitlines() if "==" in line}


def test_the_team_extra_goes_to_setup_and_the_image_but_not_to_the_wheelhouse() -> None:
    wh = load_script(REPO / "tools" / "wheelhouse.py")
    wheelhouse = {p.key for p in wh.parse_requirements(wh.export_runtime())}
    assert not wheelhouse & TEAM_PACKAGES, wheelhouse & TEAM_PACKAGES
    assert _runtime_export("plots", "team") >= TEAM_PACKAGES
    assert "--extra plots --extra team" in (REPO / "Makefile").read_text()
    assert "--extra plots --extra team" in (REPO / "Dockerfile").read_text()


def test_make_server_runs_the_launcher_with_host_and_port() -> None:
    env = {**os.environ, "ACCELBENCH_ENV": str(Path(sys.executable).parent.parent)}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "server", "HOST=0.0.0.0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("accelbench ")]
    args, extra = _launcher_args(shlex.split(line))
    assert (args.host, args.port, extra) == ("0.0.0.0", 5000, [])


def test_ci_installs_and_requires_the_services() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "postgresql openssh-server" in ci
    assert "export ACCELBENCH_REQUIRE_SERVICES=1" in ci


def test_users_are_told_the_url_to_set() -> None:
    assert server.users_url("127.0.0.1", 5000) == "http://127.0.0.1:5000"
    assert server.users_url("0.0.0.0", 5001).endswith(":5001")
    assert "0.0.0.0" not in server.users_url("0.0.0.0", 5001)


def test_the_hosts_users_are_told_are_allowed_unless_a_users_list_says_otherwise(
    monkeypatch,
) -> None:
    monkeypatch.delenv(server.ALLOWED_HOSTS_ENV, raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "error::UserWarning")
    url = server.users_url("0.0.0.0", 5001)
    env, warning = server.server_env("postgresql://u@h/db", [], url)
    allowed = env[server.ALLOWED_HOSTS_ENV].split(",")
    assert warning is None and server.refused_url(env[server.ALLOWED_HOSTS_ENV], url) is None
    assert {"localhost:*", "127.0.0.1:*", "10.*", "192.168.*"} <= set(allowed)  # MLflow's
    # `make ui`'s filter, the user's own after it (the later wins)
    assert env["PYTHONWARNINGS"] == f"{server.UI_WARNINGS},error::UserWarning"

    # a list of the user's own goes to MLflow as given; one that refuses the URL is named
    for extra, environ in (([], "mlbox:5001"), (["--allowed-hosts", "mlbox:5001"], "other:1")):
        monkeypatch.setenv(server.ALLOWED_HOSTS_ENV, environ)
        env, warning = server.server_env("postgresql://u@h/db", extra, url)
        assert env[server.ALLOWED_HOSTS_ENV] == environ
        host = url.removeprefix("http://")
        assert warning.startswith("accelbench server: warning: the allowed hosts (mlbox:5001)")
        assert f"refuse {host}" in warning and "\n" not in warning
    env, warning = server.server_env("postgresql://u@h/db", ["--allowed-hosts=*"], url)
    assert warning is None


def test_the_docs_allowed_hosts_keep_mlflows_defaults() -> None:
    """docs/teams.md's own list (which replaces MLflow's defaults), and the deploy files'."""
    import re

    from mlflow.server.security_utils import is_allowed_host_header

    for path in ("docs/teams.md", "deploy/compose.yaml", "deploy/accelbench-server.service"):
        [example] = re.findall(r"ALLOWED_HOSTS='?([^'\s]+)", (REPO / path).read_text())
        hosts = example.split(",")
        for host in ("mlbox:5000", "localhost:5000", "127.0.0.1:5000", "10.0.0.5:5000",
                     "192.168.1.9:5000", "172.16.0.1:5000", "172.24.3.4:5000", "172.31.9.9:5000"):  # fmt: skip
            assert is_allowed_host_header(hosts, host), (path, host)
        for host in ("172.32.0.1:5000", "8.8.8.8:5000", "evil.example:5000"):
            assert not is_allowed_host_header(hosts, host), (path, host)
