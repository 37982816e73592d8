"""A training's MLflow run, its calls made by a process of their own.

MLflow costs a train stage seconds it would otherwise only wait through: its import (3.1-3.4 s
on an H200 host), the run's start, its params and datasets, the model at the end. The train
stage hands those calls to a worker (`tracked_run_worker.py`), started with the stage, so
they run beside the stage's own set-up (torch, Dynamo, the model, the data) instead of
before it; the stage waits for the run only before its first timed epoch (so a CPU variant's
epochs share no core with MLflow's import) and for what is left at its end. This process
never imports MLflow.

The run ends as the stage did: FINISHED, FAILED, or KILLED (Ctrl-C, SIGTERM, or the stage's
process gone: the worker ends with it). Tracking that is down costs one line, as in-process
(`tracking/outage.py`); a bug in the worker raises here, with its traceback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import accelbench

ENDING_WAIT_S = 1.5  # a stopping stage waits this long for its run to end KILLED (lifetime)
_UNSET = object()


class TrackingWorkerError(RuntimeError):
    """The worker failed in our code (not a tracking outage): its traceback."""


class TrackedRun:
    """One variant's run in the worker process; every call but `run_id` and `end` returns at
    once, and the worker makes them in order."""

    def __init__(self) -> None:
        to_worker, from_worker = os.pipe(), os.pipe()
        source = str(Path(accelbench.__file__).parents[1])  # the worker imports this accelbench
        path = os.environ.get("PYTHONPATH")
        env = os.environ | {"PYTHONPATH": source + (os.pathsep + path if path else "")}
        worker = (
            "-m",
            "accelbench.training.tracked_run_worker",
            str(to_worker[0]),
            str(from_worker[1]),
        )
        self._process = subprocess.Popen(
            [sys.executable, *worker],
            pass_fds=(to_worker[0], from_worker[1]),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(to_worker[0])
        os.close(from_worker[1])
        self._outbox = Connection(to_worker[1], readable=False)
        self._inbox = Connection(from_worker[0], writable=False)
        self._run_id: Any = _UNSET

    def start(
        self,
        root: Path,
        variant: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        datasets: Sequence[tuple[str, Path, int, str]],
    ) -> None:
        """A new run for `variant`, with `datasets` logged as its inputs: (name, prepared
        folder, the split's `limit` (0: all), context) per split of the prepared data."""
        self._send("start", root, variant, dict(params), dict(tags), list(datasets))

    def resume(self, root: Path, run_id: str) -> None:
        """The run a checkpoint names, re-opened (a training resumed after a kill)."""
        self._send("resume", root, run_id)

    @property
    def run_id(self) -> str | None:
        """The run's id once the worker started it (None: tracking is down); waits for it."""
        if self._run_id is _UNSET:
            self._run_id = self._reply()
        return self._run_id

    def log_metrics(self, metrics: Mapping[str, float | int | None], step: int) -> None:
        self._send("metrics", dict(metrics), step)

    def log_outputs(
        self,
        summary: Any,
        artifacts: Sequence[tuple[Path, str | None]],
        model_file: Path,
        dataset: str,
        example: Any,
    ) -> None:
        """The run's summary figures, its files (path, folder in the run) and the trained
        model (read back from `model_file`, logged with `example` inputs: a numpy array)."""
        self._send("outputs", summary, list(artifacts), model_file, dataset, example)

    def end(self, status: str) -> None:
        """End the run FINISHED, FAILED or KILLED and wait for the worker: at most
        ENDING_WAIT_S when the stage is stopping (KILLED), else as long as the calls take."""
        stopping = status == "KILLED"
        self._send("end", status)
        try:
            if not stopping or self._inbox.poll(ENDING_WAIT_S):
                self._reply()
        except (EOFError, OSError):  # gone already: it ended the run as its stage went
            if not stopping:
                raise
        finally:
            self._close(wait_s=ENDING_WAIT_S if stopping else None)

    def close(self) -> None:
        """No run after all (a skipped variant; torchrun's rank 0 tracks its own)."""
        self._close(wait_s=ENDING_WAIT_S)

    def _send(self, *message: Any) -> None:
        with contextlib.suppress(OSError):  # the worker is gone: `_reply` says why
            self._outbox.send(message)

    def _reply(self) -> Any:
        try:
            kind, value = self._inbox.recv()
        except EOFError:
            code = self._process.wait()
            raise TrackingWorkerError(
                f"the MLflow worker (pid {self._process.pid}) ended with exit code {code} "
                "before it answered"
            ) from None
        if kind == "error":
            self._close(wait_s=ENDING_WAIT_S)
            raise TrackingWorkerError(f"the MLflow worker failed:\n{value}")
        return value

    def _close(self, wait_s: float | None) -> None:
        self._outbox.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # then it ends with this process
            self._process.wait(timeout=wait_s)
        self._inbox.close()
