"""system/slots.py: trainings side by side on one host take different GPUs, one at a time the
CPU, wait (bounded) for what is taken, and say what else ran while they were measured; the
evaluate and quantize stages take what their timed inference runs on the same way.

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
import torch

from accelbench.core.console import StageError
from accelbench.core.outputs import MetricsFiles
from accelbench.core.params import VariantParams
from accelbench.core.results import (
    EvalResult,
    EvalSummary,
    ModelFile,
    QuantizedResult,
    QuantizedSummary,
    Skipped,
    TrainResult,
    TrainSummary,
    read,
)
from accelbench.report import markdown
from accelbench.report.answer import SHARED_MARK, Row, variant_figures
from accelbench.stages import evaluate, quantize, train
from accelbench.system import slots
from helpers import SMALL, small_params, train_command, write_params

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
# Another experiment's CPU training, holding the host's CPU turn until a line on stdin.
CPU_WORKER = textwrap.dedent(
    """
    import sys
    from accelbench.system import slots
    with slots.tenancy(sys.argv[1], cpu=True):
        print("the CPU", flush=True)
        sys.stdin.readline()
    """
)


def _environ(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"ACCELBENCH_SLOTS_DIR": str(tmp_path / "locks"), **more}


def _worker(tmp_path: Path, name: str, gpus: str, script: str = WORKER) -> subprocess.Popen:
    env = {**os.environ, **_environ(tmp_path, CUDA_VISIBLE_DEVICES=gpus)}
    return subprocess.Popen(
        [sys.executable, "-c", script, name],
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
        assert waiting.startswith("train c: waiting for a free GPU among 0,1 (up to 120 s")
        assert f"train@a on GPU {taken[a]} (pid {a.pid})" in waiting
        assert f"train@b on GPU {taken[b]} (pid {b.pid})" in waiting
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


def test_the_wait_is_bounded_and_names_who_holds_the_gpus(tmp_path, capsys, monkeypatch) -> None:
    first = _environ(tmp_path, CUDA_VISIBLE_DEVICES="3")
    second = _environ(tmp_path, CUDA_VISIBLE_DEVICES="3", ACCELBENCH_SLOT_WAIT_S="0.3")
    here = os.getcwd()
    monkeypatch.chdir(tmp_path)  # the holder works in another checkout
    with slots.tenancy("first", gpus=1, environ=first):
        monkeypatch.chdir(here)
        started = time.monotonic()
        with (
            pytest.raises(StageError) as refused,
            slots.tenancy("second", gpus=1, environ=second),
        ):
            pytest.fail("shared a taken GPU")
        assert 0.3 <= time.monotonic() - started < 3
    assert str(refused.value) == (
        "train second: waited 0.3 s for a free GPU among 3, still taken by another checkout's "
        f"train@first on GPU 3 (pid {os.getpid()}); wait for it to finish or stop it, or set "
        "ACCELBENCH_SLOT_WAIT_S to wait longer"
    )  # its stage and pid, not its path: another user's, maybe
    assert slots.wait_limit({}) == 120  # a short default: a user learns soon who holds it
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


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_a_planted_lock_file_is_refused_and_what_it_points_at_untouched(tmp_path, plant) -> None:
    """In a shared slots folder another user could plant `cpu.lock` as a link to a file of
    this user's: the stage must neither empty it, write its holder line into it nor make it
    world-writable, and must say what to do."""
    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    victim.chmod(0o600)
    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / slots.CPU_SLOT
    if plant == "symlink":
        lock.symlink_to(victim)
    elif plant == "hardlink":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)
    refused = r"cpu\.lock: .*remove it, or set ACCELBENCH_SLOTS_DIR"
    with (
        pytest.raises(StageError, match=refused),
        slots.tenancy("cpu", cpu=True, environ=_environ(tmp_path)),
    ):
        pass
    assert victim.read_text() == "my notes\n"
    assert victim.stat().st_mode & 0o777 == 0o600


def test_the_note_names_trainings_seen_at_the_start_or_during(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(slots, "SAMPLE_S", 0.02)
    monkeypatch.setattr(slots, "cpu_seconds", lambda: (0.0, 0.0))  # this host, idle otherwise
    gpu0, gpu1 = (_environ(tmp_path, CUDA_VISIBLE_DEVICES=gpu) for gpu in "01")
    with (
        slots.tenancy("gpu", gpus=1, environ=gpu0),
        slots.tenancy("cpu", cpu=True, environ=_environ(tmp_path)) as cpu,
    ):
        with slots.tenancy("amp", gpus=1, environ=gpu1):
            time.sleep(0.2)  # started and ended during the cpu training
        note = cpu.note()
    assert note == (
        f"2 other accelbench trainings on this host: train@gpu on GPU 0 (pid {os.getpid()}), "
        f"train@amp on GPU 1 (pid {os.getpid()})"
    )
    with slots.tenancy("alone", cpu=True, environ=_environ(tmp_path)) as alone:
        assert alone.note() is None


def test_other_processes_cpu_use_is_noted_from_half_a_cpu() -> None:
    holder = slots.Holder("train@gpu", "GPU 0", 42, "/exp")
    assert slots.sharing_note([], 0.4, 16) is None
    assert slots.sharing_note([], 0.5, 16) == "other processes kept 0.5 of 16 CPUs busy on average"
    assert slots.sharing_note([holder], 3.25, 16) == (
        "another accelbench training on this host: train@gpu on GPU 0 (pid 42); "
        "other processes kept 3.2 of 16 CPUs busy on average"
    )


@pytest.mark.slow
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
        f"taken by train@cpu on the CPU (pid {other.pid}); stages timed on the "
        "CPU take turns on a host"
    ) in errors[waited[0]]
    assert "train cpu: got the CPU after" in errors[waited[0]]

    summaries = {run: read(TrainResult, tmp_path / run / "metrics" / "train.json") for run in runs}
    for summary in summaries.values():
        assert isinstance(summary, TrainSummary)
        assert f"train@gpu7 on GPU 7 (pid {gpu.pid})" in summary.shared_machine
        assert "train@cpu" not in summary.shared_machine  # they took turns

    row = Row("cpu", VariantParams(device="cpu", threads=1), summaries["one"])
    spec = markdown.ReportSpec(0.5, None, {}, "test recipe")
    table = markdown._answer_table([row], variant_figures([row], None, 0.5), spec)
    assert table[2].startswith(f"| **cpu** {SHARED_MARK} |")
    said = f"{SHARED_MARK}: measured while other work ran on the machine"
    at = next(n for n, line in enumerate(table) if line.startswith(said))
    assert table[at + 1] == f"- cpu: {summaries['one'].shared_machine}."


def test_a_train_json_without_the_field_reads_as_not_shared(tmp_path) -> None:
    from helpers import trained_summary

    payload = trained_summary(0.5).to_json()
    del payload["shared_machine"]  # written before the field existed
    path = tmp_path / "train.json"
    path.write_text(json.dumps(payload))
    assert read(TrainResult, path).shared_machine is None


# --- evaluate and quantize take what their timed inference runs on -------------------------


def _stage_command(params: Path, stage: str, model: Path, prepared: Path, metrics: Path):
    """`accelbench evaluate|quantize` as dvc.yaml runs it, in this interpreter."""
    return [
        sys.executable, "-m", "accelbench.cli", "--params", str(params), stage,
        "--model", str(model), "--data", str(prepared), "--metrics", str(metrics),
    ]  # fmt: skip


def _trained_cpu(tmp_path: Path, prepared: Path) -> train.TrainOutputs:
    out = train.TrainOutputs(tmp_path / "cpu.pt", MetricsFiles(tmp_path / "trained"))
    params = small_params(epochs=1)
    train.run(tmp_path, "cpu", train.select(params, "cpu"), prepared, out, quiet=True)
    return out


@pytest.mark.slow
def test_evaluate_and_quantize_of_a_cpu_variant_wait_for_the_cpu_turn(
    tmp_path, prepared, monkeypatch
) -> None:
    """Another experiment's CPU training holds the host's CPU: `accelbench evaluate` and
    `accelbench quantize` of a CPU variant, started beside it, wait for it, then take turns
    with each other; each says the GPU training that ran beside it."""
    monkeypatch.setenv("ACCELBENCH_SLOTS_DIR", str(tmp_path / "locks"))
    model = _trained_cpu(tmp_path, prepared).model
    params = write_params(tmp_path, None, **SMALL)
    hog, gpu = _worker(tmp_path, "hog", "", CPU_WORKER), _worker(tmp_path, "gpu7", "7")
    workers, stages = [hog, gpu], {}
    try:
        assert _line(hog.stdout) == "the CPU" and _line(gpu.stdout) == "7"
        for stage in ("evaluate", "quantize"):
            command = _stage_command(params, stage, model, prepared, tmp_path / stage)
            stages[stage] = subprocess.Popen(
                command, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
            )
            workers.append(stages[stage])
        waiting = {stage: _line(p.stderr, 60, "waiting") for stage, p in stages.items()}
        for stage, line in waiting.items():
            assert line == (
                f"{stage} cpu: waiting for the CPU (up to 120 s, ACCELBENCH_SLOT_WAIT_S): "
                f"taken by another checkout's train@hog on the CPU (pid {hog.pid}); stages timed on "
                "the CPU take turns on a host"
            )
        assert not (tmp_path / "evaluate").exists() and not (tmp_path / "quantize").exists()
        hog.communicate("\n", timeout=20)  # the training ends: the CPU goes to one of them
        errors = {stage: p.communicate(timeout=180)[1] for stage, p in stages.items()}
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate()
    assert all(p.returncode == 0 for p in stages.values()), errors
    evaluated = read(EvalResult, tmp_path / "evaluate" / "eval.json")
    assert isinstance(evaluated, EvalSummary)
    assert f"train@gpu7 on GPU 7 (pid {gpu.pid})" in evaluated.shared_machine  # kept
    assert isinstance(
        read(QuantizedResult, tmp_path / "quantize" / "quantized.json"), QuantizedSummary
    )
    for stage, err in errors.items():
        assert f"{stage} cpu: got the CPU after" in err
        shared = _line_with(err, f"{stage} cpu: measured while the machine was shared: ")
        assert f"train@gpu7 on GPU 7 (pid {gpu.pid})" in shared
        assert "train@hog" not in shared and "@cpu on the CPU" not in shared  # took turns


def _line_with(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if line.startswith(start)]
    assert len(found) == 1, text
    return found[0]


@pytest.mark.slow
def test_the_wait_of_evaluate_and_quantize_is_bounded_as_a_trainings(
    tmp_path, prepared, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("ACCELBENCH_SLOTS_DIR", str(tmp_path / "locks"))
    out = _trained_cpu(tmp_path, prepared)
    hog = _worker(tmp_path, "hog", "", CPU_WORKER)
    try:
        assert _line(hog.stdout) == "the CPU"
        monkeypatch.setenv("ACCELBENCH_SLOT_WAIT_S", "0.3")
        files = MetricsFiles(tmp_path / "metrics")
        runs = {
            "evaluate": lambda: evaluate.run(
                evaluate.select(small_params()), out.model, prepared, files
            ),
            "quantize": lambda: quantize.run(
                tmp_path, quantize.select(small_params()), out.model, prepared, files
            ),
        }
        for stage, run in runs.items():
            started = time.monotonic()
            with pytest.raises(StageError) as refused:
                run()
            assert 0.3 <= time.monotonic() - started < 3
            assert str(refused.value) == (
                f"{stage} cpu: waited 0.3 s for the CPU, still taken by train@hog on the CPU "
                f"(pid {hog.pid}); wait for it to finish or stop it, or set "
                "ACCELBENCH_SLOT_WAIT_S to wait longer"
            )
        assert not files.folder.exists() or not any(files.folder.iterdir())  # nothing measured
        err = capsys.readouterr().err
        for stage in runs:
            assert f"{stage} cpu: waiting for the CPU (up to 0.3 s" in err

        # A skipped variant measures nothing: it takes nothing, and never waits.
        monkeypatch.setenv("ACCELBENCH_SLOT_WAIT_S", "0")
        ModelFile("gpu", "skipped", None, reason="no GPU here").save(tmp_path / "gpu.pt")
        skipped = Skipped("no GPU here")
        assert (
            evaluate.run(evaluate.select(small_params()), tmp_path / "gpu.pt", prepared, files)
            == skipped
        )
        inputs = quantize.select(small_params())
        assert quantize.run(tmp_path, inputs, tmp_path / "gpu.pt", prepared, files) == skipped
    finally:
        hog.kill()
        hog.communicate()


@pytest.mark.skipif(torch.cuda.is_available(), reason="evaluates on no GPU, on purpose")
def test_a_gpu_variants_evaluation_takes_one_gpu_ddp_too(
    tmp_path, prepared, monkeypatch, capsys
) -> None:
    """A DDP variant trained on 2 GPUs is evaluated in one process: it takes one free GPU,
    narrows CUDA_VISIBLE_DEVICES to it before CUDA starts (and back after), and waits, bounded,
    while every listed GPU is taken. (No GPU here: it is then refused, as without the lock.)"""
    monkeypatch.setenv("ACCELBENCH_SLOTS_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setenv("ACCELBENCH_SLOT_WAIT_S", "10")  # one waiting for 2 GPUs fails, not hangs
    variant = {"device": "cuda", "distributed": {"nproc_per_node": 2}}
    params = {"variant": {"name": "ddp", **variant}, "train": {}}
    ModelFile("ddp", "trained", None, params, {}).save(tmp_path / "ddp.pt")
    inputs, files = evaluate.select(small_params()), MetricsFiles(tmp_path / "metrics")
    seen = {}

    def evaluation_device(name, variant):  # as placement's, noting what it was left to see
        seen["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        seen["holder"] = json.loads((tmp_path / "locks" / "gpu-6.lock").read_text())
        return real(name, variant)

    real = evaluate.evaluation_device
    monkeypatch.setattr(evaluate, "evaluation_device", evaluation_device)
    first = _worker(tmp_path, "gpu", "5,6")
    workers = [first]
    try:
        assert _line(first.stdout) == "5"
        with pytest.raises(StageError, match="the model was trained on CUDA"):
            evaluate.run(inputs, tmp_path / "ddp.pt", prepared, files)
        assert seen["CUDA_VISIBLE_DEVICES"] == "6"  # the free one, alone
        assert seen["holder"] == {
            "stage": "evaluate@ddp",
            "holds": "GPU 6",
            "pid": os.getpid(),
            "workdir": os.getcwd(),
        }
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"  # as it was
        assert "evaluate ddp: takes GPU 6 (CUDA_VISIBLE_DEVICES=6)" in capsys.readouterr().err

        second = _worker(tmp_path, "amp", "5,6")
        workers.append(second)
        assert _line(second.stdout) == "6"
        monkeypatch.setenv("ACCELBENCH_SLOT_WAIT_S", "0.3")
        seen.clear()
        with pytest.raises(StageError) as refused:
            evaluate.run(inputs, tmp_path / "ddp.pt", prepared, files)
        assert str(refused.value).startswith(
            f"evaluate ddp: waited 0.3 s for a free GPU among 5,6, still taken by train@gpu on "
            f"GPU 5 (pid {first.pid})"
        )
        assert f"train@amp on GPU 6 (pid {second.pid})" in str(refused.value)
        assert seen == {}  # never got as far as the device
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate()


def test_a_training_notes_an_evaluation_beside_it(tmp_path, monkeypatch, capsys) -> None:
    """What evaluate or quantize holds, a training beside it sees, and the other way round."""
    monkeypatch.setattr(slots, "SAMPLE_S", 0.02)
    monkeypatch.setattr(slots, "cpu_seconds", lambda: (0.0, 0.0))  # this host, idle otherwise
    pid = os.getpid()
    with slots.tenancy("gpu", gpus=1, environ=_environ(tmp_path, CUDA_VISIBLE_DEVICES="0")) as gpu:
        with slots.tenancy("cpu", stage="quantize", cpu=True, environ=_environ(tmp_path)) as cpu:
            time.sleep(0.2)  # the training looks every SAMPLE_S
            assert cpu.shared() == (
                f"another accelbench training on this host: train@gpu on GPU 0 (pid {pid})"
            )
        assert gpu.note() == (
            f"another accelbench stage on this host: quantize@cpu on the CPU (pid {pid})"
        )
    assert capsys.readouterr().err.splitlines()[-1] == (
        "quantize cpu: measured while the machine was shared: another accelbench training on "
        f"this host: train@gpu on GPU 0 (pid {pid})"
    )
    with slots.tenancy("cpu", stage="evaluate", cpu=True, environ=_environ(tmp_path)) as alone:
        assert alone.shared() is None
    assert "measured while" not in capsys.readouterr().err
