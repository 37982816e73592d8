"""`dvc repro` end to end in a temporary copy of the repository, on a small subset of MNIST."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from helpers import REPO, copy_repo, repo_params_raw, shared_mnist, write_fake_cifar10

pytestmark = pytest.mark.slow

# docs/comparing.md's `dvc exp show` command leaves out the stages' dependencies (paths, hashes).
EXP_SHOW_DROP = "^(src|data|env|models|metrics)(/|$)"
# docs/comparing-with-dvc.md's: only the params that changed (a column not named as a param is
# dropped: DVC shortens a figure that one file has to its bare name, `speedup_vs_cpu_hi`).
EXP_SHOW_PARAMS = r"^(?!(Experiment|Created)$|(params\.yaml:)?[a-z_]+\.[a-z_])"


def _env(mirror: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "ACCELBENCH_MNIST_MIRROR": str(mirror),
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    env.pop("MLFLOW_TRACKING_URI", None)  # the repository's own SQLite store
    return env


def _dvc(repo: Path, *args: str, mirror: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), *args],
        cwd=repo,
        env=_env(mirror),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def _small_repo(tmp_path: Path, only_cpu: bool = False, **train) -> tuple[Path, Path, dict]:
    """A copy of the repository on an MNIST subset: (repo, mirror, its params)."""
    mirror = shared_mnist()
    if mirror is None:
        pytest.skip("no MNIST mirror: set ACCELBENCH_MNIST_MIRROR (CI sets it)")
    repo = tmp_path / "repo"
    copy_repo(repo)
    cpu_only = {"cpu": repo_params_raw(**train)["variants"]["cpu"]} if only_cpu else None
    params = repo_params_raw(cpu_only, **train)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo, mirror, params


def test_dvc_repro_end_to_end_then_nothing_to_redo(tmp_path, monkeypatch) -> None:
    repo, mirror, params = _small_repo(tmp_path, epochs=2, train_subset=1024, test_subset=512)

    first = _dvc(repo, "repro", mirror=mirror)
    out = first.stdout + first.stderr
    for stage in (
        "env", "download", "prepare", "train@cpu", "evaluate@cpu", "quantize@cpu", "compare"
    ):  # fmt: skip
        assert f"Running stage '{stage}'" in out

    cpu = json.loads((repo / "metrics" / "cpu" / "train.json").read_text())
    assert cpu["status"] == "trained" and cpu["epochs"] == 2 and cpu["train_samples"] == 1024
    report = (repo / "reports" / "comparison.md").read_text()
    assert "| cpu | trained |" in report and "- Dataset: MNIST" in report
    assert "| cpu | dynamic int8 (Linear layers) |" in report  # the quantized-inference table
    assert "## Cost of a run" in report  # no RAPL here: stated watts × time, an estimate
    assert "estimated: 150 W (stated) × time" in report
    assert (repo / "reports" / "summary.png").stat().st_size > 5000
    # every stage recorded where its time went; the report adds them up
    timings = {p.stem for p in (repo / ".accelbench" / "timings").glob("*.json")}
    assert {"env", "download", "prepare", "train@cpu", "evaluate@cpu", "compare"} <= timings
    assert "## Where the pipeline's time goes" in report and "| train@cpu |" in report
    pipeline = json.loads((repo / "reports" / "pipeline_time.json").read_text())
    assert pipeline["training_s"] > 0 and pipeline["between_stages_s"] is not None

    metrics = _dvc(repo, "metrics", "show", "--json", mirror=mirror)
    assert "steady_epoch_s" in metrics.stdout

    monkeypatch.chdir(repo)  # artifact locations are relative to the repository root
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    runs_before = client.search_runs([experiment.experiment_id])
    assert {
        r.info.run_name for r in runs_before if r.data.tags.get("accelbench.role") == "variant"
    } == set(params["variants"])
    assert (repo / "mlartifacts").is_dir()
    cpu_run = next(r for r in runs_before if r.info.run_name == "cpu")
    logged = {a.path for a in client.list_artifacts(cpu_run.info.run_id, "pipeline")}
    assert {"pipeline/params.yaml", "pipeline/dvc.lock"} <= logged
    # compare logged the evaluation into the run that trained the variant
    assert "eval_test_accuracy" in cpu_run.data.metrics
    assert "confusion.png" in {a.path for a in client.list_artifacts(cpu_run.info.run_id)}

    second = _dvc(repo, "repro", mirror=mirror)
    out = second.stdout + second.stderr
    assert "Running stage 'env'" in out  # the probe always runs
    assert "Running stage 'train@" not in out and "Running stage 'compare'" not in out
    assert len(client.search_runs([experiment.experiment_id])) == len(runs_before)

    # `make clean`, then `dvc checkout` as it says: the outputs are back and nothing retrains
    cleaned = subprocess.run(
        ["make", "--no-print-directory", "clean"], cwd=repo, capture_output=True, text=True
    )
    assert cleaned.returncode == 0 and "`dvc checkout` puts" in cleaned.stdout
    assert not (repo / "models").exists() and not (repo / "reports" / "comparison.md").exists()
    _dvc(repo, "checkout", mirror=mirror)
    third = _dvc(repo, "repro", mirror=mirror)
    out = third.stdout + third.stderr
    assert "Running stage 'env'" in out
    assert "Running stage 'train@" not in out and "Running stage 'compare'" not in out
    assert (repo / "models" / "cpu.pt").is_file()
    assert "| cpu | trained |" in (repo / "reports" / "comparison.md").read_text()


def test_killed_dvc_repro_resumes_and_redoes_only_what_is_incomplete(tmp_path) -> None:
    import signal
    import time

    import torch

    repo, mirror, _ = _small_repo(
        tmp_path, only_cpu=True, epochs=4, train_subset=2048, test_subset=512
    )

    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dvc"), "repro"],
        cwd=repo,
        env=_env(mirror),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    checkpoint = repo / "checkpoints" / "cpu.pt"
    deadline = time.monotonic() + 600
    while not (
        checkpoint.exists()
        and torch.load(checkpoint, weights_only=False)["state"]["epochs_done"] >= 1
    ):
        assert process.poll() is None, "dvc repro ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.3)
    os.killpg(process.pid, signal.SIGKILL)  # dvc and the training stage, mid-epoch
    process.wait()
    assert not (repo / "models" / "cpu.pt").exists()
    assert not (repo / "metrics" / "cpu" / "train.json").exists()
    assert not list((repo / "checkpoints").glob(".*.tmp"))

    again = _dvc(repo, "repro", mirror=mirror)
    out = again.stdout + again.stderr
    assert "Running stage 'prepare'" not in out and "Running stage 'download'" not in out
    assert "Running stage 'train@cpu'" in out and "resuming after epoch" in out
    assert json.loads((repo / "metrics" / "cpu" / "train.json").read_text())["epochs"] == 4
    assert not checkpoint.exists()
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    cpu_runs = client.search_runs([experiment.experiment_id], "attributes.run_name = 'cpu'")
    assert [r.info.status for r in cpu_runs] == ["FINISHED"]  # one variant, one run


def test_queued_dvc_experiments_track_into_the_workspace_store(tmp_path, monkeypatch) -> None:
    """`dvc exp run --queue` + `dvc queue start -j 2` run each experiment in a copy under
    .dvc/tmp/exps that DVC deletes: both land in the workspace's MLflow store, each a pipeline
    run named after its DVC experiment, with artifacts readable from the workspace. Two
    workers on a new workspace race to create the store: its file lock lets both in."""
    import time

    repo, mirror, _ = _small_repo(
        tmp_path, only_cpu=True, epochs=2, train_subset=512, test_subset=256
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", "small params"], cwd=repo, check=True)
    assert not (repo / "mlflow.db").exists()  # a new workspace: the workers create the store
    names = {"lr-low": "train.lr=0.0005", "lr-high": "train.lr=0.002"}
    for name, change in names.items():
        _dvc(repo, "exp", "run", "--queue", "-n", name, "-S", change, mirror=mirror)
    started = subprocess.run(  # its workers keep the pipes open: no capture
        [str(Path(sys.executable).parent / "dvc"), "queue", "start", "-j", "2"],
        cwd=repo,
        env=_env(mirror),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    assert started.returncode == 0
    deadline = time.monotonic() + 600
    try:
        while True:
            status = _dvc(repo, "queue", "status", mirror=mirror).stdout
            if "Queued" not in status and "Running" not in status:
                break
            assert time.monotonic() < deadline, status
            time.sleep(5)
    finally:
        subprocess.run(
            [str(Path(sys.executable).parent / "dvc"), "queue", "stop"],
            cwd=repo,
            env=_env(mirror),
            capture_output=True,
            timeout=60,
        )
    assert status.count("Success") == 2, (
        status + _dvc(repo, "queue", "logs", "lr-low", mirror=mirror).stdout
    )
    assert not list((repo / ".dvc" / "tmp" / "exps").glob("tmp*"))  # the copies are gone

    monkeypatch.chdir(repo)  # artifact locations are relative to the workspace root
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    runs = client.search_runs([experiment.experiment_id])
    pipelines = {
        r.data.tags.get("dvc.exp_name"): r
        for r in runs
        if r.data.tags.get("accelbench.role") == "pipeline"
    }
    assert set(pipelines) == set(names)
    for name, change in names.items():
        pipeline = pipelines[name]
        assert pipeline.info.run_name.startswith(f"{name} ")
        assert pipeline.info.status == "FINISHED"
        [cpu] = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id]
        assert cpu.info.run_name == "cpu" and cpu.data.tags["dvc.exp_name"] == name
        assert cpu.data.params["train.lr"] == change.split("=")[1]
        assert "eval_test_accuracy" in cpu.data.metrics
        local = client.download_artifacts(cpu.info.run_id, "eval.json", str(tmp_path))
        assert json.loads(Path(local).read_text())["status"] == "trained"

    # docs/comparing.md's comparison: what changed, without the dependencies' hashes. In CSV:
    # beside the committed run of record (seven variants), DVC's table is wider than any
    # terminal, which is what `make exps` is for.
    env = _env(mirror)
    dvc = str(Path(sys.executable).parent / "dvc")
    shown = subprocess.run(
        [dvc, "exp", "show", "--csv", "--only-changed", "--drop", EXP_SHOW_DROP],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    header, *rows = csv.reader(shown.splitlines())
    assert {"reports/metrics/cpu.json:steady_epoch_s", "train.lr"} <= set(header), shown
    dependencies = [column for column in header if re.match(EXP_SHOW_DROP, column)]
    assert not dependencies and "train.epochs" not in header, shown
    named = {row[0]: dict(zip(header, row, strict=True)) for row in rows if row[0]}
    assert set(named) == set(names) and named["lr-low"]["train.lr"] == "0.0005", shown
    params_only = subprocess.run(
        [dvc, "exp", "show", "--csv", "--only-changed", "--drop", EXP_SHOW_PARAMS],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert params_only.splitlines()[0] == "Experiment,Created,train.lr", params_only
    assert f"--drop '{EXP_SHOW_PARAMS}'" in (REPO / "docs" / "comparing-with-dvc.md").read_text()
    assert f"--drop '{EXP_SHOW_DROP}'" in (REPO / "docs" / "comparing.md").read_text()


def test_a_dvc_experiment_is_shown_in_mlflow_beside_its_baseline(tmp_path) -> None:
    """`dvc repro`, then `dvc exp run --temp -S train.lr=0.002` (issue #40: MLflow's link then
    showed one row, nothing saying it was the experiment nor what it differed from): compare
    prints what the experiment is beside and the link; the view holds the experiment's cpu
    run and the baseline's, each saying whose, with train.lr the one param column."""
    repo, mirror, _ = _small_repo(
        tmp_path, only_cpu=True, epochs=2, train_subset=512, test_subset=256
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-qam", "small params"], cwd=repo, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    _dvc(repo, "repro", mirror=mirror)
    ran = _dvc(repo, "exp", "run", "--temp", "-n", "lr-high", "-S", "train.lr=0.002", mirror=mirror)
    printed = [line for line in (ran.stdout + ran.stderr).splitlines() if "compare: " in line]
    beside = next(line for line in printed if "beside its baseline" in line)
    assert beside.startswith("compare: experiment lr-high beside its baseline, pipeline run `")
    assert beside.endswith(f"of commit {head}; params that differ: train.lr"), beside
    link = next(line for line in printed if line.startswith("compare: in MLflow: "))
    assert link.endswith("&viewStateShareKey=accelbench-newest-pipeline"), link

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    view = json.loads(experiment.tags["mlflow.sharedViewState.accelbench-newest-pipeline"])
    state = json.loads(view["state"])
    rows = client.search_runs(
        [experiment.experiment_id], state["searchFilter"], order_by=[state["orderByKey"]]
    )
    shown = [(r.info.run_name, r.data.tags["experiment"], r.data.params["train.lr"]) for r in rows]
    assert shown == [("cpu", "lr-high", "0.002"), ("cpu", f"baseline {head}", "0.001")]
    assert [c for c in state["columnOrder"] if c.startswith("params.")] == ["params.`train.lr`"]
    assert view["name"] == "lr-high beside its baseline"


def test_dvc_exp_run_on_cifar10_end_to_end(tmp_path) -> None:
    """`dvc exp run -S data.dataset=cifar10` on a fake archive in the official format, served by
    $ACCELBENCH_CIFAR10_MIRROR, with docs/pipeline.md's flags (the tutorial's recipe): download,
    prepare, every variant (CUDA ones skipped here; the DataLoader recipe on the CPU),
    evaluate, quantize and the report."""
    md5 = write_fake_cifar10(tmp_path / "cifar-mirror", n_per_batch=256, n_test=256)
    repo = tmp_path / "repo"
    copy_repo(repo)
    raw = repo_params_raw(epochs=3, eval_batch_size=256)
    raw["variants"]["cpu_dataloader"] = {
        "device": "cpu", "batches": "dataloader", "loader": {"num_workers": 1},
    }  # fmt: skip
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run(["git", "commit", "-qam", "cpu_dataloader"], cwd=repo, check=True)
    env = _env(tmp_path / "no-mnist-needed") | {
        "ACCELBENCH_CIFAR10_MIRROR": str(tmp_path / "cifar-mirror")
    }
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), "exp", "run",  # docs/pipeline.md's command
         "-S", "data.dataset=cifar10", "-S", "train.batch_size=128",
         "-S", "train.schedule=constant", "-S", "train.shift_px=0",
         "-S", f"data.cifar10_md5={md5}"],  # the fake archive's
        cwd=repo, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    assert (repo / "data" / "raw" / "cifar-10-python.tar.gz").is_file()
    for name in ("cpu", "cpu_dataloader"):
        trained = json.loads((repo / "metrics" / name / "train.json").read_text())
        assert trained["status"] == "trained" and trained["train_samples"] == 5 * 256
        epochs = (repo / "metrics" / name / "epochs.csv").read_text().splitlines()
        assert len(epochs) == 1 + 3  # a header, then the three epochs
        first, last = (float(line.split(",")[1]) for line in (epochs[1], epochs[-1]))
        assert last < first  # train_loss: LeNet learns the fake images
        assert 3e6 < trained["flops_per_sample"] < 4e6  # LeNet's, not the seed CNN's 65 M
    report = (repo / "reports" / "comparison.md").read_text()
    assert "- Dataset: CIFAR-10, the DDP/AMP tutorial's LeNet" in report
    assert "| cpu_dataloader | trained |" in report and "| gpu | cuda, fp32 | skipped |" in report
    assert "| cpu | static int8 (x86 backend) |" in report or "not supported" in report
    assert "## Cost of a run" in report
    assert "tutorials' published figures" not in report  # those are MNIST's


