"""CIFAR-10: the official python archive, downloaded and verified, and its pickled batches
decoded safely into arrays.

The archive (`cifar-10-python.tar.gz`, 163 MB) is accepted by the MD5 the dataset's page and
torchvision publish for it: of the bytes as served, so a re-compressed copy is refused (unlike
MNIST's files). Its batches are Python pickles, read with an unpickler that can build only
dicts, lists, strings, bytes and NumPy arrays, so an archive someone else made (with
`data.cifar10_md5` changed) can hold wrong data but never run code.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from accelbench.core.console import InputError
from accelbench.data.datasets import Split, save_splits
from accelbench.data.download import ChecksumError, download_files

ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"  # inside the archive; torchvision's CIFAR10 reads this folder
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"  # torchvision.datasets.CIFAR10.tgz_md5
MIRROR_ENV = "ACCELBENCH_CIFAR10_MIRROR"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
CLASSES = 10


def md5_file(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


def check_archive(path: Path, expected_md5: str) -> None:
    """The archive's MD5 is `expected_md5` (raises ChecksumError)."""
    if (actual := md5_file(path)) != expected_md5:
        raise ChecksumError(f"MD5 of the archive is {actual[:12]}…, expected {expected_md5[:12]}…")


def download(out_dir: Path, mirrors: list[str], md5: str, **limits: float) -> list[Path]:
    """The archive with MD5 `md5` in `out_dir` (`limits`: `download_file`'s timeout_s,
    retries and deadline_s); a file of the same name that does not verify is refused first."""
    checks = {ARCHIVE: functools.partial(check_archive, expected_md5=md5)}
    options = {"variable": MIRROR_ENV, "setting": "data.cifar10_mirrors", **limits}
    return download_files(out_dir, checks, mirrors, "the verified {}", **options)


# What a CIFAR-10 batch pickle may build: NumPy arrays (their reconstructor, type and dtype;
# `numpy.core` was renamed `numpy._core` in NumPy 2) and bytes (Python 3's protocol-2 form).
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refused to load {module}.{name} (not data)")
        return super().find_class(module, name)


def _batch(content: bytes, source: str) -> Split:
    """One pickled batch: {data: uint8 [n, 3072] (R, G, B planes of 32x32), labels: [n]}."""
    what = f"{source}: not a CIFAR-10 batch"
    try:
        batch = _DataOnly(io.BytesIO(content), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{what} ({exc}); run `accelbench download` again") from None
    if not isinstance(batch, dict):
        raise InputError(f"{what} (a {type(batch).__name__}, expected a dict)")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    images, labels = batch.get("data"), batch.get("labels")
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 2:
        raise InputError(f"{what} (its data is not a uint8 [n, 3072] array)")
    if images.shape[1] != 3 * 32 * 32 or not isinstance(labels, list):
        raise InputError(f"{what} (data {images.shape}, expected [n, 3072], and a label list)")
    labels_array = np.asarray(labels, dtype=np.int64)
    if len(labels_array) != len(images):
        raise InputError(f"{source}: {len(images)} images but {len(labels_array)} labels")
    if len(labels_array) and (labels_array.min() < 0 or labels_array.max() >= CLASSES):
        raise InputError(f"{source}: a label outside 0..{CLASSES - 1}")
    return Split(images.reshape(-1, 3, 32, 32), labels_array.astype(np.uint8))


def read_archive(path: Path, expected_md5: str | None) -> tuple[dict[str, Split], dict[str, bytes]]:
    """The train and test splits, and the archive's batch files (name -> content)."""
    again = "run `accelbench download` (or `dvc repro download`) again"
    if not path.is_file():
        raise InputError(f"{path}: missing; {again}")
    if expected_md5 is not None:
        try:
            check_archive(path, expected_md5)
        except ChecksumError as exc:
            raise InputError(f"{path}: not the CIFAR-10 archive ({exc}); {again}") from None
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            present = set(archive.getnames())
            for name in (*TRAIN_BATCHES, TEST_BATCH, META):
                member = f"{FOLDER}/{name}"
                stream = archive.extractfile(member) if member in present else None
                if stream is None:  # absent, or not a file
                    raise InputError(f"{path}: no {member} in the archive; {again}")
                members[name] = stream.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: not a readable tar.gz ({exc}); {again}") from None
    train = [_batch(members[name], f"{ARCHIVE}:{name}") for name in TRAIN_BATCHES]
    splits = {
        "train": Split(
            np.concatenate([s.images for s in train]), np.concatenate([s.labels for s in train])
        ),
        "test": _batch(members[TEST_BATCH], f"{ARCHIVE}:{TEST_BATCH}"),
    }
    return splits, members


def prepare_into(raw_dir: Path, out_dir: Path, expected_md5: str | None) -> dict[str, int]:
    """The splits as .npy arrays ([n, 3, 32, 32] uint8), and the batch files in torchvision's
    layout (`cifar-10-batches-py/`) for the DataLoader variant."""
    splits, members = read_archive(raw_dir / ARCHIVE, expected_md5)
    (out_dir / FOLDER).mkdir(parents=True, exist_ok=True)
    for name, content in members.items():
        (out_dir / FOLDER / name).write_bytes(content)
    return save_splits(out_dir, splits)
