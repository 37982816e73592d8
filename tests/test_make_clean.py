"""`make clean` removes pipeline outputs and nothing of the run history, nor what a user commits
after a run (dvc.lock, compare's DVC metrics and plot data); `make clean-history` removes the
run history, and never the code, the environment or the params."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from helpers import REPO

OUTPUTS = [
    "data/raw/train-images-idx3-ubyte.gz",
    "data/prepared/train_images.npy",
    "models/cpu.pt",
    "metrics/cpu/train.json",
    "reports/comparison.md",
    "reports/summary.png",
    "env/cpu.json",
    "checkpoints/cpu.pt",
]
HISTORY = [
    "mlflow.db",
    "mlflow.db.lock",  # the lock beside a store named by a sqlite:/// URI
    "mlartifacts/1/abc/artifacts/eval.json",
    "mlruns/0/meta.yaml",
    ".accelbench/pipeline-run",
    "compile-cache/gpu.bin",
    ".dvc/cache/files/md5/ab/cdef",
    ".dvc/tmp/exps/celery/broker/in/x.msg",
]
KEPT = [".venv/bin/python", "params.yaml", "dvc.yaml", "src/accelbench/cli.py", ".dvc/config"]
COMMITTED = ["dvc.lock", "reports/metrics/cpu.json", "reports/plots/epochs.csv"]


def _make(checkout: Path, target: str) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _present(checkout: Path, names: list[str]) -> list[str]:
    return [name for name in names if (checkout / name).exists()]


def test_clean_keeps_the_run_history_and_clean_history_removes_it(tmp_path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy2(REPO / "Makefile", checkout / "Makefile")
    for name in OUTPUTS + HISTORY + KEPT + COMMITTED:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x\n")

    _make(checkout, "clean")
    assert _present(checkout, OUTPUTS) == []
    assert _present(checkout, HISTORY + KEPT + COMMITTED) == HISTORY + KEPT + COMMITTED

    _make(checkout, "clean-history")
    assert _present(checkout, HISTORY) == []
    assert _present(checkout, KEPT + COMMITTED) == KEPT + COMMITTED


def test_make_help_says_which_target_deletes_the_history() -> None:
    listing = _make(REPO, "help")
    clean = next(line for line in listing.splitlines() if line.split()[:2] == ["make", "clean"])
    history = next(line for line in listing.splitlines() if "clean-history" in line)
    assert "keeps the run history" in clean
    assert "DELETE" in history and "MLflow" in history and "DVC cache" in history
