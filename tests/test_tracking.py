"""tracking.py: runs end as they went, and an unreachable or dying server costs seconds and
loses no DVC output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from accelbench.system import tracking
from accelbench.system.tracking.dead_runs import (
    CLOSED_TAG,
    HOST_TAG,
    MACHINE_TAG,
    PID_START_TAG,
    PID_TAG,
    close_zombies,
    machine_id,
    process_start,
)
from accelbench.system.tracking.runs import pipeline_run_id
from accelbench.system.tracking.store import HTTP_DEFAULTS, setup
from helpers import REPO, cpu_train_command, mlflow_runs


def _train_cpu(
    folder: Path, prepared: Path, env: dict[str, str], epochs: int
) -> subprocess.CompletedProcess:
    """`accelbench train cpu` in its own process, as dvc.yaml runs it."""
    return subprocess.run(
        cpu_train_command(folder, prepared, epochs=epochs),
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_exception_marks_the_run_failed(tmp_path, mlflow_store) -> None:
    with pytest.raises(RuntimeError, match="boom"), tracking.variant_run(tmp_path, "x", {}, {}):
        raise RuntimeError("boom")
    [run] = mlflow_runs(mlflow_store, "x")
    assert run.info.status == "FAILED"
    with tracking.variant_run(tmp_path, "y", {}, {}):
        pass
    assert mlflow_runs(mlflow_store, "y")[0].info.status == "FINISHED"


@pytest.mark.slow
def test_closed_tracking_port_costs_seconds_and_loses_no_outputs(tmp_path, prepared) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    result = _train_cpu(tmp_path, prepared, env, epochs=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("WARNING: MLflow tracking") == 1
    assert (tmp_path / "cpu.pt").exists() and (tmp_path / "metrics" / "train.json").exists()
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_tracking_server_dying_mid_run(tmp_path, prepared) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    import mlflow_ui

    store = tmp_path / "server.db"
    url, server = mlflow_ui.start_server(store)
    try:
        env = {**os.environ, "MLFLOW_TRACKING_URI": url}
        deadline = time.monotonic() + 90
        training = subprocess.Popen(
            cpu_train_command(tmp_path, prepared, epochs=8),
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        client = MlflowClient(f"sqlite:///{store}")
        while True:  # until the first epoch's metrics reached the server
            runs = mlflow_runs(f"sqlite:///{store}", "cpu")
            if runs and client.get_metric_history(runs[0].info.run_id, "test_accuracy"):
                break
            assert training.poll() is None, training.stderr.read()
            assert time.monotonic() < deadline + 120, "no epoch was ever logged"
            time.sleep(0.5)
    finally:
        mlflow_ui.stop_server(server, signal.SIGKILL)  # the server dies mid-run
    _, stderr = training.communicate(timeout=300)
    assert training.returncode == 0, stderr[-3000:]
    assert stderr.count("WARNING: MLflow tracking") == 1
    assert (tmp_path / "cpu.pt").exists() and (tmp_path / "metrics" / "train.json").exists()
    [run] = mlflow_runs(f"sqlite:///{store}", "cpu")
    # the server died before it could be told (docs/reliability.md)
    assert run.info.status == "RUNNING"


@pytest.mark.slow
@pytest.mark.parametrize("by_hand", [False, True], ids=["dvc-stage", "by-hand"])
def test_a_run_killed_outright_is_closed_by_the_rerun(
    tmp_path, prepared, mlflow_store, by_hand
) -> None:
    """kill -9 before the first checkpoint: the rerun ends the orphan KILLED, with why; under
    DVC its own run joins the same pipeline run, by hand it has its own and the dead one's
    ends KILLED too; nothing stays RUNNING."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store, "DVC_STAGE": "train@cpu"}
    if by_hand:
        del env["DVC_STAGE"]
    command = cpu_train_command(tmp_path, prepared, epochs=200)
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not mlflow_runs(mlflow_store, "cpu"):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.5)
    process.kill()  # SIGKILL: nothing unwinds
    process.wait()
    [orphan] = mlflow_runs(mlflow_store, "cpu")
    assert orphan.info.status == "RUNNING"

    rerun = _train_cpu(tmp_path, prepared, env, epochs=1)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"MLflow run {orphan.info.run_id} was left RUNNING" in rerun.stderr
    runs = {r.info.run_id: r for r in mlflow_runs(mlflow_store, "cpu")}
    closed = runs.pop(orphan.info.run_id)
    [finished] = runs.values()
    assert closed.info.status == "KILLED" and finished.info.status == "FINISHED"
    assert f"process {process.pid}" in closed.data.tags[CLOSED_TAG]
    parent = "mlflow.parentRunId"
    if not by_hand:
        assert closed.data.tags[parent] == finished.data.tags[parent]
        return
    assert closed.data.tags[parent] != finished.data.tags[parent]
    client = MlflowClient(mlflow_store)
    dead, own = (client.get_run(r.data.tags[parent]) for r in (closed, finished))
    assert (dead.info.status, own.info.status) == ("KILLED", "FINISHED")
    assert dead.info.run_name.startswith("by hand ")


