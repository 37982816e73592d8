"""A compiled variant's torch.compile caches, carried from one machine to the next.

torch.compile keeps what it compiled in a cache folder (`.accelbench/compile-cache/`, set by
the CLI) that a new machine, container or DVC queue workspace starts without, so the first
epoch of a compiled variant waits for the compiler. The train stage writes PyTorch's
portable cache (`torch.compiler.save_cache_artifacts`), xz-compressed, to
`compile-cache/<variant>.bin` (a DVC output kept in place on re-runs and carried by `dvc
push`/`dvc pull`), and hot-loads it before the next training compiles.

The file's first line names what it is valid for (its `CacheKey`: torch, Triton, GPU, the
step's code); a file made under another key is not loaded (one line says what differs).
Inductor checks its own entries too, so a stale entry is a cache miss, never a wrong kernel.

The file also carries the CUDA driver's JIT cache (`CUDA_CACHE_PATH`, which the CLI points
at `.accelbench/cuda-jit-cache/`): cuDNN's engines built from PTX, which a machine without
them waits seconds for in benchmark mode (docs/results/2026-12-01-h200-jit-cache.md). The
driver keys them by the checkout's path, so they are restored only at that path, into a
variant's empty folder, before CUDA starts, after a digest check.

Both parts are code (pickles, generated modules, machine code): a file is loaded only when
this repository's `dvc.lock` records its md5 for that output (DVC writes it after the stage
that made the file; `dvc pull` checks a pulled file against it). Any other file means
compiling from scratch, with one line saying why; and no entry whose key would leave the
cache folder reaches torch, even from a vouched file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import io
import json
import logging
import lzma
import os
import shutil
import tarfile
import tempfile
import time
import zlib
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, fields
from itertools import chain
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import yaml

from accelbench.core.outputs import text_kind
from accelbench.core.params import VariantParams

# /1: no JIT cache after the artifacts; /2: the artifacts as torch wrote them; /3: xz
FORMAT = "accelbench-compile-cache/3"
READABLE = ("accelbench-compile-cache/1", "accelbench-compile-cache/2", FORMAT)
# torch's artifacts are mostly text: xz's preset 1 (of 0-9) packs them to about a twelfth
# in well under a second, shrinking what each re-trained variant adds to the DVC cache
XZ_PRESET = 1
ARTIFACTS_LIMIT_BYTES = 256 * 2**20  # a header promising more unpacked bytes is not ours
XZ_MEMORY_LIMIT = 64 * 2**20  # preset 1 needs ~1 MiB to unpack; a crafted header asks GiBs
JIT_ENV = "CUDA_CACHE_PATH"  # the CUDA driver's JIT cache folder (NVIDIA's variable)
JIT_LIMIT_BYTES = 64 * 2**20  # a folder larger than this is not carried (the driver's cap: 256 MiB)
JIT_LIMIT_FILES = 10_000  # nor one of more files (an H200's pipeline leaves a few dozen)
if TYPE_CHECKING:
    import torch

# the file's first bytes: `refuse_foreign` replaces only a file that starts with them
KIND = text_kind("a compile cache written by `accelbench train`", '{"format": "accelbench-')
# the code torch.compile traces in a step: the loss with its augmentation, and the models;
# an edit to either makes the saved graphs useless (though harmless: Inductor misses)
STEP_MODULES = ("accelbench.training.step", "accelbench.training.models")


@dataclass(frozen=True)
class CacheKey:
    """What a portable compile cache is valid for."""

    torch: str
    triton: str | None
    device: str  # the GPU's name, or "cpu"
    capability: str | None  # CUDA compute capability, "9.0"; None on the CPU
    compile: str  # the variant's torch.compile mode
    step_code: str  # sha256 of STEP_MODULES' source, first 16 hex digits

    def differences(self, other: CacheKey) -> list[str]:
        """`field: theirs -> ours` for each field that differs."""
        return [
            f"{f.name} {getattr(other, f.name)} -> {getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


def key_for(variant: VariantParams, device: torch.device) -> CacheKey | None:
    """This process's key for `variant` on `device`; None when the variant compiles nothing."""
    if variant.compile == "none":
        return None
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    name, capability = "cpu", None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, capability = props.name, f"{props.major}.{props.minor}"
    digest = step_code_digest()
    return CacheKey(torch.__version__, triton_version, name, capability, variant.compile, digest)


