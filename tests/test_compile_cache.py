"""torch.compile's portable cache: written by a compiled variant's training, loaded before the
next one compiles on a machine whose own caches are empty, refused (with one line) when it
was made under another key, and never in the way of a training."""

from __future__ import annotations

import json
import os
import subprocess
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


def _train(workspace, prepared, mlflow_store, cache_file):
    """`accelbench train compiled` in `workspace`, whose own compile caches
    (`.accelbench/compile-cache/`) start empty: another machine."""
    workspace.mkdir(exist_ok=True)
    params = write_params(workspace, {"compiled": COMPILED_CPU}, epochs=1, batch_size=128)
    command = [
        *train_command(params, "compiled", prepared, workspace / "m.pt", workspace / "metrics"),
        *("--compile-cache", str(cache_file)),
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
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
