"""The device clock: every training and evaluation time on a device is read through it.

CUDA work is asynchronous: a host clock read while kernels are queued measures their launch,
not their run, so `DeviceClock` synchronizes before it reads. Intervals that involve the
host alone (the wait for the next batch, CPU-only inference, the stage's phases, download
deadlines) read `time` where they are measured.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # core imports no torch: the clock's caller has it loaded already
    import torch


class DeviceClock:
    """A host clock that first waits for all queued work on `device` to finish.

    Reading it costs one synchronization, so call it at epoch boundaries, never per step.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch  # loaded by whoever made the device: a lookup, not an import

            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()