def step_code_digest() -> str:
    digest = hashlib.sha256()
    for module in STEP_MODULES:
        source = importlib.import_module(module).__file__
        assert source is not None
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Loaded:
    """What `load` found: `artifacts` entries hot-loaded, or why none were (`reason`, a line
    for the log; None when there was nothing to load)."""

    artifacts: int = 0
    reason: str | None = None
    added: int = 0  # graphs the file gave this machine's caches that they lacked
    seconds: float = 0.0  # hot-loading the file into the caches (the compiler's import apart)


def load(path: Path, key: CacheKey, root: Path) -> Loaded:
    """Hot-load `path`'s artifacts into this machine's compile caches when the file was made
    under `key` and `root`'s `dvc.lock` vouches for it. Never fails: any other file means
    compiling from scratch, with one line saying why."""
    if not path.is_file():
        return Loaded()  # nothing compiled yet
    try:
        data = path.read_bytes()
        header, stored, _ = _read(data)
    except (OSError, ValueError) as exc:
        return Loaded(reason=f"{path} is not readable ({exc}): compiling from scratch")
    saved_key = header.get("key")
    if saved_key is None or not header.get("artifacts"):
        return Loaded()  # the last run compiled nothing
    try:
        theirs = CacheKey(**saved_key)
    except TypeError:
        return Loaded(reason=f"{path} has an unknown key {saved_key}: compiling from scratch")
    if theirs != key:
        changed = "; ".join(key.differences(theirs))
        return Loaded(reason=f"{path} was made for another set-up ({changed}): compiling")
    doubt = untrusted(path, root, data)
    if doubt is not None:
        return Loaded(reason=f"{path} not loaded: {doubt}: compiling from scratch")
    # the compiler's modules, which compiling imports anyway: their time is not the load's
    import torch
    import torch._dynamo
    import torch._inductor.codecache  # noqa: F401  (imported before the clock starts)
    from torch.compiler._cache import CacheArtifactManager  # what load_cache_artifacts calls

    started = time.perf_counter()
    try:
        payload = _artifacts(header, stored)
    except ValueError as exc:
        return Loaded(reason=f"{path} is not readable ({exc}): compiling from scratch")
    # torch logs a failed read with its traceback: our one line says it instead
    quiet = logging.getLogger("torch.compiler._cache")
    was, quiet.disabled = quiet.disabled, True
    try:
        artifacts = CacheArtifactManager.deserialize(payload)
    finally:
        quiet.disabled = was
    if artifacts is None:
        return Loaded(reason=f"{path}: torch could not read its artifacts: compiling")
    outside = [a.key for a in chain.from_iterable(artifacts.values()) if not _inside(a.key)]
    if outside:
        return Loaded(
            reason=f"{path} has entries outside the cache folder {outside[:3]}: compiling"
        )
    before = _local_graphs()
    info = CacheArtifactManager.populate_caches(artifacts)
    count = sum(len(keys) for keys in info.artifacts.values())
    added = len(_local_graphs() - before)
    return Loaded(count, added=added, seconds=time.perf_counter() - started)


def save(path: Path, key: CacheKey | None, jit: Path | None = None) -> None:
    """Write what this process compiled or found cached (none where `key` is None) to `path`,
    its key on the first line, then the CUDA JIT cache folder `jit` (None: none carried)."""
    saved = None
    if key is not None:
        import torch

        saved = torch.compiler.save_cache_artifacts()
    payload, info = saved or (b"", None)
    count = sum(len(keys) for keys in info.artifacts.values()) if info else 0
    stored = lzma.compress(payload, format=lzma.FORMAT_XZ, preset=XZ_PRESET) if payload else b""
    packed, files = _pack(jit) if jit is not None else (b"", 0)
    sha256, checkout = hashlib.sha256(packed).hexdigest(), checkout_digest()
    carried = {"files": files, "bytes": len(packed), "sha256": sha256, "checkout": checkout}
    header = {
        "format": FORMAT,  # first: KIND recognises the file by it
        "key": asdict(key) if key is not None and count else None,
        "artifacts": count,
        "bytes": len(stored),  # xz, which unpacks to `raw_bytes`
        "raw_bytes": len(payload),
        "jit": carried if files else None,
    }
    path.write_bytes(json.dumps(header).encode() + b"\n" + stored + packed)


