"""MNIST: its four gzipped IDX files, downloaded and verified, and decoded into arrays.

A file is accepted by the SHA-256 of its *decompressed* content, so a re-compressed copy is
fine and a corrupt or truncated one never is. `prepare_into` checks the checksums again (a
valid gzip of something else is not MNIST), decodes the files with a strict IDX parser, and
writes the arrays and the decompressed files in the layout torchvision's MNIST reads.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from accelbench.core.console import InputError
from accelbench.data.datasets import Split, save_splits
from accelbench.data.download import ChecksumError, DamagedError, download_files

MIRROR_ENV = "ACCELBENCH_MNIST_MIRROR"

# SHA-256 of the decompressed IDX files (the canonical MNIST contents).
FILES: dict[str, str] = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
SPLITS = {"train": "train", "test": "t10k"}  # split -> the prefix of its files
IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049


class IdxFormatError(InputError):
    """An IDX file's header or size is not what MNIST's format promises."""


def check_gz(path: Path, expected_sha256: str) -> None:
    """`path` is a complete gzip whose content has SHA-256 `expected_sha256` (or ChecksumError)."""
    try:
        with gzip.open(path, "rb") as stream:
            actual = hashlib.file_digest(stream, "sha256").hexdigest()
    except (OSError, EOFError, zlib.error) as exc:
        damaged = isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile)  # a gzip, cut short
        if damaged and not str(exc).startswith("Not a gzipped file"):  # or corrupted
            raise DamagedError(f"its gzip stream breaks: {exc}") from None
        raise ChecksumError(f"not a complete gzip file ({exc})") from None
    if actual != expected_sha256:
        raise ChecksumError(
            f"SHA-256 of decompressed content is {actual[:12]}…, expected {expected_sha256[:12]}…"
        )


def download(out_dir: Path, mirrors: list[str], **limits: float) -> list[Path]:
    """The four verified `.gz` files in `out_dir` (`limits`: `download_file`'s timeout_s,
    retries and deadline_s); a file of the same name that is not MNIST's is refused first."""
    checks = {
        f"{stem}.gz": functools.partial(check_gz, expected_sha256=sha)
        for stem, sha in FILES.items()
    }
    return download_files(out_dir, checks, mirrors, "MNIST's {}", variable=MIRROR_ENV, **limits)


# --- IDX decoding -----------------------------------------------------------------------


def parse_idx(buffer: bytes, expected_magic: int, source: str = "<bytes>") -> np.ndarray:
    """Decode an unsigned-byte IDX file (MNIST's format) into an array, checking its header."""
    if len(buffer) < 8:
        raise IdxFormatError(f"{source}: {len(buffer)} bytes is too short for an IDX header")
    magic = int.from_bytes(buffer[0:4], "big")
    if magic != expected_magic:
        raise IdxFormatError(
            f"{source}: magic number {magic}, expected {expected_magic} "
            f"({'images' if expected_magic == IMAGES_MAGIC else 'labels'})"
        )
    ndim = buffer[3]
    header_size = 4 + 4 * ndim
    if len(buffer) < header_size:
        raise IdxFormatError(f"{source}: truncated header ({len(buffer)} of {header_size} bytes)")
    dims = [int.from_bytes(buffer[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected_size = header_size + int(np.prod(dims, dtype=np.int64))
    if len(buffer) != expected_size:
        raise IdxFormatError(
            f"{source}: {len(buffer)} bytes, but the header's dimensions {dims} need {expected_size}"
        )
    if expected_magic == IMAGES_MAGIC and dims[1:] != [28, 28]:
        raise IdxFormatError(f"{source}: images are {dims[1:]}, expected 28x28")
    return np.frombuffer(buffer, dtype=np.uint8, offset=header_size).reshape(dims)


def _decompressed(path: Path, expected_sha256: str | None) -> bytes:
    """A raw .gz file's content, checked against its SHA-256 (None: unchecked)."""
    what = "run `accelbench download` (or `dvc repro download`) again"
    try:
        content = gzip.decompress(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: missing; {what}") from None
    except (OSError, EOFError, zlib.error) as exc:  # zlib's: a deflate stream that breaks
        raise InputError(f"{path}: not a complete gzip file ({exc}); {what}") from None
    actual = hashlib.sha256(content).hexdigest() if expected_sha256 is not None else None
    if actual != expected_sha256:
        raise InputError(
            f"{path}: not MNIST's content (SHA-256 {actual[:12]}…, expected "
            f"{expected_sha256[:12]}…); {what}"
        )
    return content


def read_split(
    raw_dir: Path, prefix: str, checksums: Mapping[str, str] | None
) -> tuple[Split, dict[str, bytes]]:
    """A split's images and labels, and the decompressed IDX files they came from, each
    checked against `checksums` (None: unchecked)."""
    names = images_name, labels_name = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
    raw = {n: _decompressed(raw_dir / f"{n}.gz", (checksums or {}).get(n)) for n in names}
    images = parse_idx(raw[images_name], IMAGES_MAGIC, f"{images_name}.gz")
    labels = parse_idx(raw[labels_name], LABELS_MAGIC, f"{labels_name}.gz")
    if len(images) != len(labels):
        raise IdxFormatError(f"{prefix}: {len(images)} images but {len(labels)} labels")
    if labels.max(initial=0) > 9:
        raise IdxFormatError(f"{labels_name}.gz: label {labels.max()} outside 0..9")
    return Split(images=images, labels=labels), raw


def prepare_into(
    raw_dir: Path, out_dir: Path, checksums: Mapping[str, str] | None = FILES
) -> dict[str, int]:
    """The splits as .npy arrays ([n, 28, 28] uint8), and the decompressed IDX files in
    `MNIST/raw/` (torchvision's layout), checked against `checksums` first (None: unchecked).
    Returns the samples per split."""
    tv_raw = out_dir / "MNIST" / "raw"
    tv_raw.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, prefix in SPLITS.items():
        splits[split], raw = read_split(raw_dir, prefix, checksums)
        for stem, content in raw.items():
            (tv_raw / stem).write_bytes(content)
    return save_splits(out_dir, splits)
