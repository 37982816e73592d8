"""The repository's MLflow store moves with its checkout: host, container, another folder."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from accelbench import tracking


@pytest.fixture
def own_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's own store (mlflow.db in the root), as `dvc repro` uses it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    yield
    mlflow.set_tracking_uri(None)


def _log_variant(root: Path, name: str) -> str:
    (root / "note.txt").write_text(f"{name} artifact\n")
    with tracking.variant_run(root, name, {"lr": 0.001}, {}) as run_id:
        tracking.log_artifact(root / "note.txt")
        tracking.log_metrics({"steady_epoch_s": 1.5}, step=1)
    return run_id


def _move(checkout: Path, dest: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Move the checkout and work in it as a new stage process would (mlflow.set_tracking_uri
    exported the old store's URI to this process's environment)."""
    shutil.move(checkout, dest)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(dest)
    return dest


def test_store_and_artifacts_move_together(tmp_path, own_store, monkeypatch) -> None:
    first = tmp_path / "host" / "accelbench"
    first.mkdir(parents=True)
    monkeypatch.chdir(first)  # stages run in the repository root
    run_id = _log_variant(first, "cpu")
    assert MlflowClient().get_run(run_id).info.artifact_uri.startswith(f"{tracking.ARTIFACTS}/")

    moved = _move(first, tmp_path / "workspace", monkeypatch)  # e.g. seen from a container
    tracking.setup(moved)
    local = MlflowClient().download_artifacts(run_id, "note.txt", dst_path=str(tmp_path))
    assert Path(local).read_text() == "cpu artifact\n"
    assert (moved / tracking.ARTIFACTS).is_dir() and not first.exists()
    # The run logged after the move lands beside the first one.
    second = _log_variant(moved, "gpu")
    runs = {r.info.run_name for r in MlflowClient().search_runs([tracking.setup(moved)])}
    assert {"cpu", "gpu"} <= runs
    assert (moved / tracking.ARTIFACTS / second / "artifacts" / "note.txt").is_file()


def test_a_store_with_absolute_artifact_paths_is_rewritten_once(
    tmp_path, own_store, monkeypatch
) -> None:
    """Stores written before (absolute file: URIs) become movable on first use."""
    old = tmp_path / "old"
    old.mkdir()
    monkeypatch.chdir(old)
    mlflow.set_tracking_uri(f"sqlite:///{old / tracking.STORE}")
    experiment_id = mlflow.create_experiment(
        tracking.EXPERIMENT, artifact_location=(old / tracking.ARTIFACTS).as_uri()
    )
    (old / "note.txt").write_text("old artifact\n")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_artifact(str(old / "note.txt"))
    assert run.info.artifact_uri.startswith("file:///")

    moved = _move(old, tmp_path / "new", monkeypatch)
    assert tracking.relative_artifacts(moved / tracking.STORE) == 2  # the experiment and the run
    assert tracking.relative_artifacts(moved / tracking.STORE) == 0  # already relative
    tracking.setup(moved)
    info = MlflowClient().get_run(run.info.run_id).info
    assert info.artifact_uri == f"{tracking.ARTIFACTS}/{run.info.run_id}/artifacts"
    local = MlflowClient().download_artifacts(run.info.run_id, "note.txt", dst_path=str(tmp_path))
    assert Path(local).read_text() == "old artifact\n"


def test_a_shared_server_keeps_its_own_artifact_locations(tmp_path, mlflow_store) -> None:
    """With MLFLOW_TRACKING_URI set, accelbench changes nothing in that store's locations."""
    experiment_id = tracking.setup(tmp_path)
    location = MlflowClient().get_experiment(experiment_id).artifact_location
    assert location != f"{tracking.ARTIFACTS}/{experiment_id}"


