"""The repository's MLflow store moves with its checkout: host, container, another folder."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from accelbench.core.spread import Figure
from accelbench.report import answer
from accelbench.report.runs import TrackingUnreachable, pipeline_summary, summary_markdown
from accelbench.system import tracking, ui
from accelbench.system.tracking.logs import SPEEDUP_BASELINE_TAG
from accelbench.system.tracking.runs import EXP_NAME_TAG, PIPELINE_RUN_FILE, end_by_hand_runs
from accelbench.system.tracking.store import (
    ARTIFACTS,
    EXPERIMENT,
    STORE,
    relative_artifacts,
    setup,
    store_root,
)
from accelbench.system.tracking.view import (
    VARIANT_RUNS_TAG,
    VIEW_ID,
    VIEW_TAG,
    named_variant_runs,
    training_view,
    ui_path,
    variants_filter,
)


@pytest.fixture
def own_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository's own store (mlflow.db in the root), as `dvc repro` uses it (its stages
    have DVC_STAGE set)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_STAGE", "train@cpu")
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


@pytest.mark.slow
def test_store_and_artifacts_move_together(tmp_path, own_store, monkeypatch) -> None:
    first = tmp_path / "host" / "accelbench"
    first.mkdir(parents=True)
    monkeypatch.chdir(first)  # stages run in the repository root
    run_id = _log_variant(first, "cpu")
    assert MlflowClient().get_run(run_id).info.artifact_uri.startswith(f"{ARTIFACTS}/")

    moved = _move(first, tmp_path / "workspace", monkeypatch)  # e.g. seen from a container
    setup(moved)
    local = MlflowClient().download_artifacts(run_id, "note.txt", dst_path=str(tmp_path))
    assert Path(local).read_text() == "cpu artifact\n"
    assert (moved / ARTIFACTS).is_dir() and not first.exists()
    # The run logged after the move lands beside the first one.
    second = _log_variant(moved, "gpu")
    runs = {r.info.run_name for r in MlflowClient().search_runs([setup(moved)])}
    assert {"cpu", "gpu"} <= runs
    assert (moved / ARTIFACTS / second / "artifacts" / "note.txt").is_file()


@pytest.mark.slow
def test_a_store_with_absolute_artifact_paths_is_rewritten_once(
    tmp_path, own_store, monkeypatch
) -> None:
    """Stores written before (absolute file: URIs) become movable on first use."""
    old = tmp_path / "old"
    old.mkdir()
    monkeypatch.chdir(old)
    mlflow.set_tracking_uri(f"sqlite:///{old / STORE}")
    experiment_id = mlflow.create_experiment(
        EXPERIMENT, artifact_location=(old / ARTIFACTS).as_uri()
    )
    (old / "note.txt").write_text("old artifact\n")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_artifact(str(old / "note.txt"))
    assert run.info.artifact_uri.startswith("file:///")

    moved = _move(old, tmp_path / "new", monkeypatch)
    assert relative_artifacts(moved / STORE) == 2  # the experiment and the run
    assert relative_artifacts(moved / STORE) == 0  # already relative
    setup(moved)
    info = MlflowClient().get_run(run.info.run_id).info
    assert info.artifact_uri == f"{ARTIFACTS}/{run.info.run_id}/artifacts"
    local = MlflowClient().download_artifacts(run.info.run_id, "note.txt", dst_path=str(tmp_path))
    assert Path(local).read_text() == "old artifact\n"


@pytest.mark.slow
def test_a_shared_server_keeps_its_own_artifact_locations(tmp_path, mlflow_store) -> None:
    """With MLFLOW_TRACKING_URI set, accelbench changes nothing in that store's locations."""
    experiment_id = setup(tmp_path)
    location = MlflowClient().get_experiment(experiment_id).artifact_location
    assert location != f"{ARTIFACTS}/{experiment_id}"


@pytest.mark.slow
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
    assert not (moved / PIPELINE_RUN_FILE).exists()
    again = _log_variant(moved, "cpu")
    assert client.get_run(again).data.tags["mlflow.parentRunId"] != parent


