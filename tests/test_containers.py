"""What can be checked of the container files without a container engine.

`make container-test` (tools/container-test.sh, run by CI) builds the image and runs the
pipeline in it; these tests check the files themselves, fast.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO
from helpers import load_script

pytestmark = pytest.mark.xdist_group("containers")  # one worker: its module fixture runs once

flavours = load_script(REPO / "docker" / "requirements_for_flavour.py")

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match.group(1)


def _lock() -> dict[str, str]:
    """{name: version} of uv.lock (one version per package in this project's lock)."""
    packages = tomllib.loads((REPO / "uv.lock").read_text())["package"]
    return {package["name"]: package["version"] for package in packages}


def _runtime_export() -> str:
    """The runtime group (and the plots extra) as the Dockerfile exports it."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "uv"), "export", "--project", str(REPO), "--frozen",
         "--no-header", "--no-annotate", "--no-emit-project", "--no-dev", "--extra", "plots"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


@pytest.fixture(scope="module")
def devcontainer() -> dict:
    import json5  # dev-only: the GPU host, which has the runtime group, collects this file

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
    assert "COPY pyproject.toml uv.lock docker/requirements_for_flavour.py /tmp/lock/" in DOCKERFILE
    # the runtime image gets the runtime group, the plots extra (`make plots` draws offline)
    # and the team extra (`accelbench server`, an SSH remote), hashes checked; the dev image
    # adds the dev group
    [runtime_export] = re.findall(
        r"uv export [^&]*--no-dev --extra plots --extra team -o /tmp/lock/runtime.txt", DOCKERFILE
    )
    assert "--frozen" in runtime_export
    assert 'requirements_for_flavour.py "$TORCH_CUDA" /tmp/lock/runtime.txt /tmp/lock' in DOCKERFILE
    assert (
        "--require-hashes \\\n         --compile-bytecode -r /tmp/lock/requirements.txt"
        in DOCKERFILE
    )
    assert "--only-group dev -o /opt/venv/dev-requirements.txt" in DOCKERFILE
    dev_stage = DOCKERFILE.split("FROM runtime AS dev", 1)[1]
    assert "pip install --require-hashes --no-deps -r /opt/venv/dev-requirements.txt" in dev_stage
    # uv itself: the lock's version, as `make setup` installs it
    assert _arg_default("UV_VERSION") == _lock()["uv"]
    makefile = (REPO / "Makefile").read_text()
    assert (
        '/uv" sync --locked --quiet --compile-bytecode' in makefile
        and 'pip install --quiet "uv==$(UV_VERSION)"' in makefile
    )
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test-full" in ci and "make container-test" in ci
    containers = (REPO / "docs" / "containers.md").read_text()  # the README links it
    assert "uv.lock" in containers and "docker build" in containers
    assert "uv.lock" in (REPO / "README.md").read_text()
    assert not (REPO / "requirements.lock").exists()


def test_building_needs_no_registry_but_the_base_image() -> None:
    """A `# syntax=` line makes BuildKit pull a frontend image before anything else."""
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.MULTILINE | re.IGNORECASE)
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE) == [
        "nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU}",
        "runtime",
    ]


def test_the_python_environment_is_written_by_one_layer() -> None:
    """A later `chown -R` of /opt/venv copied the whole 6.8 GB environment into a second layer;
    `make container-test` also fails when two layers are over 1 GB."""
    assert "chown" not in DOCKERFILE
    [venv_layer] = [run for run in DOCKERFILE.split("\nRUN ") if "python3 -m venv" in run]
    assert "rm -rf /tmp/lock /tmp/uv" in venv_layer  # the installer goes with its layer
    # uv, the lock, and a flavour's torch
    assert [
        line.split("install")[0].strip(" &\\")
        for line in venv_layer.splitlines()
        if "pip install" in line
    ] == ["/tmp/uv/bin/pip", "/tmp/uv/bin/uv pip", "pip"]


def _runtime_dependencies() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {flavours._name(dep) for dep in project["dependencies"]}


@pytest.mark.parametrize("flavour", ["cu126", "cu128", "cu130"])
def test_every_cuda_flavour_keeps_what_the_project_needs(flavour) -> None:
    """nvidia-ml-py (doctor, GPU system metrics, energy) must survive the flavour's filter."""
    export = _runtime_export()
    requirements, torch = flavours.split_lock(export, flavour)
    names = {flavours._name(entry) for entry in requirements + torch}
    assert _runtime_dependencies() <= names
    assert "nvidia-ml-py" in names
    exported = {flavours._name(entry) for entry in flavours.requirements(export)}
    assert "setuptools" in exported  # `pip install --no-build-isolation -e` builds with it
    assert all("--hash=sha256:" in entry for entry in requirements)
    if flavour == flavours.DEFAULT_FLAVOUR:
        assert names == exported and torch == []
    else:  # torch from PyTorch's index brings its own CUDA libraries, not the lock's CUDA 13
        assert {flavours._name(pin) for pin in torch} == {"torch", "torchvision"}
        assert not any("--hash" in pin for pin in torch)  # PyPI's hashes, not this index's
        assert all(pin.startswith(("torch==2.14.1 ;", "torchvision==0.29.1 ;")) for pin in torch)
        dropped = exported - {flavours._name(entry) for entry in requirements}
        assert {"torch", "torchvision", "triton", "nvidia-cublas", "nvidia-cudnn-cu13"} <= dropped
        assert all(flavours.CUDA_STACK.match(name) or name in flavours.TORCH for name in dropped)


def test_a_flavour_that_is_not_cuXYZ_or_a_list_not_from_uv_export_is_refused(tmp_path) -> None:
    export = tmp_path / "runtime.txt"
    export.write_text("torch==2.14.1 ; sys_platform == 'linux' \\\n    --hash=sha256:ab\n")
    assert flavours.main(["cuda12", str(export), str(tmp_path / "out")]) == 2
    assert flavours.main(["cu128", str(export), str(tmp_path / "out")]) == 0
    assert (
        tmp_path / "out" / "torch.txt"
    ).read_text() == "torch==2.14.1 ; sys_platform == 'linux'\n"
    assert (tmp_path / "out" / "requirements.txt").read_text() == ""
    export.write_text("    --hash=sha256:ab\n")
    assert flavours.main(["cu128", str(export), str(tmp_path / "out")]) == 2


def test_any_uid_can_run_the_image() -> None:
    """The entry point runs commands as the checkout's owner; nothing writes to the venv at
    start (the checkout's src/ comes first on PYTHONPATH). `make container-test` runs it as
    uid 4242, with and without --user."""
    assert "PYTHONPATH=/workspace/src" in DOCKERFILE
    assert 'ENTRYPOINT ["/opt/accelbench/docker/entrypoint.sh"]' in DOCKERFILE
    assert not re.search(r"^USER ", DOCKERFILE, re.MULTILINE)  # the entry point drops root
    entrypoint = (REPO / "docker" / "entrypoint.sh").read_text()
    assert "setpriv --reuid" in entrypoint and 'exec "$@"' in entrypoint
    script = (REPO / "docker" / "run-pipeline.sh").read_text()
    assert "pip install" not in script
    assert "EXPOSE 5000" in DOCKERFILE
    assert re.search(r"^FROM runtime AS dev$", DOCKERFILE, re.MULTILINE)


def test_dockerignore_keeps_data_and_stores_out() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".venv", "data", "models", "mlflow.db", "mlartifacts", ".dvc/cache", ".git"} <= ignored


