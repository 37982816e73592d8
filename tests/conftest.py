"""Shared fixtures: small fake MNIST files made by the tests, and a private MLflow store."""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from accelbench import data

REPO = Path(__file__).resolve().parents[1]


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable 28x28 images: class c is a bright bar at a class-specific place, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        row = 3 + 2 * int(c)
        images[i, row : row + 2, 4:24] = 255
    return images, labels


def write_fake_mnist(folder: Path, n_train: int = 512, n_test: int = 256) -> dict[str, str]:
    """Four gzipped IDX files; returns {stem: sha256 of the decompressed content}."""
    folder.mkdir(parents=True, exist_ok=True)
    checksums = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images, labels = synthetic_digits(n, seed)
        for stem, payload in (
            (f"{prefix}-images-idx3-ubyte", idx_bytes(images, data.IMAGES_MAGIC)),
            (f"{prefix}-labels-idx1-ubyte", idx_bytes(labels, data.LABELS_MAGIC)),
        ):
            (folder / f"{stem}.gz").write_bytes(gzip.compress(payload, mtime=0))
            checksums[stem] = hashlib.sha256(payload).hexdigest()
    return checksums


@pytest.fixture
def fake_mnist(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "mirror"
    return folder, write_fake_mnist(folder)


@pytest.fixture
def prepared(tmp_path: Path, fake_mnist) -> Path:
    mirror, _ = fake_mnist
    out = tmp_path / "prepared"
    data.prepare(mirror, out)
    return out


@pytest.fixture(autouse=True)
def _tracking_outage_is_per_test():
    """A simulated tracking outage in one test must not switch tracking off for the next."""
    from accelbench import tracking

    tracking._outage = None
    yield
    tracking._outage = None


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    # Short test runs must still get system-metric samples before they end.
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    return uri


def write_params(folder: Path, variants: dict | None = None, **train) -> Path:
    """The repository's params.yaml with some `train` values (and the variants) replaced."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"].update(train)
    if variants is not None:
        raw["variants"] = variants
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train_command(
    params: Path,
    name: str,
    prepared: Path,
    model: Path,
    metrics: Path,
    checkpoint: Path | None = None,
) -> list[str]:
    """`accelbench train` as dvc.yaml runs it, in this interpreter."""
    command = [
        sys.executable,
        "-m",
        "accelbench.cli",
        "--params",
        str(params),
        "train",
        name,
        "--data",
        str(prepared),
        "--model",
        str(model),
        "--metrics",
        str(metrics),
        "--quiet",
    ]
    return command + (["--checkpoint", str(checkpoint)] if checkpoint else [])


def shared_mnist() -> Path | None:
    """The verified MNIST mirror: $ACCELBENCH_MNIST_MIRROR, else ../shared/datasets/mnist."""
    candidate = os.environ.get(data.MIRROR_ENV) or str(
        REPO.parent / "shared" / "datasets" / "mnist"
    )
    path = Path(candidate)
    return path if (path / "train-images-idx3-ubyte.gz").is_file() else None
