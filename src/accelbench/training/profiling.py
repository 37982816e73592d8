"""torch.profiler around a window of steady-state training steps, and what its trace says.

`accelbench train VARIANT ... --profile DIR` records up to `active` full-batch steps of the
second epoch (after compilation and graph capture, and a few settling steps; never the
evaluation between epochs or an epoch's partial last batch), one trace per process:

    DIR/<variant>-rank<r>.trace.json   Chrome/Perfetto trace (open in ui.perfetto.dev)
    DIR/<variant>-rank<r>.txt          operators and kernels by device time
    DIR/<variant>-rank<r>.json         per step: GPU span, busy, compute, all-reduce, idle

A profiled run is slower than an unprofiled one: its epoch times are not figures of record.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from accelbench.core.console import InputError
from accelbench.core.outputs import write_text

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
SETTLE_STEPS = 5  # after the first epoch, before recording (warm-up for the profiler too)
PROFILER_WARMUP_STEPS = 3


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _span(event: dict[str, Any]) -> tuple[float, float]:
    """A complete event's [start, end) in µs."""
    return float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))


def summarize_trace(trace: dict[str, Any]) -> dict[str, Any]:
    """Per-step GPU time (ms per step) from a Chrome trace written by torch.profiler.

    host: the host's ProfilerStep spans (a CPU's step time; with a GPU, the time to launch a
    step); span: the GPU-side step time, from the first recorded step's GPU work to the end
    of the last one's (the GPU-track ProfilerStep spans; work outside them is left out,
    clipped at the edges); busy: time any kernel or copy ran; compute: non-NCCL work;
    allreduce: NCCL kernels; exposed_allreduce: NCCL time not hidden under compute;
    idle_share: 1 - busy/span. GPU fields are None when the trace has no device work.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # One ProfilerStep#N span per step on the host, and copies on the GPU streams' tracks.
    step_spans = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps = len({e["name"] for e in step_spans})
    host = [float(e.get("dur", 0)) for e in step_spans if e.get("cat") != "gpu_user_annotation"]
    device = [
        (*_span(e), str(e.get("name", ""))) for e in events if e.get("cat") in DEVICE_CATEGORIES
    ]
    gpu_steps = [_span(e) for e in step_spans if e.get("cat") == "gpu_user_annotation"]
    if gpu_steps:  # the recorded steps' GPU window: clip to it, drop what lies outside
        first, last = min(s for s, _ in gpu_steps), max(e for _, e in gpu_steps)
        device = [
            (max(s, first), min(e, last), name) for s, e, name in device if s < last and e > first
        ]
    summary: dict[str, Any] = {
        "steps": steps,
        "host_ms_per_step": sum(host) / len(host) / 1000.0 if host else None,
        "device_events": len(device),
    }
    if not device or not steps:
        keys = ("span", "busy", "compute", "allreduce", "exposed_allreduce")
        return summary | {f"{k}_ms_per_step": None for k in keys} | {"idle_share": None}
    nccl = [(s, e) for s, e, name in device if "nccl" in name.lower()]
    other = [(s, e) for s, e, name in device if "nccl" not in name.lower()]
    span = (
        last - first if gpu_steps else max(e for _, e, _ in device) - min(s for s, _, _ in device)
    )
    busy = _union_us((s, e) for s, e, _ in device)
    compute = _union_us(other)
    per_step = 1000.0 * steps  # µs -> ms, per step
    return summary | {
        "kernels_per_step": len(device) / steps,
        "span_ms_per_step": span / per_step,
        "busy_ms_per_step": busy / per_step,
        "compute_ms_per_step": compute / per_step,
        "allreduce_ms_per_step": _union_us(nccl) / per_step,
        "exposed_allreduce_ms_per_step": (busy - compute) / per_step,
        "idle_share": 1 - busy / span if span > 0 else None,
    }


MIN_STEPS_PER_EPOCH = 3  # a warm-up step and a recorded one, before the epoch's last batch


def profile_window(steps_per_epoch: int, active: int) -> tuple[int, int, int]:
    """(settle, warm-up, active) steps, all inside epoch 2 and before its last, partial batch."""
    if steps_per_epoch < MIN_STEPS_PER_EPOCH:
        raise ValueError(f"an epoch of {steps_per_epoch} steps is too short to profile")
    settle, warmup = SETTLE_STEPS, PROFILER_WARMUP_STEPS
    room = steps_per_epoch - 1 - settle - warmup
    if room < 1:  # short epochs: less settling, so that something is recorded
        settle, warmup, room = 0, 1, steps_per_epoch - 2
    return settle, warmup, max(1, min(active, room))


def check_request(name: str, epochs: int, steps_per_epoch: int, epochs_done: int) -> None:
    """--profile records the second epoch this run trains: refuse what cannot reach it."""
    try:
        profile_window(steps_per_epoch, 1)
    except ValueError:
        raise InputError(
            f"--profile: an epoch of {name!r} has {steps_per_epoch} steps; profiling needs at "
            f"least {MIN_STEPS_PER_EPOCH} (lower train.batch_size)"
        ) from None
    if epochs - epochs_done < 2:
        resuming = f", resuming after epoch {epochs_done}" if epochs_done else ""
        raise InputError(
            f"--profile records the second epoch this run trains, but {name!r} has "
            f"{epochs - epochs_done} left (train.epochs {epochs}{resuming}); raise "
            "train.epochs or drop --profile"
        )


# Kineto (torch.profiler's tracer) logs at and above this level; 6 is above its highest. Only
# a CPU profile is quieted: a GPU one keeps its messages (CUPTI permissions and the like).
KINETO_LOG_ENV, KINETO_QUIET = "KINETO_LOG_LEVEL", "6"


@contextlib.contextmanager
def step_profiler(
    out_dir: Path | None,
    name: str,
    rank: int,
    steps_per_epoch: int,
    *,
    cuda: bool,
    active: int = 20,
) -> Iterator[Callable[[], None]]:
    """Yield a per-step callback; with `out_dir`, it drives a torch.profiler schedule.

    Steps are counted from entry: the recorded ones lie in the second epoch trained inside
    the context. Files of an earlier profile of this variant and rank are removed first.
    """
    if out_dir is None:
        yield lambda: None
        return
    from torch.profiler import ProfilerActivity, profile, schedule

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{name}-rank{rank}"
    for stale in out_dir.glob(f"{stem.name}.*"):
        stale.unlink()

    def write(prof: profile) -> None:
        trace_path = stem.with_suffix(".trace.json")
        prof.export_chrome_trace(str(trace_path))
        sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=30)
        write_text(stem.with_suffix(".txt"), table + "\n")
        summary = summarize_trace(json.loads(trace_path.read_text()))
        write_text(stem.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")

    if not cuda:  # Kineto's start and stop lines, and its ERROR that it found no GPU, are noise
        os.environ.setdefault(KINETO_LOG_ENV, KINETO_QUIET)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    settle, warmup, active = profile_window(steps_per_epoch, active)
    plan = schedule(wait=steps_per_epoch + settle, warmup=warmup, active=active, repeat=1)
    with profile(activities=activities, schedule=plan, on_trace_ready=write) as prof:
        yield prof.step
    if not stem.with_suffix(".json").exists():
        print(f"profile: no steps of {name} were recorded (rank {rank})", file=sys.stderr)
