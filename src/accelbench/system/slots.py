"""A timed stage's share of the host, its GPUs or the CPU, taken by a lock each, so that
experiments run side by side never time each other's kernels (docs/teams.md, "Sweeps on one
GPU box"). `tenancy()` is the one way in.

A lock is an exclusive `flock` on a file in one host-wide folder, released by the kernel
however its holder ends; the file names the holder. Where too few are free, the stage waits
up to `ACCELBENCH_SLOT_WAIT_S`, then fails: it never shares. Meanwhile it notes who else
used the host (`Tenancy.shared()`, kept as `shared_machine` in train.json and eval.json).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelbench.core import phases
from accelbench.core.console import InputError, StageError, log
from accelbench.system import lifetime

SLOTS_DIR_ENV = "ACCELBENCH_SLOTS_DIR"
WAIT_ENV = "ACCELBENCH_SLOT_WAIT_S"
DEFAULT_WAIT_S = 120.0  # a sweep whose CPU stages queue behind each other sets more
POLL_S = 0.2  # between two tries to take what is busy
SAMPLE_S = 2.0  # between two looks at who else holds a lock, while measuring
SHARED_CPUS = 0.5  # others' average CPU use worth a note: above idle daemons, below any training
CPU_SLOT = "cpu.lock"


def slots_dir(environ: MutableMapping[str, str] = os.environ) -> Path:
    """The host-wide folder of the locks (created): `ACCELBENCH_SLOTS_DIR`, else this user's
    /tmp/accelbench-slots-<uid> (a folder of this user's alone, never a link)."""
    if chosen := environ.get(SLOTS_DIR_ENV):
        Path(chosen).mkdir(parents=True, exist_ok=True)
        return Path(chosen)
    path = Path("/tmp") / f"accelbench-slots-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise InputError(
            f"{path}: not a folder of this user's (a link, a file or another user's); the "
            f"stages' GPU and CPU locks go there: remove it, or set {SLOTS_DIR_ENV} to a folder"
        )
    return path


def wait_limit(environ: MutableMapping[str, str] = os.environ) -> float:
    """How long a stage waits for its GPUs or the CPU: `ACCELBENCH_SLOT_WAIT_S` seconds."""
    if not (raw := environ.get(WAIT_ENV)):
        return DEFAULT_WAIT_S
    with contextlib.suppress(ValueError):
        if 0 <= (seconds := float(raw)) < float("inf"):
            return seconds
    raise InputError(
        f"{WAIT_ENV}={raw!r}: expected the seconds a stage may wait for its GPUs or "
        f"the CPU (0 or more; unset: {DEFAULT_WAIT_S:g})"
    )


