"""tracking.py: runs end as they went, and an unreachable or dying server costs seconds and
loses no DVC output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from accelbench import tracking
from helpers import REPO, cpu_train_command, mlflow_runs


def test_an_exception_marks_the_run_failed(tmp_path, mlflow_store) -> None:
    with pytest.raises(RuntimeError, match="boom"), tracking.variant_run(tmp_path, "x", {}, {}):
        raise RuntimeError("boom")
    [run] = mlflow_runs(mlflow_store, "x")
    assert run.info.status == "FAILED"
    with tracking.variant_run(tmp_path, "y", {}, {}):
        pass
    assert mlflow_runs(mlflow_store, "y")[0].info.status == "FINISHED"


def test_closed_tracking_port_costs_seconds_and_loses_no_outputs(tmp_path, prepared) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    result = subprocess.run(
        cpu_train_command(tmp_path, prepared, epochs=2),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("WARNING: MLflow tracking") == 1
    assert (tmp_path / "cpu.pt").exists() and (tmp_path / "metrics" / "train.json").exists()
    assert time.monotonic() - started < 120


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
    assert run.info.status == "RUNNING"  # the server died before it could be told; see README
