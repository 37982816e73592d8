"""Fixtures: small fake MNIST files made by the tests, and a private MLflow store; the test
tiers (gpu, browser and service tests are slow). Helpers the tests share are in helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accelbench.data import mnist
from accelbench.data.datasets import DATASETS
from accelbench.data.prepared import prepare
from helpers import REPO, write_fake_mnist

__all__ = ["REPO"]  # tests/test_containers.py imports it from here


FULL_TIER_ONLY = ("gpu", "browser", "services")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """GPU, browser and service tests belong to the full tier (`make test-full`) whatever
    their own time: they are `slow` too, so the fast tier (`pytest -m "not slow"`) leaves
    them out on any machine, one that has a GPU, Chromium or PostgreSQL included."""
    for item in items:
        if any(item.get_closest_marker(name) for name in FULL_TIER_ONLY):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def fake_mnist(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "mirror"
    return folder, write_fake_mnist(folder)


@pytest.fixture
def prepared(tmp_path: Path, fake_mnist) -> Path:
    mirror, checksums = fake_mnist
    out = tmp_path / "prepared"
    prepare(out, DATASETS["mnist"], lambda folder: mnist.prepare_into(mirror, folder, checksums))
    return out


@pytest.fixture
def tiny_prepared(tmp_path: Path) -> Path:
    """`prepared` at a sixteenth of its size (32 training, 16 test images): for tests whose
    contract needs a few steps, not a model that learns (CPU fp16 runs ~10x slower than fp32)."""
    mirror = tmp_path / "tiny-mirror"
    checksums = write_fake_mnist(mirror, n_train=32, n_test=16)
    out = tmp_path / "tiny-prepared"
    prepare(out, DATASETS["mnist"], lambda folder: mnist.prepare_into(mirror, folder, checksums))
    return out


@pytest.fixture(autouse=True)
def _host_slots_are_the_sessions(tmp_path_factory, monkeypatch):
    """Trainings in tests take GPUs and the CPU from this session's own slots, so they never
    wait behind a real training on the same host (nor hold one up)."""
    monkeypatch.setenv("ACCELBENCH_SLOTS_DIR", str(tmp_path_factory.getbasetemp() / "slots"))


@pytest.fixture(autouse=True)
def _tracking_outage_is_per_test(monkeypatch):
    """A simulated tracking outage in one test must not switch tracking off for the next."""
    from accelbench.system.tracking import outage

    monkeypatch.setattr(outage, "_outage", None)


@pytest.fixture(autouse=True)
def _mlflow_store_is_per_test(monkeypatch):
    """MLflow keeps the last store set in a global and in os.environ: a client made before a
    test's first run went to the store of whichever test ran before it on that worker. Each test
    starts with no store set (nor the shell's: never a user's team server), and leaves none."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _forget_mlflow_store()
    yield
    _forget_mlflow_store()


def _forget_mlflow_store() -> None:
    mlflow = sys.modules.get("mlflow")  # not imported by this test: nothing to forget
    if mlflow is not None:
        mlflow.set_tracking_uri(None)


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    # Short test runs must still get system-metric samples before they end.
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    return uri