def gpu_candidates(environ: MutableMapping[str, str] = os.environ) -> list[str] | None:
    """The GPUs a stage may take, as CUDA_VISIBLE_DEVICES names them (where it is unset,
    every GPU the driver sees, by index); None where nothing can tell (no NVML)."""
    if (listed := environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return list(dict.fromkeys(entry.strip() for entry in listed.split(",") if entry.strip()))
    from accelbench.system import hardware

    counted = hardware.nvml_gpu_count()
    return None if counted is None else [str(index) for index in range(counted[0])]


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its lock file says."""

    stage: str  # "train@gpu", "evaluate@cpu", "quantize@amp"
    holds: str  # "GPU 3", "GPUs 2,3", "the CPU"
    pid: int | None
    workdir: str

    def __str__(self) -> str:  # no workdir: it may be another user's path
        return f"{self.stage} on {self.holds} (pid {self.pid})"


def _read_holder(path: Path) -> Holder | None:
    """None: unreadable, empty, or not one of ours."""
    try:
        with path.open("rb") as handle:
            payload = json.loads(handle.read(4096) or b"null")
        stage, holds, workdir = (str(payload[key]) for key in ("stage", "holds", "workdir"))
        return Holder(stage, holds, payload.get("pid"), workdir)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _open_lock(path: Path) -> int:
    """`path` opened to lock it: never through a link, never a file other than a lock file of
    its own. In a shared folder another user could plant `gpu0.lock` as a link to, or a hard
    link of, a file of this user's, which the lock's holder line and mode would overwrite."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO must not block the open
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
        except PermissionError:  # another user's file in a shared folder: a lock, no holder
            fd = os.open(path, os.O_RDONLY | flags)
    except OSError as error:  # ELOOP: a symbolic link
        raise StageError(
            f"{path}: cannot open this lock file ({error.strerror}); a lock file is a plain "
            f"file of its own, never a link: remove it, or set {SLOTS_DIR_ENV} to a folder"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise StageError(
            f"{path}: not a lock file (a hard link of another file, or not a plain file); "
            f"remove it, or set {SLOTS_DIR_ENV} to a folder of your own"
        )
    return fd


def _try_lock(path: Path) -> int | None:
    """A descriptor of `path` holding its exclusive lock, or None where another holds it."""
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if os.fstat(fd).st_uid == os.getuid():  # a shared folder's other users must open it too
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)
    return fd


def take(
    paths: Sequence[Path], count: int, label: str, *, wait_s: float, what: str, why: str = ""
) -> list[tuple[Path, int]]:
    """`count` of the locks `paths`, all at once (never some held while waiting for the rest:
    no two stages each hold half of what the other needs), tried every POLL_S for `wait_s`."""
    started = time.monotonic()
    waiting = False
    while True:
        held: list[tuple[Path, int]] = []
        try:
            for path in paths:
                if len(held) < count and (fd := _try_lock(path)) is not None:
                    held.append((path, fd))
        except BaseException:
            for _, fd in held:
                os.close(fd)
            raise
        elapsed = time.monotonic() - started
        if len(held) == count:
            if waiting:
                log(f"{label}: got {what} after {elapsed:.0f} s")
            return held
        mine = {path for path, _ in held}
        for _, fd in held:
            os.close(fd)
        busy = [h for p in paths if p not in mine and (h := _read_holder(p)) is not None]
        named = (("" if h.workdir == os.getcwd() else "another checkout's ") + str(h) for h in busy)
        who = "; ".join(dict.fromkeys(named)) or "another process"
        if elapsed >= wait_s:
            raise StageError(
                f"{label}: waited {wait_s:g} s for {what}, still taken by {who}; wait for "
                f"it to finish or stop it, or set {WAIT_ENV} to wait longer"
            )
        if not waiting and busy:  # an empty file: its holder is still writing it
            log(
                f"{label}: waiting for {what} (up to {wait_s:g} s, {WAIT_ENV}): taken by {who}{why}"
            )
            waiting = True
        time.sleep(min(POLL_S, wait_s - elapsed))


def others_holding(folder: Path, mine: set[Path]) -> list[Holder]:
    """Who holds a lock in `folder` now, other than `mine`: a shared lock taken and let go at
    once leaves free locks free and fails on held ones."""
    found = []
    for path in sorted(folder.glob("*.lock")):
        if path in mine:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            if holder := _read_holder(path):
                found.append(holder)
        finally:
            os.close(fd)  # lets a shared lock go
    return found


def cpu_seconds() -> tuple[float, float]:
    """CPU-seconds: the host's busy ones since boot (steal included), and this process tree's
    (waited-for and running descendants too)."""
    import psutil

    host = psutil.cpu_times()
    busy = host.user + host.nice + host.system
    busy += sum(getattr(host, name, 0.0) for name in ("irq", "softirq", "steal"))
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                mine += times.user + times.system + times.children_user + times.children_system
    return busy, mine


def sharing_note(
    holders: Sequence[Holder], others_cpus: float | None, cpus: int | None
) -> str | None:
    """What else ran on the host while a stage was measured, in one line (None: nothing)."""
    parts = []
    if holders:
        named = ", ".join(str(h) for h in holders)
        kind = "training" if all(h.stage.startswith("train@") for h in holders) else "stage"
        count = (
            f"another accelbench {kind}"
            if len(holders) == 1
            else f"{len(holders)} other accelbench {kind}s"
        )
        parts.append(f"{count} on this host: {named}")
    if others_cpus is not None and others_cpus >= SHARED_CPUS:
        of = f" of {cpus}" if cpus else ""
        parts.append(f"other processes kept {others_cpus:.1f}{of} CPUs busy on average")
    return "; ".join(parts) or None


@dataclass
class Tenancy:
    """What a stage holds on this host (`fds`: for torchrun to hold too), and who else it
    finds there until `note()`."""

    folder: Path | None = None
    label: str = ""  # "evaluate cpu": how its console lines start
    held: list[tuple[Path, int]] = field(default_factory=list)
    _seen: dict[Holder, None] = field(default_factory=dict)
    _start: tuple[float, float, float] | None = None  # host busy s, own s, monotonic s
    _stop: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None
    _note: str | None = None

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for _, fd in self.held)

    def _look(self) -> None:
        if self.folder is not None:
            for holder in others_holding(self.folder, {path for path, _ in self.held}):
                self._seen.setdefault(holder)

    def watch(self) -> None:
        """Look at once, then every SAMPLE_S in a thread, until `note()`."""
        self._start = (*cpu_seconds(), time.monotonic())
        self._look()
        self._watcher = threading.Thread(target=self._watch, name="accelbench-slots", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            with contextlib.suppress(OSError):
                self._look()

    def note(self) -> str | None:
        """What else ran on this host since `watch()`; the first call ends the watch."""
        if self._stop.is_set() or self._start is None:  # noted already, or never watched
            return self._note
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        self._look()
        busy, own = cpu_seconds()
        elapsed = time.monotonic() - self._start[2]
        others_s = max(0.0, (busy - self._start[0]) - (own - self._start[1]))
        others_cpus = others_s / elapsed if elapsed > 0 else None
        self._note = sharing_note(list(self._seen), others_cpus, os.cpu_count())
        return self._note

    def shared(self) -> str | None:
        """`note()`, said on the console too."""
        if (note := self.note()) is not None:
            log(f"{self.label}: measured while the machine was shared: {note}")
        return note


@contextlib.contextmanager
def tenancy(
    name: str,
    *,
    gpus: int = 0,
    cpu: bool = False,
    stage: str = "train",
    environ: MutableMapping[str, str] = os.environ,
) -> Iterator[Tenancy]:
    """Inside: `stage` of variant `name` holds `gpus` GPUs (CUDA_VISIBLE_DEVICES names them
    alone) or, with `cpu`, the host's CPU lock, and watches who else holds one. Enter it
    before anything starts CUDA. Takes nothing in a torchrun worker (its launcher holds them)."""
    label = f"{stage} {name}"
    if lifetime.is_torchrun_worker() or not (gpus or cpu):
        yield Tenancy(label=label)
        return
    here = Tenancy(slots_dir(environ), label=label)
    wait_s = wait_limit(environ)
    before = environ.get("CUDA_VISIBLE_DEVICES")
    with phases.phase("device"):  # waiting for a GPU is part of finding one
        if gpus:
            holds = _take_gpus(here, gpus, wait_s, environ)
        else:
            why = "; stages timed on the CPU take turns on a host"
            paths = [here.folder / CPU_SLOT]
            here.held = take(paths, 1, label, wait_s=wait_s, what="the CPU", why=why)
            holds = "the CPU"
    holder = Holder(f"{stage}@{name}", holds, os.getpid(), os.getcwd())
    try:
        for _, fd in here.held:
            with contextlib.suppress(OSError):  # opened read-only: the lock holds all the same
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(asdict(holder)) + "\n").encode(), 0)
        here.watch()
        yield here
    finally:
        here.note()  # ends the watch
        for _, fd in reversed(here.held):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # a free lock names no holder
            os.close(fd)
        if gpus and here.held:
            if before is None:
                environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                environ["CUDA_VISIBLE_DEVICES"] = before


