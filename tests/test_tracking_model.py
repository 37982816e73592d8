"""tracking.log_model: the model, its signature and its pinned requirements, logged without
MLflow's scan of every installed distribution, and still checked against the environment."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from mlflow.utils import requirements_utils

from accelbench.data.datasets import DATASETS
from accelbench.system import tracking
from accelbench.system.tracking.store import EXPERIMENT
from accelbench.training.build import trained_model
from accelbench.training.models import for_dataset


@pytest.fixture
def no_distribution_map(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """MLflow's distribution map as a fresh process has it (none yet); its scan, if anything
    runs it, is recorded."""
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)
    scans: list[str] = []
    real = importlib.metadata.packages_distributions

    def scan():
        scans.append("scanned")
        return real()

    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions", scan)
    return scans


def _log_model(tmp_path, name: str = "cpu") -> str:
    model = trained_model(DATASETS["mnist"], for_dataset(DATASETS["mnist"]).state_dict())
    example = np.zeros((2, 1, 28, 28), np.float32)
    with tracking.variant_run(tmp_path, name, {}, {"status": "trained"}) as run_id:
        tracking.log_model(model, example, name)
    return run_id


@pytest.mark.slow
def test_the_model_is_logged_with_its_requirements_and_no_scan(
    tmp_path, mlflow_store, no_distribution_map
) -> None:
    run_id = _log_model(tmp_path)

    assert no_distribution_map == []
    assert requirements_utils._MODULES_TO_PACKAGES is None  # MLflow's again
    [model] = MlflowClient().search_logged_models(
        [mlflow.get_experiment_by_name(EXPERIMENT).experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
    )
    folder = mlflow.artifacts.download_artifacts(f"models:/{model.model_id}", dst_path=tmp_path)
    requirements = (tmp_path / "requirements.txt").read_text().split()
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements
    assert f"mlflow=={mlflow.__version__}" in requirements
    assert mlflow.models.get_model_info(folder).signature is not None
    loaded = mlflow.pytorch.load_model(folder)
    assert loaded(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


def test_a_requirement_the_environment_does_not_meet_is_still_reported(
    tmp_path, mlflow_store, no_distribution_map, monkeypatch, capfd
) -> None:
    monkeypatch.setattr(torch, "__version__", "0.0.1")  # the pin: torch==0.0.1

    _log_model(tmp_path)

    assert "torch (current: " in capfd.readouterr().err
    assert no_distribution_map == []


@pytest.mark.slow
def test_a_map_mlflow_built_already_is_used_as_it_is(
    tmp_path, mlflow_store, no_distribution_map
) -> None:
    requirements_utils._init_packages_to_modules_map()
    built = requirements_utils._MODULES_TO_PACKAGES
    no_distribution_map.clear()

    _log_model(tmp_path)

    assert requirements_utils._MODULES_TO_PACKAGES is built and no_distribution_map == []


@pytest.mark.slow
def test_a_training_prints_its_own_lines_not_mlflows(tmp_path, prepared, mlflow_store) -> None:
    """A trained, tracked and logged variant: MLflow's INFO lines and its pickle caution do
    not reach the stage's output; the run and its model are in the store all the same."""
    import os
    import subprocess

    from helpers import train_command, write_params

    params = write_params(tmp_path, {"cpu": {"device": "cpu", "threads": 1}}, epochs=1)
    command = train_command(params, "cpu", prepared, tmp_path / "cpu.pt", tmp_path / "m")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    env.pop("MLFLOW_LOGGING_LEVEL", None)
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "train cpu: first epoch" in output
    assert " INFO mlflow" not in output, output
    assert "CloudPickle" not in output, output
    client = MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name("accelbench")
    (run,) = client.search_runs([experiment.experiment_id], "tags.variant = 'cpu'")
    assert client.search_logged_models([experiment.experiment_id])[0].source_run_id == (
        run.info.run_id
    )


def test_mlflow_s_pytorch_flavour_is_imported_without_lightning(tmp_path) -> None:
    """Where Lightning is installed, MLflow's flavour would import it (4.6 s of a stage on an
    H200 host); pytorch_flavour keeps it out, and it imports as before afterwards."""
    fake = tmp_path / "pytorch_lightning"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import pathlib, sys\n"
        f"pathlib.Path({str(tmp_path / 'imported')!r}).write_text(str(sys.argv))\n"
    )
    script = (
        "import sys; from accelbench.system.tracking.logs import pytorch_flavour\n"
        "flavour = pytorch_flavour()\n"
        "assert flavour is sys.modules['mlflow.pytorch'] and flavour.log_model\n"
        "assert 'pytorch_lightning' not in sys.modules, 'imported or left blocked'\n"
        "import pathlib; assert not pathlib.Path(sys.argv[1]).exists()\n"
        "import pytorch_lightning  # the user's own import still works\n"
        "assert pathlib.Path(sys.argv[1]).exists()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "imported")], env=env, check=True)
