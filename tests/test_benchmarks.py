"""benchmarks/variants.py and benchmarks/step_options.py, run as the README gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from helpers import REPO, write_params

CPU = {"device": "cpu", "threads": 1}


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


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


def test_step_options_times_each_candidate_in_its_own_process(tmp_path, prepared) -> None:
    params = write_params(tmp_path, {"cpu": CPU}, batch_size=64)
    common = ("--params", str(params), "--data", str(prepared), "--epochs", "2")
    result = _run("step_options.py", "cpu:base", "cpu:poolfirst", *common, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["candidate"] for r in rows] == ["cpu:base", "cpu:poolfirst"]
    for row in rows:
        assert "error" not in row, row
        assert len(row["epoch_s"]) == 2 and row["steady_epoch_s"] == row["epoch_s"][1]
        assert row["device"] == "cpu" and row["train_loss"][1] < row["train_loss"][0]


def test_step_options_refuses_a_bad_candidate_before_running_any(tmp_path, prepared) -> None:
    params = write_params(tmp_path, {"cpu": CPU}, batch_size=64)
    common = ("--params", str(params), "--data", str(prepared))
    for bad, named in (
        ("cpu:turbo", "['turbo']; known: base, cdt, limit0, poolfirst, autotune"),
        ("tpu:base", "no variant 'tpu' (params: cpu)"),
    ):
        result = _run("step_options.py", "cpu:base", bad, *common, cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == ""  # nothing ran
        assert named in result.stderr
