"""torch.compile's portable cache: written by a compiled variant's training, loaded before the
next one compiles on a machine whose own caches are empty, refused (with one line) when it
was made under another key, and never in the way of a training."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from dataclasses import replace

import pytest

from accelbench.core.console import InputError
from accelbench.core.params import VariantParams
from accelbench.core.results import refuse_foreign
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


def test_a_compiled_variant_carries_its_cache_to_a_machine_without_one(
    tmp_path, prepared, mlflow_store
) -> None:
    first_file = tmp_path / "first" / "compile-cache" / "compiled.bin"
    first, _ = _train(tmp_path / "first", prepared, mlflow_store, first_file)
    assert first["compile_cache"] == "cold"
    header = _header(first_file)
    assert header["artifacts"] > 0 and header["key"]["device"] == "cpu"
    assert header["key"]["step_code"] == compile_cache.step_code_digest()

    # a fresh workspace on "another machine" (its caches empty), given the file as
    # `dvc pull` or a queued experiment's checkout would
    second_file = tmp_path / "second" / "compile-cache" / "compiled.bin"
    second_file.parent.mkdir(parents=True)
    second_file.write_bytes(first_file.read_bytes())
    second, log = _train(tmp_path / "second", prepared, mlflow_store, second_file)
    assert second["compile_cache"] == "portable", log
    assert f"compile cache {second_file}: " in log and "compiling" not in log
    assert _header(second_file)["artifacts"] == header["artifacts"]  # rewritten, same graphs

    # the same machine again: its own caches hold every graph now, the file adds none
    third, log = _train(tmp_path / "second", prepared, mlflow_store, second_file)
    assert third["compile_cache"] == "warm", log
    assert " entries, 0 graphs new here (loaded in " in log


def test_a_cache_made_elsewhere_is_not_loaded_and_the_line_says_what_differs(tmp_path) -> None:
    path = tmp_path / "gpu.bin"
    compile_cache.save(path, None)  # nothing compiled: a header alone
    assert _header(path)["key"] is None
    assert compile_cache.load(path, KEY).reason is None  # nothing to load, nothing to say

    payload = b"not torch's bytes"
    header = {"format": compile_cache.FORMAT, "key": vars(KEY), "artifacts": 3, "bytes": 17}
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    here = replace(KEY, torch="2.14.1+cu130", device="NVIDIA H100 80GB HBM3")
    loaded = compile_cache.load(path, here)
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
    ],
    ids=["empty", "truncated", "old-key"],
)
def test_a_damaged_cache_file_means_compiling_never_a_failure(tmp_path, content, says) -> None:
    path = tmp_path / "gpu.bin"
    path.write_bytes(content)
    loaded = compile_cache.load(path, KEY)
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


def test_the_jit_cache_travels_in_the_file_and_fills_only_an_empty_folder(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the checkout the file is made in
    made_here = tmp_path / "a" / ".accelbench" / "cuda-jit-cache"
    files = _jit_folder(made_here)
    path = tmp_path / "gpu.bin"
    compile_cache.save(path, None, jit=made_here)
    assert _header(path)["jit"]["files"] == 2 and _header(path)["format"] == compile_cache.FORMAT
    assert compile_cache.load(path, KEY) == compile_cache.Loaded()  # the artifacts part: none

    # a new checkout at the same path, whose folder does not exist yet: filled, file for file
    there = tmp_path / "b" / ".accelbench" / "cuda-jit-cache"
    line = compile_cache.restore_jit(path, there)
    assert line == f"CUDA JIT cache: 2 files from {path} into {there}"
    assert _contents(there) == files
    assert not list(there.parent.glob(".cuda-jit-cache.*"))  # no staging folder left

    # an empty folder (the driver made it, then built nothing) is filled too; in a checkout
    # at another path, the line says why the first epoch still builds cuDNN's engines
    empty = tmp_path / "c" / "cuda-jit-cache"
    empty.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "c")
    line = compile_cache.restore_jit(path, empty)
    assert line.endswith("made in a checkout at another path, so cuDNN's engines are built again")
    assert _contents(empty) == files

    # a folder with this machine's own entries is never touched
    own = _jit_folder(tmp_path / "d", {"index": b"ours", "f/8/ab97849d3aedd4": b"mine"})
    assert compile_cache.restore_jit(path, tmp_path / "d") is None
    assert _contents(tmp_path / "d") == own

    # nothing to restore: no file, a file without a JIT cache, no folder of ours
    assert compile_cache.restore_jit(tmp_path / "missing.bin", tmp_path / "e") is None
    compile_cache.save(tmp_path / "cpu.bin", None)
    assert _header(tmp_path / "cpu.bin")["jit"] is None
    assert compile_cache.restore_jit(tmp_path / "cpu.bin", tmp_path / "e") is None
    assert compile_cache.restore_jit(path, None) is None
    assert not (tmp_path / "e").exists()


def test_a_jit_cache_too_large_to_carry_is_left_out(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "jit"
    _jit_folder(folder)
    monkeypatch.setattr(compile_cache, "JIT_LIMIT_BYTES", 1000)
    compile_cache.save(tmp_path / "gpu.bin", None, jit=folder)
    assert _header(tmp_path / "gpu.bin")["jit"] is None


def test_a_version_1_file_without_a_jit_cache_still_loads(tmp_path) -> None:
    path = tmp_path / "gpu.bin"
    header = {"format": "accelbench-compile-cache/1", "key": vars(KEY), "artifacts": 3, "bytes": 5}
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"bytes")
    here = replace(KEY, device="NVIDIA H100 80GB HBM3")
    assert "was made for another set-up" in compile_cache.load(path, here).reason  # read
    assert compile_cache.restore_jit(path, tmp_path / "jit") is None


def test_a_jit_cache_that_would_write_outside_its_folder_is_not_restored(tmp_path) -> None:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        entry = tarfile.TarInfo("../../outside")
        entry.size = 4
        tar.addfile(entry, io.BytesIO(b"evil"))
    packed = packed.getvalue()
    path = tmp_path / "gpu.bin"
    header = {
        "format": compile_cache.FORMAT,
        "key": None,
        "artifacts": 0,
        "bytes": 0,
        "jit": {"files": 1, "bytes": len(packed)},
    }
    path.write_bytes(json.dumps(header).encode() + b"\n" + packed)
    folder = tmp_path / "w" / ".accelbench" / "cuda-jit-cache"
    line = compile_cache.restore_jit(path, folder)
    assert line is not None and "not restored" in line and "the driver builds it again" in line
    assert not (tmp_path / "outside").exists() and not (tmp_path / "w" / "outside").exists()
    assert not folder.exists() and not list(folder.parent.glob(".cuda-jit-cache.*"))


def test_only_the_workspaces_own_jit_cache_is_carried(tmp_path) -> None:
    inside = {"CUDA_CACHE_PATH": ".accelbench/cuda-jit-cache"}
    assert compile_cache.jit_folder(tmp_path, inside) == (
        tmp_path.resolve() / ".accelbench" / "cuda-jit-cache"
    )
    absolute = {"CUDA_CACHE_PATH": str(tmp_path / ".accelbench" / "cuda-jit-cache")}
    assert compile_cache.jit_folder(tmp_path, absolute) is not None
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
    carries them, and a fresh checkout at the same path starts with them."""
    import shutil

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    variant = {"device": "cuda", "precision": "fp32", "channels_last": True,
               "cudnn_benchmark": True}  # fmt: skip
    workspace = tmp_path / "w"
    cache_file = workspace / "compile-cache" / "compiled.bin"
    cache_file.parent.mkdir(parents=True)
    _, log = _train(workspace, prepared, mlflow_store, cache_file, variant)
    jit = _header(cache_file)["jit"]
    if jit is None:
        pytest.skip(f"the driver built nothing from PTX for {torch.cuda.get_device_name()}")
    carried = _contents(workspace / ".accelbench" / "cuda-jit-cache")
    assert jit["files"] <= len(carried)

    shutil.rmtree(workspace / ".accelbench")  # a new checkout there: only the file came along
    _, log = _train(workspace, prepared, mlflow_store, cache_file, variant)
    assert f"CUDA JIT cache: {jit['files']} files from {cache_file}" in log, log


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
