"""A training stage's MLflow run, kept by a process of its own.

Starting MLflow costs a training stage seconds on its critical path: importing it and its
store, migrating and opening the store, the system-metrics monitor, logging the model
(5-15 s a stage on the H200 host, `docs/results/h200-time-to-result.md`). So the train stage
starts `python -m accelbench.tracker` once it knows it will train, and sends it what to log
as it happens; the child does the MLflow work (`tracking.py`) on another core while the
stage builds its model and trains. The run is as live as before: each epoch's metrics
reach the store when the epoch ends, and system metrics are sampled throughout. The stage
waits for the run id (which its first checkpoint and its model file record), at its end
for the last messages to be logged, and, a CPU variant, for the child's start-up to be
over before its timed epochs (those use every core: on the H200 host a child starting
beside them made the cpu variant's first epoch 22 s instead of 12 s).

The protocol: JSON lines on the child's stdin, the first one opening the run (`start` or
`resume`), the last one ending it (`end`, with the status the stage ended with); the child
answers the run id (null when tracking is down) on its stdout, then `idle` once it has
nothing more to do until the model arrives. A stdin closed without an
`end` means the stage was killed outright: the child ends the run KILLED and says why.
Tracking trouble never fails the stage: the child reports an outage once (`tracking`),
and a child that is gone only costs the stage its run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from . import phases
from .console import log

KILLED_OUTRIGHT = "its stage process ended without closing the run (killed outright)"


class Tracker:
    """The stage's end of a tracker process: sends what to log, reads the run id once."""

    def __init__(self, process: subprocess.Popen | None = None) -> None:
        self._process = process
        self._run_id: str | None = None
        self._answered = process is None

    @classmethod
    def spawn(cls, root: Path) -> Tracker:
        """A tracker process for `root`'s store: it imports MLflow and opens the store at
        once, then waits for the run to open (`tracked`)."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "accelbench.tracker", str(root.resolve())],
                cwd=root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        except OSError as exc:
            log(f"warning: could not start the MLflow tracker ({exc}); this run is not tracked")
            return cls()
        return cls(process)

    def send(self, message: Mapping[str, Any]) -> None:
        if self._process is None or self._process.stdin is None:
            return
        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the child is gone: stop talking
            self._gone("stopped taking messages")

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        clean = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        self.send({"op": "metrics", "metrics": clean, "step": step})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.send({"op": "artifact", "path": str(path.resolve()), "artifact_path": artifact_path})

    @property
    def run_id(self) -> str | None:
        """The run's id (waits for the child's answer the first time); None if untracked."""
        if not self._answered:
            self._answered = True
            with phases.phase("mlflow"):
                line = self._process.stdout.readline() if self._process.stdout else ""
            try:
                self._run_id = json.loads(line)["run_id"] if line else None
            except (ValueError, KeyError, TypeError):
                self._run_id = None
            if not line:
                self._gone("ended before it opened the run")
        return self._run_id

    def wait_until_idle(self) -> None:
        """Wait until the run is open and the tracker has nothing to do until the model
        arrives: a CPU variant's epochs (every core busy) must not share the CPU with
        MLflow's start-up. A GPU variant's epochs run on one host thread, so it goes on
        while the tracker starts on another core."""
        if self.run_id is None or self._process is None or self._process.stdout is None:
            return
        with phases.phase("mlflow"):
            line = self._process.stdout.readline()
        if not line:
            self._gone("ended before it was ready")

    def end(self, status: str | None) -> None:
        """End the run as `status` and wait for the child to log what it was sent; None: no
        run was opened, and the child just exits (nothing to wait for)."""
        if self._process is None:
            return
        if status is not None:
            self.send({"op": "end", "status": status})
        process, self._process = self._process, None
        with phases.phase("mlflow"):
            for stream in (process.stdin, process.stdout):
                _close(stream)
            if status is None:
                return
            try:
                process.wait(timeout=600)
            except subprocess.TimeoutExpired:
                process.kill()
                log("warning: the MLflow tracker did not finish in 10 minutes; stopped it")

    def _gone(self, what: str) -> None:
        if self._process is not None:
            log(f"warning: the MLflow tracker {what}; this run is tracked no further")
            self._process = None


def _close(stream: IO[str] | None) -> None:
    try:
        if stream is not None:
            stream.close()
    except (BrokenPipeError, OSError):
        pass


@contextmanager
def tracked(tracker: Tracker, opening: Mapping[str, Any] | None) -> Iterator[Tracker]:
    """The run `opening` asks for, open for the body and ended as the body did: FINISHED,
    KILLED (Ctrl-C, SIGTERM) or FAILED. `opening` None: nothing is tracked (a rank other
    than 0), and the tracker, if any, is let go."""
    if opening is None:
        tracker.end(None)
        tracker = Tracker()
    else:
        tracker.send(opening)
    try:
        yield tracker
    except KeyboardInterrupt:
        tracker.end("KILLED")
        raise
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED")


def open_request(
    variant: str,
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    resume_run_id: str | None = None,
    datasets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The first message: resume `resume_run_id`, else start the variant's run (with
    system metrics) under the pipeline run and log the `datasets` it trains and evaluates
    on (`prepared`: the prepared folder, `dataset`: its name, `train_subset`, `test_subset`)."""
    if resume_run_id:
        return {"op": "resume", "run_id": resume_run_id}
    return {
        "op": "start",
        "variant": variant,
        "params": dict(params),
        "tags": dict(tags),
        "datasets": dict(datasets) if datasets else None,
    }


