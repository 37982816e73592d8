"""The stages end to end in-process on fake data, with a private MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from accelbench import data, stages, tracking
from accelbench.params import parse_params
from conftest import REPO


def small_params(**train_overrides):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    # shift_px=0: the synthetic digits encode their class by position
    raw["train"].update(
        epochs=2, batch_size=128, eval_batch_size=256, shift_px=0, **train_overrides
    )
    return parse_params(raw)


def run_all(root: Path, params, prepared: Path) -> dict:
    stages.env_stage(root / "env")
    for name in params.variants:
        out = stages.TrainOutputs(root / "models" / f"{name}.pt", root / "metrics" / name)
        stages.train_stage(root, params, name, prepared, out, quiet=True)
        stages.evaluate_stage(root, params, out.model, prepared, out.metrics_dir)
    return stages.compare_stage(root, params, root / "env", root / "metrics", root / "reports")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_pipeline_in_process_tracks_runs_under_one_parent(tmp_path, prepared, mlflow_store) -> None:
    params = small_params()
    headline = run_all(tmp_path, params, prepared)

    train_json = json.loads((tmp_path / "metrics" / "cpu" / "train.json").read_text())
    assert train_json["status"] == "trained" and train_json["epochs"] == 2
    assert train_json["first_epoch_s"] > 0 and train_json["steady_epoch_s"] > 0
    gpu_json = json.loads((tmp_path / "metrics" / "gpu" / "train.json").read_text())
    assert gpu_json["status"] == "skipped" and (
        "GPU" in gpu_json["reason"] or "CUDA" in gpu_json["reason"]
    )
    eval_json = json.loads((tmp_path / "metrics" / "cpu" / "eval.json").read_text())
    assert 0.5 < eval_json["test_accuracy"] <= 1 and set(eval_json["per_class"]) <= set(
        map(str, range(10))
    )
    assert (tmp_path / "metrics" / "cpu" / "confusion.png").stat().st_size > 1000
    assert headline["cpu.speedup_vs_cpu"] == 1.0

    report = (tmp_path / "reports" / "comparison.md").read_text()
    assert "| cpu | trained |" in report and "| gpu | skipped |" in report
    assert "Skipped gpu, amp" in report

    client = MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get(tracking.ROLE_TAG) == "pipeline"]
    children = [r for r in runs if r.data.tags.get(tracking.ROLE_TAG) == "variant"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {r.info.run_name for r in children} == set(params.variants)
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    assert all(r.info.status == "FINISHED" for r in children)

    cpu = next(r for r in children if r.info.run_name == "cpu")
    assert cpu.data.params["train.batch_size"] == "128"
    assert cpu.data.params["variant.precision"] == "fp32"
    assert cpu.data.tags["status"] == "trained" and cpu.data.tags["device"] == "cpu"
    history = client.get_metric_history(cpu.info.run_id, "test_accuracy")
    assert sorted(m.step for m in history) == [1, 2]
    assert "eval_macro_f1" in cpu.data.metrics and "steady_epoch_s" in cpu.data.metrics
    artifacts = {a.path for a in client.list_artifacts(cpu.info.run_id)}
    assert {"epochs.csv", "confusion.png", "eval.json"} <= artifacts
    assert mlflow.search_logged_models(experiment_ids=[experiment.experiment_id]).shape[0] >= 1
    inputs = {
        d.dataset.name: d.dataset.digest
        for d in client.get_run(cpu.info.run_id).inputs.dataset_inputs
    }
    assert inputs == {
        "mnist-train": data.dataset_digest("train", 0),
        "mnist-test": data.dataset_digest("test", 0),
    }
    system = [k for k in cpu.data.metrics if k.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system
    assert not [k for k in system if k.startswith("system/gpu")]  # absent, not zeros
    skipped = next(r for r in children if r.info.run_name == "gpu")
    assert skipped.data.tags["status"] == "skipped" and skipped.data.tags["skip_reason"]
    parent_artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "comparison.md" in parent_artifacts

    # a second pipeline gets a new parent; the first one stays finished
    out = stages.TrainOutputs(tmp_path / "models" / "cpu.pt", tmp_path / "metrics" / "cpu")
    stages.train_stage(tmp_path, params, "cpu", prepared, out, quiet=True)
    runs = client.search_runs([experiment.experiment_id], "tags.`accelbench.role` = 'pipeline'")
    assert len(runs) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_require_gpu_fails_clearly_without_cuda(tmp_path, prepared, mlflow_store) -> None:
    params = small_params(require_gpu=True)
    out = stages.TrainOutputs(tmp_path / "gpu.pt", tmp_path / "metrics")
    with pytest.raises(stages.StageError, match=r"needs CUDA .*train\.require_gpu: false"):
        stages.train_stage(tmp_path, params, "gpu", prepared, out, quiet=True)
    assert not out.model.exists()


def test_unknown_variant_is_refused(tmp_path, prepared) -> None:
    from accelbench.params import ParamsError

    out = stages.TrainOutputs(tmp_path / "x.pt", tmp_path / "metrics")
    with pytest.raises(ParamsError, match=r"unknown variant 'tpu'; params\.yaml defines: cpu"):
        stages.train_stage(tmp_path, small_params(), "tpu", prepared, out)


def test_cli_rejects_bad_params_before_any_work(tmp_path, capsys) -> None:
    from accelbench.cli import main

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"]["batch_size"] = 0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["--params", str(path), "download", "--out", str(tmp_path / "raw")]) == 2
    assert "train.batch_size = 0" in capsys.readouterr().err
    assert not (tmp_path / "raw").exists()