def jit_folder(root: Path, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The CUDA driver's JIT cache folder when it is this workspace's own (under `root`), so
    carried; None when it is the user's (not ours to copy) or the cache is disabled."""
    chosen = environ.get(JIT_ENV)
    if not chosen or environ.get("CUDA_CACHE_DISABLE", "0") not in ("", "0"):
        return None
    # as written, links not followed: a `.accelbench` linked to a scratch disk is still ours
    folder = Path(os.path.abspath(root / chosen))
    return folder if folder.is_relative_to(os.path.abspath(root)) else None


def use_variant_jit_folder(
    root: Path, name: str, environ: MutableMapping[str, str] = os.environ
) -> Path | None:
    """Before CUDA starts: variant `name`'s own JIT cache folder (`train-<name>/` inside the
    workspace's), set as `CUDA_CACHE_PATH` for this process and its torchrun workers. In a
    shared folder, the first variant's restore would leave the next nothing to restore into.
    None where `jit_folder` is None."""
    shared = jit_folder(root, environ)
    if shared is None:
        return None
    if shared.name.startswith("train-"):  # set by an earlier call in this process
        shared = shared.parent
    own = shared / f"train-{name}"
    environ[JIT_ENV] = str(own)
    return own


def restore_jit(path: Path, folder: Path | None, root: Path) -> str | None:
    """Before CUDA starts: fill the variant's empty JIT cache `folder` from `path`; a line for
    the log, or None when there was nothing to do. Never fails: a damaged, unvouched or
    other-checkout file only means the driver builds the engines again."""
    if folder is None or not path.is_file() or _has_files(folder):
        return None
    try:
        data = path.read_bytes()
        header, _, packed = _read(data)
    except (OSError, ValueError):
        return None  # `load` says so, for the whole file
    if not packed:
        return None
    carried = header["jit"]
    if carried.get("checkout") != checkout_digest():
        # the driver keys cuDNN's engines by the checkout's path (docs/pipeline.md)
        return (
            f"CUDA JIT cache in {path} not restored: made in a checkout at another path, "
            "whose engines the driver does not reuse here; it builds them again"
        )
    not_restored = f"CUDA JIT cache in {path} not restored ({{}}): the driver builds it again"
    doubt = untrusted(path, root, data)
    if doubt is not None:
        return not_restored.format(doubt)
    if hashlib.sha256(packed).hexdigest() != carried.get("sha256"):
        return not_restored.format("its bytes do not match their digest")
    if not hasattr(tarfile, "data_filter"):  # Python 3.11.0-3.11.3
        return not_restored.format("this Python's tarfile cannot extract safely")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            members = tar.getmembers()
            if sum(m.size for m in members) > JIT_LIMIT_BYTES or len(members) > JIT_LIMIT_FILES:
                return not_restored.format(
                    f"more than {JIT_LIMIT_BYTES} bytes or {JIT_LIMIT_FILES} files unpacked"
                )
            # the driver writes files and folders only; a link is where tarfile's filter
            # has had its bypasses (CVE-2025-4517, in Pythons before 3.11.13 and 3.12.11)
            if any(not (m.isfile() or m.isdir()) for m in members):
                return not_restored.format("it holds a link or a special file")
            tar.extractall(staging, filter="data")  # no path leaves the folder
        for sub, _, _ in os.walk(folder, topdown=False):  # a run that built nothing may
            if sub != str(folder):  # leave empty folders: rmdir never removes a file
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
        os.rename(staging, folder)  # replaces an empty folder, never a filled one
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and _has_files(folder):
            return None  # a stage beside this one restored it first
        return not_restored.format(exc)
    except (EOFError, zlib.error, tarfile.TarError, ValueError, OverflowError) as exc:
        # damaged or crafted members: a truncated stream, a NaN or out-of-range time, a NUL
        return not_restored.format(exc)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after the rename
    files = sum(1 for m in members if m.isfile())
    return f"CUDA JIT cache: {files} file{'s' * (files != 1)} from {path} into {folder}"


def untrusted(path: Path, root: Path, data: bytes) -> str | None:
    """Why `data`, read from `path`, is not to be trusted, or None when `root`'s `dvc.lock`
    records exactly these bytes (DVC 3's plain md5) as `path`'s output. The bytes judged are
    the bytes used: the file is not read again, so a swap after the read changes nothing."""
    lock = root / "dvc.lock"
    try:
        name = PurePosixPath(Path(os.path.abspath(path)).relative_to(os.path.abspath(root)))
    except ValueError:
        return f"it lies outside the workspace {root}, whose dvc.lock vouches for its files"
    if not lock.is_file():  # never opened when a FIFO or a folder: it would block or fail
        return f"no {lock} records it (a compile cache is code: trusted only as dvc.lock says)"
    try:
        stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages") or {}
        recorded = {
            out.get("md5")
            for stage in stages.values()
            for out in stage.get("outs") or ()
            if out.get("path") == str(name) and out.get("hash") == "md5"
        }
    except (OSError, UnicodeError, yaml.YAMLError, AttributeError, TypeError) as exc:
        return f"{lock} is not readable ({exc})"
    if not recorded:
        return f"{lock} records no {name} (a compile cache is code: trusted only as dvc.lock says)"
    digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if digest not in recorded:
        return f"its md5 {digest} is not the one {lock} records: not made by this stage here"
    return None


def _inside(key: str) -> bool:
    """Whether torch writes artifact `key` inside its cache folder: a relative path with no
    `..`, which torch joins to its folder (os.path.join would take an absolute one as is)."""
    parts = PurePosixPath(key).parts
    return bool(parts) and "\0" not in key and not os.path.isabs(key) and ".." not in parts


def checkout_digest() -> str:
    """This process's working directory, hashed (no user's path in a pushed file): the driver
    reuses cuDNN's JIT-built engines only there."""
    return hashlib.sha256(os.getcwd().encode()).hexdigest()[:16]


def state(counts: tuple[int, int], loaded: Loaded) -> str | None:
    """The first epoch's compile cache from (hits, misses): "portable" (all hit, some thanks
    to the portable file), "warm" (all hit locally), "cold", "partial", or None (nothing
    compiled)."""
    hits, misses = counts
    if misses:
        return "partial" if hits else "cold"
    return ("portable" if loaded.added else "warm") if hits else None


def counts() -> tuple[int, int]:
    """(hits, misses) of this process's graph caches (Inductor's and AOTAutograd's)."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return (
        inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
        inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"],
    )


def _read(data: bytes) -> tuple[dict, bytes, bytes]:
    """A cache file's header, its torch artifacts and its packed JIT cache (b"" if none)."""
    line, _, rest = data.partition(b"\n")
    try:
        header = json.loads(line)
    except RecursionError as exc:  # nested past the parser's depth: not ours
        raise ValueError("its header is nested too deeply to be ours") from exc
    if not isinstance(header, dict) or header.get("format") not in READABLE:
        raise ValueError(f"not a {FORMAT} file")
    jit = header.get("jit")
    if jit is not None and not isinstance(jit, dict):
        raise ValueError(f"its JIT cache entry is not a table: {jit!r}")
    size, jit_size = header.get("bytes"), (jit or {}).get("bytes", 0)
    for what, value in (("artifacts", size), ("JIT cache", jit_size)):
        if type(value) is not int or value < 0:
            raise ValueError(f"its header gives the {what} {value!r} bytes")
    if size + jit_size != len(rest):
        raise ValueError(f"{len(rest)} bytes after the header, which says {size} + {jit_size}")
    return header, rest[:size], rest[size:]


def _artifacts(header: dict, stored: bytes) -> bytes:
    """torch's artifacts: as stored before /3, else unpacked from xz to exactly the header's
    size (at most ARTIFACTS_LIMIT_BYTES)."""
    if header["format"] != FORMAT or not stored:
        return stored
    size = header.get("raw_bytes")
    if type(size) is not int or not 0 <= size <= ARTIFACTS_LIMIT_BYTES:
        raise ValueError(f"its header gives the unpacked artifacts {size!r} bytes")
    unpacker = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMORY_LIMIT)
    try:
        payload = unpacker.decompress(stored, max_length=size + 1)
    except (lzma.LZMAError, MemoryError) as exc:
        raise ValueError(f"its artifacts do not unpack: {exc or type(exc).__name__}") from exc
    if len(payload) != size or not unpacker.eof or unpacker.unused_data:
        raise ValueError(f"its artifacts do not unpack to the {size} bytes its header gives")
    return payload


def _pack(folder: Path) -> tuple[bytes, int]:
    """`folder`'s files as a gzipped tar, and how many; nothing when it has none or exceeds
    the JIT limits."""
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not files or len(files) > JIT_LIMIT_FILES:
        return b"", 0
    if sum(p.stat().st_size for p in files) > JIT_LIMIT_BYTES:
        return b"", 0
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
            for file in files:
                tar.add(file, arcname=str(file.relative_to(folder)), recursive=False)
    except OSError:  # a file the driver rewrote or removed meanwhile: carry none
        return b"", 0
    return buffer.getvalue(), len(files)


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


def _local_graphs() -> set[str]:
    """The compiled graphs in this machine's caches (Inductor's and AOTAutograd's entries)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    found = set()
    for kind in ("fxgraph", "aotautograd"):
        for folder, _, files in os.walk(Path(cache_dir()) / kind):
            found.update(os.path.join(folder, name) for name in files)
    return found
