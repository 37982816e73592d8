"""Tracking faults (issue 24), with real processes and files: a locked store is one warning
line, a deleted store starts cleanly, the store is found from a subfolder, `make ui` refuses a
busy port, and processes creating one new store at once all succeed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from accelbench.system import ui
from accelbench.system.server import port_problem
from accelbench.system.tracking import outage
from accelbench.system.tracking.outage import tolerant
from accelbench.system.tracking.runs import PIPELINE_RUN_FILE, flatten
from accelbench.system.tracking.store import (
    EXPERIMENT,
    STORE,
    STORE_LOCK,
    WORKSPACE_ENV,
    workspace_root,
)
from helpers import REPO, cpu_train_command, write_params


def _own_store_env() -> dict[str, str]:
    """The environment of a stage `dvc repro` runs (DVC_STAGE set) that tracks into its
    workspace's own mlflow.db."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_STAGE": "train@cpu"}
    for key in ("MLFLOW_TRACKING_URI", WORKSPACE_ENV):
        env.pop(key, None)
    return env


def _python(root: Path, code: str, env: dict[str, str] | None = None) -> str:
    """`code` in a process of its own in `root` (a stage is one); returns its stderr."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=root,
        env=env or _own_store_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def _runs(root: Path) -> dict[str, tuple[str, str, str | None]]:
    """run id -> (name, status, parent run id) in `root`'s store, read afresh from the file
    (MLflow's client keeps a connection to a store that was since deleted)."""
    with closing(sqlite3.connect(root / STORE)) as db:
        rows = db.execute(
            "SELECT runs.run_uuid, runs.name, runs.status, tags.value FROM runs LEFT JOIN tags "
            "ON tags.run_uuid = runs.run_uuid AND tags.key = 'mlflow.parentRunId'"
        ).fetchall()
    return {run_id: (name, status, parent) for run_id, name, status, parent in rows}


@pytest.mark.slow
def test_a_locked_store_is_one_warning_line_not_mlflows_tracebacks(tmp_path, prepared) -> None:
    """Before: each tracking call printed MLflow's own traceback (six in a pipeline, 252
    lines), though the pipeline finished."""
    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    env = {**_own_store_env(), "MLFLOW_TRACKING_URI": uri}
    _python(tmp_path, "from pathlib import Path; from accelbench.system.tracking import store; "
            "store.setup(Path('.'))", env)  # fmt: skip
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program writing: readers pass, writers wait
    try:
        result = subprocess.run(
            cpu_train_command(tmp_path, prepared, epochs=1),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.rollback()
        holder.close()
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "cpu.pt").exists()
    [warning] = [line for line in result.stderr.splitlines() if "MLflow tracking" in line]
    assert "WARNING" in warning and "database is locked" in warning
    assert "Traceback" not in result.stderr and " ERROR mlflow" not in result.stderr
    assert len(result.stderr.splitlines()) < 15, result.stderr


def test_mlflow_errors_of_a_call_that_succeeds_are_still_shown(tmp_path, capsys) -> None:
    import logging

    @tolerant
    def noisy() -> str:
        logging.getLogger("mlflow.test").error("kept: the call succeeded")
        return "ok"

    with outage.logs_held():
        pass  # installs the filter on MLflow's handler
    assert noisy() == "ok"
    assert "kept: the call succeeded" in capsys.readouterr().err

    @tolerant
    def failing() -> None:
        logging.getLogger("mlflow.test").error("dropped: the call failed")
        raise sqlite3.OperationalError("database is locked")

    assert failing() is None
    err = capsys.readouterr().err
    assert "dropped" not in err and err.count("WARNING: MLflow tracking") == 1
    assert "OperationalError: database is locked" in err


def test_mlflows_background_threads_warn_nothing(capsys) -> None:
    """MLflow's system metrics thread printed `WARNING mlflow.system_metrics...: Failed to
    get mlflow run: ... Connection refused` when the server went away, beside our one line
    (which the stage's next tracking call prints)."""
    import logging
    import threading

    with outage.logs_held():
        pass  # installs the filter on MLflow's handler
    sampler = logging.getLogger("mlflow.system_metrics.system_metrics_monitor")
    thread = threading.Thread(target=sampler.warning, args=("Failed to get mlflow run",))
    thread.start()
    thread.join()
    logging.getLogger("mlflow.test").warning("kept: the main thread's")
    err = capsys.readouterr().err
    assert "Failed to get mlflow run" not in err and "kept: the main thread's" in err


def test_mlflows_own_lines_hide_the_password(capsys) -> None:
    """A warning MLflow logs and a call that succeeds shows (its retries, a traceback) quoted
    the tracking URI with its password: ours were masked, MLflow's were not."""
    import logging

    with outage.logs_held():
        pass  # installs the filter on MLflow's handler
    logger = logging.getLogger("mlflow.utils.rest_utils")
    logger.warning("Max retries exceeded: API request to %s failed", "http://al:Pw-1@mlbox:5000")
    try:
        raise ConnectionError("http://al:Pw-1@mlbox:5000/api/2.0/mlflow/runs/get")
    except ConnectionError:
        logger.exception("retrying")
    err = capsys.readouterr().err
    assert "Pw-1" not in err, err
    assert "request to http://***@mlbox:5000 failed" in err and "Traceback" in err
    assert "ConnectionError: http://***@mlbox:5000/api/2.0/mlflow/runs/get" in err


def test_a_bug_in_our_tracking_code_raises_and_is_no_outage(tmp_path, capsys) -> None:
    """A TypeError in accelbench's own code was reported as the store failing, with the advice
    to move a healthy mlflow.db aside, and the stage carried on untracked."""
    from accelbench.core.outputs import write_json

    with pytest.raises(AttributeError):
        tolerant(flatten)(None)  # None.items(): our bug
    # raised in the standard library, on what accelbench's code handed it: a bug too
    with pytest.raises(TypeError):
        tolerant(lambda: write_json(tmp_path / "x.json", object()))()
    assert capsys.readouterr().err == "" and outage._outage is None  # tracking goes on


def _sqlalchemy_error() -> None:
    import sqlalchemy.exc

    raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))


