"""The MLflow UI in a real browser: the link `make ui` and `accelbench runs` print opens the
newest pipeline's variants, fastest first (skipped ones last), each trained one's speedup and
steady epoch on the first screen; a user finds the experiment, the pipeline run's children (skipped ones marked),
and their metrics side by side in the compare view.

With $ACCELBENCH_SCREENSHOT_DIR set, the first screen of the link is saved there as
mlflow-runs.png (the README's is made from a GPU store by tools/mlflow_ui.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from accelbench.system import tracking
from accelbench.system.tracking.store import EXPERIMENT
from accelbench.system.tracking.view import training_view
from helpers import REPO, run_all_stages, small_params, write_params

sys.path.insert(0, str(REPO / "tools"))
import mlflow_ui

pytestmark = pytest.mark.browser

missing = [
    what
    for what, ok in (
        ("Debian's chromium", mlflow_ui.chromium_path() is not None),
        ("playwright", importlib.util.find_spec("playwright") is not None),
    )
    if not ok
]
if missing and os.environ.get("ACCELBENCH_REQUIRE_BROWSER") != "1":
    pytest.skip(f"needs {', '.join(missing)} (.ci/run installs them)", allow_module_level=True)


def _screenshot(tmp_path: Path) -> Path:
    folder = os.environ.get("ACCELBENCH_SCREENSHOT_DIR")
    return Path(folder) / "mlflow-runs.png" if folder else tmp_path / "mlflow-runs.png"


def _made_up_figures(steady_epoch_s: float, cpu_epoch_s: float) -> dict[str, float | None]:
    """What compare logs for a variant (its part of the report), made up from its epoch."""
    speedup = cpu_epoch_s / steady_epoch_s
    return {
        "steady_epoch_s": steady_epoch_s,
        "steady_epoch_s_lo": 0.97 * steady_epoch_s,
        "steady_epoch_s_hi": 1.04 * steady_epoch_s,
        "speedup_vs_cpu": speedup,
        "speedup_vs_cpu_lo": 0.93 * speedup,
        "speedup_vs_cpu_hi": 1.07 * speedup,
        "time_to_target_s": 3 * steady_epoch_s,
        "speedup_vs_fp32": None,
    }


def _on_first_screen(seen: dict[str, str], trained: list) -> None:
    """Each trained variant's name, speedup and steady epoch are on the first screen, the
    fastest first."""
    shown = json.loads(seen["first_screen"])
    for run in trained:
        for text in (run.info.run_name, run.data.tags["speedup"], run.data.tags["steady_epoch"]):
            assert shown.get(text) is True, f"{text!r} is not on the first screen: {shown}"
    fastest_first = sorted(trained, key=lambda r: r.data.metrics["steady_epoch_s"])
    assert json.loads(seen["order"]) == [r.info.run_name for r in fastest_first]
    assert "viewStateShareKey" in seen["link"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only pipeline's runs")
def test_compare_view_shows_the_variants_side_by_side(tmp_path, prepared, monkeypatch) -> None:
    """Over the repository's own store, moved to another folder after the run (as a container
    sees the checkout): the report is still there in the pipeline run's artifacts."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(checkout)
    params = small_params()
    run_all_stages(checkout, params, prepared)
    client = MlflowClient(f"sqlite:///{checkout / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    trained = client.search_runs([experiment_id], "tags.status = 'trained'")
    # until compare logs them: made-up figures, as compare would log them
    cpu_epoch_s = 1.234
    tracking.log_variant_figures(
        checkout,
        {
            r.info.run_id: _made_up_figures(cpu_epoch_s / (1 + 40 * i), cpu_epoch_s)
            for i, r in enumerate(sorted(trained, key=lambda r: r.info.run_name != "cpu"))
        },
    )
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("mlflow.db", "mlartifacts"):
        shutil.move(checkout / name, moved / name)

    with mlflow_ui.mlflow_server(moved / "mlflow.db") as url:
        seen = mlflow_ui.visit(url, tmp_path / "compare.png", runs_screenshot=_screenshot(tmp_path))

    client = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    trained = client.search_runs([experiment_id], "tags.status = 'trained'")
    # `make ui` and `accelbench runs` link the newest pipeline's trained variants in the
    # model-training view (not MLflow 3's GenAI overview of traces), with their figures
    assert training_view(url, moved / "mlflow.db")[0] == seen["link"]
    _on_first_screen(seen, trained)
    lines = seen["variants"].splitlines()
    for name in params.variants:  # skipped ones too, after the trained
        assert name in lines, f"{name} is not in the table of the pipeline's variants"
    # each variant run lasts its train stage: it ended before compare logged its evaluation
    for run in trained:
        [evaluated] = client.get_metric_history(run.info.run_id, "eval_test_accuracy")
        assert run.info.end_time < evaluated.timestamp
        assert run.info.end_time - run.info.start_time < 120_000
    assert "accelbench" in seen["experiments"]
    assert "Models" in seen["runs"] and "Tool calls" not in seen["runs"]
    # the models view ranks the variants' models by the evaluation, on the test set
    assert "eval_test_accuracy" in seen["models"] and "mnist-test" in seen["models"]
    assert "cpu" in seen["models"]
    for metric in mlflow_ui.CHART_METRICS:
        assert metric in seen["chart"]
    assert (tmp_path / "compare-chart.png").stat().st_size > 20_000
    children = json.loads(seen["children"])
    assert set(children) == set(params.variants)
    for name in params.variants:
        assert name in seen["runs"], f"{name} not listed under the pipeline run"
        assert name in seen["compare"]
    assert children["cpu"] == "trained"
    assert (
        all(children[n] == "skipped" for n in params.variants if n != "cpu")
        or children.get("gpu") == "trained"
    )
    for metric in ("test_accuracy", "first_epoch_s"):
        assert metric in seen["compare"]
    assert "skipped" in seen["compare"]  # the status tag, side by side
    assert (tmp_path / "compare.png").stat().st_size > 20_000
    assert "comparison.md" in seen["artifacts"] and "accelbench comparison" in seen["artifacts"]


def test_the_printed_link_ranks_the_variants(tmp_path, monkeypatch) -> None:
    """A pipeline of three trained variants (cpu slowest) and a skipped one: the link opens
    the three, fastest first, each one's speedup and steady epoch on the first screen, then
    the skipped one; each run lasts as long as its own stage."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path)
    epochs = {"cpu": 12.3, "gpu": 0.131, "amp": 0.0834}
    ids = {}
    for name, stage_s in (("cpu", 0.9), ("gpu", 0.5), ("amp", 0.1)):
        with tracking.variant_run(tmp_path, name, {}, {"status": "trained"}) as run_id:
            tracking.log_metrics({"steady_epoch_s": epochs[name]})
            time.sleep(stage_s)
        ids[name] = run_id
    tracking.record_skipped(tmp_path, "ddp", {}, "needs 2 GPUs, this machine has 0")
    tracking.log_variant_figures(
        tmp_path, {ids[n]: _made_up_figures(epochs[n], epochs["cpu"]) for n in epochs}
    )
    tracking.finish_pipeline(tmp_path, [], {})
    store = tmp_path / "mlflow.db"

    with mlflow_ui.mlflow_server(store) as url:
        seen = mlflow_ui.visit_link(url, _screenshot(tmp_path))

    assert training_view(url, store)[0] == seen["link"]
    client = MlflowClient(f"sqlite:///{store}")
    trained = [client.get_run(i) for i in ids.values()]
    _on_first_screen(seen, trained)
    assert json.loads(seen["order"]) == ["amp", "gpu", "cpu"]
    assert "ddp" in seen["variants"].splitlines()
    durations = {r.info.run_name: r.info.end_time - r.info.start_time for r in trained}
    assert durations["cpu"] > durations["gpu"] > durations["amp"]
