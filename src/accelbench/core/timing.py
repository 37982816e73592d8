"""The device clock: every training and evaluation time on a device is read through it.

CUDA work is asynchronous: a host clock read while kernels are queued measures their launch,
not their run, so `DeviceClock` synchronizes before it reads. Intervals that involve the
host alone (the wait for the next batch, CPU-only inference, the stage's phases, download
deadlines) read `time` where they are measured.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from accelbench.core.phases import boot_clock

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


HEARTBEAT_S = 0.05  # the heartbeat's tick
STOPPED_GAP_S = 0.25  # a longer gap between ticks was time the process did not run


class Heartbeat:
    """Seconds this process did not run: stopped (SIGSTOP, Ctrl-Z), its machine suspended, or
    starved of CPU. A daemon thread ticks every HEARTBEAT_S on the boot clock, which counts a
    suspend; while the process is stopped so is its thread, so a gap far over the tick is
    time the process was stopped, less the CPU time the process used meanwhile: a thread that
    holds the GIL (torch.compile tracing a graph, for seconds) delays the tick too, but runs.
    Read it outside timed regions: it takes a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last, self._cpu, self._stopped_s = boot_clock(), time.process_time(), 0.0
        threading.Thread(target=self._beat, name="accelbench-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            self.stopped_s()

    def stopped_s(self) -> float:
        """Seconds stopped since the heartbeat started, a gap still open included."""
        with self._lock:
            now, cpu = boot_clock(), time.process_time()  # every thread's CPU time
            gap, ran = now - self._last, cpu - self._cpu
            if gap > STOPPED_GAP_S:
                self._stopped_s += max(0.0, gap - HEARTBEAT_S - ran)
            self._last, self._cpu = now, cpu
            return self._stopped_s
