"""torch.compile's portable cache: written by a compiled variant's training, loaded before the
next one compiles on a machine whose own caches are empty, refused (with one line) when it
was made under another key, and never in the way of a training."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import multiprocessing
import os
import shutil
import subprocess
import tarfile
from dataclasses import replace

import pytest
import yaml

from accelbench.core.console import InputError
from accelbench.core.outputs import refuse_foreign
from accelbench.core.params import VariantParams
from accelbench.training import compile_cache
from helpers import train_command, write_params

COMPILED_CPU = {"device": "cpu", "threads": 1, "compile": "default"}
KEY = compile_cache.CacheKey(
    torch="2.11.0+cu130",
    triton="3.5.0",
    device="NVIDIA H200",
    capability="9.0",
    compile="default",
    step_code="0123456789abcdef",
)


def _vouch(path, root=None):
    """`root` (the file's folder unless given), whose `dvc.lock` records `path`'s bytes as a
    stage's output, as DVC writes it after the stage ran or `dvc pull` checks it."""
    root = root or path.parent
    lock = root / "dvc.lock"
    record = yaml.safe_load(lock.read_text()) if lock.exists() else {"schema": "2.0", "stages": {}}
    if path.is_file():
        name = path.relative_to(root).as_posix()
        out = {"path": name, "hash": "md5", "md5": hashlib.md5(path.read_bytes()).hexdigest()}
        record["stages"][f"train@{name}"] = {"cmd": "accelbench train", "outs": [out]}
        lock.write_text(yaml.safe_dump(record))
    return root


def _header(path) -> dict:
    return json.loads(path.read_bytes().partition(b"\n")[0])


def _train(workspace, prepared, mlflow_store, cache_file, variant=COMPILED_CPU):
    """`accelbench train compiled` in `workspace`, whose own compile caches
    (`.accelbench/compile-cache/`, and the CUDA JIT cache beside them) start empty: another
    machine."""
    workspace.mkdir(exist_ok=True)
    params = write_params(workspace, {"compiled": variant}, epochs=1, batch_size=128)
    command = [
        *train_command(params, "compiled", prepared, workspace / "m.pt", workspace / "metrics"),
        *("--compile-cache", str(cache_file)),
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
        env.pop(name, None)
    done = subprocess.run(command, cwd=workspace, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads((workspace / "metrics" / "train.json").read_text())
    return summary, done.stdout + done.stderr


@pytest.mark.slow
def test_a_compiled_variant_carries_its_cache_to_a_machine_without_one(
    tmp_path, prepared, mlflow_store
) -> None:
    first_file = tmp_path / "first" / "compile-cache" / "compiled.bin"
    first, _ = _train(tmp_path / "first", prepared, mlflow_store, first_file)
    assert first["compile_cache"] == "cold"
    header = _header(first_file)
    assert header["artifacts"] > 0 and header["key"]["device"] == "cpu"
    assert header["key"]["step_code"] == compile_cache.step_code_digest()
    assert header["format"] == compile_cache.FORMAT
    assert 0 < header["bytes"] < header["raw_bytes"] / 3  # stored as xz

    # a fresh workspace on "another machine" (its caches empty), given the file as
    # `dvc pull` or a queued experiment's checkout would
    second_file = tmp_path / "second" / "compile-cache" / "compiled.bin"
    second_file.parent.mkdir(parents=True)
    second_file.write_bytes(first_file.read_bytes())
    _, log = _train(tmp_path / "second", prepared, mlflow_store, second_file)
    assert f"{second_file} not loaded: no {tmp_path / 'second' / 'dvc.lock'} records it" in log
    second_file.write_bytes(first_file.read_bytes())  # the first's again: the run rewrote it
    _vouch(second_file, tmp_path / "second")  # the repository's record, as `dvc pull` checks it
    shutil.rmtree(tmp_path / "second" / ".accelbench")  # this machine's caches empty again
    second, log = _train(tmp_path / "second", prepared, mlflow_store, second_file)
    assert second["compile_cache"] == "portable", log
    assert f"compile cache {second_file}: " in log and "compiling" not in log
    assert _header(second_file)["artifacts"] == header["artifacts"]  # rewritten, same graphs

    # the same machine again: its own caches hold every graph now, the file adds none
    _vouch(second_file, tmp_path / "second")  # as DVC records the stage's new output
    third, log = _train(tmp_path / "second", prepared, mlflow_store, second_file)
    assert third["compile_cache"] == "warm", log
    assert " entries, 0 graphs new here (loaded in " in log


def test_a_cache_made_elsewhere_is_not_loaded_and_the_line_says_what_differs(tmp_path) -> None:
    path = tmp_path / "gpu.bin"
    compile_cache.save(path, None)  # nothing compiled: a header alone
    assert _header(path)["key"] is None
    assert (
        compile_cache.load(path, KEY, _vouch(path)).reason is None
    )  # nothing to load, nothing to say

    payload = b"not torch's bytes"
    header = {"format": compile_cache.FORMAT, "key": vars(KEY), "artifacts": 3, "bytes": 17}
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    here = replace(KEY, torch="2.14.1+cu130", device="NVIDIA H100 80GB HBM3")
    loaded = compile_cache.load(path, here, _vouch(path))
    assert loaded.artifacts == 0
    assert loaded.reason == (
        f"{path} was made for another set-up (torch 2.11.0+cu130 -> 2.14.1+cu130; "
        "device NVIDIA H200 -> NVIDIA H100 80GB HBM3): compiling"
    )


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "not readable"),
        (b'{"format": "accelbench-compile-cache/1", "key": null, "bytes": 9}\nshort', "5 bytes"),
        (
            b'{"format": "accelbench-compile-cache/1", "key": {"gpu": 1}, "artifacts": 1, '
            b'"bytes": 0}\n',
            "unknown key",
        ),
        (b'{"format": "accelbench-compile-cache/2", "bytes": 0, "jit": [1]}\n', "not a table"),
        (b'{"format": "accelbench-compile-cache/2", "bytes": 0, "jit": {"bytes": "x"}}\n', "'x'"),
        (b'{"format": "accelbench-compile-cache/2", "bytes": -3, "jit": {"bytes": 3}}\n', "-3"),
        (b'{"format": "accelbench-compile-cache/2", "bytes": true}\nx', "True"),
        (b"[" * 200_000 + b"\n", "nested too deeply"),
    ],
    ids=[
        "empty",
        "truncated",
        "old-key",
        "jit-list",
        "jit-size-text",
        "negative",
        "bool",
        "deep-json",
    ],
)
def test_a_damaged_cache_file_means_compiling_never_a_failure(tmp_path, content, says) -> None:
    path = tmp_path / "gpu.bin"
    path.write_bytes(content)
    loaded = compile_cache.load(path, KEY, _vouch(path))
    assert loaded.artifacts == 0 and says in loaded.reason and "compiling" in loaded.reason


