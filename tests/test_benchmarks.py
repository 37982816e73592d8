"""benchmarks/variants.py and benchmarks/step_options.py, run as docs/development.md gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, load_script, write_params

CPU = {"device": "cpu", "threads": 1}
BENCHMARKS = REPO / "benchmarks"


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


@pytest.mark.slow
def test_variants_benchmark_prints_a_row_per_variant(tmp_path, prepared) -> None:
    params = write_params(tmp_path, {"cpu": CPU, "gpu": {"device": "cuda"}}, batch_size=64)
    result = _run("variants.py", "--params", str(params), "--data", str(prepared),
                  "--epochs", "2", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["variant", "device"]
    assert lines[1].startswith("cpu ") and "%" in lines[1]
    assert lines[2].startswith("gpu ")
    assert ("skipped" in lines[2]) == (not torch.cuda.is_available())


def _step_options():
    """benchmarks/step_options.py as a module (the benchmarks are scripts, not a package)."""
    return load_script(BENCHMARKS / "step_options.py")


@pytest.mark.slow
def test_step_options_times_each_candidate_in_its_own_process(tmp_path, prepared) -> None:
    params = write_params(tmp_path, {"cpu": CPU, "gpu": {"device": "cuda"}}, batch_size=64)
    common = ("--params", str(params), "--data", str(prepared), "--epochs", "2")
    candidates = ["cpu:base", "cpu:poolfirst"] + ([] if torch.cuda.is_available() else ["gpu"])
    result = _run("step_options.py", *candidates, *common, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {r["candidate"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert list(rows) == candidates
    for name in ("cpu:base", "cpu:poolfirst"):
        row = rows[name]
        assert len(row["epoch_s"]) == 2 and row["steady_epoch_s"] == row["epoch_s"][1]
        assert row["device"] and row["train_loss"][1] < row["train_loss"][0]
    # the same function, the same seed: max-pool before the ReLU trains like after it
    losses = zip(rows["cpu:base"]["train_loss"], rows["cpu:poolfirst"]["train_loss"], strict=True)
    for first, pooled in losses:
        assert abs(first - pooled) < 1e-3 * first
    if "gpu" in rows:
        assert "needs CUDA" in rows["gpu"]["skipped"]  # placement's reason, as a stage skips


def test_step_options_taps_and_mmgrad_are_the_convolution() -> None:
    torch.manual_seed(0)
    conv, images = torch.nn.Conv2d(1, 32, 3), torch.randn(4, 1, 28, 28)
    for option in (_step_options().conv2d_taps, _step_options().conv2d_taps_mm_grad):
        weight = conv.weight.detach().clone().requires_grad_()
        got = option(images, weight, conv.bias)
        torch.testing.assert_close(got, conv(images))
        got.sum().backward()
        expected = torch.autograd.grad(conv(images).sum(), conv.weight)[0]
        torch.testing.assert_close(weight.grad, expected, rtol=1e-4, atol=1e-4)


def test_step_options_refuses_a_bad_candidate_before_running_any(tmp_path, prepared) -> None:
    gpu = {"device": "cuda", "compile": "default", "kernel_autotune": False}
    params = write_params(
        tmp_path, {"cpu": CPU, "gpu": gpu, "ddp": {"device": "cpu", "distributed": {}}}
    )
    common = ("--params", str(params), "--data", str(prepared))
    known = ", ".join(_step_options().OPTIONS)
    for bad, named in (
        ("cpu:turbo", f"['turbo']; known: {known}"),
        ("tpu:base", "no variant 'tpu' (params: cpu, ddp, gpu)"),
        ("ddp:base", "a DDP variant (time it with benchmarks/scaling.py)"),
        ("cpu:bench+nobench", "bench and nobench contradict each other; name one"),
        ("cpu:nobench", "cpu already has {'cudnn_benchmark': False}, so nobench changes nothing"),
        ("cpu:bench", "['bench'] set cuDNN, which a cpu variant skips"),
        ("cpu:taps+cdt", "['cdt', 'taps'] change torch.compile, which cpu skips"),
        ("gpu:limit2", "limit2 needs cuDNN's benchmark; add bench"),
        ("gpu:autotune+pwtune", "pwtune tunes compile: default only, not max-autotune-no-cud"),
    ):
        result = _run("step_options.py", "cpu:base", bad, *common, cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == ""  # nothing ran
        assert named in result.stderr


def _slow(*case):
    """variants.py imports torch before it refuses: seconds a case, so the full tier only."""
    return pytest.param(*case, marks=pytest.mark.slow)


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        _slow("variants.py", ["nosuch"], "unknown variant 'nosuch'"),
        _slow("variants.py", ["cpu", "--set", "train.epochz=1"], "train.epochz: unknown key"),
        _slow("variants.py", ["cpu", "--data", "missing"], "missing: no such folder"),
        ("scaling.py", ["--only", "nosuch"], "--only nosuch: not a candidate"),
        _slow("variants.py", ["cpu", "nosuch"], "unknown variant 'nosuch'"),  # before cpu trains
        _slow("variants.py", ["--params", "missing.yaml"], "missing.yaml"),
    ],
)
def test_a_benchmark_refuses_bad_input_in_one_line(tmp_path, script, args, message) -> None:
    """They ended in tracebacks (scaling.py's --only after starting a training) where
    `accelbench` prints one line."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, *(
            ["--out", str(tmp_path / "out")] if script == "scaling.py" else [])],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script}: error: ") and message in line, line
    assert not (tmp_path / "out").exists()
