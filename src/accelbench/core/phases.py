"""Where a stage's wall time goes: named phases, each exclusive of the phases nested in it,
from the moment the process started. Imports nothing heavy: it times torch's import.

A stage records its phases with `phase(name)`; the CLI writes them and the wall time to
`.accelbench/timings/<stage>.json` when the stage succeeds, for the report's pipeline time.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter
from pydantic.dataclasses import dataclass as record

TIMINGS_DIR = Path(".accelbench") / "timings"

# Every phase, in the report's order (report/pipeline_time.py says what each covers). A stage
# records all of them but those in DERIVED, which the timing works out from the others.
PHASES = (
    "startup",
    "imports",
    "params",
    "mlflow",
    "device",
    "data",
    "model",
    "training",
    "step_setup",
    "fit_setup",
    "evaluation",
    "checkpoint",
    "outputs",
    "model_logging",
    "launch",
    "ending",
)
DERIVED = ("fit_setup",)  # training minus the timed epochs (`StageTiming.overhead_phases`)


def boot_clock() -> float:
    """Seconds since boot (suspend included): one clock for every process of this machine,
    which setting the wall clock never moves; durations come from it, Unix time only stamps."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def process_started(pid: int | str = "self") -> float | None:
    """When process `pid` started, on `boot_clock()`, from /proc (None where there is none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # starttime
    except (OSError, ValueError, IndexError):
        return None


_IMPORTED = boot_clock()


@dataclass
class Recorder:
    """Exclusive time per phase: time spent in a nested phase counts for that phase only."""

    started_boot: float = field(default_factory=lambda: process_started() or _IMPORTED)
    seconds: dict[str, float] = field(default_factory=dict)
    stage: str = ""  # dvc.yaml's name of the stage ("train@amp"), set as soon as it is known
    training_s: float | None = None  # a training stage's timed epochs (every seed), summed
    repeats_s: float | None = None  # the `repeats`' trainings, whole (their train.json's)
    root: Path | None = None  # where the stage wrote its timing, which its ending adds to
    _stack: list[tuple[str, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES or name in DERIVED:
            recordable = ", ".join(p for p in PHASES if p not in DERIVED)
            raise ValueError(f"unknown phase {name!r}; a stage records: {recordable}")
        now = time.perf_counter()
        if self._stack:  # pause the enclosing phase
            outer, since = self._stack[-1]
            self.add(outer, now - since)
        self._stack.append((name, now))
        try:
            yield
        finally:
            now = time.perf_counter()
            _, since = self._stack.pop()
            self.add(name, now - since)
            if self._stack:  # resume the enclosing phase
                self._stack[-1] = (self._stack[-1][0], now)

    def add(self, name: str, seconds: float) -> None:
        """`seconds` more for phase `name` (also time measured elsewhere: a child process's)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def elapsed_s(self) -> float:
        """Since the process started, on `boot_clock()`: never negative, whatever the clock."""
        return max(boot_clock() - self.started_boot, 0.0)

    def timing(self) -> StageTiming:
        wall = self.elapsed_s()
        started = time.time() - wall  # a stamp only: the wall clock may have been set since
        by = launcher()
        return StageTiming(
            self.stage,
            started,
            wall,
            dict(self.seconds),
            self.training_s,
            by,
            self.started_boot,
            self.repeats_s,
        )


@record(frozen=True)
class StageTiming:
    """One stage's wall time, its phases and, for a training stage, its timed epochs."""

    stage: str  # dvc.yaml's name: "train@amp"
    started: float  # Unix time the process started (a stamp: ordering, people)
    # on the boot clock, as every duration here; below zero (an older file's) measured nothing
    wall_s: Annotated[float, Field(ge=0)]
    phases: dict[str, float]
    training_s: float | None = None  # sum of the timed epochs (train stages)
    launcher: str | None = None  # the `dvc` process that ran it ("pid@start"), if any
    started_boot: float | None = None  # on `boot_clock()`: spans across this machine's stages
    repeats_s: float | None = None  # its `repeats`' trainings, whole (train stages)

    @property
    def to_model_s(self) -> float:
        """Process start to the stage's end less its `repeats`, which only measure the spread:
        a train stage's time to its model, saved and logged (node 0's torchrun launcher's: its
        workers' repeats left out; other nodes' launchers keep them)."""
        return max(self.wall_s - (self.repeats_s or 0.0), 0.0)

    @property
    def other_s(self) -> float:
        """Wall time no phase accounts for (interpreter exit excluded)."""
        return max(self.wall_s - sum(self.phases.values()), 0.0)

    def overhead_phases(self) -> dict[str, float]:
        """Every phase but the timed epochs: training's time outside them (per-epoch
        bookkeeping included) as `fit_setup`; wall time no phase accounts for as `other`."""
        parts = {k: v for k, v in self.phases.items() if k != "training"}
        if "training" in self.phases:
            parts["fit_setup"] = max(self.phases["training"] - (self.training_s or 0.0), 0.0)
        parts["other"] = self.other_s
        return parts

    @property
    def overhead_s(self) -> float:
        """Wall time that is not the timed epochs."""
        return max(self.wall_s - (self.training_s or 0.0), 0.0)

    def to_json(self) -> dict:
        return asdict(self)


def is_dvc(cmdline: list[str]) -> bool:
    """A `dvc` command line: the `dvc` entry point, or `python -m dvc`."""
    words = [os.path.basename(word) for word in cmdline[:3]]
    return "dvc" in words[:2] or words[1:3] == ["-m", "dvc"]


def launcher() -> str | None:
    """The nearest `dvc` process above this one ("pid@start time"): every stage of one
    `dvc repro` (or queued experiment) shares it; None for a stage run by hand."""
    with contextlib.suppress(Exception):
        import psutil

        for parent in psutil.Process().parents():
            if is_dvc(parent.cmdline()):
                started = process_started(parent.pid) or parent.create_time()
                return f"{parent.pid}@{started:.2f}"  # the boot clock's: a date set keeps it
    return None


RECORDER = Recorder()
phase = RECORDER.phase


def write(root: Path, timing: StageTiming) -> Path:
    path = root / TIMINGS_DIR / f"{timing.stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(timing.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_all(root: Path) -> list[StageTiming]:
    """Every stage's last recorded timing; an unreadable one is skipped (a report's garnish)."""
    timings = []
    for path in sorted((root / TIMINGS_DIR).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            timings.append(TypeAdapter(StageTiming).validate_json(path.read_bytes()))
    return timings
