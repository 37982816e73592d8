"""lifetime.py with real processes: a stage ends with the DVC that started it (directly, or
through DVC's `sh -c`; a DDP stage's torchrun and workers too), and a second train of a
variant that is training is refused. Every wait has a deadline: a hang fails the test."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch

from accelbench.core.console import InputError
from accelbench.system import lifetime
from helpers import mlflow_runs, train_command, write_params

CPU = {"cpu": {"device": "cpu", "threads": 1}}
DDP = {"ddp": {"device": "cpu", "distributed": {"nproc_per_node": 2, "backend": "gloo"}}}

# What DVC does with a stage's `cmd` (dvc/stage/run.py): `$SHELL -c CMD` (or /bin/sh; dash
# stays between DVC and the stage, bash execs the stage), with DVC_STAGE set. Named `dvc`,
# like the real entry point, so the stage finds it as its DVC.
FAKE_DVC = """\
import os, subprocess, sys
shell, command = sys.argv[1:]
env = {**os.environ, "DVC_STAGE": "train@cpu"}
sys.exit(subprocess.run([shell, "-c", command], env=env).returncode)
"""


@pytest.fixture
def leftovers() -> Iterator[list[psutil.Process]]:
    """Processes a failed test must not leave running: killed at teardown."""
    processes: list[psutil.Process] = []
    yield processes
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _until(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)


def _epochs_done(checkpoint: Path) -> int:
    try:
        return torch.load(checkpoint, weights_only=True)["state"]["epochs_done"]
    except Exception:  # not there yet, or being replaced
        return 0


def _env(mlflow_store: str) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store, "OMP_NUM_THREADS": "1"}
    for name in ("LOCAL_RANK", "DVC_STAGE", lifetime.PARENT_ENV):
        env.pop(name, None)
    return env


def _under_fake_dvc(tmp_path: Path, shell: str, command: list[str], env: dict, log: Path):
    fake = tmp_path / "bin" / "dvc"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_DVC)
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, str(fake), shell, shlex.join(command)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stage(dvc: subprocess.Popen, timeout_s: float = 60, marker: str = "accelbench.cli"):
    """The `accelbench train` process under the fake DVC (below its shell, if one stays)."""
    found: list[psutil.Process] = []

    def started() -> bool:
        assert dvc.poll() is None, "the fake dvc ended early"
        for child in psutil.Process(dvc.pid).children(recursive=True):
            try:
                if marker in child.cmdline():
                    found.append(child)
                    return True
            except psutil.Error:
                continue
        return False

    _until(started, "the train stage to start", timeout_s)
    return found[0]


# --- the lock ----------------------------------------------------------------------------------


def test_a_held_output_is_refused_naming_the_variant_pid_and_what_to_do(tmp_path) -> None:
    model = tmp_path / "models" / "cpu.pt"
    with lifetime.sole_writer("cpu", model, tmp_path / "checkpoints" / "cpu.pt"):
        assert (tmp_path / "models" / ".cpu.pt.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(InputError) as refused, lifetime.sole_writer("cpu", model):
            pass
    message = str(refused.value)
    assert f"variant 'cpu' is already being trained by process {os.getpid()}" in message
    assert f"kill {os.getpid()}" in message and "\n" not in message
    assert not list(tmp_path.rglob("*.lock"))  # removed as they are let go
    with lifetime.sole_writer("cpu", model):  # and free again
        pass


def test_a_lock_left_by_a_killed_process_never_blocks(tmp_path) -> None:
    model = tmp_path / "cpu.pt"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from accelbench.system import lifetime\n"
            "with lifetime.sole_writer('cpu', Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(model),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with (
            pytest.raises(InputError, match=f"by process {holder.pid}"),
            lifetime.sole_writer("cpu", model),
        ):
            pass
    finally:
        holder.kill()
        holder.wait(10)
    assert (tmp_path / ".cpu.pt.lock").exists()  # left behind by the kill, and harmless:
    with lifetime.sole_writer("cpu", model):
        assert (tmp_path / ".cpu.pt.lock").read_text() == f"{os.getpid()}\n"


@pytest.mark.slow
def test_a_second_train_of_a_training_variant_is_refused_and_the_first_finishes(
    tmp_path, prepared, mlflow_store, leftovers
) -> None:
    params = write_params(tmp_path, CPU, epochs=15, batch_size=64)
    env = _env(mlflow_store)

    def command(folder: str) -> list[str]:
        out = tmp_path / folder
        return train_command(params, "cpu", prepared, out / "cpu.pt", out / "metrics")

    first = subprocess.Popen(
        command("first"), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    leftovers.append(psutil.Process(first.pid))
    lock = tmp_path / "first" / ".cpu.pt.lock"
    _until(lambda: lock.exists() and lock.read_text() == f"{first.pid}\n", "the lock", 60)

    second = subprocess.run(
        command("first"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 2, second.stderr[-2000:]
    assert second.stderr.strip().splitlines() == [
        f"accelbench train: error: variant 'cpu' is already being trained by process "
        f"{first.pid} (lock {lock}); wait for it to finish or stop it (kill {first.pid}), "
        "then run again"
    ]
    assert first.poll() is None, "the refused train must leave the first one alone"

    output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output[-3000:]
    assert (tmp_path / "first" / "cpu.pt").is_file() and not lock.exists()
    assert [r.info.status for r in mlflow_runs(mlflow_store, "cpu")] == ["FINISHED"]


# --- ending with DVC ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "shell",
    [
        pytest.param("/bin/sh", id="sh-stays-between-watchdog"),
        pytest.param("bash", id="bash-execs-parent-death-signal"),
    ],
)
def test_killing_only_dvc_ends_the_training_and_a_rerun_resumes(
    tmp_path, prepared, mlflow_store, leftovers, shell
) -> None:
    params = write_params(tmp_path, CPU, epochs=15, batch_size=64)
    out = tmp_path / "run"
    checkpoint = out / "checkpoint.pt"
    command = train_command(params, "cpu", prepared, out / "cpu.pt", out / "metrics", checkpoint)
    log = tmp_path / "stage.log"
    dvc = _under_fake_dvc(tmp_path, shell, command, _env(mlflow_store), log)
    leftovers.append(psutil.Process(dvc.pid))
    stage = _stage(dvc)
    leftovers.append(stage)
    _until(lambda: _epochs_done(checkpoint) >= 1, "the first epoch's checkpoint", 120)

    dvc.send_signal(signal.SIGKILL)  # DVC alone: its shell and the stage live on
    dvc.wait(10)
    killed = time.monotonic()
    _, alive = psutil.wait_procs([stage], timeout=15)
    assert not alive, f"the train stage outlived DVC:\n{log.read_text()[-2000:]}"
    assert time.monotonic() - killed < 15

    stage_log = log.read_text()
    assert "accelbench train: interrupted (signal SIGTERM)" in stage_log, stage_log[-2000:]
    # one watchdog, one SIGTERM: a second one cut the clean-up short (the run stayed RUNNING)
    assert stage_log.count("is gone; stopping") <= 1, stage_log[-2000:]
    assert 1 <= _epochs_done(checkpoint) < 15  # the last finished epoch, kept
    assert not (out / "cpu.pt").exists() and not (out / ".cpu.pt.lock").exists()
    statuses = [r.info.status for r in mlflow_runs(mlflow_store, "cpu")]
    assert statuses == ["KILLED"], stage_log[-2000:]

    rerun = subprocess.run(
        command, cwd=tmp_path, env=_env(mlflow_store), capture_output=True, text=True, timeout=180
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming after epoch" in rerun.stderr
    assert len((out / "metrics" / "epochs.csv").read_text().splitlines()) == 1 + 15
    assert [r.info.status for r in mlflow_runs(mlflow_store, "cpu")] == ["FINISHED"]


# A stage whose unwinding will not end: an exit handler that takes a minute (a tracking
# server that stopped answering, say).
SLOW_EXIT = "import atexit, runpy, time; atexit.register(time.sleep, 60); "
SLOW_EXIT += "runpy.run_module('accelbench.cli', run_name='__main__')"


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_a_stage_ends_within_its_bound_once_dvc_is_killed(
    tmp_path, prepared, mlflow_store, leftovers, shell
) -> None:
    """`kill <dvc pid>`: the stage was still running 2 s later (a watchdog polling every
    0.5 s, then an unwinding without a bound)."""
    params = write_params(tmp_path, CPU, epochs=500, batch_size=64)
    out = tmp_path / "run"
    python, _, _, *args = train_command(params, "cpu", prepared, out / "cpu.pt", out / "metrics")
    log = tmp_path / "stage.log"
    dvc = _under_fake_dvc(
        tmp_path, shell, [python, "-c", SLOW_EXIT, *args], _env(mlflow_store), log
    )
    leftovers.append(psutil.Process(dvc.pid))
    stage = _stage(dvc, marker=SLOW_EXIT)
    leftovers.append(stage)
    _until(lambda: "train cpu: " in log.read_text(), "training to start", 120)

    dvc.terminate()
    killed = time.monotonic()
    _until(lambda: not lifetime._alive(stage), "the stage to end", 30)  # a zombie has ended
    ended_s = time.monotonic() - killed
    bound_s = lifetime.WATCH_INTERVAL_S + lifetime.STOP_LIMIT_S + 0.4  # the 2 s documented
    assert ended_s < bound_s, f"{ended_s:.1f} s:\n{log.read_text()[-2000:]}"
    assert "the stopping stage did not end within 1.5 s" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["dvc", "stage"])
def test_no_ddp_process_outlives_its_stage(
    tmp_path, prepared, mlflow_store, leftovers, victim
) -> None:
    """DVC killed: the stage stops torchrun, which stops its workers. The stage killed
    outright (SIGKILL): torchrun ends with it, and its workers with torchrun."""
    params = write_params(tmp_path, DDP, epochs=200, batch_size=64, dropout=0.0)
    out = tmp_path / "run"
    command = train_command(params, "ddp", prepared, out / "ddp.pt", out / "metrics")
    log = tmp_path / "stage.log"
    dvc = _under_fake_dvc(tmp_path, "bash", command, _env(mlflow_store), log)
    leftovers.append(psutil.Process(dvc.pid))
    stage = _stage(dvc)
    leftovers.append(stage)
    family: list[psutil.Process] = []

    def workers_started() -> bool:
        family[:] = stage.children(recursive=True)
        workers = 0
        for process in family:
            try:
                workers += "LOCAL_RANK" in process.environ()
            except psutil.Error:
                continue
        return workers == 2

    _until(workers_started, "torchrun's two workers", 120)
    leftovers.extend(family)
    _until(lambda: "over 2 processes" in log.read_text(), "rank 0 to start training", 120)

    (dvc if victim == "dvc" else stage).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    _, alive = psutil.wait_procs([stage, *family], timeout=60)
    assert not alive, f"{alive} outlived the {victim}:\n{log.read_text()[-3000:]}"
    assert time.monotonic() - killed < 60
    dvc.wait(10)
    stage_log = log.read_text()
    # the workers unwound (their MLflow run, their process group), not killed outright
    assert stage_log.count("accelbench train: interrupted (signal SIGTERM)") >= 2, stage_log
    assert "Traceback" not in stage_log, stage_log
    assert not (out / "ddp.pt").exists()


@pytest.mark.slow
def test_kill_of_dvc_repro_alone_ends_its_training_and_the_next_repro_resumes(
    tmp_path, leftovers
) -> None:
    """The real thing: `kill <dvc pid>` (SIGTERM, DVC alone) mid-training."""
    from mlflow.tracking import MlflowClient

    from test_pipeline import _dvc, _env, _small_repo

    repo, mirror, _ = _small_repo(
        tmp_path, only_cpu=True, epochs=6, train_subset=2048, test_subset=512
    )
    dvc = subprocess.Popen(
        [str(Path(sys.executable).parent / "dvc"), "repro"],
        cwd=repo,
        env=_env(mirror),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    leftovers.append(psutil.Process(dvc.pid))
    checkpoint = repo / "checkpoints" / "cpu.pt"
    _until(lambda: _epochs_done(checkpoint) >= 1, "train@cpu's first epoch", 400)
    stages = psutil.Process(dvc.pid).children(recursive=True)
    leftovers.extend(stages)

    dvc.terminate()
    dvc.wait(30)
    _, alive = psutil.wait_procs(stages, timeout=15)
    assert not alive, f"{alive} outlived DVC"
    assert 1 <= _epochs_done(checkpoint) < 6
    assert not (repo / "models" / ".cpu.pt.lock").exists()

    again = _dvc(repo, "repro", mirror=mirror)
    assert "resuming after epoch" in again.stdout + again.stderr
    assert not checkpoint.exists()
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("accelbench")
    cpu_runs = client.search_runs([experiment.experiment_id], "attributes.run_name = 'cpu'")
    assert [r.info.status for r in cpu_runs] == ["FINISHED"]  # continued, not duplicated


def test_a_stage_sets_up_its_watchdogs_once(monkeypatch) -> None:
    """The CLI and a stage both asked to end with DVC: two watchdogs sent two SIGTERMs, and
    the second cut short the clean-up of the first (CI: the run stayed RUNNING)."""
    watched: list[str] = []
    monkeypatch.setattr(lifetime, "_ENDING_WITH_LAUNCHER", False)
    monkeypatch.setenv("DVC_STAGE", "train@cpu")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(lifetime, "end_with_parent", lambda parent: watched.append("parent"))
    monkeypatch.setattr(lifetime, "_dvc_ancestor", lambda: psutil.Process(1))
    # a shell between DVC (pid 1 here) and the stage, whatever started pytest (a detached
    # pytest's own parent is pid 1)
    monkeypatch.setattr(lifetime.os, "getppid", os.getpid)
    monkeypatch.setattr(lifetime, "_watch", lambda gone, why: watched.append(why))
    lifetime.end_with_launcher()
    lifetime.end_with_launcher()
    assert watched == ["parent", "DVC (pid 1) is gone"]


SIGTERM_TWICE = """import os, signal, time
from accelbench import cli
cli._interrupt_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt as exc:
    print("interrupted:", exc, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # a second one, during the clean-up
    time.sleep(0.3)
    print("cleaned up", flush=True)
"""


def test_a_second_sigterm_does_not_cut_the_clean_up_short() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_TWICE], capture_output=True, text=True, timeout=30
    )
    assert done.stdout == "interrupted: signal SIGTERM\ncleaned up\n", done.stderr


COMPILE_POOL = r"""
import json, logging, os, sys, time
import psutil
from torch._inductor import async_compile
from accelbench.system import lifetime

logging.basicConfig(level=logging.WARNING)  # torch's warnings, were any, reach stderr
pool = async_compile.AsyncCompile.process_pool()  # the sidecar and its pool, as a compile makes
assert pool.submit(os.getpid).result(timeout=180) != os.getpid()  # ran in a started worker
sidecar = psutil.Process(pool.process.pid)
workers = sidecar.children(recursive=True)
started = time.perf_counter()
lifetime.end_compile_workers()
ended = time.perf_counter()
async_compile.shutdown_compile_workers()  # what Inductor's exit handler then does
done = time.perf_counter()
def alive():  # SIGKILL takes effect a moment later; a killed worker may wait as a zombie
    found = []
    for p in [sidecar, *workers]:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return found
deadline = time.monotonic() + 5
while alive() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"workers": len(workers), "alive": alive(),
                  "end_s": ended - started, "handler_s": done - ended}))
