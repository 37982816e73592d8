"""A team's tracking server (docs/teams.md): `accelbench server` and `make server` in front of a
real PostgreSQL, which the tests start themselves (Debian's `postgresql` package, on
127.0.0.1, in a temporary cluster, as `nobody` when run as root).

The launcher refuses bad input in one line before anything starts; the tiny pipeline finds its
runs, metrics and artifacts through the server alone; a server killed mid-training and started
again costs the pipeline nothing (the documented contract: docs/reliability.md); two pipelines
tracking into one server at once stay apart. Without PostgreSQL the tests skip, unless
ACCELBENCH_REQUIRE_SERVICES=1 (CI) makes that a failure.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from mlflow.tracking import MlflowClient

from helpers import REPO, copy_repo, repo_params_raw, shared_mnist, write_params

pytestmark = pytest.mark.xdist_group("team_server")  # one worker: one PostgreSQL for the module

BIN = Path(sys.executable).parent
ACCELBENCH = str(BIN / "accelbench")
REQUIRE_ENV = "ACCELBENCH_REQUIRE_SERVICES"
DB_USER, DB_PASSWORD = "mlflow", "s3cret-pw"
# Tiny: one CPU variant, a few seconds of training per run.
TINY = {"epochs": 2, "train_subset": 1024, "test_subset": 512}


def require(found: bool, what: str) -> None:
    """Skip without `what` (a service package), or fail where CI says it must be there."""
    if found:
        return
    message = f"{what} is not installed (apt-get install postgresql openssh-server)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.3) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(interval_s)


# --- PostgreSQL -------------------------------------------------------------------------------


def _postgres_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


@dataclass
class Postgres:
    bin: Path
    port: int
    pg_ctl: Callable[..., None]  # pg_ctl ARGS, as the cluster's owner
    running: bool = True

    def stop(self) -> None:
        """Stop the cluster at once, as a crash would (its clients' connections break)."""
        self.pg_ctl("-m", "immediate", "-w", "stop")
        self.running = False

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "60", "start")
        self.running = True

    def uri(self, database: str, password: bool = True) -> str:
        secret = f":{DB_PASSWORD}" if password else ""
        return f"postgresql://{DB_USER}{secret}@127.0.0.1:{self.port}/{database}"

    def createdb(self, name: str) -> str:
        subprocess.run(
            [self.bin / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", DB_USER, name],
            env={**os.environ, "PGPASSWORD": DB_PASSWORD},
            check=True,
            timeout=60,
        )
        return name


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster of this test module: user `mlflow` with a password, on 127.0.0.1.
    PostgreSQL refuses to run as root: as root, the cluster belongs to `nobody`."""
    pg_bin = _postgres_bin()
    require(pg_bin is not None, "PostgreSQL (/usr/lib/postgresql/*/bin)")
    base = Path(tempfile.mkdtemp(prefix="accelbench-pg-"))
    as_user: dict = {}
    if os.geteuid() == 0:
        as_user = {"user": 65534, "group": 65534, "extra_groups": []}
        os.chown(base, 65534, 65534)
    data, log, password = base / "data", base / "postgres.log", base / "password"
    password.write_text(DB_PASSWORD + "\n")
    if as_user:
        os.chown(password, 65534, 65534)
    port = free_port()

    def pg(*args: str) -> None:
        result = subprocess.run(
            [str(pg_bin / args[0]), *args[1:]],
            timeout=120,
            cwd=base,
            capture_output=True,
            text=True,
            **as_user,
        )
        assert result.returncode == 0, f"{args[0]}: {result.stdout}{result.stderr}"

    try:
        pg(
            "initdb",
            "-D",
            str(data),
            "-U",
            DB_USER,
            "-A",
            "scram-sha-256",
            "--pwfile",
            str(password),
            "-E",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",
        )
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off"

        def pg_ctl(*args: str) -> None:
            pg("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, *args)

        pg_ctl("-w", "-t", "60", "start")
        yield Postgres(pg_bin, port, pg_ctl)
    finally:
        if (data / "postmaster.pid").exists():
            pg("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


# --- the server -------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout_s: float = 180) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"server exited:\n{self.log.read_text()[-3000:]}"
            return self.alive()

        wait_for(ready, timeout_s, f"the server at {self.url}")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_server(command: list[str], port: int, log: Path, env: dict, cwd: Path = REPO) -> Server:
    """Start `command` (`accelbench server` or `make server`) in its own process group."""
    with log.open("a") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


def server_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}
    env["MLFLOW_WORKERS"] = "1"  # one uvicorn worker: 2 cores run the pipeline beside it
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"):
        env.pop(name, None)
    env.update(extra)
    return env


@pytest.fixture
def team_server(postgres, tmp_path) -> Iterator[tuple[Server, Path, list[str], dict]]:
    """`accelbench server` on a new database of the cluster: (server, its artifact folder,
    its command, its environment), the password from PGPASSWORD as the compose file gives it."""
    database = postgres.createdb(f"mlflow_{tmp_path.name.lower().replace('-', '_')}"[:60])
    artifacts, port = tmp_path / "team-artifacts", free_port()
    command = [
        ACCELBENCH,
        "server",
        "--database",
        postgres.uri(database, password=False),
        "--artifacts",
        str(artifacts),
        "--port",
        str(port),
        "--",
        "--workers",
        "1",
    ]
    env = server_env(PGPASSWORD=DB_PASSWORD)
    server = start_server(command, port, tmp_path / "server.log", env)
    try:
        yield server, artifacts, command, env
    finally:
        server.stop()


# --- the pipeline -----------------------------------------------------------------------------


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(
        command, cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def small_repo(folder: Path, **train) -> tuple[Path, Path]:
    """A copy of the repository with the CPU variant alone at TINY (and `train`) params:
    (repo, MNIST mirror)."""
    mirror = shared_mnist()
    if mirror is None:
        pytest.skip("no MNIST mirror: set ACCELBENCH_MNIST_MIRROR (CI sets it)")
    repo = folder / "repo"
    copy_repo(repo)
    cpu_only = {"cpu": repo_params_raw(**(TINY | train))["variants"]["cpu"]}
    params = repo_params_raw(cpu_only, **(TINY | train))
    params["quantize"]["variants"] = []  # int8 inference is not what these tests are about
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo, mirror


def pipeline_env(mirror: Path, tracking_uri: str | None, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "ACCELBENCH_MNIST_MIRROR": str(mirror),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        **extra,
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def dvc(repo: Path, *args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(BIN / "dvc"), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )
    if check:
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def stages_run(result: subprocess.CompletedProcess) -> list[str]:
    out = result.stdout + result.stderr
    return [line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage '")]


# --- what the server holds --------------------------------------------------------------------


def pipeline_runs(client: MlflowClient) -> tuple[str, list, dict[str, list]]:
    """(experiment id, the pipeline runs, their variant runs by pipeline run id)."""
    experiment = client.get_experiment_by_name("accelbench")
    assert experiment is not None, "no accelbench experiment on the server"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("accelbench.role") == "pipeline"]
    children = {
        p.info.run_id: [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
        for p in parents
    }
    return experiment.experiment_id, parents, children


def download(client: MlflowClient, run_id: str, path: str, into: Path) -> bytes:
    into.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(into))).read_bytes()


def assert_complete_through_server(url: str, repo: Path, downloads: Path) -> str:
    """The repo's pipeline as the server holds it: one FINISHED pipeline run with the report,
    its `cpu` run FINISHED with params, per-epoch metrics, the evaluation, the files and the
    model; every artifact an mlflow-artifacts:/ location, downloaded through the server and
    equal to the stage's file. Returns the pipeline run's id."""
    client = MlflowClient(url)
    experiment_id, parents, children = pipeline_runs(client)
    mine = [p for p in parents if p.data.tags.get("accelbench.workdir") == str(repo.resolve())]
    assert len(mine) == 1, [p.data.tags for p in parents]
    pipeline = mine[0]
    assert pipeline.info.status == "FINISHED"
    assert pipeline.info.artifact_uri.startswith("mlflow-artifacts:/")
    report = download(client, pipeline.info.run_id, "comparison.md", downloads / "pipeline")
    assert report == (repo / "reports" / "comparison.md").read_bytes()

    (cpu,) = children[pipeline.info.run_id]
    assert cpu.info.run_name == "cpu" and cpu.info.status == "FINISHED"
    assert cpu.info.artifact_uri.startswith("mlflow-artifacts:/")
    assert cpu.data.params["train.epochs"] == str(TINY["epochs"])
    assert {"steady_epoch_s", "test_accuracy", "eval_test_accuracy"} <= set(cpu.data.metrics)
    history = client.get_metric_history(cpu.info.run_id, "test_accuracy")
    assert len(history) == TINY["epochs"]
    train = json.loads((repo / "metrics" / "cpu" / "train.json").read_text())
    logged_s = cpu.data.metrics["steady_epoch_s"]  # to 4 significant digits
    assert logged_s == pytest.approx(train["steady_epoch_s"], rel=1e-3)
    for name, local in (
        ("confusion.png", repo / "metrics" / "cpu" / "confusion.png"),
        ("eval.json", repo / "metrics" / "cpu" / "eval.json"),
        ("pipeline/params.yaml", repo / "params.yaml"),
    ):
        assert download(client, cpu.info.run_id, name, downloads / "cpu") == local.read_bytes()

    models = client.search_logged_models([experiment_id])
    (model,) = [m for m in models if m.source_run_id == cpu.info.run_id]
    assert model.name == "cpu"
    assert model.artifact_location.startswith("mlflow-artifacts:/")
    import mlflow.artifacts

    folder = mlflow.artifacts.download_artifacts(
        artifact_uri=model.artifact_location, dst_path=str(downloads / "model"), tracking_uri=url
    )
    assert (Path(folder) / "MLmodel").is_file() and (Path(folder) / "data").is_dir()
    return pipeline.info.run_id


# --- the launcher refuses bad input before anything starts ------------------------------------


def run_server(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ACCELBENCH, "server", *args],
        env=env or server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused(result: subprocess.CompletedProcess, *says: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("accelbench server: error: "), result.stderr
    for words in says:
        assert words in lines[0], lines[0]
    assert DB_PASSWORD not in result.stderr + result.stdout


@pytest.mark.slow
def test_refuses_what_is_not_a_postgresql_database_or_a_folder(tmp_path) -> None:
    folder, port = str(tmp_path / "artifacts"), str(free_port())
    good = f"postgresql://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{port}/mlflow"
    assert_refused(run_server("--artifacts", folder), "no database", "MLFLOW_BACKEND_STORE_URI")
    assert_refused(
        run_server("--database", f"postgres://{DB_USER}:{DB_PASSWORD}@h/db", "--artifacts", folder),
        "not a postgresql:// URI",
        "write postgresql://",
        "***",
    )
    assert_refused(
        run_server("--database", "sqlite:///mlflow.db", "--artifacts", folder), "SQLite", "make ui"
    )
    assert_refused(run_server("--database", good), "no artifact store", "--artifacts")
    (tmp_path / "a-file").write_text("x")
    assert_refused(
        run_server("--database", good, "--artifacts", str(tmp_path / "a-file")), "not a folder"
    )
    # `mlflow server`'s command line, which ps shows everyone, would hold the password
    assert_refused(
        run_server("--database", good, "--artifacts", f"sftp://mlflow:{DB_PASSWORD}@h/a"),
        "sftp://***@h/a: holds a password",
        "~/.ssh/config",
    )
    assert_refused(
        run_server("--database", good, "--artifacts", folder, "--", "--backend-store-uri", "x"),
        "--backend-store-uri after `--`",
        "use --database",
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = str(busy.getsockname()[1])
        assert_refused(
            run_server("--database", good, "--artifacts", folder, "--port", taken),
            f"port {taken} on 127.0.0.1 is in use",
            f"--port {int(taken) + 1} (make server PORT={int(taken) + 1})",
        )
    # a host name that does not resolve: where the server is, not who may log in
    assert_refused(
        run_server("--database", f"postgresql://{DB_USER}@nosuchhost.invalid/mlflow", "--artifacts",
                   folder),
        "failed to resolve host",
        "start PostgreSQL there, or fix the host and port",
    )  # fmt: skip
    # nothing listens at `port`: the database is named, and what to do
    assert_refused(
        run_server("--database", good, "--artifacts", folder),
        f"postgresql://***@127.0.0.1:{port}/mlflow",
        "Connection refused",
        "start PostgreSQL there",
    )


@pytest.mark.services
def test_refuses_a_wrong_password_or_a_missing_database(postgres, tmp_path) -> None:
    folder = str(tmp_path / "artifacts")
    wrong = postgres.uri("postgres").replace(DB_PASSWORD, "wrong-pw")
    result = run_server("--database", wrong, "--artifacts", folder)
    assert_refused(result, "password authentication failed", "fix the user or password")
    assert "wrong-pw" not in result.stderr
    assert not Path(folder).exists() or not any(Path(folder).iterdir())


@pytest.mark.services
def test_a_missing_database_is_refused_with_the_command_an_admin_runs(postgres, tmp_path) -> None:
    """Before: the hint was `createdb -U alice ...`, which a role made by plain `createuser`
    (docs/teams.md) may not run: "permission denied to create database"."""
    folder = str(tmp_path / "artifacts")
    as_admin = {**os.environ, "PGPASSWORD": DB_PASSWORD}  # the cluster's superuser: mlflow
    where = ["-h", "127.0.0.1", "-p", str(postgres.port)]
    subprocess.run(
        [postgres.bin / "psql", *where, "-U", DB_USER, "-d", "postgres", "-c",
         "CREATE ROLE alice LOGIN PASSWORD 'alice-pw'"],  # what `createuser -P alice` makes
        env=as_admin, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    uri = f"postgresql://alice:alice-pw@127.0.0.1:{postgres.port}/alice_db"
    result = run_server("--database", uri, "--artifacts", folder)
    assert_refused(result, 'database "alice_db" does not exist', "as a PostgreSQL admin")
    hint = result.stderr.split("): ")[-1].strip()
    command = shlex.split(hint)
    assert command[0] == "createdb" and command[-3:] == ["-O", "alice", "alice_db"], hint
    # alice may not run it herself; the admin may, and then alice's database is there
    own = subprocess.run(
        [postgres.bin / "createdb", *where, "-U", "alice", "alice_db"],
        env={**os.environ, "PGPASSWORD": "alice-pw"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert own.returncode != 0 and "permission denied" in own.stderr, own.stderr
    subprocess.run(
        [postgres.bin / "createdb", *command[1:], "-U", DB_USER], env=as_admin, check=True,
        timeout=60,
    )  # fmt: skip
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("SELECT current_database()")).scalar() == (
                "alice_db"
            )
    finally:
        engine.dispose()


# --- the pipeline through the server ----------------------------------------------------------


@pytest.mark.services
@pytest.mark.slow
def test_make_server_serves_two_pipelines_at_once_every_run_metric_and_artifact(
    postgres, tmp_path
) -> None:
    """docs/teams.md's `make server`, configured by MLflow's own environment variables (the
    password in the URI: it stays out of every process's command line), and two checkouts
    whose pipelines know only MLFLOW_TRACKING_URI, run at once: each finds all of its runs,
    metrics and artifacts through the server alone, and none of the other's."""
    repos = []
    for name in ("alice", "bob"):
        (tmp_path / name).mkdir()
        repos.append(small_repo(tmp_path / name))
    database = postgres.createdb("mlflow_make")
    artifacts, port = tmp_path / "team-artifacts", free_port()
    env = server_env(
        MLFLOW_BACKEND_STORE_URI=postgres.uri(database),
        MLFLOW_ARTIFACTS_DESTINATION=str(artifacts),
        ACCELBENCH_ENV=str(BIN.parent),  # make's setup: this environment, nothing installed
    )
    command = ["make", "--no-print-directory", "server", f"PORT={port}"]
    server = start_server(command, port, tmp_path / "server.log", env, cwd=repos[0][0])
    try:
        for pid in _process_group(server.process.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert DB_PASSWORD.encode() not in cmdline, cmdline
        assert f"users set MLFLOW_TRACKING_URI=http://127.0.0.1:{port}" in server.log.read_text()

        processes = [
            subprocess.Popen(
                [str(BIN / "dvc"), "repro"],
                cwd=repo,
                env=pipeline_env(mirror, server.url),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for repo, mirror in repos
        ]
        outputs = [p.communicate(timeout=900)[0] for p in processes]
        for process, out in zip(processes, outputs, strict=True):
            assert process.returncode == 0, out[-4000:]
            assert "Running stage 'train@cpu'" in out, out[-4000:]
            assert "WARNING: MLflow tracking" not in out, out[-4000:]

        ids = {
            assert_complete_through_server(server.url, repo, tmp_path / f"downloads-{i}")
            for i, (repo, _) in enumerate(repos)
        }
        client = MlflowClient(server.url)
        _, parents, children = pipeline_runs(client)
        assert {p.info.run_id for p in parents} == ids and len(ids) == 2
        assert sum(len(c) for c in children.values()) == 2  # one cpu run each, none shared
        # both created the experiment at once: there is one
        assert [e.name for e in client.search_experiments()].count("accelbench") == 1
        # the server wrote the files where it was told; the checkouts hold no store
        assert len(list(artifacts.rglob("comparison.md"))) == 2
        for repo, _ in repos:
            assert not (repo / "mlartifacts").exists() and not (repo / "mlflow.db").exists()

        repo, mirror = repos[0]
        runs = subprocess.run(
            [ACCELBENCH, "runs"],
            cwd=repo,
            env=pipeline_env(mirror, server.url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert runs.returncode == 0, runs.stderr
        assert f"MLflow: {server.url}" in runs.stdout and "| cpu |" in runs.stdout
    finally:
        server.stop()


def _process_group(pgid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.services
def test_the_systemd_units_command_serves_from_its_environment_file(postgres, tmp_path) -> None:
    """deploy/accelbench-server.service's ExecStart, in a checkout, with the environment file
    its header describes (the variables, not a command-line secret); on 127.0.0.1 and a free
    port instead of 0.0.0.0:5000."""
    unit = (REPO / "deploy" / "accelbench-server.service").read_text()
    service = dict(
        line.split("=", 1)
        for line in unit.split("[Service]")[1].split("[Install]")[0].splitlines()
        if "=" in line and not line.startswith("#")
    )
    described = [line[1:].strip() for line in unit.splitlines() if line.startswith("#     ")]
    assert {line.split("=", 1)[0] for line in described} == {
        "MLFLOW_BACKEND_STORE_URI",
        "MLFLOW_ARTIFACTS_DESTINATION",
        "PGPASSWORD",
        "MLFLOW_SERVER_ALLOWED_HOSTS",
    }
    port = free_port()
    values = {
        "MLFLOW_BACKEND_STORE_URI": postgres.uri(postgres.createdb("mlflow_unit"), password=False),
        "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts"),
        "PGPASSWORD": DB_PASSWORD,
        "MLFLOW_SERVER_ALLOWED_HOSTS": f"mlbox:{port},127.0.0.1:{port}",
    }
    argv = shlex.split(service["ExecStart"])
    checkout = service["WorkingDirectory"]
    assert argv[0] == f"{checkout}/.venv/bin/accelbench" and argv[1] == "server"
    argv[0] = ACCELBENCH
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    server = start_server(argv, port, tmp_path / "server.log", server_env(**values))
    try:
        assert MlflowClient(server.url).search_experiments() is not None
        # MLflow answers the names it was given (MLFLOW_SERVER_ALLOWED_HOSTS), refuses others
        api = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=1"
        named = requests.get(api, headers={"Host": f"mlbox:{port}"}, timeout=5)
        stranger = requests.get(api, headers={"Host": "other:1"}, timeout=5)
        assert (named.status_code, stranger.status_code) == (200, 403)
        # a name the list leaves out: `accelbench runs` says so, not "start the server"
        checkout = tmp_path / "checkout"
        (checkout / ".dvc").mkdir(parents=True)
        write_params(checkout)
        runs = subprocess.run(
            [ACCELBENCH, "runs"], cwd=checkout, capture_output=True, text=True, timeout=120,
            env=pipeline_env(tmp_path, f"http://localhost:{port}"),
        )  # fmt: skip
        assert runs.returncode == 1, runs.stdout + runs.stderr
        assert f"refuses the host name localhost:{port}" in runs.stderr, runs.stderr
        assert (
            "MLFLOW_SERVER_ALLOWED_HOSTS" in runs.stderr and "start the server" not in runs.stderr
        )
    finally:
        server.stop()
    assert "warning: the allowed hosts" not in server.log.read_text()  # they allow its URL
    assert (tmp_path / "artifacts").is_dir()


@pytest.mark.services
def test_the_url_users_are_told_is_allowed_and_the_workers_start_quietly(
    postgres, tmp_path
) -> None:
    """`accelbench server --host 0.0.0.0`, MLFLOW_SERVER_ALLOWED_HOSTS unset. Before: it told
    users http://<hostname>:PORT, which MLflow's default allowed hosts refused (403 Invalid Host
    header), and each worker printed Starlette's deprecation warning."""
    database = postgres.createdb("mlflow_names")
    port = free_port()
    command = [
        ACCELBENCH, "server", "--database", postgres.uri(database, password=False),
        "--artifacts", str(tmp_path / "artifacts"), "--host", "0.0.0.0", "--port", str(port),
        "--", "--workers", "2",
    ]  # fmt: skip
    env = server_env(PGPASSWORD=DB_PASSWORD)
    env.pop("MLFLOW_SERVER_ALLOWED_HOSTS", None)
    server = start_server(command, port, tmp_path / "server.log", env)
    try:
        told = f"http://{socket.gethostname()}:{port}"
        assert f"users set MLFLOW_TRACKING_URI={told}\n" in server.log.read_text()
        api = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=1"
        for host, status in (
            (f"{socket.gethostname()}:{port}", 200),
            (f"{socket.getfqdn()}:{port}", 200),
            (f"localhost:{port}", 200),  # MLflow's defaults stay
            (f"10.1.2.3:{port}", 200),
            ("mlbox.example:1", 403),
        ):
            got = requests.get(api, headers={"Host": host}, timeout=10).status_code
            assert got == status, (host, got)
    finally:
        server.stop()
    output = server.log.read_text()
    assert output.count("Started server process") == 2, output  # both workers ran
    assert "starlette.middleware.wsgi" not in output, output


LOG_A_PIPELINE = """
    from pathlib import Path
    from accelbench.system import tracking
    with tracking.variant_run(Path("."), "cpu", {}, {"status": "trained"}):
        tracking.log_metrics({"steady_epoch_s": 1.5, "test_accuracy": 0.8799})
    tracking.finish_pipeline(Path("."), [], {})
"""


@pytest.mark.services
def test_runs_and_make_ui_lead_to_the_server(team_server, tmp_path) -> None:
    """Before: runs logged to a server printed MLflow's "View run" lines (two a run);
    `accelbench runs` linked the UI of `make ui`, which served the checkout's empty store."""
    server = team_server[0]
    checkout = tmp_path / "checkout"
    (checkout / ".dvc").mkdir(parents=True)
    write_params(checkout)
    env = pipeline_env(tmp_path, server.url)
    env.pop("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", None)

    def log_a_pipeline(**extra: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(LOG_A_PIPELINE)],
            cwd=checkout, env={**env, **extra}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout + out.stderr

    assert "View run" not in log_a_pipeline()
    # a user who wants MLflow's links back
    loud = log_a_pipeline(MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT="false")
    assert f"View run cpu at: {server.url}/" in loud, loud

    runs = subprocess.run(
        [ACCELBENCH, "runs"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert runs.returncode == 0, runs.stderr
    [link_line] = [line for line in runs.stdout.splitlines() if line.startswith("Its variants")]
    link = link_line.split(": ", 1)[1]
    assert link.startswith(f"{server.url}/#/experiments/") and "make ui" not in link_line
    assert "viewStateShareKey" in link
    assert requests.get(link.split("#")[0], timeout=10).status_code == 200

    (checkout / "uv.lock").symlink_to(REPO / "uv.lock")  # the Makefile reads uv's version
    ui = subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "ui", f"PORT={free_port()}"],
        cwd=checkout, env={**env, "ACCELBENCH_ENV": str(BIN.parent)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ui.returncode != 0 and "Open" not in ui.stdout, ui.stdout + ui.stderr
    [refusal] = [line for line in ui.stderr.splitlines() if line.startswith("make ui:")]
    assert f"open {link} (or run `accelbench runs`)" in refusal
    assert "`MLFLOW_TRACKING_URI= make ui`" in refusal
    assert not (checkout / "mlflow.db").exists()

    # a repro of compare alone: a new pipeline run names the earlier one's cpu; both links
    # lead to it (the refusal's link had filtered by the new run's children: none trained)
    report_again = (
        "from pathlib import Path\n"
        "from mlflow.tracking import MlflowClient\n"
        "from accelbench.system import tracking\n"
        "from accelbench.system.tracking.store import setup\n"
        "ids = [r.info.run_id for r in MlflowClient().search_runs(\n"
        "    [setup(Path('.'))], \"attributes.run_name = 'cpu'\")]\n"
        "tracking.finish_pipeline(Path('.'), [], {}, ids[:1])\n"
    )
    again = subprocess.run(
        [sys.executable, "-c", report_again], cwd=checkout, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    runs = subprocess.run(
        [ACCELBENCH, "runs"], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert "| cpu |" in runs.stdout, runs.stdout
    [link_line] = [line for line in runs.stdout.splitlines() if line.startswith("Its variants")]
    link = link_line.split(": ", 1)[1]
    ui = subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "ui", f"PORT={free_port()}"],
        cwd=checkout, env={**env, "ACCELBENCH_ENV": str(BIN.parent)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    [refusal] = [line for line in ui.stderr.splitlines() if line.startswith("make ui:")]
    assert f"open {link} (or run `accelbench runs`)" in refusal and "viewStateShareKey" in link


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "203.0.113.5", "mlbox.lab.example", "fd00::5", "2001:db8::7"]
)
def test_the_url_printed_for_any_host_is_allowed(host) -> None:
    """Only the machine's own names were added to MLflow's defaults: `--host 203.0.113.5` (or a
    name, or an IPv6 address) printed a URL the server then refused (403), with no warning."""
    from mlflow.server.security_utils import is_allowed_host_header

    from accelbench.system import server

    url = server.users_url(host, 5001)
    env, warning = server.server_env("postgresql://mlflow@db/mlflow", [], url)
    allowed = env[server.ALLOWED_HOSTS_ENV].split(",")
    assert warning is None
    assert is_allowed_host_header(allowed, url.split("//", 1)[1])
    assert is_allowed_host_header(allowed, "localhost:5001")  # MLflow's own defaults stay
    assert not is_allowed_host_header(allowed, "evil.example:5001")


def _mlflow_lines(output: str) -> list[str]:
    """MLflow's own log lines and tracebacks in a stage's output (its loggers write
    `<date> WARNING mlflow.<module>: ...`)."""
    return [line for line in output.splitlines() if " mlflow." in line or "Traceback" in line]


SERVER_BACK_IN_TIME = "the server, back before the stage ends"
SERVER_BACK_LATE = "the server, back after the stage ended"
DATABASE_BACK_IN_TIME = "its database, back before the stage ends"


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.parametrize("down", [SERVER_BACK_IN_TIME, SERVER_BACK_LATE, DATABASE_BACK_IN_TIME])
def test_a_run_cut_by_an_outage_ends_finished_with_every_epoch(
    postgres, team_server, tmp_path, down
) -> None:
    """The server is killed (or its PostgreSQL stopped) during epoch 2 of 3 and started again.
    Before: `dvc repro` ended 0, but the variant's run stayed RUNNING under a FINISHED
    pipeline run when the stage ended before the server answered again, lacked the epochs
    trained meanwhile, and MLflow's own warnings (system metrics) reached the user beside
    our one line."""
    server, _, command, env = team_server
    epochs = 3
    repo, mirror = small_repo(tmp_path, epochs=epochs, train_subset=4096)
    port = int(server.url.rsplit(":", 1)[1])
    log = tmp_path / "dvc.log"
    with log.open("w") as out:
        train = subprocess.Popen(
            [str(BIN / "dvc"), "repro", "train@cpu"], cwd=repo, env=pipeline_env(mirror, server.url),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        checkpoint = repo / "checkpoints" / "cpu.pt"
        wait_for(lambda: checkpoint.exists() or train.poll() is not None, 600, "epoch 1", 0.05)
        assert train.poll() is None, "training ended before the outage"
        if down == DATABASE_BACK_IN_TIME:
            postgres.stop()
        else:
            server.stop(signal.SIGKILL)  # during epoch 2: a crash, no goodbye to anyone
        wait_for(lambda: "WARNING: MLflow tracking" in log.read_text(), 120, "the outage")
        if down != SERVER_BACK_LATE:  # the stage waits (SIGSTOP): it ends after the comeback
            os.killpg(train.pid, signal.SIGSTOP)
            assert "accelbench train@cpu: done" not in log.read_text()
            try:
                if down == DATABASE_BACK_IN_TIME:
                    postgres.start()
                else:
                    server = start_server(command, port, server.log, env)
            finally:
                os.killpg(train.pid, signal.SIGCONT)
        assert train.wait(timeout=600) == 0, log.read_text()[-4000:]
        if down == SERVER_BACK_LATE:
            server = start_server(command, port, server.log, env)
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)
        if not postgres.running:
            postgres.start()  # for the module's other tests
    try:
        out = log.read_text()
        later = dvc(repo, "repro", env=pipeline_env(mirror, server.url))  # evaluate, compare
        client = MlflowClient(server.url)
        _, (pipeline,), children = pipeline_runs(client)
        (cpu,) = children[pipeline.info.run_id]
        assert (pipeline.info.status, cpu.info.status) == ("FINISHED", "FINISHED"), cpu.info
        history = client.get_metric_history(cpu.info.run_id, "test_accuracy")
        assert sorted(m.step for m in history) == list(range(1, epochs + 1))
        train_json = json.loads((repo / "metrics" / "cpu" / "train.json").read_text())
        assert train_json["status"] == "trained" and train_json["epochs"] == epochs
        steady_s = train_json["steady_epoch_s"]  # logged to 4 significant digits
        assert cpu.data.metrics["steady_epoch_s"] == pytest.approx(steady_s, rel=1e-3)
        assert "eval_test_accuracy" in cpu.data.metrics  # compare, a later stage, tracked it
        report = download(client, pipeline.info.run_id, "comparison.md", tmp_path / "d")
        assert report == (repo / "reports" / "comparison.md").read_bytes()
        caught_up = [line for line in later.stderr.splitlines() if "caught up" in line]
        said = f"cpu: MLflow run {cpu.info.run_id} caught up with its train stage: logged "
        said += "epoch 2, epoch 3, its summary"  # what the outage cost it, from its files
        if down == SERVER_BACK_LATE:
            said += "; ended it FINISHED, as its train stage ended while tracking was down"
        assert caught_up == [said], later.stderr
        if down == SERVER_BACK_LATE:  # as long as its stage, not until compare
            ended_s = (repo / "metrics" / "cpu" / "train.json").stat().st_mtime
            assert cpu.info.end_time == int(ended_s * 1000)
        # one line of ours, none of MLflow's
        [warning] = [line for line in out.splitlines() if "WARNING: MLflow tracking at" in line]
        assert "The stage goes on and writes its DVC outputs" in warning
        if down == DATABASE_BACK_IN_TIME:  # the server answered 503: not "start the server"
            assert "Before the next run: the server runs but fails" in warning, warning
        assert _mlflow_lines(out + later.stdout + later.stderr) == [], out[-4000:]
    finally:
        server.stop()
