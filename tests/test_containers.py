"""What can be checked of the container files without a container engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import json5
import pytest

from conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match.group(1)


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.lower()] = version.strip()
    return pins


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


@pytest.fixture(scope="module")
def devcontainer() -> dict:
    return json5.loads((REPO / ".devcontainer" / "devcontainer.json").read_text())


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_cuda_is_not_older_than_the_locked_torch_build() -> None:
    cuda_base = _version(_arg_default("CUDA_VERSION"))
    torch_cuda = _version(_lock()["nvidia-cuda-runtime"])[:2]  # the runtime torch's wheel pulls in
    assert cuda_base[:2] >= torch_cuda, f"base CUDA {cuda_base} < torch's CUDA {torch_cuda}"
    assert f"cu{torch_cuda[0]}{torch_cuda[1]}" == _arg_default("TORCH_CUDA")
    assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-base-ubuntu", DOCKERFILE, re.MULTILINE)


def test_image_installs_from_the_same_lock_as_make_and_ci() -> None:
    assert "COPY requirements.lock" in DOCKERFILE
    assert "pip install -r /tmp/requirements.lock" in DOCKERFILE
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet -r requirements.lock" in makefile
    assert "make test" in (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "requirements.lock" in readme and "docker build" in readme


def test_image_runs_as_non_root_and_documents_the_ui_port() -> None:
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users[-1] != "0" and users[-1] != "root"
    assert "EXPOSE 5000" in DOCKERFILE
    assert re.search(r"^FROM runtime AS dev$", DOCKERFILE, re.MULTILINE)


def test_dockerignore_keeps_data_and_stores_out() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".venv", "data", "models", "mlflow.db", "mlartifacts", ".dvc/cache", ".git"} <= ignored


def test_devcontainer_has_what_users_need(devcontainer) -> None:
    build = devcontainer["build"]
    assert (REPO / ".devcontainer" / build["dockerfile"]).resolve() == REPO / "Dockerfile"
    assert build["target"] == "dev"
    assert build["args"]["CUDA_VERSION"] == _arg_default("CUDA_VERSION")
    assert devcontainer["hostRequirements"]["gpu"] == "optional"
    assert "--gpus" not in " ".join(devcontainer.get("runArgs", []))
    assert 5000 in devcontainer["forwardPorts"]
    extensions = devcontainer["customizations"]["vscode"]["extensions"]
    assert {"ms-python.python", "ms-toolsai.jupyter", "Iterative.dvc"} <= set(extensions)
    assert "accelbench doctor" in devcontainer["postCreateCommand"]
    assert "pip install" in devcontainer["postCreateCommand"]
    mounts = " ".join(devcontainer["mounts"])
    assert ".dvc/cache" in mounts and "type=volume" in mounts


def test_pipeline_script_refuses_to_run_on_doctor_problems() -> None:
    script = (REPO / "docker" / "run-pipeline.sh").read_text()
    assert "accelbench doctor" in script and "dvc repro" in script
    assert script.index("accelbench doctor") < script.index("dvc repro")
