"""The prepared data folder: built atomically, described by its manifest, read back checked.

`prepare` builds the folder beside its final path, lets the dataset's own code fill it,
writes `manifest.json` (the dataset's name, whose model later stages build, and every file's
SHA-256) and renames the folder into place: all new or all old. Later stages read only
through this module: `load_split` checks the folder against its manifest once per process
(a stage run directly refuses tampered arrays), and refuses labels outside 0..9 and arrays
of the wrong shape, naming the file. Nothing here downloads or decodes raw files, so the
stages that only read prepared data do not depend on that code.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from accelbench.core.console import InputError
from accelbench.data.datasets import DATASETS, Dataset, Split

MANIFEST = "manifest.json"
_AGAIN = "run `accelbench prepare` (or `dvc repro prepare`) again"

# prepare's temporaries beside its folder: `.<name>.prepare-<random>` (being built) and
# `.<name>.prepare-old` (the folder it replaces)
_BUILDING, _REPLACED = "prepare-", "prepare-old"


def prepare(
    out_dir: Path, dataset: Dataset, write: Callable[[Path], Mapping[str, int]]
) -> dict[str, int]:
    """The prepared folder `out_dir` of `dataset`: `write(folder)` fills a new folder (and
    returns the samples per split), then its manifest is written and it replaces `out_dir`
    (`refuse_foreign_prepared` says which it may replace). Returns the samples per split."""
    refuse_foreign_prepared(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_prepare_leftovers(out_dir)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{_BUILDING}", dir=parent))
    umask = os.umask(0)  # read (and restored): mkdtemp's 0700 is not what the umask gives
    os.umask(umask)
    building.chmod(0o777 & ~umask)
    try:
        counts = dict(write(building))
        write_manifest(building, dataset)
        old = parent / f".{out_dir.name}.{_REPLACED}"
        if os.path.lexists(out_dir):
            os.replace(out_dir, old)  # a link is moved itself: its target stays
        os.replace(building, out_dir)
        _remove_tree(old)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return counts


def _remove_prepare_leftovers(out_dir: Path) -> None:
    """The folders a killed earlier prepare of `out_dir` left (its own names only; older
    versions' were `.<name>.<8 random>.tmp`)."""
    ours = re.compile(rf"\.{re.escape(out_dir.name)}\.({_BUILDING}.*|[a-z0-9_]{{8}}\.tmp)", re.S)
    for leftover in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.*"):
        if ours.fullmatch(leftover.name):
            _remove_tree(leftover)


def _remove_tree(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def refuse_foreign_prepared(out_dir: Path) -> None:
    """`prepare --out` replaces only a folder it wrote (every file in it is in its manifest)
    or an empty one; anything else there is the user's: refused, never emptied."""
    # absent, or a dangling link (only the link is replaced): nothing to refuse
    if out_dir.exists() and (reason := _not_prepared(out_dir)) is not None:
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


def write_manifest(out_dir: Path, dataset: Dataset) -> None:
    """`manifest.json`: the dataset's name and the SHA-256 of every file in `out_dir`."""
    files = sorted(p for p in out_dir.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(out_dir)): _sha256_file(p) for p in files}
    payload = {"dataset": dataset.name, "sha256": manifest}
    (out_dir / MANIFEST).write_text(json.dumps(payload, indent=2) + "\n")


def _sha256_file(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


_verified: set[tuple[str, float]] = set()  # (folder, manifest mtime): checked in this process


def _manifest(prepared_dir: Path) -> dict:
    """The manifest of a verified prepared folder: every file of it is there with its
    SHA-256 (checked once per process and folder)."""
    manifest_path = prepared_dir / MANIFEST
    if not prepared_dir.is_dir():
        what = "not a folder" if prepared_dir.exists() else "no such folder"
        raise InputError(f"{prepared_dir}: {what}; expected prepared data ({_AGAIN})")
    try:
        key = (str(prepared_dir.resolve()), manifest_path.stat().st_mtime)
        manifest = json.loads(manifest_path.read_text())
        expected = manifest["sha256"]
        if not isinstance(expected, dict):
            raise TypeError
    except FileNotFoundError:
        raise InputError(
            f"{manifest_path}: missing; not a prepared data folder ({_AGAIN})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(f"{manifest_path}: unreadable or not a manifest ({_AGAIN})") from None
    if key in _verified:
        return manifest
    for name, sha in expected.items():
        path = prepared_dir / name
        if not path.is_file():
            raise InputError(f"{path}: missing from the prepared data ({_AGAIN})")
        if _sha256_file(path) != sha:
            raise InputError(f"{path}: changed since prepare wrote it (SHA-256 differs; {_AGAIN})")
    _verified.add(key)
    return manifest


def prepared_dataset(prepared_dir: Path) -> Dataset:
    """The dataset a verified prepared folder holds, as its manifest names it."""
    name = _manifest(prepared_dir).get("dataset")
    if name not in DATASETS:
        said = f"names an unknown dataset {name!r}"
        if name is None:
            said = "names no dataset (an older prepare wrote it)"
        raise InputError(
            f"{prepared_dir / MANIFEST}: {said} (known: {', '.join(DATASETS)}); "
            "run `accelbench prepare` again"
        )
    return DATASETS[name]


def dataset_digest(prepared_dir: Path, split: str, limit: int = 0) -> str:
    """A short, stable id of a split of a verified prepared folder: the SHA-256 of the files
    that identify it (its dataset's `digest_files`, from the manifest) plus the subset size."""
    sha256 = _manifest(prepared_dir)["sha256"]
    text = "".join(sha256[name] for name in prepared_dataset(prepared_dir).digest_files[split])
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
    keep = slice(limit or None)  # limit 0: every sample
    images, labels = np.array(images[keep]), np.array(labels[keep])  # out of the memory map
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