def test_a_run_names_its_process_start_without_the_wall_clock(tmp_path) -> None:
    """The tag was psutil's creation time, seconds since the epoch as a float: the wall clock
    (which NTP or a date set by hand moves) and an odd figure in MLflow's UI. It is the boot id
    and the start in clock ticks since boot, as the kernel counts them for that process."""
    import json

    code = "import json, time; from accelbench.system.tracking.dead_runs import process_tags;"
    code += "print(json.dumps(process_tags()), flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        tags = json.loads(process.stdout.readline())
        start = tags[PID_START_TAG]
        with pytest.raises(ValueError):
            float(start)
        ticks = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        assert start == f"{machine_id()}/{ticks}" == process_start(process.pid)
        assert tags[PID_TAG] == str(process.pid)
    finally:
        process.kill()
        process.wait()
    assert process_start(process.pid) is None  # gone


def test_a_live_run_or_one_on_another_host_is_left_alone(tmp_path, mlflow_store) -> None:

    experiment_id = setup(tmp_path)
    parent = pipeline_run_id(tmp_path, experiment_id)
    client = MlflowClient()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        live = {
            HOST_TAG: __import__("socket").gethostname(),
            MACHINE_TAG: machine_id(),
            PID_TAG: str(sleeper.pid),
            PID_START_TAG: process_start(sleeper.pid),
        }
        elsewhere = {
            **live,
            HOST_TAG: "another-host",
            MACHINE_TAG: "another-boot",
            PID_TAG: "1",
        }
        reused = {**live, PID_START_TAG: f"{machine_id()}/12"}  # the pid, but not its process
        # A stage killed in a container: another host name, the same kernel, a pid gone.
        container = {
            HOST_TAG: "3f9a1c0e2b7d",
            MACHINE_TAG: machine_id(),
            PID_TAG: "999999",
            PID_START_TAG: f"{machine_id()}/12",
        }
        ids = {}
        cases = (
            ("live", live),
            ("elsewhere", elsewhere),
            ("reused", reused),
            ("container", container),
        )
        for name, tags in cases:
            run = client.create_run(
                experiment_id, tags={**tags, "variant": "cpu", "mlflow.parentRunId": parent}
            )
            ids[name] = run.info.run_id
        close_zombies(experiment_id, parent, "cpu")
        status = {name: client.get_run(i).info.status for name, i in ids.items()}
        assert status == {
            "live": "RUNNING",
            "elsewhere": "RUNNING",
            "reused": "KILLED",
            "container": "KILLED",
        }
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_evaluation_joins_the_run_as_its_train_stage_ended_it(tmp_path, mlflow_store) -> None:
    """Compare logs the evaluation into the variant's run without re-opening it (its Duration
    stays its train stage's), against the run's model and evaluation dataset (the models
    view ranks the variants' models by it)."""
    import numpy as np

    from accelbench.core.results import EvalSummary

    images, labels = np.zeros((4, 28, 28), np.uint8), np.arange(4, dtype=np.uint8)
    with tracking.variant_run(tmp_path, "cpu", {}, {"status": "trained"}) as run_id:
        tracking.log_dataset("mnist-test", images, labels, tmp_path, "d1g3st", "evaluation")
        experiment_id = mlflow.active_run().info.experiment_id
        model = MlflowClient().create_logged_model(experiment_id, "cpu", source_run_id=run_id)
    client = MlflowClient()
    trained = client.get_run(run_id).info
    time.sleep(0.05)  # a re-opened run would end later than it did
    (tmp_path / "eval.json").write_text("{}\n")
    summary = EvalSummary(0.9912, 0.03, 0.99, 12345.0, per_class={})
    tracking.log_evaluation(tmp_path, run_id, summary, [tmp_path / "eval.json"], {"quant_x": 2})

    run = client.get_run(run_id)
    assert (run.info.start_time, run.info.end_time, run.info.status) == (
        trained.start_time,
        trained.end_time,
        "FINISHED",
    )
    assert run.data.metrics["eval_test_accuracy"] == 0.9912 and run.data.metrics["quant_x"] == 2
    assert "eval.json" in [a.path for a in client.list_artifacts(run_id)]
    [accuracy] = [
        m for m in client.get_logged_model(model.model_id).metrics if m.key == "eval_test_accuracy"
    ]
    assert (accuracy.value, accuracy.dataset_name, accuracy.dataset_digest) == (
        0.9912,
        "mnist-test",
        "d1g3st",
    )