"""


@pytest.mark.slow
def test_a_finished_stage_ends_its_compile_workers_without_waiting() -> None:
    """Inductor's orderly shutdown waits for each idle worker's teardown (0.8-3.1 s on an
    H200 host, 0.9 s here); a stage that is done ends them at once, and quietly."""
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_POOL], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.splitlines()[-1])
    assert facts["workers"] >= 1
    assert facts["alive"] == []
    assert facts["end_s"] < 5
    assert facts["handler_s"] < 0.5  # the pool is already stopped: nothing left to wait for
    assert "SubprocPool" not in result.stderr  # no "unclean exit" from its reader


def test_ending_compile_workers_without_torch_is_a_no_op() -> None:
    code = "import sys; from accelbench.system import lifetime; lifetime.end_compile_workers(); "
    code += "assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


HANGS = {
    "a-thread": "threading.Thread(target=time.sleep, args=(600,), name='stuck-teardown').start()",
    "an-exit-handler": "atexit.register(time.sleep, 600)",
}


@pytest.mark.slow
@pytest.mark.parametrize("hang", HANGS.values(), ids=HANGS.keys())
def test_a_finished_stage_ends_within_its_limit_whatever_hangs(hang: str) -> None:
    """A thread or exit handler that never returns (a DDP communicator's teardown, say) is cut
    short at the ending limit, with the stage's own exit code and one line saying so."""
    code = "\n".join(
        [
            "import atexit, threading, time",
            "from accelbench import cli",
            "from accelbench.system import lifetime",
            "lifetime.ENDING_LIMIT_S = 2",
            hang,
            "cli._end_process(3)",
        ]
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 30
    assert "the finished stage's process did not end within 2 s" in result.stderr
    if "Thread" in hang:
        assert "threads still running: stuck-teardown" in result.stderr
