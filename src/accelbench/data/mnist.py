"""The datasets: mirrors, verified atomic downloads, MNIST's IDX decoding, prepared arrays.

MNIST is the default; CIFAR-10's archive format is in `cifar10.py`, its downloads and
prepared folder follow the same rules. The prepared folder's manifest names its dataset, so
the stages after `prepare` build the dataset's model from the data they are given.

A file is accepted by the SHA-256 of its *decompressed* content, so a re-compressed copy
is fine and a corrupt or truncated one never is. Nothing reaches its final path unless it
verified: downloads go to a temporary file in the same folder and are renamed into place
(with the mode the umask gives); a `.part` left by a killed download is removed on the next
start. Each file from each mirror has an overall deadline besides the per-read timeout.

`prepare` checks the raw files' checksums again (a valid gzip of something else is not
MNIST) and writes `manifest.json`, the SHA-256 of every prepared file; `load_split` checks
it once per process, so a stage run directly refuses tampered arrays, and refuses labels
outside 0..9 and arrays of the wrong shape, naming the file.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from accelbench.core.console import AccelbenchError, InputError, log
from accelbench.data.datasets import DATASETS, Dataset, Split

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
MANIFEST = "manifest.json"
_GZIP_MAGIC = b"\x1f\x8b"


class DownloadError(AccelbenchError, RuntimeError):
    """Every mirror failed for a file; the message names each mirror and why."""


class ChecksumError(ValueError):
    pass


class IdxFormatError(InputError):
    """An IDX file's header or size is not what MNIST's format promises."""


def mirrors_with_override(
    mirrors: Iterable[str], env: dict[str, str] | None = None, variable: str = MIRROR_ENV
) -> list[str]:
    """The mirror list, with $ACCELBENCH_MNIST_MIRROR (or `variable`, if set) tried first."""
    env = os.environ if env is None else env
    ordered = list(mirrors)
    override = env.get(variable, "").strip()
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


def _fetch(
    mirror: str,
    name: str,
    dest: Path,
    session: requests.Session,
    timeout_s: float,
    deadline_s: float = 600.0,
) -> None:
    """Copy `name` from `mirror` into the temporary file `dest`, within `deadline_s` (a
    server that trickles bytes resets the per-read timeout, never the deadline)."""
    local = _local_dir(mirror)
    if local is not None:
        source = local / name
        if not source.is_file():
            raise FileNotFoundError(f"{source} does not exist")
        shutil.copyfile(source, dest)
        return
    url = mirror.rstrip("/") + "/" + name
    started = time.monotonic()
    with session.get(url, stream=True, timeout=timeout_s) as response:
        response.raise_for_status()
        expected = response.headers.get("Content-Length")
        written = 0
        with open(dest, "wb") as out:
            # The bytes as sent (Content-Length counts them): a .gz served with
            # `Content-Encoding: gzip` is the .gz itself; read1 returns what has arrived.
            while chunk := response.raw.read1(_CHUNK, decode_content=False):
                out.write(chunk)
                written += len(chunk)
                if time.monotonic() - started > deadline_s:
                    raise TimeoutError(
                        f"not complete after the {deadline_s:g} s deadline ({written} bytes; "
                        "data.deadline_s)"
                    )
        if expected is not None and written != int(expected):
            raise OSError(f"truncated: got {written} of {expected} bytes")
        if "gzip" in response.headers.get("Content-Encoding", "").lower():
            _unwrap_transfer_gzip(dest)


def _unwrap_transfer_gzip(path: Path) -> None:
    """A server that gzips the .gz again on the way: keep the .gz inside."""
    with gzip.open(path, "rb") as stream:
        try:
            nested = stream.read(2) == _GZIP_MAGIC
        except (OSError, EOFError):
            return  # verify() says what is wrong with it
    if nested:
        unwrapped = path.with_name(path.name + ".inner")
        unwrapped.unlink(missing_ok=True)  # a leftover (or a link): never written through
        with gzip.open(path, "rb") as stream, open(unwrapped, "wb") as out:
            shutil.copyfileobj(stream, out, _CHUNK)
        os.replace(unwrapped, path)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _umask_mode() -> int:
    """The mode a new file gets under the process's umask (mkstemp's 0600 is not it)."""
    return 0o666 & ~_umask()


MNIST_GZ = tuple(f"{stem}.gz" for stem in MNIST_FILES)


def remove_leftovers(folder: Path, names: Iterable[str] = MNIST_GZ) -> None:
    """The temporaries a killed earlier download of `names` left in `folder` (its own only:
    `.<name>.<random>.part`, and `.inner` beside it; other files in the folder stay)."""
    if not folder.is_dir():
        return
    for name in names:
        for pattern in (f".{name}.*.part", f".{name}.*.part.inner"):
            for leftover in folder.glob(pattern):
                if leftover.is_file() or leftover.is_symlink():
                    leftover.unlink(missing_ok=True)


def output_folder(folder: Path) -> Path:
    """`--out` as a folder to write into (created if absent); a file there is refused."""
    if folder.exists() and not folder.is_dir():
        raise InputError(
            f"{folder}: exists and is a file, not a folder; accelbench writes its outputs into "
            "a folder: move the file away or pass another path"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def refuse_foreign_download(final: Path, check: Callable[[Path], None], what: str) -> None:
    """A file at a download's final path is replaced only when it is the verified file it
    names (an earlier download's); anything else is the user's and is refused, before any
    download starts."""
    if not os.path.lexists(final) or not final.exists():  # absent, or a dangling link
        return
    if final.is_file():
        try:
            check(final)
            return
        except (ChecksumError, OSError):
            pass
    raise InputError(
        f"{final}: exists and is not {what} (it does not verify); download replaces only its "
        "own files: move it away or pass another --out"
    )


def download_file(
    stem: str,
    expected_sha256: str,
    out_dir: Path,
    mirrors: list[str],
    *,
    timeout_s: float = 30.0,
    retries: int = 2,
    deadline_s: float = 600.0,
    filename: str | None = None,
    check: Callable[[Path], None] | None = None,
    variable: str = MIRROR_ENV,
) -> Path:
    """Fetch `<stem>.gz` (or `filename`) from the first mirror that yields a verified copy
    (`check` raises ChecksumError; default: the decompressed SHA-256); each mirror that
    failed before it is logged."""
    name = filename or f"{stem}.gz"
    check = check or (lambda path: verify(path, expected_sha256))
    final = out_dir / name
    output_folder(out_dir)
    refuse_foreign_download(final, check, f"the verified {name}")
    failures: list[str] = []
    session = _session(retries)
    for mirror in mirrors:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _fetch(mirror, name, tmp, session, timeout_s, deadline_s)
            check(tmp)
            tmp.chmod(_umask_mode())
            os.replace(tmp, final)
            if failures:
                log(f"download: {name} from {mirror}, after {len(failures)} failed mirror(s)")
            return final
        except (
            requests.RequestException,
            urllib3.exceptions.HTTPError,
            OSError,
            ValueError,
        ) as exc:
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            failures.append(f"{mirror}: {reason}")
            log(f"download: {name}: mirror {mirror} failed ({reason[:300]})")
        finally:
            tmp.unlink(missing_ok=True)
    raise DownloadError(
        f"could not get a verified copy of {name} from any mirror ({'; '.join(failures)}). "
        f"To use a local copy, set {variable}=/path/to/the/folder/with/{name} "
        "(a directory, file:// or http(s) URL), or edit data's mirrors in params.yaml."
    )


def download_mnist(
    out_dir: Path,
    mirrors: list[str],
    *,
    timeout_s: float = 30.0,
    retries: int = 2,
    deadline_s: float = 600.0,
) -> list[Path]:
    output_folder(out_dir)
    for stem, sha in MNIST_FILES.items():  # all checked before the first download
        refuse_foreign_download(
            out_dir / f"{stem}.gz", lambda path, sha=sha: verify(path, sha), f"MNIST's {stem}.gz"
        )
    remove_leftovers(out_dir)
    return [
        download_file(
            stem, sha, out_dir, mirrors, timeout_s=timeout_s, retries=retries, deadline_s=deadline_s
        )
        for stem, sha in MNIST_FILES.items()
    ]


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


def _decompressed(path: Path, expected_sha256: str | None = None) -> bytes:
    """A raw .gz file's content, checked against its SHA-256 (None: unchecked)."""
    what = "run `accelbench download` (or `dvc repro download`) again"
    try:
        content = gzip.decompress(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: missing; {what}") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"{path}: not a complete gzip file ({exc}); {what}") from None
    if expected_sha256 is not None:
        actual = hashlib.sha256(content).hexdigest()
        if actual != expected_sha256:
            raise InputError(
                f"{path}: not MNIST's content (SHA-256 {actual[:12]}…, expected "
                f"{expected_sha256[:12]}…); {what}"
            )
    return content


def read_split(
    raw_dir: Path, prefix: str, checksums: Mapping[str, str] | None = None
) -> tuple[Split, dict[str, bytes]]:
    """A split's images and labels, and the decompressed IDX files they came from."""
    checksums = checksums or {}
    raw: dict[str, bytes] = {}
    for kind in ("images-idx3", "labels-idx1"):
        stem = f"{prefix}-{kind}-ubyte"
        raw[stem] = _decompressed(raw_dir / f"{stem}.gz", checksums.get(stem))
    images_name, labels_name = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
    images = parse_idx(raw[images_name], IMAGES_MAGIC, f"{images_name}.gz")
    labels = parse_idx(raw[labels_name], LABELS_MAGIC, f"{labels_name}.gz")
    if len(images) != len(labels):
        raise IdxFormatError(f"{prefix}: {len(images)} images but {len(labels)} labels")
    if labels.max(initial=0) > 9:
        raise IdxFormatError(f"{labels_name}.gz: label {labels.max()} outside 0..9")
    return Split(images=images, labels=labels), raw


def prepare(
    raw_dir: Path,
    out_dir: Path,
    checksums: Mapping[str, str] | None = MNIST_FILES,
    dataset: str = "mnist",
    decode: Callable[[Path, Path], dict[str, int]] | None = None,
) -> dict[str, int]:
    """Decode the raw files into .npy arrays (and torchvision's layout), with a manifest of
    their SHA-256 and the dataset's name. MNIST: the four IDX files, checked against
    `checksums` first; another dataset: `decode(raw_dir, folder)` writes its files (and
    checks its raw files) and returns the samples per split.

    The folder is built beside `out_dir` and renamed into place: all new or all old. An
    existing `out_dir` is replaced only when it is a prepared folder (every file in it is in
    its manifest) or empty; anything else is refused, untouched. Returns the number of
    samples per split.
    """
    refuse_foreign_prepared(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_prepare_leftovers(out_dir)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{_BUILDING}", dir=parent))
    building.chmod(0o777 & ~_umask())  # mkdtemp's 0700 is not what the umask gives
    try:
        if decode is not None:
            counts = decode(raw_dir, building)
        else:
            counts = _prepare_into(raw_dir, building, checksums)
        write_manifest(building, dataset)
        old = parent / f".{out_dir.name}.{_REPLACED}"
        if os.path.lexists(out_dir):
            os.replace(out_dir, old)  # a link is moved itself: its target stays
        os.replace(building, out_dir)
        _remove_tree(old)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return counts


# prepare's temporaries beside its folder: `.<name>.prepare-<random>` (being built) and
# `.<name>.prepare-old` (the folder it replaces); older versions' `.<name>.<8 random>.tmp`
_BUILDING, _REPLACED = "prepare-", "prepare-old"
_OLD_BUILDING = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def _remove_prepare_leftovers(out_dir: Path) -> None:
    """The folders a killed earlier prepare of `out_dir` left (its own names only)."""
    for leftover in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.*"):
        name = leftover.name
        ours = name.startswith(f".{out_dir.name}.{_BUILDING}") or (
            (match := _OLD_BUILDING.fullmatch(name)) is not None and match["name"] == out_dir.name
        )
        if ours:
            _remove_tree(leftover)


def _remove_tree(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def refuse_foreign_prepared(out_dir: Path) -> None:
    """`prepare --out` replaces only a folder it wrote (every file in it is in its manifest)
    or an empty one; anything else there is the user's: refused, never emptied."""
    if not out_dir.exists():  # absent, or a dangling link (only the link is replaced)
        return
    reason = _not_prepared(out_dir)
    if reason is not None:
        raise InputError(
            f"{out_dir}: exists and is not a prepared data folder ({reason}); prepare replaces "
            "only the folder it wrote: pass a new path, or move this one away"
        )


def _not_prepared(folder: Path) -> str | None:
    """Why `folder` is not one `prepare` wrote (None: it is, or it is empty)."""
    if not folder.is_dir():
        return "a file" if folder.is_file() else "not a folder"
    if next(folder.iterdir(), None) is None:
        return None
    try:
        listed = json.loads((folder / MANIFEST).read_text())["sha256"]
        if not isinstance(listed, dict):
            raise TypeError
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is not prepare's"
    files = {MANIFEST, *listed}
    folders = {str(parent) for name in listed for parent in Path(name).parents} - {"."}
    for top, dirs, names in os.walk(folder):  # stops at the first file it did not write
        here = Path(top).relative_to(folder)
        for entry in names + [d for d in dirs if str(here / d) not in folders]:
            if str(here / entry) not in files:
                return f"it holds {here / entry}, which prepare did not write"
    return None


def _prepare_into(raw_dir: Path, out_dir: Path, checksums: Mapping[str, str] | None) -> dict:
    tv_raw = out_dir / "MNIST" / "raw"  # the layout torchvision.datasets.MNIST reads
    tv_raw.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, prefix in SPLITS.items():
        arrays, raw = read_split(raw_dir, prefix, checksums)
        np.save(out_dir / f"{split}_images.npy", arrays.images)
        np.save(out_dir / f"{split}_labels.npy", arrays.labels)
        for stem, content in raw.items():
            (tv_raw / stem).write_bytes(content)
        counts[split] = len(arrays.labels)
    return counts


def write_manifest(out_dir: Path, dataset: str) -> None:
    """`manifest.json`: the dataset's name and the SHA-256 of every file in `out_dir`."""
    files = sorted(p for p in out_dir.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(out_dir)): _sha256_file(p) for p in files}
    payload = {"dataset": dataset, "sha256": manifest}
    (out_dir / MANIFEST).write_text(json.dumps(payload, indent=2) + "\n")


def prepared_dataset(prepared_dir: Path) -> Dataset:
    """The dataset a verified prepared folder holds (manifests before CIFAR-10: MNIST)."""
    verify_prepared(prepared_dir)
    manifest = json.loads((prepared_dir / MANIFEST).read_text())
    name = manifest.get("dataset", "mnist")
    if name not in DATASETS:
        raise InputError(
            f"{prepared_dir / MANIFEST}: unknown dataset {name!r} (known: {', '.join(DATASETS)}); "
            "run `accelbench prepare` again"
        )
    return DATASETS[name]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_verified: set[tuple[str, float]] = set()  # (folder, manifest mtime): checked in this process


def verify_prepared(prepared_dir: Path) -> None:
    """Every file of the manifest is there with its SHA-256 (once per process and folder)."""
    again = "run `accelbench prepare` (or `dvc repro prepare`) again"
    manifest_path = prepared_dir / MANIFEST
    if not prepared_dir.is_dir():
        what = "not a folder" if prepared_dir.exists() else "no such folder"
        raise InputError(f"{prepared_dir}: {what}; expected prepared data ({again})")
    try:
        key = (str(prepared_dir.resolve()), manifest_path.stat().st_mtime)
        if key in _verified:
            return
        expected = json.loads(manifest_path.read_text())["sha256"]
        if not isinstance(expected, dict):
            raise TypeError
    except FileNotFoundError:
        raise InputError(
            f"{manifest_path}: missing; not a prepared data folder ({again})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(f"{manifest_path}: unreadable or not a manifest ({again})") from None
    for name, sha in expected.items():
        path = prepared_dir / name
        if not path.is_file():
            raise InputError(f"{path}: missing from the prepared data ({again})")
        if _sha256_file(path) != sha:
            raise InputError(f"{path}: changed since prepare wrote it (SHA-256 differs; {again})")
    _verified.add(key)


def dataset_digest(split: str, limit: int = 0, prepared_dir: Path | None = None) -> str:
    """A short, stable id of a split: the verified file checksums plus the subset size (MNIST:
    the official files'; another dataset: its prepared arrays', from the manifest)."""
    if prepared_dir is not None and prepared_dataset(prepared_dir).name != "mnist":
        manifest = json.loads((prepared_dir / MANIFEST).read_text())["sha256"]
        text = manifest[f"{split}_images.npy"] + manifest[f"{split}_labels.npy"]
    else:
        prefix = SPLITS[split]
        text = "".join(sha for stem, sha in MNIST_FILES.items() if stem.startswith(prefix))
    return hashlib.sha256(f"{text}:{limit}".encode()).hexdigest()[:16]


def load_split(prepared_dir: Path, split: str, limit: int = 0) -> Split:
    """Load a prepared split (memory-mapped .npy: milliseconds), checked against the manifest
    and for its shapes and labels; `limit` > 0 keeps the first n."""
    spec = prepared_dataset(prepared_dir)
    images_path = prepared_dir / f"{split}_images.npy"
    labels_path = prepared_dir / f"{split}_labels.npy"
    images, labels = _load_npy(images_path), _load_npy(labels_path)
    if images.dtype != np.uint8 or images.shape[1:] != spec.sample_shape:
        expected = ", ".join(map(str, ("n", *spec.sample_shape)))
        raise InputError(
            f"{images_path}: {images.dtype} {images.shape}, expected uint8 ({expected}) "
            f"for {spec.name}"
        )
    if labels.dtype != np.uint8 or labels.shape != images.shape[:1]:
        raise InputError(
            f"{labels_path}: {labels.dtype} {labels.shape}, expected uint8 ({len(images)},)"
        )
    if limit:
        images, labels = images[:limit], labels[:limit]
    images, labels = np.array(images), np.array(labels)  # copy out of the memory map
    if labels.max(initial=0) > 9:
        raise InputError(f"{labels_path}: label {labels.max()} outside 0..9")
    return Split(images=images, labels=labels)


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: missing; run `accelbench prepare` again") from None
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{path}: not a NumPy array file ({exc})") from None
