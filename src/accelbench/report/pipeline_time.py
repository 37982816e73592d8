"""Where the pipeline's time goes: each stage's wall time, its timed epochs and the rest,
split by phase, from the timings the stages recorded (`phases`). A figure of record like the
epoch times: the user waits for the whole `dvc repro`, not for epochs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelbench.core.phases import PHASES, StageTiming
from accelbench.report import prose

# What each phase covers: the report's legend, in `PHASES`' order.
PHASE_LEGEND = {
    "startup": "Python start and the CLI's own imports, before the stage's code",
    "imports": "importing the stage's modules (torch, MLflow, ...)",
    "params": "reading and validating params.yaml",
    "mlflow": "MLflow: store set-up, starting, logging to and ending runs",
    "device": "finding the GPUs (NVML, then torch), waiting for them (or the CPU) to be free "
    "on this host, CUDA start, backend set-up",
    "data": "reading the prepared arrays and moving them to the device",
    "model": "building the model, counting its FLOPs",
    "training": "the timed epochs (compilation, autotuning and graph capture in the first)",
    "step_setup": "building the step before the first epoch: torch.compile's import and "
    "wrapper, the optimizer, DDP",
    "fit_setup": "in training, outside the timed epochs and every other phase (per-epoch "
    "bookkeeping, the rest)",
    "evaluation": "evaluating on the test set (after every epoch, untimed; the evaluate stage)",
    "checkpoint": "saving the per-epoch training state",
    "outputs": "writing the stage's files and figures",
    "model_logging": "logging the model to MLflow",
    "launch": "waiting for torchrun's processes (a distributed stage)",
    "ending": "the process ending after the stage's work: exit handlers, worker threads and "
    "processes (DataLoader's, Inductor's, MLflow's)",
}

# dvc.yaml's order; a stage of another name (a variant) sorts by its prefix.
ORDER = ("env", "download", "prepare", "train", "evaluate", "quantize", "compare")


def _order(timing: StageTiming) -> tuple[int, float]:
    prefix = timing.stage.split("@")[0]
    return (ORDER.index(prefix) if prefix in ORDER else len(ORDER), timing.started)


@dataclass(frozen=True)
class PipelineTime:
    stages: list[StageTiming]  # dvc.yaml's order
    this_run: set[str]  # stages that ran in this `dvc repro` (the others were up to date)
    span_s: float | None  # first stage's start to the last one's end, this `dvc repro`
    current: str | None = None  # the stage writing the report: its timing stops there

    @property
    def wall_s(self) -> float:
        return sum(t.wall_s for t in self.ran)

    @property
    def ran(self) -> list[StageTiming]:
        return [t for t in self.stages if t.stage in self.this_run]

    @property
    def training_s(self) -> float:
        return sum(t.training_s or 0.0 for t in self.ran)

    @property
    def overhead_s(self) -> float:
        return sum(t.overhead_s for t in self.ran)

    @property
    def between_stages_s(self) -> float | None:
        """DVC's own work between the stages: hashing, the lock file, starting processes; and
        each process's exit, after its stage recorded its wall time."""
        return max(self.span_s - self.wall_s, 0.0) if self.span_s is not None else None

    def phase_totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for name, seconds in (kv for t in self.ran for kv in t.overhead_phases().items()):
            totals[name] = totals.get(name, 0.0) + seconds
        return totals

    def to_json(self) -> dict[str, Any]:
        return {
            "span_s": self.span_s,
            "stages_wall_s": self.wall_s,
            "training_s": self.training_s,
            "overhead_s": self.overhead_s,
            "between_stages_s": self.between_stages_s,
            "phases_s": self.phase_totals(),
            "stages": {
                t.stage: {
                    **t.to_json(),
                    "this_run": t.stage in self.this_run,
                    "until_this_report": t.stage == self.current,  # its timing stops there
                }
                for t in self.stages
            },
        }


def of_pipeline(timings: list[StageTiming], stages: set[str]) -> list[StageTiming]:
    """The timings of the pipeline's stages now: `stages`, the `<stage>@<variant>` ones that
    params.yaml defines (a removed variant's timing file stays), and every stage without one."""
    return [t for t in timings if "@" not in t.stage or t.stage in stages]


def collect(timings: list[StageTiming], current: StageTiming) -> PipelineTime:
    """`current` is the compare stage's own timing so far. This `dvc repro`'s stages are those
    its `dvc` process ran (the same launcher as compare's); run by hand, there is no repro to
    measure and every stage is shown as last run."""
    stages = sorted([t for t in timings if t.stage != current.stage] + [current], key=_order)
    if current.launcher is None:
        return PipelineTime(stages, {t.stage for t in stages}, None, current.stage)
    ran = [t for t in stages if t.launcher == current.launcher]
    # On the boot clock, which a wall clock set back or forward between stages never moves
    # (one dvc process's stages share a machine); none for stages an older version timed.
    starts = [t.started_boot for t in ran]
    span = None if None in starts else current.started_boot + current.wall_s - min(starts)
    return PipelineTime(stages, {t.stage for t in ran}, span, current.stage)


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"


def _largest(phases: dict[str, float], unit: str, sep: str, n: int | None = None) -> str:
    """The phases of 0.05 s or more, largest first (the first `n`)."""
    top = sorted(phases.items(), key=lambda kv: -kv[1])[:n]
    return sep.join(f"{name} {seconds:.1f}{unit}" for name, seconds in top if seconds >= 0.05)


def markdown(pipeline: PipelineTime) -> list[str]:
    rows = []
    for t in pipeline.stages:
        name = t.stage if t.stage in pipeline.this_run else prose.UP_TO_DATE.format(stage=t.stage)
        if t.stage == pipeline.current:  # logging to MLflow and its outputs come after
            name += prose.UNTIL_THIS_REPORT
        largest = _largest(t.overhead_phases(), "", ", ", 3)
        rows.append((name, _s(t.wall_s), _s(t.training_s), _s(t.overhead_s), largest))
    lines = [prose.PIPELINE_TIME, *prose.table(prose.PIPELINE_COLUMNS.split(" | "), rows)]
    wall, training, overhead = map(_s, (pipeline.wall_s, pipeline.training_s, pipeline.overhead_s))
    lines += [prose.PIPELINE_TOTAL.format(wall=wall, training=training, overhead=overhead), ""]
    if pipeline.span_s is not None:
        between = _s(pipeline.between_stages_s)
        lines += [prose.PIPELINE_SPAN.format(span=_s(pipeline.span_s), between=between), ""]
    phases = _largest(pipeline.phase_totals(), " s", "; ")
    legend = "; ".join(f"*{name}*: {PHASE_LEGEND[name]}" for name in PHASES)
    lines += [prose.PIPELINE_PHASES.format(phases=phases), ""]
    return [*lines, prose.PHASES.format(legend=legend), ""]
