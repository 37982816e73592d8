"""A `dvc repro`'s runs: one parent run ("pipeline") holding one child run per variant.

The first stage to need the parent writes its run id to `.accelbench/pipeline-run` and the
others read it there; compare, which runs last, finishes it and removes the file (a DVC
experiment's copy keeps its own: one pipeline run per experiment). A stage run by hand gets a
pipeline run of its own ("by hand") that ends with its process, so no repro adopts it.
A variant run starts and ends with its train stage, so the UI's Duration is that stage's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from accelbench.core.outputs import write_text
from accelbench.system import lifetime
from accelbench.system.tracking import outage
from accelbench.system.tracking.dead_runs import (
    BY_HAND_TAG,
    HOST_TAG,
    close_gone_by_hand,
    close_zombies,
    process_tags,
)
from accelbench.system.tracking.logs import log_metrics
from accelbench.system.tracking.outage import tolerant
from accelbench.system.tracking.store import (
    EXPERIMENT,
    ROLE_TAG,
    once_more_on_conflict,
    run_in_store,
    setup,
)
from accelbench.system.tracking.view import VARIANT_RUNS_TAG, VIEW_TAG, variants_view

WORKDIR_TAG = "accelbench.workdir"
GPUS_TAG = "accelbench.gpus"  # a CUDA variant's GPUs, as CUDA_VISIBLE_DEVICES named them
EXP_NAME_TAG = "dvc.exp_name"
PIPELINE_RUN_FILE = Path(".accelbench") / "pipeline-run"
SYSTEM_METRICS_INTERVAL_S = 1


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}"""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _common_tags(root: Path, role: str) -> dict[str, str]:
    tags = {ROLE_TAG: role, WORKDIR_TAG: str(root.resolve()), HOST_TAG: socket.gethostname()}
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        git = ["git", "rev-parse", "HEAD"]
        out = subprocess.run(git, cwd=root, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            tags["mlflow.source.git.commit"] = out.stdout.strip()
    if exp_name := os.environ.get("DVC_EXP_NAME"):
        tags[EXP_NAME_TAG] = exp_name
    return tags


# This process's own pipeline run, by experiment, where it runs by hand: ended as it ends.
_by_hand: dict[str, str] = {}


def open_pipeline_run_id(root: Path) -> str | None:
    """The RUNNING pipeline run this checkout's `dvc repro` (by hand: this process) started;
    a pointer to a run the store has not (a deleted mlflow.db) is removed."""
    pointer = root / PIPELINE_RUN_FILE
    try:
        run_id = (
            pointer.read_text().strip() if lifetime.under_dvc() else _by_hand[_experiment_key()]
        )
    except (OSError, KeyError):
        return None
    try:
        run = run_in_store(MlflowClient(), run_id)
    except MlflowException:  # not a run id at all
        run = None
    if run is None:
        pointer.unlink(missing_ok=True)
        _by_hand.pop(_experiment_key(), None)
        return None
    if run.info.status != "RUNNING" or run.data.tags.get(ROLE_TAG) != "pipeline":
        return None
    return run_id


def _experiment_key() -> str:
    """The store and experiment this process tracks into (`_by_hand`'s key)."""
    return f"{mlflow.get_tracking_uri()} {EXPERIMENT}"


def pipeline_run_id(root: Path, experiment_id: str) -> str:
    """The RUNNING parent run of this checkout, created (and its id kept) if there is none."""
    if run_id := open_pipeline_run_id(root):
        return run_id
    by_hand = not lifetime.under_dvc()  # else named after its DVC experiment, as dvc exp show
    kind = "by hand" if by_hand else (os.environ.get("DVC_EXP_NAME") or "pipeline")
    client = MlflowClient()
    tags = _common_tags(root, "pipeline")
    if by_hand:  # its process ends it; one killed outright, the next by hand does
        close_gone_by_hand(experiment_id)
        tags |= {BY_HAND_TAG: "true", **process_tags()}
    run = client.create_run(
        experiment_id, tags=tags, run_name=f"{kind} {datetime.now():%Y-%m-%d %H:%M:%S}"
    )
    once_more_on_conflict(
        lambda: client.set_experiment_tag(experiment_id, VIEW_TAG, variants_view(run.info.run_id))
    )
    if by_hand:
        if not _by_hand:
            atexit.register(end_by_hand_runs)
        _by_hand[_experiment_key()] = run.info.run_id
        return run.info.run_id
    write_text(root / PIPELINE_RUN_FILE, run.info.run_id + "\n")
    return run.info.run_id


def end_by_hand_runs() -> None:
    """End the pipeline runs this process started by hand (at its exit) FINISHED."""
    while _by_hand:
        _, run_id = _by_hand.popitem()
        with outage.reported():
            try:
                MlflowClient().set_terminated(run_id, "FINISHED")
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # gone with its store
                    raise


def variant_run(
    root: Path,
    variant: str,
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    *,
    system_metrics: bool = False,
) -> AbstractContextManager[str | None]:
    """A child run of the pipeline run for one variant, ended FINISHED, FAILED or KILLED as
    the body did; yields its run id (None when tracking is down: the body runs untracked).
    With `system_metrics`, MLflow samples CPU, memory and GPU every second."""
    return _ended_as_it_went(_start_variant_run(root, variant, params, tags, system_metrics))


@tolerant
def _start_variant_run(
    root: Path,
    variant: str,
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    system_metrics: bool,
) -> str:
    experiment_id = setup(root)
    parent = pipeline_run_id(root, experiment_id)
    all_tags = {**_common_tags(root, "variant"), "variant": variant, **tags}
    if tags.get("device") == "cuda" and os.environ.get("CUDA_VISIBLE_DEVICES"):
        all_tags[GPUS_TAG] = os.environ["CUDA_VISIBLE_DEVICES"]
    if system_metrics:  # every second, unless MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says
        os.environ.setdefault(
            "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", str(SYSTEM_METRICS_INTERVAL_S)
        )
    close_zombies(experiment_id, parent, variant)
    run = mlflow.start_run(
        run_name=variant,
        parent_run_id=parent,
        tags=all_tags | process_tags(),
        log_system_metrics=system_metrics,
    )
    try:
        mlflow.log_params({k: "null" if v is None else v for k, v in flatten(params).items()})
        for name in ("params.yaml", "dvc.lock"):  # what produced this run
            if (root / name).is_file():
                mlflow.log_artifact(str(root / name), artifact_path="pipeline")
    except BaseException:
        with outage.reported():
            mlflow.end_run(status="FAILED")
        raise
    return run.info.run_id


@contextmanager
def _ended_as_it_went(run_id: str | None) -> Iterator[str | None]:
    """End the active run as the body went: FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED."""
    if run_id is None:
        yield None
        return
    status = "FAILED"
    try:
        yield run_id
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        with outage.reported():  # the server went away: the local state still has to end
            mlflow.end_run(status=status)


def resume_run(root: Path, run_id: str) -> AbstractContextManager[str | None]:
    """Re-open a variant's run (evaluation, or training resumed from a checkpoint)."""
    return _ended_as_it_went(_reopen_run(root, run_id))


@tolerant
def _reopen_run(root: Path, run_id: str) -> str:
    experiment_id = setup(root)
    run = MlflowClient().get_run(run_id)
    parent, variant = run.data.tags.get("mlflow.parentRunId"), run.data.tags.get("variant")
    if parent and variant:
        close_zombies(experiment_id, parent, variant, keep=run_id)
    reopened = mlflow.start_run(run_id=run_id).info.run_id
    mlflow.set_tags(process_tags())
    return reopened


def record_skipped(root: Path, variant: str, params: Mapping[str, Any], reason: str) -> str | None:
    """A variant this machine could not run, as a run tagged with why and no metric."""
    with variant_run(root, variant, params, {"status": "skipped", "skip_reason": reason}) as run:
        return run


@tolerant
def finish_pipeline(
    root: Path,
    artifacts: list[Path],
    metrics: Mapping[str, float],
    variant_runs: Sequence[str] = (),
) -> str | None:
    """Log the comparison to the open pipeline run (a new one where a repro re-ran compare
    alone) and finish it; returns its id. Where some of `variant_runs` trained under an
    earlier pipeline run, this one names them all (`VARIANT_RUNS_TAG`) for the saved view."""
    experiment_id = setup(root)
    run_id = pipeline_run_id(root, experiment_id)
    client = MlflowClient()
    parents = {
        rid: run.data.tags.get("mlflow.parentRunId")
        for rid in variant_runs
        if (run := run_in_store(client, rid)) is not None
    }
    if any(parent != run_id for parent in parents.values()):
        shown = list(parents)
        client.set_tag(run_id, VARIANT_RUNS_TAG, ",".join(shown))
        once_more_on_conflict(
            lambda: client.set_experiment_tag(experiment_id, VIEW_TAG, variants_view(run_id, shown))
        )
    with mlflow.start_run(run_id=run_id):
        for path in artifacts:
            mlflow.log_artifact(str(path))
        log_metrics(metrics)
    if lifetime.under_dvc():
        (root / PIPELINE_RUN_FILE).unlink(missing_ok=True)
    else:
        _by_hand.pop(_experiment_key(), None)  # ended just now
    return run_id
