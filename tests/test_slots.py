"""system/slots.py: trainings side by side on one host take different GPUs, one at a time the
CPU, wait (bounded) for what is taken, and say what else ran while they were measured.

No GPU here: CUDA_VISIBLE_DEVICES lists fake ones, which is all the locks look at."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelbench.core.console import StageError
from accelbench.core.params import VariantParams
from accelbench.core.results import TrainSummary, read_train
from accelbench.report import markdown
from accelbench.report.answer import SHARED_MARK, Row, variant_figures
from accelbench.system import slots
from helpers import train_command, write_params

# A training's share of the host, as `accelbench train` takes it, in a process of its own:
# prints CUDA_VISIBLE_DEVICES once it holds its GPU, lets go at a line on stdin.
WORKER = textwrap.dedent(
    """
    import os, sys
    from accelbench.system import slots
    with slots.tenancy(sys.argv[1], gpus=1):
        print(os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
        sys.stdin.readline()
    """
)


def _environ(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"ACCELBENCH_SLOTS_DIR": str(tmp_path / "locks"), **more}


def _worker(tmp_path: Path, name: str, gpus: str) -> subprocess.Popen:
    env = {**os.environ, **_environ(tmp_path, CUDA_VISIBLE_DEVICES=gpus)}
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, name],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _line(stream, timeout_s: float = 20.0, containing: str = "") -> str:
    """The next line of `stream` (that contains `containing`), within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], deadline - time.monotonic())
        if ready:
            line = stream.readline()
            if not line:
                break
            if containing in line:
                return line.strip()
    pytest.fail(f"no line with {containing!r} within {timeout_s} s")


def _quiet(stream, seconds: float) -> bool:
    ready, _, _ = select.select([stream], [], [], seconds)
    return not ready


def test_workers_take_different_gpus_wait_for_a_freed_one_and_a_killed_one(tmp_path) -> None:
    a, b = _worker(tmp_path, "a", "0,1"), _worker(tmp_path, "b", "0,1")
    workers = [a, b]
    try:
        taken = {a: _line(a.stdout), b: _line(b.stdout)}
        assert sorted(taken.values()) == ["0", "1"]  # each its own GPU, narrowed to it

        c = _worker(tmp_path, "c", "0,1")
        workers.append(c)
        waiting = _line(c.stderr, containing="waiting")
        assert waiting.startswith("train c: waiting for a free GPU among 0,1 (up to 3600 s")
        assert f"train@a on GPU {taken[a]} (pid {a.pid}," in waiting
        assert f"train@b on GPU {taken[b]} (pid {b.pid}," in waiting
        assert _quiet(c.stdout, 0.5)  # still waiting: never shares

        a.communicate("\n", timeout=20)  # the holder ends: its GPU goes to the waiter
        assert _line(c.stdout) == taken[a]

        d = _worker(tmp_path, "d", "0,1")
        workers.append(d)
        _line(d.stderr, containing="waiting")
        b.send_signal(signal.SIGKILL)  # no unwinding: the kernel lets the lock go
        b.wait(timeout=20)
        assert _line(d.stdout) == taken[b]
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate()


def test_the_wait_is_bounded_and_names_who_holds_the_gpus(tmp_path, capsys) -> None:
    first = _environ(tmp_path, CUDA_VISIBLE_DEVICES="3")
    second = _environ(tmp_path, CUDA_VISIBLE_DEVICES="3", ACCELBENCH_SLOT_WAIT_S="0.3")
    with slots.tenancy("first", gpus=1, environ=first):
        started = time.monotonic()
        with (
            pytest.raises(StageError) as refused,
            slots.tenancy("second", gpus=1, environ=second),
        ):
            pytest.fail("shared a taken GPU")
        assert 0.3 <= time.monotonic() - started < 3
    assert str(refused.value) == (
        f"train second: waited 0.3 s for a free GPU among 3, still taken by train@first on "
        f"GPU 3 (pid {os.getpid()}, {os.getcwd()}); wait for that training to finish or stop "
        "it, or set ACCELBENCH_SLOT_WAIT_S to wait longer"
    )
    assert "train second: waiting for a free GPU among 3 (up to 0.3 s" in capsys.readouterr().err
    with pytest.raises(Exception, match=r"ACCELBENCH_SLOT_WAIT_S='soon': expected the seconds"):
        slots.wait_limit({"ACCELBENCH_SLOT_WAIT_S": "soon"})