def test_devcontainer_has_what_users_need(devcontainer) -> None:
    build = devcontainer["build"]
    assert (REPO / ".devcontainer" / build["dockerfile"]).resolve() == REPO / "Dockerfile"
    assert build["target"] == "dev"
    # The flavour comes from the host's environment, defaulting to the Dockerfile's.
    for arg, variable in (
        ("CUDA_VERSION", "ACCELBENCH_CUDA_VERSION"),
        ("TORCH_CUDA", "ACCELBENCH_TORCH_CUDA"),
    ):
        assert build["args"][arg] == f"${{localEnv:{variable}:{_arg_default(arg)}}}"
    assert devcontainer["hostRequirements"]["gpu"] == "optional"
    run_args = devcontainer["runArgs"]
    assert "--gpus" not in " ".join(run_args)
    assert "--shm-size=8g" in run_args  # DataLoader workers and NCCL need more than 64 MB
    assert "${localEnv:ACCELBENCH_GPU_ARG:--ipc=private}" in run_args  # Podman/CDI: --device
    assert devcontainer["containerEnv"]["ACCELBENCH_GPU"] == "${localEnv:ACCELBENCH_GPU:}"
    assert 5000 in devcontainer["forwardPorts"]
    extensions = devcontainer["customizations"]["vscode"]["extensions"]
    assert {"ms-python.python", "ms-toolsai.jupyter", "Iterative.dvc"} <= set(extensions)
    assert devcontainer["workspaceFolder"] == "/workspace"  # where PYTHONPATH looks
    assert "target=/workspace," in devcontainer["workspaceMount"]
    # A failed post-create step fails the container's creation; nothing hides it.
    assert devcontainer["postCreateCommand"] == "bash docker/post-create.sh"
    post_create = (REPO / "docker" / "post-create.sh").read_text()
    assert "set -euo pipefail" in post_create and "|| true" not in post_create
    assert "accelbench doctor" in post_create and "/workspace/src/" in post_create
    assert devcontainer["remoteUser"] == "dev" and devcontainer["updateRemoteUserUID"] is True
    mounts = " ".join(devcontainer["mounts"])
    assert ".dvc/cache" in mounts and "type=volume" in mounts


