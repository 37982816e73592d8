"""run_summary.py: achieved TFLOP/s against every process's datasheet peak, per-process
throughput under DDP."""

from __future__ import annotations

import pytest
import torch

from accelbench.core.params import VariantParams
from accelbench.core.results import EpochRecord
from accelbench.training.placement import Placement
from accelbench.training.run_summary import summarize_run


def test_tflops_share_of_peak_and_per_process_throughput() -> None:
    records = [
        EpochRecord(epoch, 0.1, seconds, 0.0, 60000, 60000 / seconds, 0.1, 0.99, 0, 1e-3, None)
        for epoch, seconds in ((1, 2.0), (2, 0.5), (3, 0.5))
    ]
    two_h200s = Placement(torch.device("cpu"), "NVIDIA H200", world_size=2)
    tf32 = VariantParams(device="cuda", tf32=True)
    summary = summarize_run(
        records, tf32, two_h200s, accumulation_steps=2, flops_per_sample=1_000_000
    )
    assert summary.steady_tflops == pytest.approx(1e6 * 60000 / 0.5 / 1e12)
    assert summary.peak_tflops == 494.7
    assert summary.peak_share == pytest.approx(summary.steady_tflops / (494.7 * 2))
    assert summary.steady_samples_per_s_per_process == 60000 / 0.5 / 2
    assert summary.accumulation_steps == 2 and summary.world_size == 2
    one_cpu = Placement(torch.device("cpu"), "Test CPU")
    alone = summarize_run(
        records, VariantParams(device="cpu"), one_cpu, accumulation_steps=1, flops_per_sample=1
    )
    assert alone.peak_share is None and alone.steady_samples_per_s_per_process is None
