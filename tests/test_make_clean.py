"""`make clean` removes pipeline outputs and nothing of the run history, nor what a user commits
after a run (dvc.lock, compare's DVC metrics and plot data); `make clean-history` removes the
run history, and never the code, the environment or the params, and only once a user said yes
at its prompt or YES=1 on its command line."""

from __future__ import annotations

import os
import pty
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


def _run_make(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=checkout,
        stdin=subprocess.DEVNULL,  # as in CI: no terminal to ask on
        capture_output=True,
        text=True,
        timeout=60,
    )


def _make(checkout: Path, *args: str) -> str:
    result = _run_make(checkout, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _make_at_a_terminal(checkout: Path, answer: str) -> tuple[int, str]:
    """`make clean-history` with a terminal as its stdin, answering its prompt: (exit status,
    what it printed on the terminal)."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "clean-history"],
            cwd=checkout,
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        os.write(controller, answer.encode() + b"\n")
        out, _ = process.communicate(timeout=60)
    finally:
        os.close(controller)
        os.close(terminal)
    return process.returncode, out


def _present(checkout: Path, names: list[str]) -> list[str]:
    return [name for name in names if (checkout / name).exists()]


def _checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy2(REPO / "Makefile", checkout / "Makefile")
    shutil.copy2(REPO / "uv.lock", checkout / "uv.lock")  # the Makefile reads uv's version there
    for name in OUTPUTS + HISTORY + KEPT + COMMITTED:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x\n")
    return checkout


def test_clean_keeps_the_run_history_and_clean_history_removes_it(tmp_path) -> None:
    checkout = _checkout(tmp_path)

    said = _make(checkout, "clean")
    assert _present(checkout, OUTPUTS) == []
    assert _present(checkout, HISTORY + KEPT + COMMITTED) == HISTORY + KEPT + COMMITTED
    assert "`dvc checkout` puts\nthe cached outputs back" in said  # how to get them back
    assert "remakes env/ alone" in said  # never cached: not put back

    said = _make(checkout, "clean-history", "YES=1")
    assert _present(checkout, HISTORY) == []
    assert _present(checkout, KEPT + COMMITTED) == KEPT + COMMITTED
    assert "mlflow.db" in said and ".dvc/cache" in said and "Deleted." in said
    assert "nothing to delete" in _make(checkout, "clean-history", "YES=1")


def test_clean_history_deletes_nothing_without_a_yes(tmp_path) -> None:
    checkout = _checkout(tmp_path)

    refused = _run_make(checkout, "clean-history")  # no terminal, no YES=1
    assert refused.returncode != 0
    assert "Nothing deleted" in refused.stderr and "make clean-history YES=1" in refused.stderr
    assert _present(checkout, HISTORY) == HISTORY

    for answer in ("", "n", "no thanks"):
        status, out = _make_at_a_terminal(checkout, answer)
        assert status == 0 and "Delete them? [y/N]" in out and "Nothing deleted." in out
        assert "mlartifacts" in out  # it listed what it would delete
        assert _present(checkout, HISTORY) == HISTORY

    status, out = _make_at_a_terminal(checkout, "y")
    assert status == 0 and "Deleted." in out
    assert _present(checkout, HISTORY) == []
    assert _present(checkout, KEPT + COMMITTED) == KEPT + COMMITTED


def test_make_help_says_which_target_deletes_the_history() -> None:
    listing = _make(REPO, "help")
    clean = next(line for line in listing.splitlines() if line.split()[:2] == ["make", "clean"])
    history = next(line for line in listing.splitlines() if "clean-history" in line)
    assert "keeps the run history" in clean
    assert "DELETE" in history and "MLflow" in history and "DVC cache" in history
