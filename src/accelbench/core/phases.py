"""Where a stage's wall time goes: named phases, each measured exclusive of the phases nested
in it, from the moment the operating system started the process.

Imports nothing heavy (it runs before torch and MLflow are imported, to time their import).
A stage process records its phases with `phase(name)`; the CLI writes them, with the
process's whole wall time, to `.accelbench/timings/<stage>.json` when the stage succeeds, and
the compare stage turns those files into the report's "where the pipeline's time goes".
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
)
DERIVED = ("fit_setup",)  # training minus the timed epochs (`StageTiming.overhead_phases`)


def process_started() -> float:
    """When this process started (Unix time): from /proc on Linux, else this import."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return _IMPORTED


_IMPORTED = time.time()


@dataclass
class Recorder:
    """Exclusive time per phase: time spent in a nested phase counts for that phase only."""

    started: float = field(default_factory=process_started)  # Unix time
    seconds: dict[str, float] = field(default_factory=dict)
    stage: str = ""  # dvc.yaml's name of the stage ("train@amp"), set as soon as it is known
    training_s: float | None = None  # a training stage's timed epochs, summed
    _stack: list[tuple[str, float]] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES or name in DERIVED:
            recordable = ", ".join(p for p in PHASES if p not in DERIVED)
            raise ValueError(f"unknown phase {name!r}; a stage records: {recordable}")
        now = time.perf_counter()
        if self._stack:  # pause the enclosing phase
            outer, since = self._stack[-1]
            self._add(outer, now - since)
        self._stack.append((name, now))
        try:
            yield
        finally:
            now = time.perf_counter()
            _, since = self._stack.pop()
            self._add(name, now - since)
            if self._stack:  # resume the enclosing phase
                self._stack[-1] = (self._stack[-1][0], now)

    def add(self, name: str, seconds: float) -> None:
        """Time measured elsewhere (e.g. a child process's), counted as `name`."""
        self._add(name, seconds)

    def _add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def timing(self) -> StageTiming:
        wall = time.time() - self.started
        return StageTiming(
            self.stage, self.started, wall, dict(self.seconds), self.training_s, launcher()
        )


@dataclass(frozen=True)
class StageTiming:
    """One stage's wall time, its phases and, for a training stage, its timed epochs."""

    stage: str  # dvc.yaml's name: "train@amp"
    started: float  # Unix time the process started
    wall_s: float
    phases: dict[str, float]
    training_s: float | None = None  # sum of the timed epochs (train stages)
    launcher: str | None = None  # the `dvc` process that ran it ("pid@start"), if any

    @property
    def ended(self) -> float:
        return self.started + self.wall_s

    @property
    def other_s(self) -> float:
        """Wall time no phase accounts for (interpreter exit excluded)."""
        return max(self.wall_s - sum(self.phases.values()), 0.0)

    def overhead_phases(self) -> dict[str, float]:
        """The overhead by phase: every phase but the timed epochs; the training phase's
        time outside them and every phase nested in training (per-epoch bookkeeping) as
        `fit_setup`; wall time no phase accounts for as `other`."""
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

    @classmethod
    def from_json(cls, data: dict) -> StageTiming:
        return cls(
            stage=str(data["stage"]),
            started=float(data["started"]),
            wall_s=float(data["wall_s"]),
            phases={str(k): float(v) for k, v in data["phases"].items()},
            training_s=None if data.get("training_s") is None else float(data["training_s"]),
            launcher=None if data.get("launcher") is None else str(data["launcher"]),
        )


def is_dvc(cmdline: list[str]) -> bool:
    """A `dvc` command line: the `dvc` entry point, or `python -m dvc`."""
    words = [os.path.basename(word) for word in cmdline[:3]]
    return "dvc" in words[:2] or words[1:3] == ["-m", "dvc"]


def launcher() -> str | None:
    """The nearest `dvc` process above this one ("pid@start time"): every stage of one
    `dvc repro` (or queued experiment) shares it; None for a stage run by hand."""
    try:
        import psutil

        for parent in psutil.Process().parents():
            if is_dvc(parent.cmdline()):
                return f"{parent.pid}@{parent.create_time():.2f}"
    except Exception:
        return None
    return None


RECORDER = Recorder()
phase = RECORDER.phase


def timing_file(root: Path, stage: str) -> Path:
    return root / TIMINGS_DIR / f"{stage}.json"


def write(root: Path, timing: StageTiming) -> Path:
    path = timing_file(root, timing.stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(timing.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_all(root: Path) -> list[StageTiming]:
    """Every stage's last recorded timing (unreadable files are skipped: they are a report's
    garnish, never a reason to fail it)."""
    timings = []
    for path in sorted((root / TIMINGS_DIR).glob("*.json")):
        try:
            timings.append(StageTiming.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return timings