def test_the_pipeline_run_is_found_by_the_checkout_not_the_host(
    tmp_path, own_store, monkeypatch
) -> None:
    """One `dvc repro` whose stages run on the host and in containers (other hostnames, other
    paths) still makes one pipeline run; the next repro makes a new one."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(socket, "gethostname", lambda: "host")
    cpu = _log_variant(checkout, "cpu")

    moved = _move(checkout, tmp_path / "workspace", monkeypatch)
    monkeypatch.setattr(socket, "gethostname", lambda: "3f9a1c0e2b7d")  # a container
    gpu = _log_variant(moved, "gpu")
    client = MlflowClient()
    parent = client.get_run(cpu).data.tags["mlflow.parentRunId"]
    assert client.get_run(gpu).data.tags["mlflow.parentRunId"] == parent

    report = moved / "comparison.md"
    report.write_text("report\n")
    assert tracking.finish_pipeline(moved, [report], {"runs": 2}) == parent
    assert client.get_run(parent).info.status == "FINISHED"
    assert not (moved / tracking.PIPELINE_RUN_FILE).exists()
    assert tracking.finish_pipeline(moved, [report], {}) is None  # nothing open any more

    again = _log_variant(moved, "cpu")
    assert client.get_run(again).data.tags["mlflow.parentRunId"] != parent


def test_a_pointer_to_another_store_or_a_finished_run_starts_a_new_pipeline_run(
    tmp_path, own_store, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    pointer = tmp_path / tracking.PIPELINE_RUN_FILE
    pointer.parent.mkdir()
    pointer.write_text("0123456789abcdef0123456789abcdef\n")  # no such run in this store
    run_id = _log_variant(tmp_path, "cpu")
    parent = MlflowClient().get_run(run_id).data.tags["mlflow.parentRunId"]
    assert pointer.read_text().strip() == parent
    MlflowClient().set_terminated(parent, "FINISHED")
    other = _log_variant(tmp_path, "cpu")
    assert MlflowClient().get_run(other).data.tags["mlflow.parentRunId"] != parent


def test_a_dvc_experiment_copy_tracks_into_its_workspace(tmp_path, own_store, monkeypatch) -> None:
    """`dvc exp run --temp` and queued experiments run in a copy under .dvc/tmp/exps that DVC
    deletes afterwards; DVC names the workspace in $DVC_ROOT. Runs, artifacts and the pipeline
    run's name land in the workspace; each copy keeps its own pipeline run."""
    workspace = tmp_path / "workspace"
    copies = [workspace / ".dvc" / "tmp" / "exps" / name for name in ("tmp1", "tmp2")]
    runs = {}
    for copy, exp_name in zip(copies, ("swift-lamb", "wired-owls"), strict=True):
        copy.mkdir(parents=True)
        monkeypatch.chdir(copy)  # stages run in the copy's root
        monkeypatch.setenv("DVC_ROOT", str(workspace))
        monkeypatch.setenv("DVC_EXP_NAME", exp_name)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        runs[exp_name] = _log_variant(copy, "cpu")
        assert not (copy / tracking.STORE).exists()
    for copy in copies:
        shutil.rmtree(copy)  # as DVC does once the experiment is collected

    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(workspace)
    tracking.setup(workspace)
    client = MlflowClient()
    parents = set()
    for exp_name, run_id in runs.items():
        run = client.get_run(run_id)
        assert run.data.tags[tracking.EXP_NAME_TAG] == exp_name
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        assert parent.info.run_name.startswith(f"{exp_name} ")
        parents.add(parent.info.run_id)
        local = client.download_artifacts(run_id, "note.txt", dst_path=str(tmp_path))
        assert Path(local).read_text() == "cpu artifact\n"
    assert len(parents) == 2  # one pipeline run per experiment


def test_a_workspace_that_is_not_here_falls_back_to_the_checkout(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "elsewhere"))
    assert tracking.store_root(tmp_path) == tmp_path
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking.store_root(tmp_path / "copy") == tmp_path
    monkeypatch.delenv("DVC_ROOT")
    assert tracking.store_root(tmp_path / "copy") == tmp_path / "copy"


def test_accelbench_runs_labels_each_column(tmp_path, mlflow_store) -> None:
    with tracking.variant_run(tmp_path, "gpu", {}, {"status": "skipped"}):
        tracking.log_metrics({"skipped": 1})
    table = tracking.summary_markdown(tmp_path)
    header = next(line for line in table.splitlines() if line.startswith("| variant |"))
    row = next(line for line in table.splitlines() if line.startswith("| gpu |"))
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert cells[" result "] == " skipped " and cells[" run status "] == " FINISHED "
    assert "workflowType=machine_learning" in table
