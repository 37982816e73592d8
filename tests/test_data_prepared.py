"""prepared.py: the prepared folder built all at once, its manifest naming the dataset, and
the stages that read it kept apart from the download code."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelbench.core.console import InputError
from accelbench.data import mnist
from accelbench.data import prepared as prepared_data
from accelbench.data.datasets import DATASETS
from accelbench.stages import download, prepare
from test_dvc_yaml import code_of

DOWNLOAD_CODE = (
    "src/accelbench/data/download.py",
    "src/accelbench/data/mnist.py",
    "src/accelbench/data/cifar10.py",
)


def _prepare_mnist(raw: Path, out: Path, checksums: dict[str, str]) -> dict:
    return prepared_data.prepare(
        out, DATASETS["mnist"], lambda folder: mnist.prepare_into(raw, folder, checksums)
    )


@pytest.mark.parametrize("stage", ["train", "evaluate", "quantize"])
def test_the_stages_after_prepare_run_no_download_code(stage) -> None:
    """An edit to the download or decoding code re-runs download and prepare, never these."""
    code = code_of(stage)
    assert "src/accelbench/data/prepared.py" in code  # not vacuous: they read through it
    assert not code & set(DOWNLOAD_CODE), sorted(code & set(DOWNLOAD_CODE))


def test_reading_prepared_data_imports_no_http_client() -> None:
    probe = "import sys, accelbench.data.prepared; print('requests' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_every_dataset_has_a_download_and_a_decoder() -> None:
    assert set(download.DOWNLOADS) == set(DATASETS) == set(prepare.DECODERS)


def test_prepare_replaces_the_folder_all_at_once(fake_mnist, tmp_path) -> None:
    mirror, checksums = fake_mnist
    out = tmp_path / "p"
    _prepare_mnist(mirror, out, checksums)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    crash = tmp_path / ".p.prepare-abcd1234"  # a killed prepare's half-built folder
    crash.mkdir()
    (mirror / "t10k-labels-idx1-ubyte.gz").write_bytes(b"broken")
    with pytest.raises(InputError):
        _prepare_mnist(mirror, out, checksums)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # all old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".p")) == []


def test_the_manifest_names_the_dataset_it_was_given(tmp_path) -> None:
    def write(folder: Path) -> dict[str, int]:
        (folder / "notes.txt").write_text("the decoder's")
        return {"train": 0, "test": 0}

    counts = prepared_data.prepare(tmp_path / "p", DATASETS["cifar10"], write)
    manifest = json.loads((tmp_path / "p" / prepared_data.MANIFEST).read_text())
    assert counts == {"train": 0, "test": 0}
    assert manifest["dataset"] == "cifar10"
    assert manifest["sha256"] == {"notes.txt": hashlib.sha256(b"the decoder's").hexdigest()}


def test_prepared_data_is_checked_once_per_process(prepared, monkeypatch) -> None:
    calls = []
    original = prepared_data._sha256_file
    monkeypatch.setattr(prepared_data, "_verified", set())
    monkeypatch.setattr(prepared_data, "_sha256_file", lambda p: calls.append(p) or original(p))
    prepared_data.load_split(prepared, "train")
    prepared_data.load_split(prepared, "test")
    manifest = json.loads((prepared / prepared_data.MANIFEST).read_text())["sha256"]
    assert len(calls) == len(manifest)


def _rewrite_manifest(folder: Path, **changes) -> None:
    path = folder / prepared_data.MANIFEST
    manifest = json.loads(path.read_text()) | changes
    path.write_text(json.dumps({k: v for k, v in manifest.items() if v is not None}))


def test_a_manifest_that_names_no_dataset_is_refused(prepared, monkeypatch) -> None:
    """Never a silent default: an older prepare's folder is prepared again."""
    monkeypatch.setattr(prepared_data, "_verified", set())
    _rewrite_manifest(prepared, dataset=None)
    with pytest.raises(InputError, match=r"names no dataset .*run `accelbench prepare` again"):
        prepared_data.load_split(prepared, "train")
    _rewrite_manifest(prepared, dataset="imagenet")
    with pytest.raises(InputError, match=r"unknown dataset 'imagenet' \(known: mnist, cifar10\)"):
        prepared_data.prepared_dataset(prepared)


def test_the_mnist_digest_is_the_official_files_checksums(prepared, fake_mnist) -> None:
    """MNIST's split id is the SHA-256 of its IDX files (the official checksums, on the real
    files), so runs on different machines share it; the subset size is part of it."""
    _, checksums = fake_mnist

    def expected(prefix: str, limit: int) -> str:
        text = checksums[f"{prefix}-images-idx3-ubyte"] + checksums[f"{prefix}-labels-idx1-ubyte"]
        return hashlib.sha256(f"{text}:{limit}".encode()).hexdigest()[:16]

    assert prepared_data.dataset_digest(prepared, "train") == expected("train", 0)
    assert prepared_data.dataset_digest(prepared, "test", 100) == expected("t10k", 100)
    assert prepared_data.dataset_digest(prepared, "test") != expected("t10k", 100)