def _locked() -> None:
    raise sqlite3.OperationalError("database is locked")


def _refused() -> None:  # a refused connection, retried in MLflow
    MlflowClient("http://127.0.0.1:9").get_run("0" * 32)


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (_locked, "OperationalError: database is locked"),
        (lambda: json.loads("<html>bad gateway</html>"), "JSONDecodeError"),
        (_refused, "MlflowException"),
        (_sqlalchemy_error, "OperationalError: (builtins.Exception) server closed"),
        (lambda: Path("/nonexistent/mlflow.db").read_text(), "FileNotFoundError"),
    ],
)
def test_an_error_from_mlflow_its_store_or_the_network_is_an_outage(
    monkeypatch, capsys, failure, said
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert tolerant(failure)() is None
    [line] = capsys.readouterr().err.splitlines()
    assert "WARNING: MLflow tracking" in line and said in line, line
    assert tolerant(failure)() is None  # the rest of the process tracks nothing, quietly
    assert capsys.readouterr().err == ""


# The stages' tracking calls, as a process runs them: train opens the variant's run in the
# pipeline run; compare logs the evaluation into it, records skipped variants, finishes.
TRAIN = """
    from pathlib import Path
    from accelbench.system import tracking
    with tracking.variant_run(Path('.'), 'cpu', {}, {'status': 'trained'}) as run_id:
        print('RUN', run_id)
"""
COMPARE = """
    from pathlib import Path
    from accelbench.system import tracking
    from accelbench.core.results import EvalSummary
    root = Path('.')
    tracking.record_skipped(root, 'gpu', {}, 'needs CUDA')
    tracking.log_evaluation(root, 'RUN_ID', EvalSummary(0.9, 0.1, 0.9, 1.0, per_class={}), [])
    tracking.log_variant_figures(root, {'RUN_ID': {'speedup_vs_cpu': 1.0}})
    print('PIPELINE', tracking.finish_pipeline(root, [], {}))
"""


@pytest.mark.slow
def test_a_deleted_store_starts_cleanly_and_leaves_nothing_running(tmp_path) -> None:
    """Before: a stage reading run ids of the deleted store (DVC's run cache restores a
    trained variant's outputs, run id included) failed all tracking, and a pipeline run
    opened by another call stayed RUNNING."""
    out = _python(tmp_path, TRAIN)
    old_run = out.split("RUN ")[1].split()[0]
    pointer = tmp_path / PIPELINE_RUN_FILE
    assert pointer.is_file()  # the pipeline run is open: compare has not run
    (tmp_path / STORE).unlink()  # the user deletes the store between runs

    out = _python(tmp_path, COMPARE.replace("RUN_ID", old_run))
    assert "WARNING: MLflow tracking" not in out, out
    assert f"MLflow run {old_run} is not in" in out and "evaluation is not logged" in out
    finished = out.split("PIPELINE ")[1].split()[0]
    assert finished != "None" and not pointer.exists()
    runs = _runs(tmp_path)
    assert runs[finished][1] == "FINISHED"
    assert [run for run in runs.values() if run[1] == "RUNNING"] == []
    assert [run for run in runs.values() if run[0] == "gpu"] == [("gpu", "FINISHED", finished)]

    # and a stale pointer alone (the store deleted mid-pipeline): a new pipeline run
    _python(tmp_path, TRAIN)
    (tmp_path / STORE).unlink()
    out = _python(tmp_path, TRAIN)
    [(_, status, parent)] = [run for run in _runs(tmp_path).values() if run[0] == "cpu"]
    assert status == "FINISHED" and pointer.read_text().strip() == parent
    assert _runs(tmp_path)[parent][1] == "RUNNING"  # open until compare finishes it
    assert "WARNING" not in out


@pytest.mark.slow
def test_runs_from_a_subfolder_reads_the_workspace_store(tmp_path) -> None:
    """Before: `accelbench --params ../params.yaml runs` from a subfolder created a new store
    there and said "No pipeline run"."""
    workspace = tmp_path / "workspace"
    (workspace / ".dvc").mkdir(parents=True)
    write_params(workspace)
    sub = workspace / "docs" / "deeper"
    sub.mkdir(parents=True)
    runs = [sys.executable, "-m", "accelbench.cli", "--params", "../../params.yaml", "runs"]

    before = subprocess.run(runs, cwd=sub, env=_own_store_env(), capture_output=True, text=True)
    assert before.returncode == 0, before.stderr
    assert f"No MLflow store at {workspace / 'mlflow.db'} yet" in before.stdout
    assert not (workspace / "mlflow.db").exists()  # reading creates no store

    _python(workspace, TRAIN)
    _python(workspace, "from pathlib import Path; from accelbench.system import tracking; "
            "tracking.finish_pipeline(Path('.'), [], {})")  # fmt: skip
    after = subprocess.run(runs, cwd=sub, env=_own_store_env(), capture_output=True, text=True)
    assert after.returncode == 0, after.stderr
    assert f"MLflow: sqlite:///{workspace / 'mlflow.db'}" in after.stdout
    assert "Pipeline run `pipeline " in after.stdout and "| cpu |" in after.stdout
    assert list(sub.iterdir()) == [] and not (workspace / "docs" / "mlflow.db").exists()
    # as docs/reliability.md has it: plain `accelbench runs`, with no params file where it runs
    plain = [sys.executable, "-m", "accelbench.cli", "runs"]
    again = subprocess.run(plain, cwd=sub, env=_own_store_env(), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout == after.stdout


@pytest.mark.slow
def test_runs_reads_a_store_on_a_read_only_mount(tmp_path) -> None:
    """`accelbench runs` took the store's set-up lock to read it: beside a store on a
    read-only mount (a colleague's results, shared) it failed "Read-only file system:
    '.../mlflow.db.lock'" and advised starting a server. Needs root (a bind mount)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    _python(workspace, TRAIN)
    _python(workspace, "from pathlib import Path; from accelbench.system import tracking; "
            "tracking.finish_pipeline(Path('.'), [], {})")  # fmt: skip
    shared, mounted = tmp_path / "shared", tmp_path / "mounted"
    shared.mkdir()
    mounted.mkdir()
    shutil.copy2(workspace / STORE, shared / STORE)
    mount = subprocess.run(["mount", "--bind", str(shared), str(mounted)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mount.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], check=True)
        env = {**_own_store_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{mounted / 'mlflow.db'}"}
        runs = [sys.executable, "-m", "accelbench.cli", "runs"]
        shown = subprocess.run(runs, cwd=workspace, env=env, capture_output=True, text=True)
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)
    assert shown.returncode == 0, shown.stderr
    assert "Pipeline run `pipeline " in shown.stdout and "| cpu |" in shown.stdout
    assert sorted(p.name for p in shared.iterdir()) == [STORE]  # nothing written


def test_runs_refuses_a_store_uri_naming_no_file_and_creates_nothing(tmp_path) -> None:
    """A typo in MLFLOW_TRACKING_URI created the store, its folders and a lock file, then said
    "No pipeline run ... yet: run `dvc repro`", exit 0."""
    (tmp_path / "params.yaml").write_text("")
    typo = tmp_path / "nonexistent" / "mlfow.db"
    env = {**_own_store_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{typo}"}
    runs = [sys.executable, "-m", "accelbench.cli", "runs"]
    shown = subprocess.run(runs, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr.startswith(
        f"accelbench runs: error: MLFLOW_TRACKING_URI names the store {typo}"
    )
    assert "which does not exist (a typo?)" in shown.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing created


def test_the_workspace_is_found_as_dvc_finds_it_else_by_the_params_file(tmp_path) -> None:
    (tmp_path / "ws" / ".dvc").mkdir(parents=True)
    (tmp_path / "ws" / "a" / "b").mkdir(parents=True)
    assert workspace_root(tmp_path / "ws" / "a" / "b") == (tmp_path / "ws").resolve()
    (tmp_path / "plain" / "sub").mkdir(parents=True)
    found = workspace_root(tmp_path / "plain" / "sub", Path("../params.yaml"))
    assert found == (tmp_path / "plain").resolve()
    assert workspace_root(tmp_path / "plain", Path("params.yaml")) == (tmp_path / "plain").resolve()


def _make_env() -> dict[str, str]:
    """`make`'s environment in these tests: this interpreter's tools, no `uv sync`."""
    return {
        **_own_store_env(),
        "ACCELBENCH_ENV": str(Path(sys.executable).parents[1]),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }


def test_make_ui_refuses_a_busy_port_before_printing_a_link() -> None:
    """Before: `make ui` on a busy port exited 0 and printed a link to the other program."""
    env = _make_env()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = subprocess.run(
            ["make", "--no-print-directory", "ui", f"PORT={port}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert "Open" not in result.stdout and "mlflow server" not in result.stdout
    [message] = [line for line in result.stderr.splitlines() if line.startswith("make ui:")]
    assert f"port {port} on 127.0.0.1 is in use" in message and f"PORT={port + 1}" in message
    assert port_problem("127.0.0.1", port) is None  # free again once closed


@pytest.mark.parametrize(
    ("host", "port", "said"),
    [
        ("127.0.0.1", "99999", "PORT='99999' is not a port number (1-65535): make ui PORT=5000"),
        ("127.0.0.1", "abc", "PORT='abc' is not a port number (1-65535): make ui PORT=5000"),
        ("999.1.1.1", "5078", "HOST='999.1.1.1' is not an address to serve on ("),
    ],
)
def test_make_ui_refuses_a_bad_port_or_host_naming_what_to_pass(
    tmp_path, monkeypatch, capsys, host, port, said
) -> None:
    """PORT=99999 printed the link, then the server's traceback, and exited 0; a bad HOST was
    told to choose another port."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert ui.ui_intro(host, port, tmp_path / "mlflow.db") == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"make ui: {said}")
    assert "HOST=127.0.0.1" in err if host != "127.0.0.1" else "another port" not in err


SETUP = """
    import sys, time
    from pathlib import Path
    from accelbench.system.tracking.store import setup
    start = float(sys.argv[1])
    time.sleep(max(0.0, start - time.time()))  # every process at once
    print(setup(Path('.')))
"""


@pytest.mark.slow
def test_processes_creating_one_new_store_at_once_all_succeed(tmp_path) -> None:
    """`dvc queue start -j 2` on a new workspace: before, two experiments raced to create and
    migrate mlflow.db and one failed ("duplicate column name"), its pipeline untracked."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    copies = [tmp_path / f"exp{i}" for i in range(4)]  # each experiment runs in a copy
    env = {**_own_store_env(), WORKSPACE_ENV: str(workspace)}
    start = time.time() + 8  # after every interpreter has imported MLflow
    processes = []
    for copy in copies:
        copy.mkdir()
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(SETUP), str(start)],
                cwd=copy,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [(*p.communicate(timeout=180), p.returncode) for p in processes]
    for _, err, code in results:
        assert code == 0, err[-3000:]
    assert len({out.split()[-1] for out, _, _ in results}) == 1  # one experiment
    assert not list(workspace.glob("mlflow.db-journal"))
    experiments = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}").search_experiments()
    assert [e.name for e in experiments].count(EXPERIMENT) == 1
    assert (workspace / STORE_LOCK).is_file()


def test_make_ui_refuses_another_store_named_by_the_environment(
    tmp_path, monkeypatch, capsys
) -> None:
    """With MLFLOW_TRACKING_URI naming a colleague's store, `accelbench runs` read that store
    and pointed to `make ui`, which served this checkout's own."""
    store = tmp_path / "mlflow.db"
    other = f"sqlite:///{tmp_path / 'colleague' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    assert ui.ui_intro("127.0.0.1", "5000", store) == 1
    [message] = capsys.readouterr().err.splitlines()
    assert message.startswith(f"make ui: MLFLOW_TRACKING_URI is {other}, not this checkout's")
    assert f"mlflow server --backend-store-uri {other}" in message
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")  # its own, named: served
    monkeypatch.setattr(ui, "port_problem", lambda *_: None)
    assert ui.ui_intro("127.0.0.1", "5000", store) == 0


@pytest.mark.slow
def test_make_ui_serves_the_link_it_prints(tmp_path) -> None:
    """The README's `make ui`, run as it ships: the link it prints answers, and its start-up
    is MLflow's few lines (one worker; no warnings about MLflow's own imports)."""
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _make_env()
    (tmp_path / "uv.lock").symlink_to(REPO / "uv.lock")  # the Makefile reads uv's version there
    log = tmp_path / "ui.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "ui", f"PORT={port}"],
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "Application startup complete" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        link = next(w for line in log.read_text().splitlines() if line.startswith("Open")
                    for w in line.split() if w.startswith("http://"))  # fmt: skip
        with urllib.request.urlopen(link.split("#")[0], timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
    output = log.read_text()
    assert link.startswith(f"http://127.0.0.1:{port}/#/")
    assert "DeprecationWarning" not in output, output
    assert output.count("Started server process") == 1, output


@pytest.mark.parametrize(
    ("failure", "remedy"),
    [
        ("API request to endpoint failed with error code 403: Invalid Host header", (
            "refuses the host name mlbox:5000: use a name it allows, or add this one to "
            "MLFLOW_SERVER_ALLOWED_HOSTS")),
        ("Max retries exceeded: Connection refused", "start the server, or set"),
        ("ResponseError: too many 503 error responses", (
            "the server runs but fails (HTTP 5xx): its database or artifact store may be down")),
    ],
)  # fmt: skip
def test_an_outage_in_a_stage_says_what_to_do(monkeypatch, capsys, failure, remedy) -> None:
    """A stage that met a server refusing its host name (403) got only the generic outage
    line; the advice was `accelbench runs`'s alone."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlbox:5000")
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", None)
    outage.report(RuntimeError(failure))
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("accelbench: WARNING: MLflow tracking at http://mlbox:5000 failed")
    assert "Before the next run: " in line and remedy in line.split("Before the next run: ")[1]


def test_an_unknown_scheme_or_a_file_no_store_is_named_as_such() -> None:
    """`foo://bar` was told to "check that the database runs"; params.yaml named as the store
    was told it was locked."""
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        raise UnsupportedModelRegistryStoreURIException("foo://bar", []) from KeyError("foo")
    except UnsupportedModelRegistryStoreURIException as exc:
        unknown = outage.remedy("foo://bar", exc)
    assert unknown.startswith("MLflow has no tracking store for the scheme 'foo': set ")
    # a scheme MLflow has (Unity Catalog's), failing for another reason: no such advice
    assert "no tracking store" not in outage.remedy("databricks-uc://p", KeyError("x"))
    not_sqlite = sqlite3.DatabaseError("file is not a database")
    said = outage.remedy("sqlite:////work/params.yaml", not_sqlite)
    assert said.startswith("that file is no SQLite database (damaged, or not a store at all)")
    assert "locked" not in said and "move it aside" in said
    for uri in ("postgresql+psycopg2://u@db/mlflow", "/tmp/mlruns", "file:///tmp/mlruns"):
        assert "no tracking store for the scheme" not in outage.remedy(uri, OSError())
