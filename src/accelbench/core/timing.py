"""The one place that reads clocks. CUDA work is asynchronous: synchronize before reading."""

from __future__ import annotations

import time

import torch


class DeviceClock:
    """A host clock that first waits for all queued work on `device` to finish.

    Reading it costs one synchronization, so call it at epoch boundaries, never per step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()
