"""The MLflow UI in a real browser: a user finds the experiment, the pipeline run's children
(skipped ones marked), and their metrics side by side in the compare view."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from accelbench import tracking
from helpers import REPO, run_all_stages, small_params

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
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("mlflow.db", "mlartifacts"):
        shutil.move(checkout / name, moved / name)

    with mlflow_ui.mlflow_server(moved / "mlflow.db") as url:
        seen = mlflow_ui.visit(url, tmp_path / "compare.png")

    assert "accelbench" in seen["experiments"]
    # `make ui` and `accelbench runs` link the experiment in the model-training view, not
    # MLflow 3's GenAI overview (usage, quality, tool calls of traces)
    experiment_id = (
        MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
        .get_experiment_by_name(tracking.EXPERIMENT)
        .experiment_id
    )
    link = tracking.training_view_url(url, moved / "mlflow.db")
    assert link == url + tracking.ui_path(experiment_id)
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