def test_what_a_training_takes_and_gives_back(tmp_path, monkeypatch) -> None:
    environ = _environ(tmp_path, CUDA_VISIBLE_DEVICES="4,5,6")
    with slots.tenancy("ddp", gpus=2, environ=environ) as held:
        assert environ["CUDA_VISIBLE_DEVICES"] == "4,5" and len(held.fds) == 2
        holder = json.loads((tmp_path / "locks" / "gpu-5.lock").read_text())
        assert holder == {
            "stage": "train@ddp",
            "holds": "GPUs 4,5",
            "pid": os.getpid(),
            "workdir": os.getcwd(),
        }
    assert environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"  # as it was
    assert (tmp_path / "locks" / "gpu-5.lock").read_text() == ""  # a free lock names no one

    with slots.tenancy("skipped", gpus=0, environ=environ) as held:  # needs nothing
        assert held.fds == () and held.note() is None
    few = _environ(tmp_path, CUDA_VISIBLE_DEVICES="0")
    with slots.tenancy("ddp", gpus=2, environ=few) as held:  # placement skips or refuses it
        assert held.fds == () and few["CUDA_VISIBLE_DEVICES"] == "0"
    monkeypatch.setenv("LOCAL_RANK", "1")  # a torchrun worker: its launcher holds them
    with slots.tenancy("ddp", gpus=2, environ=environ) as held:
        assert held.fds == () and environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"


def test_the_note_names_trainings_seen_at_the_start_or_during(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slots, "SAMPLE_S", 0.02)
    monkeypatch.setattr(slots, "cpu_seconds", lambda: (0.0, 0.0))  # this host, idle otherwise
    cwd = os.getcwd()
    gpu0, gpu1 = (_environ(tmp_path, CUDA_VISIBLE_DEVICES=gpu) for gpu in "01")
    with (
        slots.tenancy("gpu", gpus=1, environ=gpu0),
        slots.tenancy("cpu", cpu=True, environ=_environ(tmp_path)) as cpu,
    ):
        with slots.tenancy("amp", gpus=1, environ=gpu1):
            time.sleep(0.2)  # started and ended during the cpu training
        note = cpu.note()
    assert note == (
        f"2 other accelbench trainings on this host: train@gpu on GPU 0 (pid {os.getpid()}, "
        f"{cwd}), train@amp on GPU 1 (pid {os.getpid()}, {cwd})"
    )
    with slots.tenancy("alone", cpu=True, environ=_environ(tmp_path)) as alone:
        assert alone.note() is None


def test_other_processes_cpu_use_is_noted_from_half_a_cpu() -> None:
    holder = slots.Holder("train@gpu", "GPU 0", 42, "/exp")
    assert slots.sharing_note([], 0.4, 16) is None
    assert slots.sharing_note([], 0.5, 16) == "other processes kept 0.5 of 16 CPUs busy on average"
    assert slots.sharing_note([holder], 3.25, 16) == (
        "another accelbench training on this host: train@gpu on GPU 0 (pid 42, /exp); "
        "other processes kept 3.2 of 16 CPUs busy on average"
    )


def test_cpu_trainings_take_turns_and_the_report_notes_a_shared_one(
    tmp_path, prepared, mlflow_store
) -> None:
    """Two `accelbench train` of CPU variants at once: one waits for the other; both trained
    while a GPU training held GPU 7, which their train.json and the report say."""
    gpu = _worker(tmp_path, "gpu7", "7")
    try:
        assert _line(gpu.stdout) == "7"
        params = write_params(tmp_path, {"cpu": {"device": "cpu", "threads": 1}}, epochs=2)
        env = {**os.environ, **_environ(tmp_path), "MLFLOW_TRACKING_URI": mlflow_store}
        runs = {}
        for run in ("one", "two"):
            out = tmp_path / run
            command = train_command(params, "cpu", prepared, out / "cpu.pt", out / "metrics")
            runs[run] = subprocess.Popen(
                command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
            )
        errors = {run: process.communicate(timeout=120)[1] for run, process in runs.items()}
    finally:
        gpu.kill()
        gpu.communicate()
    assert all(p.returncode == 0 for p in runs.values()), errors
    waited = [run for run, err in errors.items() if "train cpu: waiting for the CPU" in err]
    assert len(waited) == 1, errors
    other = runs["one" if waited == ["two"] else "two"]
    assert (
        f"taken by train@cpu on the CPU (pid {other.pid}, {tmp_path}); CPU trainings on a "
        "host take turns"
    ) in errors[waited[0]]
    assert "train cpu: got the CPU after" in errors[waited[0]]

    summaries = {run: read_train(tmp_path / run / "metrics" / "train.json") for run in runs}
    for summary in summaries.values():
        assert isinstance(summary, TrainSummary)
        assert f"train@gpu7 on GPU 7 (pid {gpu.pid}, " in summary.shared_machine
        assert "train@cpu" not in summary.shared_machine  # they took turns

    row = Row("cpu", VariantParams(device="cpu", threads=1), summaries["one"])
    spec = markdown.ReportSpec(0.5, None, {}, "test recipe")
    table = markdown._answer_table([row], variant_figures([row], None, 0.5), spec)
    assert table[2].startswith(f"| **cpu** {SHARED_MARK} |")
    assert table[-2].startswith(f"{SHARED_MARK}: measured while other work ran on the machine")
    assert table[-1] == f"- cpu: {summaries['one'].shared_machine}."


def test_a_train_json_without_the_field_reads_as_not_shared(tmp_path) -> None:
    from helpers import trained_summary

    payload = trained_summary(0.5).to_json()
    del payload["shared_machine"]  # written before the field existed
    path = tmp_path / "train.json"
    path.write_text(json.dumps(payload))
    assert read_train(path).shared_machine is None