def test_the_image_refuses_a_cuda_and_torch_pair_that_do_not_match() -> None:
    """The check the Dockerfile runs (its RUN line, in sh) on the pairs docs/containers.md lists."""
    line = re.search(r"^RUN (minor=.*?)^\S", (REPO / "Dockerfile").read_text(), re.M | re.S)
    script = line.group(1).replace("\\\n", " ")  # Docker joins continued lines
    for cuda, torch_cuda, ok in (
        ("13.0.1", "cu130", True),
        ("12.8.1", "cu128", True),
        ("12.6.3", "cu126", True),
        ("12.8.1", "cu130", False),
    ):
        env = {"CUDA_VERSION": cuda, "TORCH_CUDA": torch_cuda, "PATH": "/usr/bin:/bin"}
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
        assert (done.returncode == 0) == ok, (cuda, torch_cuda, done.stderr)
    assert "does not match CUDA_VERSION=12.8.1 (use cu128)" in done.stderr


def test_make_uses_an_environment_given_by_absolute_path(tmp_path) -> None:
    """In the image ACCELBENCH_ENV=/opt/venv: `make lock` and `make wheelhouse` run its tools
    (they once ran /workspace//opt/venv/bin/uv and tried to create a venv there)."""
    env_bin = tmp_path / "venv" / "bin"
    env_bin.mkdir(parents=True)
    for tool in ("uv", "python"):
        (env_bin / tool).write_text("#!/bin/sh\n")
        (env_bin / tool).chmod(0o755)
    environ = {"PATH": "/usr/bin:/bin", "ACCELBENCH_ENV": str(env_bin.parent)}
    for goal, expected in (
        (["lock"], f'"{env_bin}/uv" lock'),
        (["wheelhouse", "PY=3.12", "HOST_PACKAGES=x"], f'"{env_bin}/python" tools/wheelhouse.py'),
    ):
        plan = subprocess.run(
            ["make", "-n", *goal], cwd=REPO, env=environ, capture_output=True, text=True, check=True
        ).stdout
        assert expected in plan and "-m venv" not in plan and "//" not in plan, plan


def test_pipeline_script_refuses_to_run_on_doctor_problems() -> None:
    script = (REPO / "docker" / "run-pipeline.sh").read_text()
    assert "accelbench doctor" in script and "dvc repro" in script
    assert script.index("accelbench doctor") < script.index("dvc repro")
