"""CIFAR-10: the real download, verification and decoding code on a small fake archive in the
official format (no network here reaches the real one)."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest
import torch

from accelbench.core.console import InputError
from accelbench.core.params import LoaderParams
from accelbench.data import cifar10
from accelbench.data.batches import normalize_images
from accelbench.data.datasets import DATASETS
from accelbench.data.download import DownloadError
from accelbench.data.prepared import dataset_digest, load_split, prepared_dataset
from accelbench.stages import download, prepare
from accelbench.training import build
from accelbench.training.models import LeNet
from helpers import cifar10_batch, small_params, write_fake_cifar10


def _inputs(md5: str, mirrors: list[str]):
    raw = small_params().data.model_dump() | {"dataset": "cifar10", "cifar10_md5": md5}
    return type(small_params().data).model_validate(raw | {"cifar10_mirrors": mirrors})


def test_the_official_md5_is_torchvisions() -> None:
    from torchvision.datasets import CIFAR10

    assert cifar10.ARCHIVE_MD5 == CIFAR10.tgz_md5 == small_params().data.cifar10_md5
    assert CIFAR10.filename == cifar10.ARCHIVE and CIFAR10.base_folder == cifar10.FOLDER


def test_download_takes_the_env_mirror_first_and_verifies_the_md5(tmp_path, monkeypatch) -> None:
    md5 = write_fake_cifar10(tmp_path / "mirror")
    monkeypatch.setenv(cifar10.MIRROR_ENV, str(tmp_path / "mirror"))
    paths = download.run(_inputs(md5, ["https://unreachable.invalid/"]), tmp_path / "raw")
    assert [p.name for p in paths] == ["cifar-10-python.tar.gz"]
    assert cifar10.md5_file(paths[0]) == md5


def test_download_refuses_an_archive_with_another_md5(tmp_path, monkeypatch) -> None:
    write_fake_cifar10(tmp_path / "mirror")
    monkeypatch.delenv(cifar10.MIRROR_ENV, raising=False)
    mirror = (tmp_path / "mirror").as_uri()
    with pytest.raises(
        DownloadError,
        match=r"ACCELBENCH_CIFAR10_MIRROR.*data.cifar10_mirrors.*MD5 of the archive is",
    ):
        download.run(_inputs(cifar10.ARCHIVE_MD5, [mirror]), tmp_path / "raw")
    assert not list((tmp_path / "raw").iterdir())  # nothing unverified left behind


@pytest.fixture
def cifar_prepared(tmp_path):
    md5 = write_fake_cifar10(tmp_path / "raw")
    out = tmp_path / "prepared"
    prepare.run(tmp_path / "raw", out, prepare.PrepareInputs(DATASETS["cifar10"], md5))
    return out


def test_prepare_decodes_the_batches_into_channel_first_arrays(cifar_prepared) -> None:
    train, test = load_split(cifar_prepared, "train"), load_split(cifar_prepared, "test")
    assert train.images.shape == (5 * 64, 3, 32, 32) and test.images.shape == (128, 3, 32, 32)
    assert train.images.dtype == np.uint8 and set(np.unique(test.labels)) <= set(range(10))
    # the archive's planes are R, G, B: the fake's green is half its red, blue the inverse
    assert np.array_equal(test.images[:, 1], test.images[:, 0] // 2)
    assert json.loads((cifar_prepared / "manifest.json").read_text())["dataset"] == "cifar10"
    assert prepared_dataset(cifar_prepared).input_shape == (3, 32, 32)
    normalized = normalize_images(test.images[:2], DATASETS["cifar10"], torch.device("cpu"))
    assert normalized.shape == (2, 3, 32, 32) and normalized.min() >= -1 and normalized.max() <= 1


def test_a_cifar10_split_is_identified_by_its_prepared_arrays(cifar_prepared) -> None:
    manifest = json.loads((cifar_prepared / "manifest.json").read_text())["sha256"]
    text = manifest["test_images.npy"] + manifest["test_labels.npy"]
    expected = hashlib.sha256(f"{text}:0".encode()).hexdigest()[:16]
    assert dataset_digest(cifar_prepared, "test") == expected
    assert dataset_digest(cifar_prepared, "train") != expected


def test_prepare_checks_the_archive_again(tmp_path) -> None:
    write_fake_cifar10(tmp_path / "raw")
    with pytest.raises(InputError, match="not the CIFAR-10 archive"):
        prepare.run(
            tmp_path / "raw", tmp_path / "out", prepare.PrepareInputs(DATASETS["cifar10"], "0" * 32)
        )


def test_a_batch_that_would_run_code_is_refused(tmp_path, capsys) -> None:
    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = pickle.dumps({b"data": Exploit(), b"labels": []}, protocol=2)
    md5 = write_fake_cifar10(tmp_path / "raw", members={"test_batch": evil})
    refused = r"test_batch: not a CIFAR-10 batch \(refused to load __builtin__.print \(not data"
    with pytest.raises(InputError, match=refused):
        cifar10.read_archive(tmp_path / "raw" / cifar10.ARCHIVE, md5)
    assert "pwned" not in capsys.readouterr().out


def test_a_batch_with_wrong_shapes_or_labels_is_refused(tmp_path) -> None:
    images = np.zeros((4, 3, 32, 32), np.uint8)
    bad_label = cifar10_batch(images, np.array([0, 1, 2, 10]), "test")
    md5 = write_fake_cifar10(tmp_path / "raw", members={"test_batch": bad_label})
    with pytest.raises(InputError, match=r"a label outside 0\.\.9"):
        cifar10.read_archive(tmp_path / "raw" / cifar10.ARCHIVE, md5)


def test_the_dataset_decides_the_model_and_its_flops(cifar_prepared) -> None:
    train = small_params().train
    cifar = DATASETS["cifar10"]
    model = build.fresh_model(cifar, train, small_params().variant("cpu"), torch.device("cpu"))
    assert isinstance(model, LeNet)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    flops = build.flops_per_sample(cifar, model)
    # forward, 2 FLOPs a multiply-add: conv1, conv2, then the three Linear layers
    forward = 2 * (28 * 28 * 6 * 3 * 25 + 10 * 10 * 16 * 6 * 25 + 400 * 120 + 120 * 84 + 84 * 10)
    assert 2 * forward < flops < 3 * forward  # backward: no input gradient for conv1


def test_the_tutorials_dataloader_reads_the_prepared_cifar10(cifar_prepared) -> None:
    train = small_params(batch_size=32).train
    variant = (
        small_params()
        .variant("cpu")
        .model_copy(update={"batches": "dataloader", "loader": LoaderParams(num_workers=0)})
    )
    cifar, cpu = DATASETS["cifar10"], torch.device("cpu")
    batches = build.train_batches(cifar, train, variant, cifar_prepared, cpu)
    images, labels = next(iter(batches.epoch(0)))
    resident = normalize_images(load_split(cifar_prepared, "train").images, cifar, cpu)
    assert images.shape == (32, 3, 32, 32) and labels.shape == (32,)
    # the same normalization as the resident batches: each loader image is one of them
    assert any(torch.allclose(images[0], r, atol=1e-6) for r in resident)