def _jit_folder(folder, files=None):
    """A CUDA JIT cache as the driver lays it out: an index and entries two folders deep."""
    files = files or {"index": b"\x01" * 192, "2/1/6e6f0bd077b869": b"sass" * 1000}
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return files


def _contents(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _with_jit(path, packed: bytes, **jit) -> None:
    """`path`: a file whose JIT cache is `packed`, made in this checkout unless `jit` says."""
    jit = {
        "files": 1,
        "bytes": len(packed),
        "sha256": hashlib.sha256(packed).hexdigest(),
        "checkout": compile_cache.checkout_digest(),
        **jit,
    }
    header = {"format": compile_cache.FORMAT, "key": None, "artifacts": 0, "bytes": 0, "jit": jit}
    path.write_bytes(json.dumps(header).encode() + b"\n" + packed)


def _no_staging_left(folder) -> bool:
    return not list(folder.parent.glob(f".{folder.name}.*"))


def test_the_jit_cache_travels_in_the_file_and_fills_only_an_empty_folder(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the checkout the file is made in
    made_here = tmp_path / "a" / ".accelbench" / "cuda-jit-cache" / "train-gpu"
    files = _jit_folder(made_here)
    path = tmp_path / "gpu.bin"
    compile_cache.save(path, None, jit=made_here)
    assert _header(path)["jit"]["files"] == 2 and _header(path)["format"] == compile_cache.FORMAT
    assert (
        compile_cache.load(path, KEY, _vouch(path)) == compile_cache.Loaded()
    )  # the artifacts part: none

    # a new checkout at the same path, whose folder does not exist yet: filled, file for file
    there = tmp_path / "b" / ".accelbench" / "cuda-jit-cache" / "train-gpu"
    line = compile_cache.restore_jit(path, there, _vouch(path))
    assert line == f"CUDA JIT cache: 2 files from {path} into {there}"
    assert _contents(there) == files and _no_staging_left(there)

    # an empty folder (the driver made it, then built nothing) is filled too
    empty = tmp_path / "c" / "train-gpu"
    (empty / "ComputeCache" / "0").mkdir(parents=True)  # empty folders in it: still empty
    assert (
        compile_cache.restore_jit(path, empty, _vouch(path)) is not None
        and _contents(empty) == files
    )

    # a folder with this machine's own entries is never touched
    own = _jit_folder(tmp_path / "d", {"index": b"ours", "f/8/ab97849d3aedd4": b"mine"})
    assert compile_cache.restore_jit(path, tmp_path / "d", _vouch(path)) is None
    assert _contents(tmp_path / "d") == own

    # nothing to restore: no file, a file without a JIT cache, no folder of ours
    assert (
        compile_cache.restore_jit(
            tmp_path / "missing.bin", tmp_path / "e", _vouch(tmp_path / "missing.bin")
        )
        is None
    )
    compile_cache.save(tmp_path / "cpu.bin", None)
    assert _header(tmp_path / "cpu.bin")["jit"] is None
    assert (
        compile_cache.restore_jit(
            tmp_path / "cpu.bin", tmp_path / "e", _vouch(tmp_path / "cpu.bin")
        )
        is None
    )
    assert compile_cache.restore_jit(path, None, _vouch(path)) is None
    assert not (tmp_path / "e").exists()


def test_a_jit_cache_made_at_another_checkout_path_is_not_restored(tmp_path, monkeypatch) -> None:
    """The driver keys cuDNN's engines by the checkout's path: elsewhere they would only
    pile up beside the ones it builds again, so the line says why none were restored."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    made = tmp_path / "first" / "jit"
    _jit_folder(made)
    monkeypatch.chdir(tmp_path / "first")
    compile_cache.save(tmp_path / "gpu.bin", None, jit=made)
    monkeypatch.chdir(tmp_path / "second")
    folder = tmp_path / "second" / "jit"
    line = compile_cache.restore_jit(tmp_path / "gpu.bin", folder, _vouch(tmp_path / "gpu.bin"))
    assert line == (
        f"CUDA JIT cache in {tmp_path / 'gpu.bin'} not restored: made in a checkout at another "
        "path, whose engines the driver does not reuse here; it builds them again"
    )
    assert not folder.exists()
    # the file records a digest of the path, never the path (it may be pushed to a remote)
    assert str(tmp_path).encode() not in (tmp_path / "gpu.bin").read_bytes()


def test_each_variant_restores_into_its_own_folder(tmp_path, monkeypatch) -> None:
    """In a fresh checkout gpu's restore must not leave amp nothing to restore into."""
    monkeypatch.chdir(tmp_path)
    environ = {"CUDA_CACHE_PATH": str(tmp_path / "made" / ".accelbench" / "cuda-jit-cache")}
    for name in ("gpu", "amp"):
        folder = compile_cache.use_variant_jit_folder(tmp_path / "made", name, environ)
        assert environ["CUDA_CACHE_PATH"] == str(folder) and folder.name == f"train-{name}"
        _jit_folder(folder, {"index": name.encode(), f"0/1/{name}": name.encode() * 100})
        compile_cache.save(tmp_path / f"{name}.bin", None, jit=folder)

    checkout = tmp_path / "fresh"
    lines = {}
    for name in ("gpu", "amp"):
        environ = {"CUDA_CACHE_PATH": str(checkout / ".accelbench" / "cuda-jit-cache")}
        folder = compile_cache.use_variant_jit_folder(checkout, name, environ)
        lines[name] = compile_cache.restore_jit(
            tmp_path / f"{name}.bin", folder, _vouch(tmp_path / f"{name}.bin")
        )
        assert _contents(folder) == {"index": name.encode(), f"0/1/{name}": name.encode() * 100}
    assert all(line and line.startswith("CUDA JIT cache: 2 files") for line in lines.values())

    # called again in one process (tests, library use): a sibling, never nested
    again = compile_cache.use_variant_jit_folder(checkout, "gpu", environ)
    assert again == checkout / ".accelbench" / "cuda-jit-cache" / "train-gpu"

    user = {"CUDA_CACHE_PATH": "/root/.nv/ComputeCache"}
    assert compile_cache.use_variant_jit_folder(checkout, "gpu", user) is None
    assert user == {"CUDA_CACHE_PATH": "/root/.nv/ComputeCache"}  # theirs: left as it was


def _packed(files: dict, **pax: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, content in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(content)
            entry.pax_headers = pax
            tar.addfile(entry, io.BytesIO(content))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "packed, digest, says",
    [
        (_packed({"../../outside": b"evil"}), None, "outside the destination"),
        (_packed({"index": b"x" * 4000})[:-30], None, "not restored ("),  # truncated gzip
        (_packed({"index": b"x" * 4000}), "0" * 64, "its bytes do not match their digest"),
        (_packed({"index": b"x" * 4000}), "limit", "files unpacked"),
        (_packed({"index": b"x"}, mtime="nan"), None, "not restored ("),
        (_packed({"index": b"x"}, mtime="1e300"), None, "not restored ("),
        (_packed({"index": b"x"}, path="a\x00b"), None, "not restored ("),
    ],
    ids=[
        "path-traversal",
        "truncated",
        "corrupted",
        "too-large-unpacked",
        "nan-time",
        "huge-time",
        "nul-in-name",
    ],
)
def test_a_bad_jit_cache_is_not_restored_and_says_why(
    tmp_path, monkeypatch, packed, digest, says
) -> None:
    monkeypatch.chdir(tmp_path)
    if digest == "limit":
        monkeypatch.setattr(compile_cache, "JIT_LIMIT_BYTES", 1000)
    elif digest is not None:
        _with_jit(tmp_path / "gpu.bin", packed, sha256=digest)
    if digest in (None, "limit"):
        _with_jit(tmp_path / "gpu.bin", packed)
    folder = tmp_path / "w" / ".accelbench" / "cuda-jit-cache" / "train-gpu"
    line = compile_cache.restore_jit(tmp_path / "gpu.bin", folder, _vouch(tmp_path / "gpu.bin"))
    assert line.startswith(f"CUDA JIT cache in {tmp_path / 'gpu.bin'} not restored (")
    assert says in line and line.endswith("the driver builds it again")
    assert not (tmp_path / "outside").exists() and not (tmp_path / "w" / "outside").exists()
    assert not folder.exists() and _no_staging_left(folder)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
def test_a_jit_cache_holding_a_link_or_a_special_file_is_not_restored(tmp_path, kind) -> None:
    """The driver writes files and folders only. Links are where tarfile's "data" filter had
    its bypasses (CVE-2025-4517: writes outside the folder, on Pythons before 3.11.13 and
    3.12.11); even one pointing inside the folder is refused."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.addfile(tarfile.TarInfo("index"), io.BytesIO(b""))
        odd = tarfile.TarInfo("0/entry")
        odd.type, odd.linkname = kind, "index"
        tar.addfile(odd)
    path = tmp_path / "w" / "gpu.bin"
    path.parent.mkdir()
    _with_jit(path, buffer.getvalue())
    folder = tmp_path / "w" / ".accelbench" / "cuda-jit-cache" / "train-gpu"
    line = compile_cache.restore_jit(path, folder, _vouch(path))
    assert "not restored (it holds a link or a special file)" in line
    assert not folder.exists() and _no_staging_left(folder)


def test_a_jit_cache_of_too_many_files_is_not_restored(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compile_cache, "JIT_LIMIT_FILES", 3)
    path = tmp_path / "gpu.bin"
    _with_jit(path, _packed({f"0/{i}": b"x" for i in range(4)}))
    folder = tmp_path / "train-gpu"
    line = compile_cache.restore_jit(path, folder, _vouch(path))
    assert "more than 67108864 bytes or 3 files unpacked" in line and not folder.exists()


def test_an_interrupted_restore_leaves_no_staging_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _with_jit(tmp_path / "gpu.bin", _packed({"index": b"x"}))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("signal SIGTERM")  # what the CLI makes of SIGTERM

    monkeypatch.setattr(tarfile.TarFile, "extractall", interrupted)
    folder = tmp_path / "w" / "train-gpu"
    with pytest.raises(KeyboardInterrupt):
        compile_cache.restore_jit(tmp_path / "gpu.bin", folder, _vouch(tmp_path / "gpu.bin"))
    assert not folder.exists() and _no_staging_left(folder)


def _restore_after(barrier, path, folder, lines) -> None:
    barrier.wait()
    lines.put(compile_cache.restore_jit(path, folder, path.parent))


def test_two_stages_restoring_at_once_fill_the_folder_once_without_a_word(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    files = {"index": b"i" * 100, **{f"{i:x}/0/entry{i}": bytes([i]) * 5000 for i in range(8)}}
    _with_jit(tmp_path / "gpu.bin", _packed(files))
    _vouch(tmp_path / "gpu.bin")
    context = multiprocessing.get_context("fork")
    for attempt in range(10):
        folder = tmp_path / str(attempt) / "train-gpu"
        folder.mkdir(parents=True)  # the driver made it empty: the racy case
        barrier, lines = context.Barrier(2), context.Queue()
        workers = [
            context.Process(
                target=_restore_after, args=(barrier, tmp_path / "gpu.bin", folder, lines)
            )
            for _ in range(2)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        said = [lines.get(timeout=5) for _ in workers]
        assert all(line is None or line.startswith("CUDA JIT cache: 9 files") for line in said)
        assert any(said), said
        assert _contents(folder) == files and _no_staging_left(folder)


def test_a_jit_cache_too_large_to_carry_is_left_out(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "jit"
    _jit_folder(folder)
    monkeypatch.setattr(compile_cache, "JIT_LIMIT_BYTES", 1000)
    compile_cache.save(tmp_path / "gpu.bin", None, jit=folder)
    assert _header(tmp_path / "gpu.bin")["jit"] is None


def _torch_reads(monkeypatch) -> list[bytes]:
    """What `load` hands torch (torch answers that it could not read it)."""

    handed: list[bytes] = []
    from torch.compiler._cache import CacheArtifactManager

    monkeypatch.setattr(CacheArtifactManager, "deserialize", lambda b: handed.append(b))
    return handed


def _xz_file(path, stored: bytes, raw_bytes) -> None:
    header = {"format": compile_cache.FORMAT, "key": vars(KEY), "artifacts": 3,
              "bytes": len(stored), "raw_bytes": raw_bytes}  # fmt: skip
    path.write_bytes(json.dumps(header).encode() + b"\n" + stored)


def test_torch_gets_the_artifacts_unpacked_and_older_files_as_stored(tmp_path, monkeypatch) -> None:
    handed = _torch_reads(monkeypatch)
    raw = b"torch's artifacts " * 1000
    _xz_file(tmp_path / "new.bin", lzma.compress(raw), len(raw))
    old = {"format": "accelbench-compile-cache/2", "key": vars(KEY), "artifacts": 3,
           "bytes": len(raw), "jit": None}  # fmt: skip
    (tmp_path / "old.bin").write_bytes(json.dumps(old).encode() + b"\n" + raw)
    for name in ("new.bin", "old.bin"):
        loaded = compile_cache.load(tmp_path / name, KEY, _vouch(tmp_path / name))
        assert "torch could not read its artifacts" in loaded.reason
    assert handed == [raw, raw]


@pytest.mark.parametrize(
    "stored, raw_bytes, says",
    [
        (b"\xfd7zXZ\x00 not xz after all", 10, "do not unpack"),
        (lzma.compress(b"x" * 100), 99, "do not unpack to the 99 bytes"),
        (lzma.compress(b"x" * 100), 101, "do not unpack to the 101 bytes"),
        (lzma.compress(b"x" * 100) + b"tail", 100, "do not unpack to the 100 bytes"),
        (lzma.compress(b"x"), 2**31, "2147483648"),
        (lzma.compress(b"x"), None, "None"),
        (
            lzma.compress(b"x", filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1536 * 2**20}]),
            1,
            "do not unpack: Memory usage limit",
        ),
    ],
    ids=["garbage", "longer", "shorter", "trailing-bytes", "over-limit", "no-size", "huge-dict"],
)
def test_damaged_xz_artifacts_mean_compiling(tmp_path, monkeypatch, stored, raw_bytes, says):
    handed = _torch_reads(monkeypatch)
    _xz_file(tmp_path / "gpu.bin", stored, raw_bytes)
    loaded = compile_cache.load(tmp_path / "gpu.bin", KEY, _vouch(tmp_path / "gpu.bin"))
    assert says in loaded.reason and "compiling from scratch" in loaded.reason
    assert handed == []  # torch never sees them


def test_a_version_1_file_without_a_jit_cache_still_loads(tmp_path) -> None:
    path = tmp_path / "gpu.bin"
    header = {"format": "accelbench-compile-cache/1", "key": vars(KEY), "artifacts": 3, "bytes": 5}
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"bytes")
    here = replace(KEY, device="NVIDIA H100 80GB HBM3")
    assert (
        "was made for another set-up" in compile_cache.load(path, here, _vouch(path)).reason
    )  # read
    assert compile_cache.restore_jit(path, tmp_path / "jit", _vouch(path)) is None


def test_only_the_workspaces_own_jit_cache_is_carried(tmp_path) -> None:
    inside = {"CUDA_CACHE_PATH": ".accelbench/cuda-jit-cache"}
    assert compile_cache.jit_folder(tmp_path, inside) == tmp_path / ".accelbench" / "cuda-jit-cache"
    absolute = {"CUDA_CACHE_PATH": str(tmp_path / ".accelbench" / "cuda-jit-cache")}
    assert compile_cache.jit_folder(tmp_path, absolute) is not None
    # a `.accelbench` linked to a scratch disk is still the workspace's own
    (tmp_path / "scratch").mkdir()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / ".accelbench").symlink_to(tmp_path / "scratch")
    assert compile_cache.jit_folder(tmp_path / "w", inside) is not None
    # the user's own cache (their other programs' kernels), a disabled one, or none
    assert compile_cache.jit_folder(tmp_path, {"CUDA_CACHE_PATH": "/root/.nv/ComputeCache"}) is None
    assert compile_cache.jit_folder(tmp_path, {**inside, "CUDA_CACHE_DISABLE": "1"}) is None
    assert compile_cache.jit_folder(tmp_path, {}) is None


def test_the_cli_keeps_the_jit_cache_in_the_workspace_unless_the_user_chose(
    tmp_path, monkeypatch
) -> None:
    from accelbench import cli

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
        monkeypatch.setenv(name, str(tmp_path / name))  # recorded: put back afterwards
    monkeypatch.delenv("CUDA_CACHE_PATH")
    cli._persistent_compile_cache(tmp_path)
    assert os.environ["CUDA_CACHE_PATH"] == str(tmp_path / ".accelbench" / "cuda-jit-cache")
    monkeypatch.setenv("CUDA_CACHE_PATH", "/scratch/jit")
    cli._persistent_compile_cache(tmp_path)
    assert os.environ["CUDA_CACHE_PATH"] == "/scratch/jit"


@pytest.mark.gpu
def test_a_cuda_training_carries_the_jit_cache_to_a_new_checkout_at_its_path(
    tmp_path, prepared, mlflow_store
) -> None:
    """On the GPU host: cuDNN's benchmark mode has the driver build engines from PTX; the file
    carries them, and a fresh checkout at the same path starts with them and reuses them."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    variant = {"device": "cuda", "precision": "fp32", "channels_last": True,
               "cudnn_benchmark": True}  # fmt: skip
    workspace = tmp_path / "w"
    cache_file = workspace / "compile-cache" / "compiled.bin"
    cache_file.parent.mkdir(parents=True)
    _train(workspace, prepared, mlflow_store, cache_file, variant)
    jit = _header(cache_file)["jit"]
    if jit is None:
        pytest.skip(f"the driver built nothing from PTX for {torch.cuda.get_device_name()}")
    folder = workspace / ".accelbench" / "cuda-jit-cache" / "train-compiled"
    first = _contents(folder)
    assert 0 < jit["files"] <= len(first)

    shutil.rmtree(workspace / ".accelbench")  # a new checkout there: only the file came along
    _vouch(cache_file, workspace)  # with its record in dvc.lock
    _, log = _train(workspace, prepared, mlflow_store, cache_file, variant)
    assert f"CUDA JIT cache: {jit['files']} files from {cache_file}" in log, log
    # reused, not built again under new names: the second run's entries are the first's
    assert set(_contents(folder)) == set(first)


def test_a_users_file_at_the_cache_path_is_refused_not_replaced(tmp_path) -> None:
    ours = tmp_path / "ours.bin"
    compile_cache.save(ours, None)
    refuse_foreign(ours, compile_cache.KIND)  # ours: replaced without a word
    theirs = tmp_path / "theirs.bin"
    theirs.write_bytes(b"\x00weights")
    with pytest.raises(InputError, match="not a compile cache written by `accelbench train`"):
        refuse_foreign(theirs, compile_cache.KIND)


def test_the_state_says_where_the_first_epochs_graphs_came_from() -> None:
    loaded = compile_cache.Loaded(artifacts=3, added=3)
    none = compile_cache.Loaded()
    assert compile_cache.state((0, 0), loaded) is None  # nothing compiled
    assert compile_cache.state((4, 0), loaded) == "portable"
    assert compile_cache.state((4, 0), none) == "warm"
    # loaded into caches that already held every graph: this machine's own, not the file's
    assert compile_cache.state((4, 0), replace(loaded, added=0)) == "warm"
    assert compile_cache.state((0, 4), loaded) == "cold"
    assert compile_cache.state((2, 2), none) == "partial"


def test_a_variant_that_compiles_nothing_has_no_key() -> None:
    import torch

    eager = VariantParams(device="cpu", precision="fp32")
    assert compile_cache.key_for(eager, torch.device("cpu")) is None
    key = compile_cache.key_for(
        eager.model_copy(update={"compile": "default"}), torch.device("cpu")
    )
    assert key is not None and (key.device, key.capability) == ("cpu", None)
    assert key.torch == torch.__version__


def _crafted(key: str, content: bytes = b"print('INJECTED')\n") -> bytes:
    """torch's portable cache format holding one Inductor entry under `key`."""
    from torch.compiler._cache import (
        CacheArtifactFactory,
        CacheArtifactManager,
        _serialize_single_cache,
    )
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    CacheArtifactManager._ensure_cache_artifacts_registered()
    artifact = CacheArtifactFactory.create("inductor", key, content)
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend([("inductor", [artifact])])
    return serializer.to_bytes()


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_a_crafted_cache_writes_nothing_outside_its_folder(tmp_path, monkeypatch, where) -> None:
    """A file whose header matches (every field of the key is guessable) and whose entry is
    keyed by a path outside the cache folder: never handed to torch, vouched for or not."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    target = tmp_path / "victim" / "INJECTED.py"
    key = str(target) if where == "absolute" else "../" * 12 + str(target).lstrip("/")
    raw = _crafted(key)
    path = tmp_path / "w" / "compile-cache" / "gpu.bin"
    path.parent.mkdir(parents=True)
    _xz_file(path, lzma.compress(raw), len(raw))
    unvouched = compile_cache.load(path, KEY, tmp_path / "w")
    assert "not loaded: no " in unvouched.reason and "dvc.lock" in unvouched.reason
    loaded = compile_cache.load(path, KEY, _vouch(path, tmp_path / "w"))
    assert loaded.artifacts == 0 and "entries outside the cache folder" in loaded.reason
    assert not list(tmp_path.rglob("INJECTED.py"))  # written nowhere


def test_only_a_file_dvc_lock_records_is_trusted(tmp_path) -> None:
    root = tmp_path / "w"
    path = root / "compile-cache" / "gpu.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"artifacts")

    def doubt(at=path):
        return compile_cache.untrusted(at, root, b"artifacts")

    assert "records it" in doubt()  # no dvc.lock at all
    _vouch(path, root)
    assert doubt() is None
    path.write_bytes(b"artifacts, swapped")  # changed since DVC recorded it
    _vouch(path, root)
    assert "is not the one" in doubt()  # the bytes judged are those read, not the file's
    (root / "dvc.lock").write_text("stages: {train@gpu: {outs: [{path: other.bin}]}}")
    assert "records no compile-cache/gpu.bin" in doubt()
    (root / "dvc.lock").write_text("[unbalanced")
    assert "is not readable" in doubt()
    assert "outside the workspace" in doubt(tmp_path / "x.bin")
    (root / "dvc.lock").unlink()
    os.mkfifo(root / "dvc.lock")  # never opened: it would block
    assert "records it" in doubt()


def test_a_file_swapped_after_it_was_read_is_judged_by_what_was_read(tmp_path, monkeypatch) -> None:
    """A crafted cache that a vouched copy replaces between the read and the md5 check (a
    local race) is refused: the check hashes the bytes read, never the file again."""
    handed = _torch_reads(monkeypatch)
    root = tmp_path / "w"
    path = root / "compile-cache" / "gpu.bin"
    path.parent.mkdir(parents=True)
    raw, crafted = b"vouched artifacts " * 100, b"crafted artifacts " * 100
    _xz_file(path, lzma.compress(raw), len(raw))
    vouched = path.read_bytes()
    _vouch(path, root)
    _xz_file(path, lzma.compress(crafted), len(crafted))
    read = compile_cache._read

    def read_then_swap(data):
        parts = read(data)
        path.write_bytes(vouched)  # the vouched bytes back in place before the check
        return parts

    monkeypatch.setattr(compile_cache, "_read", read_then_swap)
    assert "is not the one" in compile_cache.load(path, KEY, root).reason
    assert handed == []
    monkeypatch.setattr(compile_cache, "_read", read)
    assert "torch could not read" in compile_cache.load(path, KEY, root).reason
    assert handed == [raw]  # the vouched file itself loads


def test_a_garbage_payload_under_a_valid_header_is_one_line(tmp_path, capfd) -> None:
    path = tmp_path / "gpu.bin"
    raw = b"\x00not torch's format" * 50
    _xz_file(path, lzma.compress(raw), len(raw))
    loaded = compile_cache.load(path, KEY, _vouch(path))
    assert loaded.reason == f"{path}: torch could not read its artifacts: compiling"
    printed = capfd.readouterr()
    assert "Traceback" not in printed.out + printed.err
