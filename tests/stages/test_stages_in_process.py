"""Every stage in order, in this process, on fake data, with a private MLflow store."""

from __future__ import annotations

import json

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from accelbench.core.outputs import MetricsFiles
from accelbench.data.prepared import dataset_digest
from accelbench.stages import train
from accelbench.system.tracking.store import EXPERIMENT, ROLE_TAG
from helpers import run_all_stages, small_params


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_pipeline_in_process_tracks_runs_under_one_parent(tmp_path, prepared, mlflow_store) -> None:
    params = small_params()
    headline = run_all_stages(tmp_path, params, prepared)

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
    assert "| cpu | trained |" in report and "| gpu | cuda, fp32 | skipped |" in report
    assert "Skipped gpu, amp" in report
    assert "## Quantized inference on the CPU" in report
    assert "| cpu | dynamic int8 (Linear layers) |" in report
    assert "## Cost of a run" in report and "| cpu |" in report.split("## Cost of a run")[1]
    assert headline["cpu.cost_usd"] > 0 and "gpu.cost_usd" not in headline  # skipped: no cost

    client = MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE_TAG) == "pipeline"]
    children = [r for r in runs if r.data.tags.get(ROLE_TAG) == "variant"]
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
    assert "quant_dynamic_int8_latency_ms" in cpu.data.metrics
    artifacts = {a.path for a in client.list_artifacts(cpu.info.run_id)}
    assert {"epochs.csv", "confusion.png", "eval.json", "per_class.csv"} <= artifacts
    # The evaluation is logged against the variant's model and the test set: the models view
    # ranks the variants' models by it.
    [model] = mlflow.search_logged_models(
        experiment_ids=[experiment.experiment_id],
        filter_string=f"source_run_id = '{cpu.info.run_id}'",
        output_format="list",
    )
    assert model.name == "cpu"
    model_metrics = {m.key: m for m in model.metrics}
    accuracy = model_metrics["eval_test_accuracy"]
    assert accuracy.value == pytest.approx(eval_json["test_accuracy"])
    assert (accuracy.dataset_name, accuracy.dataset_digest) == (
        "mnist-test",
        dataset_digest(prepared, "test"),
    )
    per_class = (tmp_path / "metrics" / "cpu" / "per_class.csv").read_text().splitlines()
    assert per_class[0] == "digit,precision,recall,f1" and len(per_class) == 11
    assert (tmp_path / "metrics" / "gpu" / "per_class.csv").read_text().strip() == per_class[0]
    variant_metrics = json.loads((tmp_path / "reports" / "metrics" / "cpu.json").read_text())
    compared = {"steady_epoch_s", "speedup_vs_cpu", "test_accuracy"}
    # with their 95% intervals where two steady epochs or more give one; time to target if
    # reached
    optional = {"time_to_target_s"}
    optional |= {f"{k}_{end}" for k in compared | optional for end in ("lo", "hi")}
    assert compared <= set(variant_metrics) <= compared | optional
    # MLflow's figures are the report's (to 4 significant digits), not a second computation
    # that happens to agree
    logged = client.get_run(cpu.info.run_id).data.metrics
    assert {k: logged[k] for k in variant_metrics} == pytest.approx(variant_metrics, rel=1e-3)
    assert json.loads((tmp_path / "reports" / "metrics" / "gpu.json").read_text()) == {}
    inputs = {
        d.dataset.name: d.dataset.digest
        for d in client.get_run(cpu.info.run_id).inputs.dataset_inputs
    }
    assert inputs == {
        "mnist-train": dataset_digest(prepared, "train"),
        "mnist-test": dataset_digest(prepared, "test"),
    }
    system = [k for k in cpu.data.metrics if k.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system
    assert not [k for k in system if k.startswith("system/gpu")]  # absent, not zeros
    skipped = next(r for r in children if r.info.run_name == "gpu")
    assert skipped.data.tags["status"] == "skipped" and skipped.data.tags["skip_reason"]
    parent_artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "comparison.md" in parent_artifacts
    assert parents[0].data.metrics["cpu.cost_usd"] == pytest.approx(
        headline["cpu.cost_usd"], rel=1e-3
    )  # logged to 4 significant digits

    # a second pipeline gets a new parent; the first one stays finished
    out = train.TrainOutputs(
        tmp_path / "models" / "cpu.pt", MetricsFiles(tmp_path / "metrics" / "cpu")
    )
    train.run(tmp_path, "cpu", train.select(params, "cpu"), prepared, out, quiet=True)
    runs = client.search_runs([experiment.experiment_id], "tags.`accelbench.role` = 'pipeline'")
    assert len(runs) == 2