def test_what_is_logged_is_rounded_to_what_it_means(tmp_path, mlflow_store) -> None:
    """The UI showed `total_train_s` 122.10302640200007 and a loss of 3.9581195820925785e-9:
    seconds are kept to the millisecond (4 significant digits below a second), shares of 1
    to 4 decimals, every other measurement to 4 significant digits, counts whole; the
    runs table's text figures still read as the report."""
    with tracking.variant_run(tmp_path, "cpu", {}, {"status": "trained"}) as run_id:
        tracking.log_metrics(
            {"total_train_s": 122.10302640200007, "first_epoch_s": 0.0834123,
             "train_loss": 3.9581195820925785e-9,
             "samples": 60000, "test_accuracy": 0.99123456, "samples_per_s": 275.39337007},
            step=1,
        )  # fmt: skip
    figures = {"steady_epoch_s": 12.34567, "steady_epoch_s_lo": 12.01234, "speedup_vs_cpu": 147.66}
    tracking.log_variant_figures(tmp_path, {run_id: figures})
    run = MlflowClient().get_run(run_id)
    assert run.data.metrics == {
        "total_train_s": 122.103,
        "first_epoch_s": 0.08341,
        "train_loss": 3.958e-9,
        "samples": 60000,
        "test_accuracy": 0.9912,
        "samples_per_s": 275.4,
        "steady_epoch_s": 12.346,
        "steady_epoch_s_lo": 12.012,  # an interval's end as its figure
        "speedup_vs_cpu": 147.7,
    }
    assert run.data.tags["speedup"] == "148×"  # from 147.66, as the report writes it


def test_compares_tracking_calls_survive_an_outage(tmp_path, monkeypatch, capsys) -> None:
    """A tracking server that is down when compare runs: the figures and the evaluation are
    dropped with one warning, compare goes on."""
    import socket

    from accelbench.core.results import EvalSummary

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    for key, value in HTTP_DEFAULTS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    summary = EvalSummary(0.99, 0.03, 0.99, 1.0, per_class={})
    assert tracking.log_variant_figures(tmp_path, {"0" * 32: {"speedup_vs_cpu": 2.0}}) is None
    assert tracking.log_evaluation(tmp_path, "0" * 32, summary, []) is None
    assert capsys.readouterr().err.count("WARNING: MLflow tracking") == 1