# ---- the tracker process ----------------------------------------------------------------


def _serve(root: Path, lines: Iterator[str], answer: IO[str]) -> None:
    # While the stage imports torch and builds its model: MLflow and the store, opened (and
    # migrated) here and never in the stage.
    from . import tracking

    stage_pid = os.getppid()
    tracking.tolerant(tracking.setup)(root)
    try:
        opening = json.loads(next(lines))
    except StopIteration:  # the stage opened no run after all
        return
    if opening["op"] == "resume":
        run_id = tracking.reopen_run(root, opening["run_id"], stage_pid)
    else:
        run_id = tracking.start_variant_run(
            root,
            opening["variant"],
            opening["params"],
            opening["tags"],
            system_metrics=True,
            pid=stage_pid,
        )
    if run_id is not None and opening.get("datasets"):
        _log_datasets(tracking, opening["datasets"])
    _answer(answer, {"run_id": run_id})
    if run_id is not None:  # what logging the model will need, while the stage trains
        import mlflow.pytorch  # noqa: F401

        from . import build  # noqa: F401
    # From here until the model arrives, this process only logs each epoch's metrics (and
    # samples system metrics): a CPU variant waits for this before its timed epochs.
    _answer(answer, {"idle": True})
    status = None
    for line in lines:
        message = json.loads(line)
        if message["op"] == "end":
            status = message["status"]
            break
        if run_id is not None:
            _handle(tracking, message)
    if run_id is not None:
        if status is None:
            tracking.set_tag(tracking.CLOSED_TAG, KILLED_OUTRIGHT)
        tracking.end_run(status or "KILLED")


def _answer(answer: IO[str], message: Mapping[str, Any]) -> None:
    answer.write(json.dumps(message) + "\n")
    answer.flush()


def _handle(tracking: Any, message: Mapping[str, Any]) -> None:
    op = message["op"]
    if op == "metrics":
        tracking.log_metrics(message["metrics"], step=message["step"])
    elif op == "artifact":
        tracking.log_artifact(Path(message["path"]), message["artifact_path"])
    elif op == "model":
        _log_model(tracking, message)
    else:
        raise ValueError(f"unknown tracker message {op!r}")


def _log_datasets(tracking: Any, message: Mapping[str, Any]) -> None:
    from . import data

    prepared, dataset = Path(message["prepared"]), message["dataset"]
    for split, limit, context in (
        ("train", message["train_subset"], "training"),
        ("test", message["test_subset"], "evaluation"),
    ):
        arrays = data.load_split(prepared, split, limit)
        digest = data.dataset_digest(split, limit, prepared)
        tracking.log_dataset(
            f"{dataset}-{split}", arrays.images, arrays.labels, prepared, digest, context
        )


def _log_model(tracking: Any, message: Mapping[str, Any]) -> None:
    import numpy as np

    from . import build
    from .results import ModelFile

    model_file = ModelFile.load(Path(message["path"]))
    model = build.trained_model(model_file.state_dict, dataset=message["dataset"])
    example = np.asarray(message["example"], dtype=np.float32)
    tracking.log_model(model, example, model_file.variant)


def main() -> None:
    # Ctrl-C (and a SIGTERM to the process group) reach this process too: the stage says
    # how its run ended, or closes its end of the pipe by dying.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _serve(Path(sys.argv[1]), iter(sys.stdin), sys.stdout)


if __name__ == "__main__":
    main()
