"""cli.py: bad params fail before any work; SIGTERM unwinds like Ctrl-C; stages by name."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time

from accelbench.cli import main
from helpers import REPO, cpu_train_command, mlflow_runs, write_params


def test_sigterm_marks_the_run_killed_and_writes_no_outputs(
    tmp_path, prepared, mlflow_store
) -> None:
    command = cpu_train_command(tmp_path, prepared, epochs=200)
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(r.info.status == "RUNNING" for r in mlflow_runs(mlflow_store, "cpu")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.5)
    time.sleep(2)  # inside training
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted (signal SIGTERM)" in stderr
    [run] = mlflow_runs(mlflow_store, "cpu")
    assert run.info.status == "KILLED"
    assert not (tmp_path / "cpu.pt").exists()
    assert not (tmp_path / "metrics" / "train.json").exists()


def test_cli_rejects_bad_params_before_any_work(tmp_path, capsys) -> None:
    path = write_params(tmp_path, batch_size=0)
    assert main(["--params", str(path), "download", "--out", str(tmp_path / "raw")]) == 2
    assert "train.batch_size = 0" in capsys.readouterr().err
    assert not (tmp_path / "raw").exists()


def test_a_stage_error_exits_2_naming_the_stage(tmp_path, fake_mnist, capsys) -> None:
    mirror, _ = fake_mnist
    images_magic = (2051).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes(1)
    (mirror / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(images_magic))
    args = ["--params", str(REPO / "params.yaml"), "prepare", "--raw", str(mirror)]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelbench prepare: error: ") and "magic number 2051" in err


def test_the_cli_imports_no_stage_but_the_one_it_runs() -> None:
    """A stage's code is its module's imports: dvc.yaml's deps rely on it."""
    probe = (
        "import sys, accelbench.cli; "
        "print([m for m in sys.modules if m.startswith('accelbench.stages.')])"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