@pytest.mark.slow
def test_a_pointer_to_another_store_or_a_finished_run_starts_a_new_pipeline_run(
    tmp_path, own_store, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    pointer = tmp_path / PIPELINE_RUN_FILE
    pointer.parent.mkdir()
    pointer.write_text("0123456789abcdef0123456789abcdef\n")  # no such run in this store
    run_id = _log_variant(tmp_path, "cpu")
    parent = MlflowClient().get_run(run_id).data.tags["mlflow.parentRunId"]
    assert pointer.read_text().strip() == parent
    MlflowClient().set_terminated(parent, "FINISHED")
    other = _log_variant(tmp_path, "cpu")
    assert MlflowClient().get_run(other).data.tags["mlflow.parentRunId"] != parent


@pytest.mark.slow
def test_stages_run_by_hand_and_under_dvc_never_share_a_pipeline_run(
    tmp_path, own_store, monkeypatch
) -> None:
    """A profiled training run by hand left its pipeline run open, and the next `dvc exp run`
    logged into it: named "pipeline ...", not after the experiment, with the profiled cpu
    listed beside the real one. A stage run by hand now has a pipeline run of its own, ended
    with its process, and does not join a repro that stopped part way (the next repro
    resumes that one)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE")
    profiled = _log_variant(tmp_path, "cpu")  # `accelbench train cpu ... --profile`
    client = MlflowClient()  # the store that run set up
    by_hand = client.get_run(profiled).data.tags["mlflow.parentRunId"]
    assert client.get_run(by_hand).info.run_name.startswith("by hand ")
    end_by_hand_runs()  # as its process exits
    assert client.get_run(by_hand).info.status == "FINISHED"
    assert not (tmp_path / PIPELINE_RUN_FILE).exists()

    monkeypatch.setenv("DVC_STAGE", "train@cpu")
    monkeypatch.setenv("DVC_EXP_NAME", "tgt50")
    trained = _log_variant(tmp_path, "cpu")
    pipeline = client.get_run(trained).data.tags["mlflow.parentRunId"]
    assert pipeline != by_hand
    assert client.get_run(pipeline).info.run_name.startswith("tgt50 ")

    monkeypatch.delenv("DVC_STAGE")  # that repro stopped before compare: its run stays open
    monkeypatch.delenv("DVC_EXP_NAME")
    again = _log_variant(tmp_path, "gpu")
    second = client.get_run(again).data.tags["mlflow.parentRunId"]
    assert second not in (by_hand, pipeline)
    end_by_hand_runs()

    monkeypatch.setenv("DVC_STAGE", "compare")
    assert tracking.finish_pipeline(tmp_path, [], {}) == pipeline
    children = client.search_runs(
        [client.get_run(pipeline).info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{pipeline}'",
    )
    assert [run.info.run_id for run in children] == [trained]


@pytest.mark.slow
def test_a_stage_run_by_hand_ends_its_pipeline_run_as_it_exits(tmp_path) -> None:
    """Its pipeline run stayed RUNNING for good, and every later stage run by hand joined it."""
    code = (
        "from pathlib import Path; from accelbench.system import tracking\n"
        "with tracking.variant_run(Path('.'), 'cpu', {}, {}) as run_id: print(run_id)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_STAGE", "MLFLOW_TRACKING_URI")}
    parents = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env,
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        parents.append(client.get_run(done.stdout.split()[-1]).data.tags["mlflow.parentRunId"])
        assert client.get_run(parents[-1]).info.status == "FINISHED"
    assert parents[0] != parents[1]
    assert not (tmp_path / PIPELINE_RUN_FILE).exists()  # no pointer for the next


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
        assert not (copy / STORE).exists()
    for copy in copies:
        shutil.rmtree(copy)  # as DVC does once the experiment is collected

    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(workspace)
    setup(workspace)
    client = MlflowClient()
    parents = set()
    for exp_name, run_id in runs.items():
        run = client.get_run(run_id)
        assert run.data.tags[EXP_NAME_TAG] == exp_name
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        assert parent.info.run_name.startswith(f"{exp_name} ")
        parents.add(parent.info.run_id)
        local = client.download_artifacts(run_id, "note.txt", dst_path=str(tmp_path))
        assert Path(local).read_text() == "cpu artifact\n"
    assert len(parents) == 2  # one pipeline run per experiment


def test_a_workspace_that_is_not_here_falls_back_to_the_checkout(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "elsewhere"))
    assert store_root(tmp_path) == tmp_path
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert store_root(tmp_path / "copy") == tmp_path
    monkeypatch.delenv("DVC_ROOT")
    assert store_root(tmp_path / "copy") == tmp_path / "copy"


STEADY = {"cpu": 12.3, "amp": 0.0834}


def _pipeline(root: Path) -> dict[str, str]:
    """A pipeline run as the stages leave it: cpu, then amp trained (their runs end with their
    train stage), gpu skipped; {variant: run id}."""
    ids = {}
    for name in ("cpu", "amp"):
        with tracking.variant_run(root, name, {}, {"status": "trained"}) as run_id:
            for epoch in (1, 2, 3):
                tracking.log_metrics({"test_accuracy": 0.9 + epoch / 100}, step=epoch)
            tracking.log_metrics({"steady_epoch_s": STEADY[name]})  # as train.json says
        ids[name] = run_id
    tracking.record_skipped(root, "gpu", {}, "no CUDA device")
    [skipped] = MlflowClient().search_runs(
        [setup(root)], "attributes.run_name = 'gpu'", max_results=1
    )
    return ids | {"gpu": skipped.info.run_id}


FIGURES = {
    "cpu": {"steady_epoch_s": 12.3, "steady_epoch_s_lo": 11.9, "steady_epoch_s_hi": 12.8,
            "speedup_vs_cpu": 1.0, "speedup_vs_cpu_lo": 0.95, "speedup_vs_cpu_hi": 1.05,
            "test_accuracy": 0.9912, "time_to_target_s": None, "speedup_vs_fp32": None},
    "amp": {"steady_epoch_s": 0.0834, "steady_epoch_s_lo": 0.0811, "steady_epoch_s_hi": 0.0857,
            "speedup_vs_cpu": 148.3, "speedup_vs_cpu_lo": 140.1, "speedup_vs_cpu_hi": 155.6,
            "speedup_vs_fp32": 1.87, "test_accuracy": 0.9921, "time_to_target_s": 4.2},
}  # fmt: skip


@pytest.mark.slow
def test_variant_figures_are_logged_without_reopening_the_runs(tmp_path, mlflow_store) -> None:
    ids = _pipeline(tmp_path)
    client = MlflowClient()
    before = {name: client.get_run(run_id).info for name, run_id in ids.items()}
    tracking.log_variant_figures(tmp_path, {ids[name]: FIGURES[name] for name in FIGURES})

    amp, cpu = client.get_run(ids["amp"]), client.get_run(ids["cpu"])
    for name in ids:  # each run keeps its train stage's start, end and status
        info = client.get_run(ids[name]).info
        assert (info.start_time, info.end_time, info.status) == (
            before[name].start_time,
            before[name].end_time,
            "FINISHED",
        )
    assert amp.data.metrics["speedup_vs_cpu"] == 148.3
    # a figure the train stage logged (the same value there) is not logged twice
    assert amp.data.metrics["steady_epoch_s"] == 0.0834
    assert amp.data.metrics["steady_epoch_s_lo"] == 0.0811
    assert amp.data.tags["speedup"] == "148× (140–156×)"
    assert amp.data.tags["steady_epoch"] == "0.083 s (0.081–0.086 s)"
    assert amp.data.tags["speedup_vs_fp32"] == "1.87×"
    assert amp.data.tags["time_to_target"] == "4.200 s"
    # the tags read as the report writes the same figures
    steady = Figure(0.0834, 0.0811, 0.0857)
    assert amp.data.tags["steady_epoch"] == answer.fmt_time(steady)
    assert amp.data.tags["speedup"] == answer.fmt_speedup(Figure(148.3, 140.1, 155.6))
    # None: no metric, no tag
    assert "time_to_target_s" not in cpu.data.metrics and "time_to_target" not in cpu.data.tags
    assert cpu.data.tags["speedup"] == "1.00× (0.95–1.05×)"
    # nor one it has as a per-epoch series: the series keeps its shape
    history = client.get_metric_history(ids["amp"], "test_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]


@pytest.mark.slow
def test_a_skipped_variant_has_no_figures_and_is_last_in_the_view(tmp_path, mlflow_store) -> None:
    """A CPU-only laptop saw only cpu in the view: its skipped variants, and why, were not."""
    ids = _pipeline(tmp_path)
    client = MlflowClient()
    skipped = client.get_run(ids["gpu"])
    assert skipped.data.metrics == {}
    assert skipped.data.tags["status"] == "skipped"
    assert skipped.data.tags["skip_reason"] == "no CUDA device"
    parent = skipped.data.tags["mlflow.parentRunId"]
    state = json.loads(json.loads(client.get_experiment(setup(tmp_path)).tags[VIEW_TAG])["state"])
    assert state["searchFilter"] == variants_filter(parent)
    assert {"tags.`status`", "tags.`skip_reason`"} <= set(state["selectedColumns"])
    shown = client.search_runs(
        [setup(tmp_path)], variants_filter(parent), order_by=[f"{state['orderByKey']} ASC"]
    )
    assert [r.info.run_name for r in shown] == ["amp", "cpu", "gpu"]


@pytest.mark.slow
def test_the_saved_view_shows_the_newest_pipelines_variants(tmp_path, mlflow_store) -> None:
    ids = _pipeline(tmp_path)
    client = MlflowClient()
    experiment = client.get_experiment(setup(tmp_path))
    parent = client.get_run(ids["cpu"]).data.tags["mlflow.parentRunId"]
    view = json.loads(experiment.tags[VIEW_TAG])
    state = json.loads(view["state"])
    assert state["searchFilter"] == variants_filter(parent)
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`steady_epoch_s`", True)
    assert state["columnOrder"][:4] == [
        "tags.`steady_epoch`",
        "tags.`speedup`",
        "metrics.`test_accuracy`",
        "tags.`time_to_target`",
    ]
    assert set(state["selectedColumns"]) <= set(state["columnOrder"])
    store = tmp_path / "mlflow.db"
    link = training_view("http://ui", store)[0]
    assert link == (
        f"http://ui/#/experiments/{experiment.experiment_id}/runs?"
        f"workflowType=machine_learning&viewStateShareKey={VIEW_ID}"
    )
    # the next pipeline takes the view over; the link follows
    tracking.finish_pipeline(tmp_path, [], {})
    with tracking.variant_run(tmp_path, "cpu", {}, {"status": "trained"}) as newer:
        pass
    newer_parent = client.get_run(newer).data.tags["mlflow.parentRunId"]
    assert f"'{newer_parent}'" in client.get_experiment(experiment.experiment_id).tags[VIEW_TAG]
    assert training_view("http://ui", store)[0] == link
    # a view that is not the newest pipeline's (written by another store's copy, or deleted):
    # the link filters and sorts by itself
    client.set_experiment_tag(experiment.experiment_id, VIEW_TAG, "{}")
    fallback = training_view("http://ui", store)[0]
    assert "viewStateShareKey" not in fallback
    query = parse_qs(urlsplit(fallback.split("#", 1)[1]).query)
    assert query["searchFilter"] == [variants_filter(newer_parent)]
    assert query["orderByKey"] == ["metrics.`steady_epoch_s`"]
    assert query["workflowType"] == ["machine_learning"]


@pytest.mark.slow
def test_a_repro_of_compare_alone_is_a_pipeline_run_of_the_variants_it_reports(
    tmp_path, mlflow_store
) -> None:
    """A `dvc repro` that re-ran compare alone (a changed target accuracy or price) opened no
    pipeline run: with a skipped variant compare opened one holding only that variant, so
    `accelbench runs` and the UI link showed no trained variant; without one the new report
    was logged nowhere."""
    ids = _pipeline(tmp_path)
    trained = [ids["cpu"], ids["amp"]]
    client = MlflowClient()
    experiment_id = setup(tmp_path)
    first = tracking.finish_pipeline(tmp_path, [], {}, trained)
    assert VARIANT_RUNS_TAG not in client.get_run(first).data.tags  # its own children

    skipped = tracking.record_skipped(tmp_path, "gpu", {}, "no CUDA device")  # compare, alone
    reported = [*trained, skipped]  # as compare passes them: evaluated, then skipped
    second = tracking.finish_pipeline(tmp_path, [], {"cpu.test_accuracy": 0.99}, reported)
    assert second not in (None, first)
    run = client.get_run(second)
    assert run.info.status == "FINISHED" and run.data.metrics == {"cpu.test_accuracy": 0.99}
    parent, children = pipeline_summary(tmp_path)
    assert parent.info.run_id == second
    assert sorted(r.info.run_name for r in children) == ["amp", "cpu", "gpu"]
    view = client.get_experiment(experiment_id).tags[VIEW_TAG]
    shown = client.search_runs(
        [experiment_id], json.loads(json.loads(view)["state"])["searchFilter"]
    )
    assert sorted(r.info.run_name for r in shown) == ["amp", "cpu", "gpu"]
    link = training_view("http://ui", tmp_path / "mlflow.db")[0]
    assert link.endswith(f"viewStateShareKey={VIEW_ID}")
    # the link without the saved view filters by the same runs
    path = ui_path(experiment_id, second, None, named_variant_runs(run.data.tags))
    query = parse_qs(urlsplit(path.split("#", 1)[1]).query)
    assert query["searchFilter"] == [variants_filter(second, reported)]

    # nothing skipped, so nothing opened a run: the report still gets its pipeline run
    third = tracking.finish_pipeline(tmp_path, [], {}, [ids["cpu"]])
    assert third not in (None, first, second)
    assert named_variant_runs(client.get_run(third).data.tags) == [ids["cpu"]]


@pytest.mark.slow
def test_the_link_before_any_pipeline(tmp_path, mlflow_store) -> None:
    store = tmp_path / "mlflow.db"
    assert training_view("http://ui", store)[0].endswith(
        "/#/experiments?workflowType=machine_learning"
    )
    experiment_id = setup(tmp_path)
    assert training_view("http://ui", store)[0] == (
        f"http://ui/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    )


def test_make_ui_serves_without_mlflows_job_runner_or_telemetry(tmp_path, monkeypatch) -> None:
    """`make ui` started 12 processes in 2.5 GiB: MLflow's job runner and its 7 workers, for
    GenAI jobs; and MLflow's usage telemetry is off only where the user's shell said so."""
    for key in ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ui, "port_problem", lambda *_: None)
    started = {}
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.update(argv=argv, env=env))
    ui.main(["--port", "5999"])
    assert started["argv"][1:4] == ["-m", "mlflow", "server"]
    env = started["env"]
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert env["MLFLOW_DISABLE_TELEMETRY"] == env["DO_NOT_TRACK"] == "true"
    # a user's own choice stands
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    ui.main(["--port", "5999"])
    assert started["env"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"


@pytest.mark.slow
def test_make_ui_says_what_its_link_shows(tmp_path, mlflow_store, monkeypatch, capsys) -> None:
    """`make ui` on a fresh clone said "(the newest pipeline run: its variants, fastest
    first)" with no store at all."""
    store = tmp_path / "mlflow.db"
    monkeypatch.setattr(ui, "port_problem", lambda *_: None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")

    def said() -> str:
        assert ui.ui_intro("127.0.0.1", "5000", store) == 0
        return capsys.readouterr().out

    assert "(no runs yet: `make repro` records them" in said()
    setup(tmp_path)
    assert "(the experiment: no pipeline run yet)" in said()
    _pipeline(tmp_path)
    assert "(the newest pipeline run: its variants, fastest first)" in said()


@pytest.mark.slow
def test_accelbench_runs_leads_with_the_speedup(tmp_path, mlflow_store) -> None:
    ids = _pipeline(tmp_path)
    tracking.log_variant_figures(tmp_path, {ids[name]: FIGURES[name] for name in FIGURES})
    table = summary_markdown(tmp_path)
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| variant |"))
    rows = [line for line in lines if line.startswith("| ") and line != header]
    assert header.split(" | ")[1] == "speedup vs cpu (95% interval)"
    assert [r.split(" | ")[0] for r in rows] == ["| amp", "| cpu", "| gpu"]  # fastest first
    cells = dict(zip(header.split("|"), rows[0].split("|"), strict=True))
    assert cells[" speedup vs cpu (95% interval) "] == " 148× (140–156×) "
    assert cells[" steady epoch (95% interval) "] == " 0.083 s (0.081–0.086 s) "
    assert cells[" test accuracy "] == " 93.00% "  # the run's own: the last epoch's
    assert cells[" time to target "] == " 4.200 s "
    gpu = dict(zip(header.split("|"), rows[2].split("|"), strict=True))
    assert gpu[" result "] == " skipped " and gpu[" run status "] == " FINISHED "
    assert "- gpu: no CUDA device" in lines
    assert f"viewStateShareKey={VIEW_ID}" in table
    # a training stopped part way is not a trained variant, whatever its status tag says
    MlflowClient().set_terminated(ids["cpu"], "KILLED")
    [cpu] = [r for r in summary_markdown(tmp_path).splitlines() if r.startswith("| cpu")]
    assert dict(zip(header.split("|"), cpu.split("|"), strict=True))[" result "] == " interrupted "


@pytest.mark.slow
def test_speedups_over_another_baseline_are_tagged_and_headed_as_such(
    tmp_path, mlflow_store
) -> None:
    """With report.speedup_baseline: cpu2, the figure is `speedup_vs_cpu2`: no `speedup` tag
    was written and `accelbench runs` read "speedup vs cpu" with n/a in every row."""
    ids = _pipeline(tmp_path)
    over_cpu2 = {
        ids[name]: {k.replace("_vs_cpu", "_vs_cpu2"): v for k, v in FIGURES[name].items()}
        for name in FIGURES
    }
    tracking.log_variant_figures(tmp_path, over_cpu2, "cpu2")
    amp = MlflowClient().get_run(ids["amp"])
    assert amp.data.tags["speedup"] == "148× (140–156×)"
    assert amp.data.tags[SPEEDUP_BASELINE_TAG] == "cpu2"
    lines = summary_markdown(tmp_path).splitlines()
    header = next(line for line in lines if line.startswith("| variant |"))
    assert header.split(" | ")[1] == "speedup vs cpu2 (95% interval)"
    amp_row = next(line for line in lines if line.startswith("| amp |"))
    assert amp_row.split(" | ")[1] == "148× (140–156×)"


@pytest.mark.slow
def test_accelbench_runs_shows_the_evaluated_accuracy(tmp_path, mlflow_store) -> None:
    """Before: the last per-epoch `test_accuracy` the run logged, which after a tracking outage
    mid-training is an early epoch's (87.99% against the evaluated 97.17%)."""
    ids = _pipeline(tmp_path)
    client = MlflowClient()
    client.log_metric(ids["cpu"], "test_accuracy", 0.8799, step=1)  # the epoch before the outage
    client.log_metric(ids["cpu"], "eval_test_accuracy", 0.9717)  # as compare logs it
    rows = {
        line.split(" | ")[0]: line.split(" | ")
        for line in summary_markdown(tmp_path).splitlines()
        if line.startswith("| ")
    }
    assert rows["| cpu"][3] == "97.17%"
    assert rows["| amp"][3] == "93.00%"  # no evaluation logged: the last epoch's


def test_a_store_that_cannot_be_read_is_not_a_server_to_start(tmp_path, mlflow_store) -> None:
    (tmp_path / "mlflow.db").write_bytes(b"not a database" * 100)
    with pytest.raises(TrackingUnreachable) as error:
        summary_markdown(tmp_path)
    assert f"cannot read MLflow tracking at {mlflow_store}" in str(error.value)
    assert "server" not in str(error.value).split(")")[-1]
    assert "move it aside" in str(error.value)


@pytest.mark.slow
def test_setup_hides_mlflows_run_links_unless_asked(tmp_path, mlflow_store, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    setup(tmp_path)
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")
    setup(tmp_path)
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "false"


def test_make_ui_refuses_a_tracking_server(tmp_path, monkeypatch, capsys) -> None:
    """Before: `make ui` with MLFLOW_TRACKING_URI naming a server served the checkout's own,
    empty, mlflow.db. (tests/test_team_server.py checks the link against a real server.)"""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    assert ui.ui_intro("127.0.0.1", "5000", tmp_path / "mlflow.db") == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert f"the runs are on that server, open http://127.0.0.1:{closed} (or" in err
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_second_comparison_replaces_the_figures_and_tags_it_changes(
    tmp_path, mlflow_store
) -> None:
    """A repro of compare alone after a new target kept the first comparison's time to
    target in `accelbench runs` (figures already logged were never logged again); a baseline
    that did not train left the old `speedup` tag under a "speedup vs gpu" header."""
    ids = _pipeline(tmp_path)
    client = MlflowClient()
    tracking.log_variant_figures(tmp_path, {ids[name]: FIGURES[name] for name in FIGURES})
    later = {**FIGURES["amp"], "time_to_target_s": 9.9, "test_accuracy": 0.95}
    tracking.log_variant_figures(tmp_path, {ids["amp"]: later})
    amp = client.get_run(ids["amp"])
    assert (
        amp.data.metrics["time_to_target_s"] == 9.9 and amp.data.tags["time_to_target"] == "9.900 s"
    )
    # the per-epoch series training logged keeps its shape
    assert sorted(m.step for m in client.get_metric_history(ids["amp"], "test_accuracy")) == [
        1,
        2,
        3,
    ]
    row = next(line for line in summary_markdown(tmp_path).splitlines() if "| amp |" in line)
    assert row.split(" | ")[4] == "9.900 s"

    # now over gpu, which was skipped: no speedups, and no tag left from the cpu baseline
    none = {k: v for k, v in later.items() if not k.startswith("speedup_vs_cpu")}
    tracking.log_variant_figures(tmp_path, {ids["amp"]: none}, "gpu")
    amp = client.get_run(ids["amp"])
    assert "speedup" not in amp.data.tags and amp.data.tags["speedup_baseline"] == "gpu"
    lines = summary_markdown(tmp_path).splitlines()
    row = next(line for line in lines if "| amp |" in line)
    assert row.split(" | ")[1] == "n/a"