def _take_gpus(here: Tenancy, count: int, wait_s: float, environ: MutableMapping[str, str]) -> str:
    """Takes `count` free GPUs for `here` and narrows CUDA_VISIBLE_DEVICES to them; says what
    it holds ("GPU 3"), or "" where there are too few or NVML cannot count them (placement
    then skips or refuses the stage)."""
    if (candidates := gpu_candidates(environ)) is None:
        log(
            f"{here.label}: cannot count this machine's GPUs (no NVML): takes no GPU lock "
            "and may share a GPU; list them in CUDA_VISIBLE_DEVICES to share them safely"
        )
        return ""
    if len(candidates) < count:
        return ""
    # a lock file per GPU as CUDA_VISIBLE_DEVICES names it: gpu-3.lock, gpu-GPU-8a1f….lock
    paths = [here.folder / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock" for gpu in candidates]
    wanted = "a free GPU" if count == 1 else f"{count} free GPUs"
    what = f"{wanted} among {','.join(candidates)}"
    here.held = take(paths, count, here.label, wait_s=wait_s, what=what)
    taken = ",".join(candidates[paths.index(path)] for path, _ in here.held)
    environ["CUDA_VISIBLE_DEVICES"] = taken
    holds = f"GPU {taken}" if count == 1 else f"GPUs {taken}"
    log(f"{here.label}: takes {holds} (CUDA_VISIBLE_DEVICES={taken})")
    return holds
