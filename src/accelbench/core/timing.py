"""The device clock: every training and evaluation time on a device is read through it.

CUDA work is asynchronous: a host clock read while kernels are queued measures their launch,
so `DeviceClock` synchronizes before it reads. Intervals on the host alone (a batch wait,
CPU-only inference, phases) read `time` where they are measured.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from accelbench.core.phases import boot_clock

if TYPE_CHECKING:  # core imports no torch: the clock's caller has it loaded already
    import torch


class DeviceClock:
    """A host clock that first waits for all queued work on `device` to finish: a read costs
    one synchronization, so read it at epoch boundaries, never per step."""

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
    """Seconds this process did not run (SIGSTOP, a suspend, starved of CPU): a daemon thread
    ticks every HEARTBEAT_S on the boot clock; a gap far over the tick, less the CPU time used
    meanwhile (a thread holding the GIL delays the tick, but runs), was time stopped. Read it
    outside timed regions: it takes a lock."""

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
