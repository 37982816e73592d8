"""The process that makes a training's MLflow calls (`tracked_run.py` starts it).

    python -m accelbench.training.tracked_run_worker FD_IN FD_OUT

It reads the stage's calls from FD_IN in order and answers the start and the end on FD_OUT.
Before it answers the start it has also imported what the run's end needs (MLflow's PyTorch
flavour, torch, the model code), so none of that is left for the stage to wait for. The run
ends as the stage says; KILLED when the stage is gone without a word (its pipe closed, or
SIGTERM once its process ended: `lifetime.end_with_parent`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from accelbench.system import lifetime
from accelbench.system.tracking import logs, runs


class _StageFailed(Exception):
    """The stage's training failed: the run ends FAILED."""


def _stopped(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: unwinding is under way
    raise KeyboardInterrupt


class _NotNeeded(Exception):
    """The stage closed the worker before any run: it skipped the variant, or launched
    torchrun, whose rank 0 tracks."""


def _started(inbox: Connection, stack: contextlib.ExitStack) -> str | None:
    """The first call: start (or re-open) the run; then import what its end needs."""
    try:
        op, *args = inbox.recv()
    except EOFError:
        raise _NotNeeded from None
    if op == "start":
        root, variant, params, tags, datasets = args
        run_id = stack.enter_context(
            runs.variant_run(root, variant, params, tags, system_metrics=True)
        )
        for name, prepared_dir, limit, context in datasets if run_id else ():
            _log_dataset(name, prepared_dir, limit, context)
    elif op == "resume":
        run_id = stack.enter_context(runs.resume_run(*args))
    else:
        raise ValueError(f"the first call must be start or resume, not {op!r}")
    import mlflow.pytorch  # noqa: F401  (the model's logging, at the run's end)

    from accelbench.training import build  # noqa: F401

    return run_id


def _log_dataset(name: str, prepared_dir: Path, limit: int, context: str) -> None:
    from accelbench.data import prepared

    split = "train" if context == "training" else "test"
    arrays = prepared.load_split(prepared_dir, split, limit)
    digest = prepared.dataset_digest(prepared_dir, split, limit)
    logs.log_dataset(name, arrays.images, arrays.labels, prepared_dir, digest, context)


def _log_outputs(summary, artifacts, model_file: Path, dataset: str, example) -> None:
    from accelbench.core.results import ModelFile
    from accelbench.data.datasets import by_name
    from accelbench.training import build

    logs.log_train_summary(summary)
    for path, folder in artifacts:
        logs.log_artifact(path, folder)
    state_dict = ModelFile.load(model_file).state_dict  # the stage's own, written just now
    logs.log_model(build.trained_model(by_name(dataset), state_dict), example, model_file.stem)


def serve(inbox: Connection, outbox: Connection) -> None:
    """Make the stage's calls until it ends the run (or is gone: KILLED)."""
    with contextlib.ExitStack() as stack:
        outbox.send(("run_id", _started(inbox, stack)))
        while True:
            try:
                op, *args = inbox.recv()
            except EOFError:  # the stage ended without a word
                raise KeyboardInterrupt from None
            if op == "metrics":
                logs.log_metrics(*args)
            elif op == "outputs":
                _log_outputs(*args)
            elif op == "end":
                (status,) = args
                if status == "KILLED":
                    raise KeyboardInterrupt
                if status == "FAILED":
                    raise _StageFailed
                break
            else:
                raise ValueError(f"unknown call {op!r}")
    outbox.send(("ended", None))


def main(argv: list[str]) -> int:
    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the stage, which says KILLED
    signal.signal(signal.SIGTERM, _stopped)
    lifetime.end_with_parent(os.getppid())
    try:
        serve(inbox, outbox)
    except _NotNeeded:
        pass
    except (KeyboardInterrupt, _StageFailed):
        with contextlib.suppress(OSError):
            outbox.send(("ended", None))
    except Exception:  # our bug: the stage raises it, with this traceback
        with contextlib.suppress(OSError):
            outbox.send(("error", traceback.format_exc()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