def test_make_smoke_writes_a_report_and_leaves_the_workspace_alone(tmp_path) -> None:
    """`make smoke` as a new user runs it: the whole pipeline as the DVC experiment `smoke`
    in a copy of the workspace, its report copied to reports/smoke/, its runs in MLflow; the
    workspace's params.yaml, dvc.lock and outputs untouched."""
    mirror = shared_mnist()
    if mirror is None:
        pytest.skip("no MNIST mirror: set ACCELBENCH_MNIST_MIRROR (CI sets it)")
    repo = tmp_path / "repo"
    copy_repo(repo)
    committed_lock = (repo / "dvc.lock").read_bytes()  # the run of record's
    earlier = repo / "reports" / "smoke"  # an earlier `make smoke`'s report: replaced whole
    (earlier / "plots").mkdir(parents=True)
    (earlier / "comparison.md").write_text("an earlier smoke run's report\n")
    env = _env(mirror) | {"ACCELBENCH_ENV": sys.prefix}  # the tests' environment: no setup
    command = ["make", "--no-print-directory", "smoke"]
    made = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stdout[-4000:] + made.stderr[-4000:]
    assert not (earlier / "reports").exists() and not (repo / "reports" / ".smoke.new").exists()
    report = (repo / "reports" / "smoke" / "comparison.md").read_text()
    assert "| cpu | trained |" in report and "training subset 6000" in report
    assert (repo / "reports" / "smoke" / "summary.png").is_file()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True)
    assert status.stdout == b""  # the workspace as it was
    assert (repo / "dvc.lock").read_bytes() == committed_lock
    assert not (repo / "models").exists()
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    names = {r.info.run_name for r in client.search_runs([experiment.experiment_id])}
    assert "cpu" in names and any(name.startswith("smoke ") for name in names)  # the pipeline's
