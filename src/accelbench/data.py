"""MNIST: mirrors, verified atomic downloads, and IDX decoding.

A file is accepted by the SHA-256 of its *decompressed* content, so a re-compressed copy
is fine and a corrupt or truncated one never is. Nothing reaches its final path unless it
verified: downloads go to a temporary file in the same folder and are renamed into place.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from .console import AccelbenchError

MIRROR_ENV = "ACCELBENCH_MNIST_MIRROR"

# SHA-256 of the decompressed IDX files (the canonical MNIST contents).
MNIST_FILES: dict[str, str] = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
SPLITS = {"train": "train", "test": "t10k"}
IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
_CHUNK = 1 << 20


class DownloadError(AccelbenchError, RuntimeError):
    """Every mirror failed for a file; the message names each mirror and why."""


class ChecksumError(ValueError):
    pass


class IdxFormatError(AccelbenchError, ValueError):
    """An IDX file's header or size is not what MNIST's format promises."""


def mirrors_with_override(mirrors: Iterable[str], env: dict[str, str] | None = None) -> list[str]:
    """The mirror list, with $ACCELBENCH_MNIST_MIRROR (if set) tried first."""
    env = os.environ if env is None else env
    ordered = list(mirrors)
    override = env.get(MIRROR_ENV, "").strip()
    if override:
        ordered = [override] + [m for m in ordered if m != override]
    return ordered


def gunzip_sha256(path: Path) -> str:
    """SHA-256 of a gzip file's decompressed content (raises on a truncated/corrupt file)."""
    digest = hashlib.sha256()
    with gzip.open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, expected_sha256: str) -> None:
    try:
        actual = gunzip_sha256(path)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ChecksumError(f"not a complete gzip file ({exc})") from None
    if actual != expected_sha256:
        raise ChecksumError(
            f"SHA-256 of decompressed content is {actual[:12]}…, expected {expected_sha256[:12]}…"
        )


def _session(retries: int) -> requests.Session:
    session = requests.Session()
    retry = Retry(
        total=retries,
        backoff_factor=0.5,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=("GET",),
        raise_on_status=False,
    )
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _local_dir(mirror: str) -> Path | None:
    """A mirror given as a directory path or a file:// URL; None for http(s)."""
    parsed = urlparse(mirror)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # plain path (or a Windows drive)
        return Path(mirror).expanduser()
    raise ValueError(
        f"unsupported mirror scheme {parsed.scheme!r} (use http(s)://, file:// or a path)"
    )


def _fetch(mirror: str, name: str, dest: Path, session: requests.Session, timeout_s: float) -> None:
    """Copy `name` from `mirror` into the open temporary file `dest`."""
    local = _local_dir(mirror)
    if local is not None:
        source = local / name
        if not source.is_file():
            raise FileNotFoundError(f"{source} does not exist")
        shutil.copyfile(source, dest)
        return
    url = mirror.rstrip("/") + "/" + name
    with session.get(url, stream=True, timeout=timeout_s) as response:
        response.raise_for_status()
        expected = response.headers.get("Content-Length")
        written = 0
        with open(dest, "wb") as out:
            for chunk in response.iter_content(_CHUNK):
                out.write(chunk)
                written += len(chunk)
        if expected is not None and written != int(expected):
            raise OSError(f"truncated: got {written} of {expected} bytes")


def download_file(
    stem: str,
    expected_sha256: str,
    out_dir: Path,
    mirrors: list[str],
    *,
    timeout_s: float = 30.0,
    retries: int = 2,
) -> Path:
    """Fetch `<stem>.gz` from the first mirror that yields a verified copy."""
    name = f"{stem}.gz"
    final = out_dir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    session = _session(retries)
    for mirror in mirrors:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _fetch(mirror, name, tmp, session, timeout_s)
            verify(tmp, expected_sha256)
            os.replace(tmp, final)
            return final
        except (requests.RequestException, OSError, ValueError) as exc:
            failures.append(f"  - {mirror}: {type(exc).__name__}: {exc}")
        finally:
            tmp.unlink(missing_ok=True)
    raise DownloadError(
        f"could not get a verified copy of {name} from any mirror:\n"
        + "\n".join(failures)
        + f"\nTo use a local copy, set {MIRROR_ENV}=/path/to/folder/with/the/.gz/files "
        "(a directory, file:// or http(s) URL), or edit data.mirrors in params.yaml."
    )


def download_mnist(
    out_dir: Path, mirrors: list[str], *, timeout_s: float = 30.0, retries: int = 2
) -> list[Path]:
    return [
        download_file(stem, sha, out_dir, mirrors, timeout_s=timeout_s, retries=retries)
        for stem, sha in MNIST_FILES.items()
    ]


# --- IDX decoding -----------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 [n, 28, 28]
    labels: np.ndarray  # uint8 [n]


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


def read_split(raw_dir: Path, prefix: str) -> Split:
    images_path = raw_dir / f"{prefix}-images-idx3-ubyte.gz"
    labels_path = raw_dir / f"{prefix}-labels-idx1-ubyte.gz"
    images = parse_idx(gzip.decompress(images_path.read_bytes()), IMAGES_MAGIC, images_path.name)
    labels = parse_idx(gzip.decompress(labels_path.read_bytes()), LABELS_MAGIC, labels_path.name)
    if len(images) != len(labels):
        raise IdxFormatError(f"{prefix}: {len(images)} images but {len(labels)} labels")
    if labels.max(initial=0) > 9:
        raise IdxFormatError(f"{labels_path.name}: label {labels.max()} outside 0..9")
    return Split(images=images, labels=labels)


def prepare(raw_dir: Path, out_dir: Path) -> dict[str, int]:
    """Decode the four IDX files into .npy arrays (and plain IDX files for torchvision).

    Returns the number of samples per split.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tv_raw = out_dir / "MNIST" / "raw"  # the layout torchvision.datasets.MNIST reads
    tv_raw.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, prefix in SPLITS.items():
        data = read_split(raw_dir, prefix)
        np.save(out_dir / f"{split}_images.npy", data.images)
        np.save(out_dir / f"{split}_labels.npy", data.labels)
        for kind in ("images-idx3", "labels-idx1"):
            stem = f"{prefix}-{kind}-ubyte"
            (tv_raw / stem).write_bytes(gzip.decompress((raw_dir / f"{stem}.gz").read_bytes()))
        counts[split] = len(data.labels)
    return counts


def dataset_digest(split: str, limit: int = 0) -> str:
    """A short, stable id of a split: the verified file checksums plus the subset size."""
    prefix = SPLITS[split]
    text = "".join(sha for stem, sha in MNIST_FILES.items() if stem.startswith(prefix))
    return hashlib.sha256(f"{text}:{limit}".encode()).hexdigest()[:16]


def load_split(prepared_dir: Path, split: str, limit: int = 0) -> Split:
    """Load a prepared split (memory-mapped .npy: milliseconds); `limit` > 0 keeps the first n."""
    images = np.load(prepared_dir / f"{split}_images.npy", mmap_mode="r")
    labels = np.load(prepared_dir / f"{split}_labels.npy", mmap_mode="r")
    if limit:
        images, labels = images[:limit], labels[:limit]
    return Split(images=np.array(images), labels=np.array(labels))  # copy out of the memory map
