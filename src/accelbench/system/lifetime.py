"""A training stage's processes: they end with the process that started them, and only one
process at a time trains into the same outputs.

Under DVC a stage ends when DVC does (killing only DVC leaves no training behind to fight the
next `dvc repro`); run by hand, it is left alone (`nohup` outlives a logout). torchrun ends
with the stage, its workers with torchrun. "Ends" means SIGTERM, unwound by the CLI as Ctrl-C
is (the MLflow run KILLED, the last epoch's checkpoint kept), within STOP_LIMIT_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from accelbench.core.console import InputError, log

# Set by `accelbench.training.torchrun` for the processes it starts: the pid they must not outlive
PARENT_ENV = "ACCELBENCH_PARENT_PID"
WATCH_INTERVAL_S = 0.1  # a few /proc reads a tick
# Once its launcher is gone, a stage's unwinding has this long (the MLflow run marked KILLED:
# 0.1 s here, more on a loaded machine or a slow server); then it ends unfinished.
STOP_LIMIT_S = 1.5
# A stage whose work is done ends within this long. Exit handlers or threads that have not
# returned by then are cut short, with one line: a communicator's teardown, a stuck pool.
ENDING_LIMIT_S = 30.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def is_torchrun_worker() -> bool:
    return "LOCAL_RANK" in os.environ


def under_dvc() -> bool:
    """Whether DVC runs this stage (it sets `DVC_STAGE`; torchrun's workers inherit it)."""
    return "DVC_STAGE" in os.environ


_ENDING_WITH_LAUNCHER = False  # set by the first end_with_launcher of this process


def ending_with_launcher() -> bool:
    """Whether this process ends with its launcher: SIGTERM then gets STOP_LIMIT_S (the CLI)."""
    return _ENDING_WITH_LAUNCHER and (is_torchrun_worker() or under_dvc())


def end_with_launcher() -> None:
    """Call first thing in a stage: a torchrun worker ends with torchrun, a stage run by DVC
    with DVC. Once per process: a second watchdog's SIGTERM could cut the first's clean-up."""
    global _ENDING_WITH_LAUNCHER
    if _ENDING_WITH_LAUNCHER:
        return
    _ENDING_WITH_LAUNCHER = True
    if is_torchrun_worker():  # the parent our wrapper recorded: catches one already gone
        parent = os.environ.get(PARENT_ENV, "")
        end_with_parent(int(parent) if parent.isdigit() else os.getppid())
    elif under_dvc():
        parent = os.getppid()
        end_with_parent(parent)
        dvc = _dvc_ancestor()
        if dvc is not None and dvc.pid != parent:  # a shell between: watch DVC itself
            _watch(lambda: not _alive(dvc), f"DVC (pid {dvc.pid}) is gone")


def end_with_parent(parent: int) -> None:
    """SIGTERM to this process once `parent` has ended: on Linux the kernel's parent-death
    signal (it fires when the parent *thread* ends: our launchers start children from a
    thread that waits for them), checked once for a parent already gone; elsewhere a watcher."""
    pdeathsig = False
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pdeathsig = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    if pdeathsig:
        if os.getppid() != parent:
            log(f"accelbench: the process that started this one (pid {parent}) is gone")
            os.kill(os.getpid(), signal.SIGTERM)
    else:
        _watch(lambda: os.getppid() != parent, f"the parent process (pid {parent}) is gone")


def _dvc_ancestor():
    """The nearest `dvc` process above this one (psutil.Process), or None."""
    import psutil

    from accelbench.core.phases import is_dvc

    with contextlib.suppress(psutil.Error):
        for ancestor in psutil.Process().parents():
            if is_dvc(ancestor.cmdline()):
                return ancestor
    return None


def _alive(process) -> bool:
    """`process` (psutil.Process) still runs: not ended, not a zombie, its pid not reused."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _watch(gone: Callable[[], bool], why: str) -> None:
    """A daemon thread that sends this process SIGTERM once `gone()` holds."""

    def watch() -> None:
        while not gone():
            time.sleep(WATCH_INTERVAL_S)
        log(f"accelbench: {why}; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="accelbench-watchdog", daemon=True).start()


def end_now(code: int) -> NoReturn:
    """End this process at once with `code`: its streams flushed, nothing else run."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader went away
            stream.flush()
    os._exit(code)


def end_within(limit_s: float, code: int, what: str) -> None:
    """Past `limit_s` from now, end this process with `code` and one line naming `what` was
    ending and the threads still running."""

    def deadline() -> None:
        time.sleep(limit_s)
        running = [
            t.name
            for t in threading.enumerate()
            if t.is_alive() and t not in (threading.main_thread(), threading.current_thread())
        ]
        waiting = f" (threads still running: {', '.join(running)})" if running else ""
        log(f"accelbench: {what} did not end within {limit_s:g} s{waiting}; ending it now")
        end_now(code)

    threading.Thread(target=deadline, name="accelbench-ending", daemon=True).start()


def lock_path(output: Path) -> Path:
    """The lock file of an output: a hidden file beside it (`models/.cpu.pt.lock`)."""
    return output.with_name(f".{output.name}.lock")


@contextlib.contextmanager
def sole_writer(name: str, *outputs: Path | None) -> Iterator[tuple[int, ...]]:
    """Inside: this process alone writes `outputs` (yields its locks' descriptors): an
    exclusive `flock` on a lock file beside each, naming this pid, which the kernel releases
    however the process ends. A torchrun worker takes none: its launcher holds them."""
    if is_torchrun_worker():
        yield ()
        return
    # one lock per file: a second descriptor of it in this process would be refused too
    paths = {lock_path(p).resolve(): lock_path(p) for p in outputs if p is not None}
    held: list[tuple[Path, int]] = []
    try:
        for path in paths.values():
            held.append((path, _acquire(path, name)))
        yield tuple(fd for _, fd in held)
    finally:
        for path, fd in reversed(held):  # the lock file removed while still held, then let go
            try:
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    path.unlink()
            except OSError:
                pass  # already gone, or its folder unreadable: the lock ends with the descriptor
            finally:
                os.close(fd)


def _acquire(path: Path, name: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f"process {holder}" if holder.isdigit() else "another process"
            stop = f"stop it (kill {holder})" if holder.isdigit() else "stop it"
            raise InputError(
                f"variant {name!r} is already being trained by {who} (lock {path}); wait for "
                f"it to finish or {stop}, then run again"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # The holder before us removes the file as it ends: lock the file that is there now.
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.stat(path), os.fstat(fd)):
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def end_compile_workers() -> None:
    """Kill torch.compile's idle compile workers once a stage is done with them: Inductor's
    exit handler shuts them down one by one (0.8-3.1 s while DVC waits). The pool is marked
    stopped first, so its reader takes the closed pipe as a shutdown; where Inductor's
    internal attributes differ, its handler's own shutdown runs as before."""
    compiling = sys.modules.get("torch._inductor.async_compile")
    for pool in list(getattr(compiling, "_pool_set", ())):
        sidecar, lock = getattr(pool, "process", None), getattr(pool, "write_lock", None)
        if sidecar is None or lock is None or not hasattr(pool, "running"):
            continue
        with lock:
            if not pool.running:
                continue
            pool.running = False
            if getattr(pool, "timer", None) is not None:
                pool.timer.quit()
        import psutil

        with contextlib.suppress(psutil.Error):
            for worker in psutil.Process(sidecar.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):  # SIGKILL, reaped by init
                    worker.kill()
        with contextlib.suppress(ProcessLookupError):
            sidecar.kill()
        sidecar.wait()
