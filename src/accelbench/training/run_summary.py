"""A trained variant's `TrainSummary`: the engine's epoch figures, and what they mean here."""

from __future__ import annotations

import resource
from dataclasses import asdict

from accelbench.core.params import VariantParams
from accelbench.core.results import EpochRecord, TrainSummary, steady_epochs
from accelbench.system import hardware
from accelbench.training import engine
from accelbench.training.placement import Placement


def summarize_run(
    records: list[EpochRecord],
    variant: VariantParams,
    placement: Placement,
    *,
    accumulation_steps: int,
    flops_per_sample: int,
    repeats: list[list[EpochRecord]] | None = None,
    repeats_wall_s: float | None = None,
    compile_cache: str | None = None,
) -> TrainSummary:
    """Epoch figures, plus achieved TFLOP/s against every process's datasheet peak, and
    per-process throughput under DDP; `repeats`' epochs 2..N join the steady samples.
    `compile_cache`: `compile_cache.state(...)` before the repeats (which hit every graph)."""
    repeats = repeats or []
    more_steady = [r.train_time_s for repeat in repeats for r in steady_epochs(repeat)]
    figures = engine.summarize(records, more_steady)  # the TrainSummary's first fields
    world_size = placement.world_size
    steady_s = figures.steady_epoch_s or figures.first_epoch_s
    samples = records[-1].samples
    steady_tflops = flops_per_sample * samples / steady_s / 1e12
    peak = hardware.peak_tflops(placement.device_name, variant.precision, variant.tf32)
    per_process = figures.steady_samples_per_s
    return TrainSummary(
        **asdict(figures),
        accumulation_steps=accumulation_steps,
        device=variant.device,
        device_name=placement.device_name,
        precision=variant.precision,
        batches=variant.batches,
        world_size=world_size,
        train_samples=samples,
        flops_per_sample=flops_per_sample,
        steady_tflops=steady_tflops,
        peak_tflops=peak,
        peak_share=steady_tflops / (peak * world_size) if peak else None,
        peak_host_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        steady_samples_per_s_per_process=(
            per_process / world_size if world_size > 1 and per_process else None
        ),
        compile_cache=compile_cache if variant.compile != "none" else None,
        repeats=1 + len(repeats),
        repeat_epochs=[[[r.train_time_s, r.test_accuracy] for r in repeat] for repeat in repeats],
        repeats_wall_s=repeats_wall_s,
    )
