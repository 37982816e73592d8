"""Everything MLflow, in one place.

One `dvc repro` = one parent run ("pipeline") holding one child run per variant. Stages are
separate processes, so the first one to need the parent writes its run id to
`.accelbench/pipeline-run` in the checkout, and the others read it there: the same checkout
finds its run from the host and from a container alike, whatever the path or host name. The
compare stage, which runs last, logs the report to it, finishes it and removes the file.
A stage run by hand (no `DVC_STAGE`: a profiled training, one of a benchmark's sweep) gets
a pipeline run of its own ("by hand"), which ends with its process: no `dvc repro` adopts
runs it did not make, and no stage run by hand joins a repro that stopped part way (the
next repro resumes that one). Compare logs each variant's
evaluation and headline figures into the variant's run through the client, without re-opening
it: a variant run starts and ends with its train stage, so the UI's Duration is that stage's.

The experiment keeps one saved view of the runs table (`VIEW_ID`), rewritten whenever a new
pipeline run starts: that pipeline's trained variants, fastest first, their speedup, steady
epoch, test accuracy and time to target as the first columns. `make ui` and `accelbench runs`
link it.

The repository's own store (`mlflow.db`) keeps its artifacts in `mlartifacts/` under a
*relative* location, so the store and its artifacts can move together: to another path, or
into a container that mounts the checkout at /workspace.

DVC experiments run with `--temp` or from the queue (`dvc queue start`) run the pipeline in a
copy of the repository under `.dvc/tmp/exps/`, deleted afterwards. Their runs go to the store
of the workspace the copy was made from (`store_root`), their artifacts through a link to its
`mlartifacts/`; each copy keeps its own pipeline run pointer, so every experiment is one
pipeline run, named after the experiment.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import logging
import math
import os
import socket
import sqlite3
import subprocess
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import mlflow
import psutil
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from accelbench.core import phases
from accelbench.core.console import AccelbenchError, InputError, clip, log, redact
from accelbench.core.progress import fmt_interval, fmt_ratio, fmt_seconds
from accelbench.core.results import EpochRecord, EvalSummary, TrainSummary

T = TypeVar("T")
EXPERIMENT = "accelbench"
ROLE_TAG = "accelbench.role"
WORKDIR_TAG = "accelbench.workdir"
HOST_TAG = "accelbench.host"
MACHINE_TAG = "accelbench.boot_id"  # the running kernel: the host and its containers share it
PID_TAG = "accelbench.pid"  # the process that has the run open, and when it started,
PID_STARTED_TAG = "accelbench.pid_started"  # so that a reused pid is not mistaken for it
CLOSED_TAG = "accelbench.closed"  # why a rerun ended a run its killed process left RUNNING
BY_HAND_TAG = "accelbench.by_hand"  # "true" on the pipeline run of a stage run by hand
# A pipeline run's trained variants where some trained under an earlier pipeline run (a
# `dvc repro` that re-ran compare alone): their run ids, comma-separated.
VARIANT_RUNS_TAG = "accelbench.variant_runs"
# A CUDA variant's GPUs, as CUDA_VISIBLE_DEVICES named them: those it took (system/slots.py)
GPUS_TAG = "accelbench.gpus"
KIND_TAG = "mlflow.experimentKind"
STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
PIPELINE_RUN_FILE = Path(".accelbench") / "pipeline-run"
EXP_NAME_TAG = "dvc.exp_name"
WORKSPACE_ENV = "DVC_ROOT"  # DVC sets it for every stage: the workspace an experiment came from


def store_root(root: Path) -> Path:
    """The folder whose `mlflow.db` is the repository's store, for a stage running in `root`.

    DVC sets $DVC_ROOT for every stage it runs: the repository root for `dvc repro` and
    `dvc exp run`, and for `--temp` and queued experiments, which run in a throwaway copy,
    the workspace the copy was made from. Without it (a stage run by hand) it is `root`.
    """
    workspace = os.environ.get(WORKSPACE_ENV)
    if not workspace:
        return root
    if not Path(workspace).is_dir():  # queued on another machine or container path
        log(f"${WORKSPACE_ENV} {workspace} is not a folder here; tracking into {root / STORE}")
        return root
    return Path(workspace)


def workspace_root(start: Path, params: Path | None = None) -> Path:
    """The workspace a command run in `start` belongs to, found as DVC finds its root: the
    nearest folder upwards that holds `.dvc/`; outside one, the folder of the params file
    (`accelbench --params ../params.yaml runs` from a subfolder), else `start`."""
    for origin in (start, (start / params).parent if params is not None else None):
        if origin is None:
            continue
        origin = origin.resolve()
        for folder in (origin, *origin.parents):
            if (folder / ".dvc").is_dir():
                return folder
    return (start / params).parent.resolve() if params is not None else start


def tracking_uri(root: Path) -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite store at an absolute path in the workspace."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(store_root(root) / STORE).resolve()}"
    )


# A tracking server that is down must cost seconds, not MLflow's default minutes of retries.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
_outage: str | None = None  # set once tracking failed: the rest of this process skips it


def _environment_defaults() -> None:
    """MLflow's settings for accelbench, each unless the user set it: no telemetry, short HTTP
    retries, and no "View run ... at" lines (two per run logged to a server)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def is_server(uri: str) -> bool:
    """Whether the tracking URI is a tracking server's (over HTTP), not a store of one's own."""
    return uri.startswith(("http://", "https://"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def describe_failure(exc: BaseException) -> str:
    """What went wrong, in a few words: the innermost cause says it ("OperationalError:
    database is locked"), where MLflow's own exception wraps it in a line of SQLAlchemy advice."""
    root, seen = exc, {id(exc)}
    while (cause := root.__cause__ or root.__context__) is not None and id(cause) not in seen:
        root = cause
        seen.add(id(root))
    if root is exc:
        return clip(f"{type(exc).__name__}: {_first_line(exc)}", 300)
    return clip(f"{type(exc).__name__} from {type(root).__name__}: {_first_line(root)}", 300)


_PACKAGE = Path(__file__).resolve().parents[1]  # accelbench/
# Set (to "raise") by the test suite: an error raised in accelbench's own tracking code is a
# bug to fail on, not an outage to carry on through.
BUGS_ENV = "ACCELBENCH_TRACKING_BUGS"


_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def raised_here(exc: BaseException) -> bool:
    """Whether `exc` was raised by accelbench's own code (a bug: a KeyError for a figure's
    name, a TypeError), directly or through the standard library, not by MLflow, its store
    or the network, and wraps nothing from them."""
    return _our_frame(exc) is not None


def _our_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The frame of accelbench's code that raised `exc` (or called the standard library that
    did); None where MLflow, a library or the network raised it."""
    if isinstance(exc, MlflowException | OSError | sqlite3.Error) or exc.__cause__ is not None:
        return None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):  # innermost first
        path = Path(frame.filename).resolve()
        if not path.is_relative_to(_STDLIB) or {"site-packages", "dist-packages"} & set(path.parts):
            return frame if path.is_relative_to(_PACKAGE) else None
    return None


def _report_outage(exc: BaseException) -> None:
    global _outage
    if _outage is not None:
        return
    _outage = describe_failure(exc)
    uri = mlflow.get_tracking_uri()
    if (where := _our_frame(exc)) is not None:
        log(
            f"accelbench: WARNING: tracking to MLflow at {uri} stopped on a bug in accelbench "
            f"({_outage}, {Path(where.filename).name}:{where.lineno}), not on the store. The "
            "stage goes on and writes its DVC outputs; this process logs nothing more to "
            "MLflow. Please report it with this line."
        )
        return
    log(
        f"accelbench: WARNING: MLflow tracking at {uri} failed ({_outage}). The stage goes "
        "on and writes its DVC outputs; this process logs nothing more to MLflow. "
        f"Before the next run: {_remedy(uri, exc)}."
    )


class _HeldBack(logging.Filter):
    """On one of MLflow's log handlers: MLflow's warnings and errors (a traceback each, six
    on a locked store) wait while a tracking call runs (`_mlflow_logs_held`), and go once
    tracking failed: the outage is one warning line (`_report_outage`)."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if _outage is not None:
            return False
        if _held is not None:
            _held.append((self.handler, record))
            return False
        return True


_held: list[tuple[logging.Handler, logging.LogRecord]] | None = None


@contextmanager
def _mlflow_logs_held() -> Iterator[None]:
    """MLflow's warnings and errors during the body: dropped if it fails (its caller says why
    in one line), shown as they were if it succeeds."""
    global _held
    for handler in logging.getLogger("mlflow").handlers:
        if not any(isinstance(f, _HeldBack) for f in handler.filters):
            handler.addFilter(_HeldBack(handler))
    if _held is not None:  # within another tracking call: the outermost decides
        yield
        return
    _held = []
    try:
        yield
    except BaseException:
        _held = None
        raise
    records, _held = _held, None
    for handler, record in records:
        handler.handle(record)


def tolerant(function: Callable[..., T]) -> Callable[..., T | None]:
    """Run a tracking call unless tracking already failed; a failure is reported once, in one
    line, instead of MLflow's own tracebacks."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        if _outage is not None:
            return None
        try:
            with phases.phase("mlflow"), _mlflow_logs_held():
                return function(*args, **kwargs)
        except Exception as exc:  # MlflowException, requests errors, sqlite errors, ...
            if os.environ.get(BUGS_ENV) == "raise" and raised_here(exc):
                raise
            _report_outage(exc)
            return None

    return wrapper


STORE_LOCK = Path(".accelbench") / "mlflow.db.lock"  # in the workspace, beside its store
STORE_LOCK_TIMEOUT_S = 300


def _sqlite_path(uri: str) -> Path | None:
    """The file of a SQLite store's URI (None: not a SQLite file)."""
    if not uri.startswith("sqlite:///") or uri.startswith("sqlite:///:memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def _store_lock_path(uri: str, workspace: Path, own_store: bool) -> Path | None:
    """The lock file that serializes setting up the SQLite store at `uri` (None: not SQLite)."""
    if own_store:
        return workspace / STORE_LOCK
    store = _sqlite_path(uri)
    return None if store is None else store.with_name(store.name + ".lock")


@contextmanager
def _store_locked(path: Path | None, store: Path | None = None) -> Iterator[None]:
    """Hold `path`'s lock (fcntl.flock: released by the kernel when the process dies, however it
    dies), waiting up to STORE_LOCK_TIMEOUT_S for another process to release it. Where the
    lock cannot be made and the `store` is one this process cannot write either (a read-only
    mount, a colleague's folder), it can only read the store, and readers need no lock."""
    if path is None:
        yield
        return
    import fcntl
    import time

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
    except OSError as exc:
        read_only = store is not None and store.exists() and not os.access(store, os.W_OK)
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not read_only:
            raise
        handle = None
    if handle is None:
        yield
        return
    with handle:
        deadline = time.monotonic() + STORE_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{path}: held by another process for over {STORE_LOCK_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def setup(root: Path) -> str:
    """Point MLflow at the store and the `accelbench` experiment; returns the experiment id.

    Creating a SQLite store (MLflow's schema migrations) and the experiment happen under a
    file lock: the experiments of `dvc queue start -j 2` start at once on a new workspace, and
    two processes migrating one new database fail ("duplicate column name").
    """
    _environment_defaults()
    own_store = not os.environ.get("MLFLOW_TRACKING_URI")  # read before set_tracking_uri sets it
    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    workspace = store_root(root)
    if own_store:
        _link_artifacts(root, workspace)
    store = workspace / STORE if own_store else _sqlite_path(uri)
    with _store_locked(_store_lock_path(uri, workspace, own_store), store):
        experiment_id = _experiment_id(workspace, own_store)
        if own_store:
            relative_artifacts(workspace / STORE)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def _experiment_id(workspace: Path, own_store: bool) -> str:
    """The `accelbench` experiment's id, the experiment created if the store has none."""
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)  # creates and migrates the store
    if experiment is not None:
        return experiment.experiment_id
    artifacts = (workspace / ARTIFACTS).resolve().as_uri() if own_store else None
    try:
        # Earlier MLflow 3 UIs open a model-training experiment on its runs by this tag;
        # 3.17's goes by the link's workflowType (`ui_path`), which make ui prints.
        return mlflow.create_experiment(
            EXPERIMENT, artifact_location=artifacts, tags={KIND_TAG: "custom_model_development"}
        )
    except MlflowException as exc:  # a tracking server: another process created it first
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow.get_experiment_by_name(EXPERIMENT).experiment_id


def _link_artifacts(root: Path, workspace: Path) -> None:
    """In an experiment's copy of the repository, `mlartifacts` links to the workspace's: the
    store's relative artifact locations resolve against the working directory."""
    link, target = root / ARTIFACTS, (workspace / ARTIFACTS).resolve()
    if root.resolve() == workspace.resolve() or link.resolve() == target:
        return
    if link.exists() or link.is_symlink():
        log(f"{link} exists and is not {target}: this run's artifacts stay in {link}")
        return
    target.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


# Where MLflow keeps artifact locations in a SQLite store: (table, column, experiment column).
_LOCATIONS = (
    ("experiments", "artifact_location", "experiment_id"),
    ("runs", "artifact_uri", "experiment_id"),
    ("logged_models", "artifact_location", "experiment_id"),
)


def relative_artifacts(store: Path) -> int:
    """Make the store's artifact locations under `mlartifacts/` relative; returns rows changed.

    MLflow turns a local artifact location into an absolute path when it creates an experiment
    and copies that path into every run and logged model, so a store moved to another folder,
    or opened in a container that mounts the checkout elsewhere, points at artifacts that are
    not there. A relative location (`mlartifacts/<experiment>/...`) resolves against the
    working directory, which is the repository root for every stage, `make ui` and the image's
    commands. Absolute locations written before (by older versions, or on another machine)
    are rewritten too; other stores and remote locations are left alone.
    """
    changed = 0
    with closing(sqlite3.connect(store)) as db, db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        rows = db.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        for experiment_id, location in rows:
            folder = f"/{ARTIFACTS}"
            if not location.startswith("file:") or folder not in location:
                continue
            relative = ARTIFACTS + location[location.rindex(folder) + len(folder) :]
            if relative not in (ARTIFACTS, f"{ARTIFACTS}/{experiment_id}"):
                continue  # an artifact root of the user's own choosing
            for table, column, key in _LOCATIONS:
                if table in tables:
                    changed += db.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                        f"WHERE {key} = ? AND substr({column}, 1, ?) = ?",
                        (relative, len(location) + 1, experiment_id, len(location), location),
                    ).rowcount
    return changed


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}"""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _identity(root: Path) -> dict[str, str]:
    return {WORKDIR_TAG: str(root.resolve()), HOST_TAG: socket.gethostname()}


def _common_tags(root: Path, role: str) -> dict[str, str]:
    tags = {ROLE_TAG: role, **_identity(root)}
    if commit := git_commit(root):
        tags["mlflow.source.git.commit"] = commit
    if exp_name := os.environ.get("DVC_EXP_NAME"):
        tags[EXP_NAME_TAG] = exp_name
    return tags


def _run_in_store(client: MlflowClient, run_id: str) -> Any | None:
    """The run, or None where this store does not have it: mlflow.db was deleted or replaced
    since (a new store starts empty), or the id comes from another store."""
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def under_dvc(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a stage `dvc repro` runs (DVC sets `DVC_STAGE` for every stage
    command; torchrun's workers inherit it), not one run by hand."""
    return "DVC_STAGE" in environ


# This process's own pipeline run, by experiment, where it runs by hand (`under_dvc` false):
# ended as the process ends.
_by_hand: dict[str, str] = {}


def open_pipeline_run_id(root: Path) -> str | None:
    """The RUNNING pipeline run this checkout's `dvc repro` started (a stage run by hand:
    the one this process started), if the current store has it. A pointer to a run the store
    does not have (a deleted mlflow.db) is removed: the next stage starts a new pipeline run
    in the new store."""
    pointer = root / PIPELINE_RUN_FILE
    try:
        run_id = pointer.read_text().strip() if under_dvc() else _by_hand[_experiment_key()]
    except (OSError, KeyError):
        return None
    try:
        run = _run_in_store(MlflowClient(), run_id)
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
    # A DVC experiment's pipeline run carries its name: `dvc exp show` and the UI line up.
    by_hand = not under_dvc()
    kind = "by hand" if by_hand else (os.environ.get("DVC_EXP_NAME") or "pipeline")
    client = MlflowClient()
    tags = _common_tags(root, "pipeline")
    if by_hand:  # its process ends it; one killed outright, the next by hand does
        close_gone_by_hand(experiment_id)
        tags |= {BY_HAND_TAG: "true", **_process_tags()}
    run = client.create_run(
        experiment_id, tags=tags, run_name=f"{kind} {datetime.now():%Y-%m-%d %H:%M:%S}"
    )
    _once_more_on_conflict(
        lambda: client.set_experiment_tag(experiment_id, VIEW_TAG, variants_view(run.info.run_id))
    )
    if by_hand:
        if not _by_hand:
            atexit.register(end_by_hand_runs)
        _by_hand[_experiment_key()] = run.info.run_id
        return run.info.run_id
    pointer = root / PIPELINE_RUN_FILE
    pointer.parent.mkdir(exist_ok=True)
    partial = pointer.with_name(f".{pointer.name}.tmp")
    partial.write_text(run.info.run_id + "\n")
    partial.replace(pointer)
    return run.info.run_id


def end_by_hand_runs() -> None:
    """End the pipeline runs this process started by hand (at its exit): FINISHED, their
    variants' runs saying how each went. Tracking that is down ends nothing, and says so once."""
    while _by_hand:
        _, run_id = _by_hand.popitem()
        try:
            with phases.phase("mlflow"), _mlflow_logs_held():
                MlflowClient().set_terminated(run_id, "FINISHED")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # gone with its store: nothing to end
                _report_outage(exc)
        except Exception as exc:
            _report_outage(exc)


SYSTEM_METRICS_INTERVAL_S = 1


@contextmanager
def variant_run(
    root: Path,
    variant: str,
    params: Mapping[str, Any],
    tags: Mapping[str, str],
    *,
    system_metrics: bool = False,
) -> Iterator[str]:
    """A child run of the pipeline run for one variant; yields its run id (None when tracking
    is down: the body then runs untracked).

    The run ends FINISHED, FAILED or KILLED as the body did. With `system_metrics`,
    MLflow samples CPU, host memory and (through NVML, where there is a GPU) GPU utilization,
    memory and power every second; without a GPU those series are absent, not zeros.
    """
    with _ended_as_it_went(
        _start_variant_run(root, variant, params, tags, system_metrics)
    ) as run_id:
        yield run_id


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
        tags=all_tags | _process_tags(),
        log_system_metrics=system_metrics,
    )
    try:
        mlflow.log_params({k: "null" if v is None else v for k, v in flatten(params).items()})
        for name in ("params.yaml", "dvc.lock"):  # what produced this run
            if (root / name).is_file():
                mlflow.log_artifact(str(root / name), artifact_path="pipeline")
    except Exception:
        _end_run("FAILED")
        raise
    return run.info.run_id


def _end_run(status: str) -> None:
    try:
        with phases.phase("mlflow"), _mlflow_logs_held():
            mlflow.end_run(status=status)
    except Exception as exc:  # the server went away: the local state still has to end
        _report_outage(exc)


@contextmanager
def _ended_as_it_went(run_id: str | None) -> Iterator[str | None]:
    """End the active run as what happened: FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED.

    With no run (tracking is down) the body runs untracked.
    """
    if run_id is None:
        yield None
        return
    try:
        yield run_id
    except KeyboardInterrupt:
        _end_run("KILLED")
        raise
    except BaseException:
        _end_run("FAILED")
        raise
    _end_run("FINISHED")


def numpy_dataset(name: str, images, labels, source: Path, digest: str):
    """An MLflow dataset of arrays (digest from the verified checksums, so the training and
    the evaluation stage name the same data alike)."""
    import mlflow.data

    with warnings.catch_warnings():
        # MLflow registers its local-file source class twice and says so on every resolve.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        return mlflow.data.from_numpy(
            images, targets=labels, source=str(source.resolve()), name=name, digest=digest
        )


@tolerant
def log_dataset(name: str, images, labels, source: Path, digest: str, context: str) -> None:
    """The data a run used, as an MLflow dataset input."""
    dataset = numpy_dataset(name, images, labels, source, digest)
    _once_more_on_conflict(lambda: mlflow.log_input(dataset, context=context))


# What a SQL store answers the second of two writers that insert one new row at once (MLflow's
# server reads, then inserts: two pipelines logging the same dataset, or the experiment's view
# tag, into one PostgreSQL-backed server).
_CONFLICTS = ("UniqueViolation", "duplicate key value", "UNIQUE constraint failed")


def _once_more_on_conflict(call: Callable[[], T]) -> T:
    """`call()`, and once more if a concurrent writer inserted the same row first: the retry
    finds the row and uses it."""
    try:
        return call()
    except MlflowException as exc:
        if not any(conflict in str(exc) for conflict in _CONFLICTS):
            raise
        return call()


@contextmanager
def resume_run(root: Path, run_id: str) -> Iterator[str]:
    """Re-open a variant's run (evaluation, or training resumed from a checkpoint)."""
    with _ended_as_it_went(_reopen_run(root, run_id)) as reopened:
        yield reopened


@tolerant
def _reopen_run(root: Path, run_id: str) -> str:
    experiment_id = setup(root)
    run = MlflowClient().get_run(run_id)
    parent, variant = run.data.tags.get("mlflow.parentRunId"), run.data.tags.get("variant")
    if parent and variant:
        close_zombies(experiment_id, parent, variant, keep=run_id)
    reopened = mlflow.start_run(run_id=run_id).info.run_id
    mlflow.set_tags(_process_tags())
    return reopened


def machine_id() -> str:
    """The running kernel's boot id: the same on the host and in each of its containers (whose
    host names change with every `docker run`), new after a reboot; else the host name."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def _process_tags() -> dict[str, str]:
    started = psutil.Process().create_time()  # seconds since the epoch, in every pid namespace
    return {
        HOST_TAG: socket.gethostname(),
        MACHINE_TAG: machine_id(),
        PID_TAG: str(os.getpid()),
        PID_STARTED_TAG: f"{started:.2f}",
    }


def _gone(tags: Mapping[str, str]) -> str | None:
    """Why the process that has a run open is gone (None: alive, or on another machine, where
    this process cannot tell).

    A run opened in a container and checked from the host or another container (same kernel,
    another pid namespace) counts as gone unless the same pid with the same start time is
    visible here: DVC's lock on the checkout never lets two stages of it run at once.
    """
    host, pid = tags.get(HOST_TAG), tags.get(PID_TAG)
    if tags.get(MACHINE_TAG, host) not in (machine_id(), socket.gethostname()):
        return None
    if pid is None:
        return "no process recorded for it"
    try:
        process = psutil.Process(int(pid))
        started = float(tags.get(PID_STARTED_TAG, "nan"))
        if abs(process.create_time() - started) < 1:
            return None
    except (psutil.Error, ValueError):
        pass
    return f"its process {pid} on {host} is gone (killed outright: kill -9, the OOM killer)"


def close_zombies(experiment_id: str, parent: str, variant: str, keep: str | None = None) -> None:
    """End as KILLED, tagged with why, every RUNNING run of `variant` in pipeline run `parent`
    whose process is gone, so that no run stays RUNNING after a rerun."""
    _close_gone(
        experiment_id,
        f"tags.`mlflow.parentRunId` = '{parent}' and tags.variant = '{variant}'",
        keep,
    )


def close_gone_by_hand(experiment_id: str) -> None:
    """End as KILLED the pipeline runs of stages run by hand whose process was killed
    outright (no exit to end them), and their variants' runs left RUNNING with them."""
    for parent in _close_gone(
        experiment_id, f"tags.`{ROLE_TAG}` = 'pipeline' and tags.`{BY_HAND_TAG}` = 'true'"
    ):
        _close_gone(experiment_id, f"tags.`mlflow.parentRunId` = '{parent}'")


def _close_gone(experiment_id: str, which: str, keep: str | None = None) -> list[str]:
    """End as KILLED, tagged with why, the RUNNING runs `which` (a search filter) selects
    whose process is gone; returns their ids."""
    client = MlflowClient()
    running = client.search_runs(
        [experiment_id], filter_string=f"{which} and attributes.status = 'RUNNING'"
    )
    closed = []
    for run in running:
        why = _gone(run.data.tags) if run.info.run_id != keep else None
        if why is None:
            continue
        client.set_tag(run.info.run_id, CLOSED_TAG, f"closed by a rerun: {why}")
        client.set_terminated(run.info.run_id, status="KILLED")
        name = run.data.tags.get("variant", run.info.run_name)
        log(f"{name}: MLflow run {run.info.run_id} was left RUNNING ({why}); marked KILLED")
        closed.append(run.info.run_id)
    return closed


@tolerant
def log_metrics(metrics: Mapping[str, float | int | None], step: int | None = None) -> None:
    clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    if clean:
        mlflow.log_metrics(clean, step=step)


def log_train_summary(summary: TrainSummary) -> None:
    """A trained variant's run-level figures, as summary metrics of its run."""
    log_metrics(summary.metrics())


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of `metrics` (None, NaN and non-numbers are left out)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


@tolerant
def log_evaluation(
    root: Path,
    run_id: str,
    summary: EvalSummary,
    artifacts: list[Path],
    more_metrics: Mapping[str, float | int | None] | None = None,
) -> None:
    """An evaluated variant's figures and files, in the run that trained it, which stays as
    its train stage ended it. The figures, prefixed `eval_` where a training metric has the
    same name, are logged against the run's model and the test set the training stage logged
    as the run's evaluation dataset (so MLflow's models view lists and ranks every variant's
    model by them); `more_metrics` (the quantized models' figures) as plain run metrics."""
    setup(root)
    client = MlflowClient()
    run = _run_in_store(client, run_id)
    if run is None:
        log(
            f"MLflow run {run_id} is not in {mlflow.get_tracking_uri()} (the store was deleted "
            "or replaced after it trained): its evaluation is not logged; `dvc repro --force "
            "train@<variant>` tracks the variant again"
        )
        return
    model_id = logged_model_id(run.info.experiment_id, run_id)
    dataset = _evaluation_dataset(run)
    now = get_current_time_millis()
    evaluation = _numbers(
        {
            "eval_test_accuracy": summary.test_accuracy,
            "eval_test_loss": summary.test_loss,
            "eval_macro_f1": summary.macro_f1,
            "inference_samples_per_s": summary.inference_samples_per_s,
        }
    )
    metrics = [
        Metric(
            key,
            value,
            now,
            0,
            model_id=model_id,
            dataset_name=dataset.name if dataset else None,
            dataset_digest=dataset.digest if dataset else None,
            run_id=run_id,
        )
        for key, value in evaluation.items()
    ]
    metrics += [Metric(k, v, now, 0) for k, v in _numbers(more_metrics or {}).items()]
    client.log_batch(run_id, metrics=metrics)
    for path in artifacts:
        client.log_artifact(run_id, str(path))


def _evaluation_dataset(run):
    """The dataset `run` logged with context `evaluation` (name and digest), if any."""
    inputs = run.inputs
    for dataset_input in inputs.dataset_inputs if inputs else []:
        if any(
            t.key == "mlflow.data.context" and t.value == "evaluation" for t in dataset_input.tags
        ):
            return dataset_input.dataset
    return None


def record_skipped(root: Path, variant: str, params: Mapping[str, Any], reason: str) -> None:
    """A variant this machine could not run, as a run of the pipeline that says why: tagged
    (`status` skipped, `skip_reason`), with no metric, so that it adds no empty column to a
    comparison; the saved view of the pipeline leaves it out."""
    with variant_run(root, variant, params, {"status": "skipped", "skip_reason": reason}):
        pass


# The headline figures a variant run also carries as text, for the runs table, written as
# the report writes them: tag -> (figure in comparison.json, its formatter). A figure's 95%
# interval is `<figure>_lo` .. `<figure>_hi`.
FIGURE_TAGS: dict[str, tuple[str, Callable[[float], str]]] = {
    "speedup": ("speedup_vs_cpu", fmt_ratio),
    "steady_epoch": ("steady_epoch_s", fmt_seconds),
    "time_to_target": ("time_to_target_s", fmt_seconds),
    "speedup_vs_fp32": ("speedup_vs_fp32", fmt_ratio),
}
# The variant every `speedup` tag is over (report.speedup_baseline), as a tag of each run.
SPEEDUP_BASELINE_TAG = "speedup_baseline"


def figure_tags(speedup_baseline: str | None) -> dict[str, tuple[str, Callable[[float], str]]]:
    """FIGURE_TAGS with the speedup over `speedup_baseline` (none: no speedup tag)."""
    tags = {k: v for k, v in FIGURE_TAGS.items() if k != "speedup"}
    if speedup_baseline is None:
        return tags
    return {"speedup": (f"speedup_vs_{speedup_baseline}", fmt_ratio)} | tags


def figure_text(figures: Mapping[str, float], name: str, fmt: Callable[[float], str]) -> str | None:
    """`figures[name]` and, where both ends are there, its 95% interval: "148× (140–156×)",
    "0.083 s (0.081–0.086 s)"; None where the variant has no such figure (skipped, a single
    epoch, the target not reached, no fp32 twin)."""
    value = figures.get(name)
    if value is None:
        return None
    return fmt_interval(value, figures.get(f"{name}_lo"), figures.get(f"{name}_hi"), fmt)


@tolerant
def log_variant_figures(
    root: Path,
    figures: Mapping[str, Mapping[str, float | None]],
    speedup_baseline: str | None = "cpu",
) -> None:
    """Each variant's headline figures (`steady_epoch_s`, `speedup_vs_<baseline>`, their
    `_lo`/`_hi` 95% interval, ...), keyed by the variant's MLflow run id, as metrics of that
    run, and the key ones as text tags (`figure_tags`), with the baseline the speedup is over;
    None (a figure this variant has not) is left out, and a tag an earlier comparison wrote
    for it is removed.

    Logged through the client, so the runs keep their train stage's start and end. A figure
    the run already has with the same value (training logged `steady_epoch_s`) is not logged
    again, nor is one the training logs per epoch (`test_accuracy`): its series keeps its
    shape. Another comparison's figures (a new target, another baseline) are logged anew.
    """
    setup(root)
    client = MlflowClient()
    now = get_current_time_millis()
    series = {f.name for f in fields(EpochRecord)}
    wanted = figure_tags(speedup_baseline)
    for run_id, values in figures.items():
        run = _run_in_store(client, run_id)
        if run is None:  # log_evaluation said so
            continue
        numbers = _numbers(values)
        logged = run.data.metrics
        tags = {
            tag: figure_text(numbers, *wanted[tag]) if tag in wanted else None
            for tag in FIGURE_TAGS
        }
        tags[SPEEDUP_BASELINE_TAG] = speedup_baseline
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, v, now, 0)
                for k, v in numbers.items()
                if k not in logged or (logged[k] != v and k not in series)
            ],
            tags=[RunTag(k, v) for k, v in tags.items() if v is not None],
        )
        for key in [k for k, v in tags.items() if v is None and k in run.data.tags]:
            client.delete_tag(run_id, key)


def logged_model_id(experiment_id: str, run_id: str) -> str | None:
    """The model that run `run_id` logged (train's `log_model`), if any."""
    models = MlflowClient().search_logged_models(
        [experiment_id], filter_string=f"source_run_id = '{run_id}'", max_results=1
    )
    return models[0].model_id if models else None


@tolerant
def set_tag(key: str, value: str) -> None:
    mlflow.set_tag(key, value)


@tolerant
def log_artifact(path: Path, artifact_path: str | None = None) -> None:
    mlflow.log_artifact(str(path), artifact_path=artifact_path)


@tolerant
def log_model(model, input_example, name: str) -> None:
    """The trained model with a signature inferred from an input example, named after its
    variant (the models view lists the variants' models by name)."""
    import mlflow.pytorch
    import torch

    with (
        phases.phase("model_logging"),
        torch.no_grad(),
        _no_distribution_scan(),
        _without_pickle_caution(),
    ):
        output = model(torch.as_tensor(input_example)).numpy()
        signature = mlflow.models.infer_signature(input_example, output)
        mlflow.pytorch.log_model(
            model,
            name=name,
            signature=signature,
            input_example=input_example,
            # pickle, not MLflow 3's default pt2 (torch.export): pt2 models exported on the
            # CPU cannot be re-loaded onto a GPU, which MLflow tries when it validates the
            # example.
            serialization_format="pickle",
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )


class _PickleCaution(logging.Filter):
    """MLflow's caution about pickled models, on every trained variant. It is for models
    from elsewhere; these are this pipeline's own, loaded back by its evaluate stage."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "by Pickle or CloudPickle format requires exercising caution" not in str(record.msg)


@contextmanager
def _without_pickle_caution() -> Iterator[None]:
    logger, caution = logging.getLogger("mlflow.pytorch"), _PickleCaution()
    logger.addFilter(caution)
    try:
        yield
    finally:
        logger.removeFilter(caution)


@contextmanager
def _no_distribution_scan() -> Iterator[None]:
    """MLflow checks a logged model's requirements against the environment, and first maps
    every installed distribution to its modules for that (`packages_distributions`: 0.5 s
    for 194 distributions, most of logging the model). Ours, torch and mlflow, are modules
    of the same name, which the check finds without the map: an empty one keeps the check
    and spares the scan. MLflow's own map is restored afterwards (inferring requirements
    needs it)."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", ()) is not None:  # built, or renamed
        yield
        return
    requirements_utils._MODULES_TO_PACKAGES = {}
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = None
        requirements_utils._PACKAGES_TO_MODULES = None


@tolerant
def finish_pipeline(
    root: Path,
    artifacts: list[Path],
    metrics: Mapping[str, float],
    variant_runs: Sequence[str] = (),
) -> str | None:
    """Log the comparison to the open pipeline run, or to a new one where none is open (a
    `dvc repro` that re-ran compare alone), and finish it; returns its id.

    `variant_runs`: the trained variants' runs the comparison reports on. Where some trained
    under an earlier pipeline run, this one names them all (`VARIANT_RUNS_TAG`), and the
    saved view shows them: the newest pipeline's variants are the ones its report compares.
    """
    experiment_id = setup(root)
    run_id = pipeline_run_id(root, experiment_id)
    client = MlflowClient()
    parents = {
        rid: run.data.tags.get("mlflow.parentRunId")
        for rid in variant_runs
        if (run := _run_in_store(client, rid)) is not None
    }
    if any(parent != run_id for parent in parents.values()):
        shown = list(parents)
        client.set_tag(run_id, VARIANT_RUNS_TAG, ",".join(shown))
        _once_more_on_conflict(
            lambda: client.set_experiment_tag(experiment_id, VIEW_TAG, variants_view(run_id, shown))
        )
    with mlflow.start_run(run_id=run_id):
        for path in artifacts:
            mlflow.log_artifact(str(path))
        log_metrics(metrics)
    if under_dvc():
        (root / PIPELINE_RUN_FILE).unlink(missing_ok=True)
    else:
        _by_hand.pop(_experiment_key(), None)  # ended just now
    return run_id


# The UI's experiment page in its model-training view: MLflow 3's UI chooses between its GenAI
# and model-training views by this query parameter (else the last choice, GenAI at first) and
# no longer by the experiment's `mlflow.experimentKind` tag.
TRAINING_VIEW = "workflowType=machine_learning"

# The newest pipeline's variants as a saved view of the runs table. MLflow 3.17's UI keeps a
# saved view as an experiment tag `mlflow.sharedViewState.<id>` (listed in the Views menu) and
# opens it from a link's `viewStateShareKey=<id>`: the search facets (filter, sort) and the
# table's UI state (columns, their order and widths), which no URL parameter sets. A link that
# also carries a facet (searchFilter, orderByKey, ...) makes the UI ignore the view.
VIEW_ID = "accelbench-newest-pipeline"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
VIEW_NAME = "newest pipeline: fastest first"
VIEW_SORT = "metrics.`steady_epoch_s`"  # ascending: the fastest variant first
# The first columns: what answers "who is fastest", as text with its interval; then the
# numbers to sort and chart by. `duration` (always shown) is the run's train stage.
VIEW_COLUMNS = {  # column -> width (px), None: the UI's
    "tags.`speedup`": 150,
    "tags.`steady_epoch`": 190,
    "metrics.`test_accuracy`": 110,
    "tags.`time_to_target`": 170,
    "duration": 90,
    "tags.`speedup_vs_fp32`": 150,
    "metrics.`steady_epoch_s`": None,
    "metrics.`speedup_vs_cpu`": None,
}


def variants_filter(pipeline_run_id: str, variant_runs: Sequence[str] = ()) -> str:
    """The runs-table filter for a pipeline run's trained variants (skipped ones carry no
    figure: their runs say why, under the pipeline run): its children, or the runs it names
    (`VARIANT_RUNS_TAG`: some trained under an earlier pipeline run)."""
    if variant_runs:
        ids = ", ".join(f"'{run_id}'" for run_id in variant_runs)
        return f"attributes.run_id IN ({ids}) and tags.status = 'trained'"
    return f"tags.`mlflow.parentRunId` = '{pipeline_run_id}' and tags.status = 'trained'"


def named_variant_runs(tags: Mapping[str, str]) -> list[str]:
    """The variant runs a pipeline run's tags name (VARIANT_RUNS_TAG); none: its children."""
    return [run_id for run_id in tags.get(VARIANT_RUNS_TAG, "").split(",") if run_id]


def variants_view(pipeline_run_id: str, variant_runs: Sequence[str] = ()) -> str:
    """The VIEW_TAG value that shows `pipeline_run_id`'s trained variants, fastest first: a
    saved view's envelope (name, creation time in ms, the view state as a JSON string)."""
    state = {
        "searchFilter": variants_filter(pipeline_run_id, variant_runs),
        "orderByKey": VIEW_SORT,
        "orderByAsc": True,
        "selectedColumns": [c for c in VIEW_COLUMNS if c != "duration"],
        "columnOrder": list(VIEW_COLUMNS),
        "columnWidths": {c: w for c, w in VIEW_COLUMNS.items() if w is not None},
    }
    return json.dumps(
        {"name": VIEW_NAME, "createdAt": get_current_time_millis(), "state": json.dumps(state)}
    )


def _view_filter(view: str | None) -> str | None:
    """The search filter of a saved view (a VIEW_TAG value); None if it is not one."""
    try:
        return json.loads(json.loads(view)["state"])["searchFilter"]
    except (TypeError, ValueError, KeyError):
        return None


def ui_path(
    experiment_id: str,
    pipeline_run_id: str | None = None,
    view: str | None = None,
    variant_runs: Sequence[str] = (),
) -> str:
    """The experiment's runs in the UI's model-training view, relative to the server's URL.

    With `pipeline_run_id`: that pipeline's trained variants (`variant_runs` where it names
    them), fastest first; through the saved view where `view` (the experiment's VIEW_TAG
    value) shows them (the key columns shown), else by the link's own filter and sort (the
    UI's default columns).
    """
    runs = f"/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"
    if pipeline_run_id is None:
        return runs
    wanted = variants_filter(pipeline_run_id, variant_runs)
    if _view_filter(view) == wanted:
        return f"{runs}&viewStateShareKey={VIEW_ID}"
    facets = {
        "searchFilter": wanted,
        "orderByKey": VIEW_SORT,
        "orderByAsc": "true",
    }
    return f"{runs}&{urlencode(facets, quote_via=quote)}"


def pipeline_path(experiment_id: str, pipeline: Any | None, view: str | None) -> str:
    """`ui_path` for a pipeline run as MLflow's client returns it (None: there is none yet):
    its variants, those it names (VARIANT_RUNS_TAG) where it does."""
    if pipeline is None:
        return ui_path(experiment_id)
    named = named_variant_runs(pipeline.data.tags)
    return ui_path(experiment_id, pipeline.info.run_id, view, named)


def training_view_url(base_url: str, store: Path) -> str:
    """Where `make ui` sends a user: the newest pipeline's variants (`ui_path`), read from the
    SQLite `store` without writing to it; the experiment while it has no pipeline run, the
    list of experiments while the store has none (both in the model-training view)."""
    return _training_view(base_url, store)[0]


def _training_view(base_url: str, store: Path) -> tuple[str, str]:
    """`training_view_url`, and what it shows, in words."""
    pipeline = view = None
    try:
        with closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute(
                "SELECT experiment_id FROM experiments WHERE name = ?", (EXPERIMENT,)
            ).fetchone()
            if row:
                pipeline = db.execute(
                    "SELECT runs.run_uuid FROM runs JOIN tags ON tags.run_uuid = runs.run_uuid "
                    "WHERE runs.experiment_id = ? AND runs.lifecycle_stage = 'active' "
                    "AND tags.key = ? AND tags.value = 'pipeline' "
                    "ORDER BY runs.start_time DESC LIMIT 1",
                    (row[0], ROLE_TAG),
                ).fetchone()
                view = db.execute(
                    "SELECT value FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                    (row[0], VIEW_TAG),
                ).fetchone()
                named = (
                    pipeline
                    and db.execute(
                        "SELECT key, value FROM tags WHERE run_uuid = ? AND key = ?",
                        (pipeline[0], VARIANT_RUNS_TAG),
                    ).fetchall()
                )
    except sqlite3.Error:  # no store yet, or not one of MLflow's
        row = None
    if not row:
        return (
            f"{base_url}/#/experiments?{TRAINING_VIEW}",
            "no runs yet: `make repro` records them; reload the page after it",
        )
    if not pipeline:
        return base_url + ui_path(str(row[0])), "the experiment: no pipeline run yet"
    url = base_url + ui_path(
        str(row[0]), pipeline[0], view[0] if view else None, named_variant_runs(dict(named or []))
    )
    return url, "the newest pipeline run: its trained variants, fastest first"


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on `host:port` (another program holds it), or None."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, OverflowError) as exc:
        return f"{host}:{port} is not an address to serve on ({exc})"
    with closing(socket.socket(family, kind, proto)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind(address)
        except OSError as exc:
            return f"port {port} on {host} is in use by another program ({exc.strerror})"
    return None


def server_view_url(uri: str) -> str:
    """The newest pipeline's variants on the tracking server at `uri` (`ui_path`), read
    without writing; the server's URL alone if it cannot be read."""
    base = uri.rstrip("/")
    _environment_defaults()
    try:
        with _mlflow_logs_held():
            client = MlflowClient(uri)
            experiment = client.get_experiment_by_name(EXPERIMENT)
            if experiment is None:
                return f"{base}/#/experiments?{TRAINING_VIEW}"
            pipelines = client.search_runs(
                [experiment.experiment_id],
                filter_string=f"tags.`{ROLE_TAG}` = 'pipeline'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
    except Exception:  # down, or refusing: the server's own page says why
        return base
    return base + pipeline_path(
        experiment.experiment_id, pipelines[0] if pipelines else None, experiment.tags.get(VIEW_TAG)
    )


def _ui_address_problem(host: str, port: str) -> str | None:
    """Why `make ui` cannot serve on HOST:PORT, with what to pass instead; None if it can."""
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"PORT={port!r} is not a port number (1-65535): make ui PORT=5000"
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"HOST={host!r} is not an address to serve on ({exc}): make ui HOST=127.0.0.1"
    if problem := port_problem(host, int(port)):
        return f"{problem}; stop it, or choose another port: make ui PORT={int(port) + 1}"
    return None


def ui_intro(host: str, port: str, store: Path) -> int:
    """`make ui`'s first step: refuse a port another program holds (one line on stderr, exit
    1, before any link that would open that program), or a MLFLOW_TRACKING_URI that is not
    `store` (a tracking server, another store: the runs are there), else print the link."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if is_server(uri):
        log(
            f"make ui: MLFLOW_TRACKING_URI is {uri}: the runs are on that server, open "
            f"{server_view_url(uri)} (or run `accelbench runs`); `MLFLOW_TRACKING_URI= make ui` "
            "serves this checkout's own store"
        )
        return 1
    elsewhere = _sqlite_path(uri)
    if uri and (elsewhere is None or elsewhere.resolve() != store.resolve()):
        log(
            f"make ui: MLFLOW_TRACKING_URI is {uri}, not this checkout's store {store}: serve "
            f"it with `mlflow server --backend-store-uri {uri}`; `MLFLOW_TRACKING_URI= make ui` "
            "serves this checkout's own"
        )
        return 1
    if problem := _ui_address_problem(host, port):
        log(f"make ui: {problem}")
        return 1
    url, what = _training_view(f"http://{host}:{port}", store)
    print("Open", url, f"({what})")
    return 0


def pipeline_variants(
    client: MlflowClient, experiment_id: str, pipeline_id: str | None = None
) -> tuple[Any, list[Any]]:
    """A pipeline run (`pipeline_id`, else the experiment's newest) and its variant runs: its
    children (skipped ones too), after the trained runs it names (VARIANT_RUNS_TAG) from
    earlier pipeline runs; (None, []) where there is no such pipeline run."""
    role = f"tags.`{ROLE_TAG}` = 'pipeline'"
    wanted = f" and attributes.run_id = '{pipeline_id}'" if pipeline_id else ""
    parents = client.search_runs(
        [experiment_id],
        filter_string=role + wanted,
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not parents:
        return None, []
    parent = parents[0]
    children = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    if named := named_variant_runs(parent.data.tags):  # trained under earlier pipeline runs
        own = {run.info.run_id for run in children}
        earlier = client.search_runs(
            [experiment_id],
            filter_string=variants_filter(parent.info.run_id, named),
            order_by=["attributes.start_time ASC"],
        )
        children = [run for run in earlier if run.info.run_id not in own] + children
    return parent, children


def pipeline_summary(root: Path) -> tuple[Any, list[Any]]:
    """The newest pipeline run of this store and its variant runs (None, [] if there is none)."""
    experiment_id = setup(root)  # first: it points the client at this store
    return pipeline_variants(MlflowClient(), experiment_id)


class TrackingUnreachable(AccelbenchError):
    """The tracking store cannot be read (a server that is down, a broken store)."""


def _figures(run: Any) -> dict[str, str | None]:
    """A run's figures as text, by FIGURE_TAGS key: as compare last tagged them on the run
    (a figure it dropped: None), or from their metrics on a run it never compared (no
    figure tag at all)."""
    tags = run.data.tags
    if any(t in tags for t in (*FIGURE_TAGS, SPEEDUP_BASELINE_TAG)):
        return {tag: tags.get(tag) for tag in FIGURE_TAGS}
    return {tag: figure_text(run.data.metrics, *keys) for tag, keys in FIGURE_TAGS.items()}


def _summary_row(run: Any) -> str:
    metrics, tags = run.data.metrics, run.data.tags
    # compare's evaluation of the trained model; else the last epoch the run logged (an
    # older run, or one whose evaluation was not logged)
    accuracy = metrics.get("eval_test_accuracy", metrics.get("test_accuracy"))
    figures = _figures(run)
    cells = [
        run.info.run_name,
        figures["speedup"],  # over the report's baseline
        figures["steady_epoch"],
        f"{100 * accuracy:.2f}%" if accuracy is not None else None,  # as the report writes it
        figures["time_to_target"],
        _result(tags.get("status", ""), run.info.status),
        tags.get("device_name", tags.get("device", "")),
        run.info.status,
        run.info.run_id,
    ]
    return "| " + " | ".join("n/a" if c is None else c for c in cells) + " |"


def _result(status: str, run_status: str) -> str:
    """What became of a variant: its stage's `status` tag (trained, skipped), unless its run
    ended otherwise: a training stopped part way (or running, or left RUNNING by a killed
    process) is no trained variant, whatever it logged."""
    if status == "trained" and run_status in _UNFINISHED:
        return _UNFINISHED[run_status]
    return status


_UNFINISHED = {"KILLED": "interrupted", "FAILED": "failed", "RUNNING": "unfinished"}

SUMMARY_COLUMNS = (
    "variant",
    "speedup vs {baseline} (95% interval)",
    "steady epoch (95% interval)",
    "test accuracy",
    "time to target",
    "result",
    "device",
    "run status",
    "run id",
)


def _speedup_baseline(runs: list[Any]) -> str:
    """The variant the runs' speedups are over, as compare tagged them."""
    named = {r.data.tags[SPEEDUP_BASELINE_TAG] for r in runs if SPEEDUP_BASELINE_TAG in r.data.tags}
    if not named:
        return "the baseline"
    return "/".join(sorted(named))  # one, unless runs compared over different baselines


def _remedy(uri: str, exc: BaseException) -> str:
    """What to do about tracking at `uri` failing with `exc`."""
    # by hand, not urlsplit: a malformed URI (http://[::1) is advised on, not a crash
    scheme, _, rest = uri.partition(":")
    host = rest.lstrip("/").split("/")[0].rpartition("@")[2]  # host:port, no user info
    if "Unsupported" in describe_failure(exc):  # MLflow's Unsupported...StoreURIException
        return (
            f"MLflow has no tracking store for the scheme {scheme!r}: set MLFLOW_TRACKING_URI "
            "to http(s)://…, sqlite:///…, postgresql://… (or mysql, mssql), file:… or a folder"
        )
    if not is_server(uri) and _sqlite_path(uri) is None:  # a database server: postgresql://
        return "check that the database runs and MLFLOW_TRACKING_URI names it"
    if "file is not a database" in describe_failure(exc):
        return (
            "that file is no SQLite database (damaged, or not a store at all): move it aside, "
            "and a new store starts cleanly, or set MLFLOW_TRACKING_URI to another store"
        )
    if not is_server(uri):
        return (
            "try again once no stage writes to it (locked); if it stays unreadable, move it "
            "aside, or set MLFLOW_TRACKING_URI to another store"
        )
    if "Invalid Host header" in describe_failure(exc) or "Invalid Host header" in str(exc):
        return (
            f"the server runs but refuses the host name {host}: use a name it "
            f"allows, or add this one to MLFLOW_SERVER_ALLOWED_HOSTS on the server "
            "(docs/teams.md)"
        )
    return "start the server, or set MLFLOW_TRACKING_URI to one that runs"


def _unreadable(uri: str, exc: BaseException) -> str:
    """Why `accelbench runs` cannot read the runs at `uri`, and what to do."""
    return f"cannot read MLflow tracking at {uri} ({describe_failure(exc)}); {_remedy(uri, exc)}"


def summary_markdown(root: Path) -> str:
    """`accelbench runs`: the newest pipeline run's variants, fastest first, and the link to
    them in the UI. Reading creates no store where there is none."""
    store = store_root(root) / STORE
    if not os.environ.get("MLFLOW_TRACKING_URI") and not store.exists():
        return f"No MLflow store at {store} yet: run `dvc repro` in {store.parent}."
    named = _sqlite_path(tracking_uri(root)) if os.environ.get("MLFLOW_TRACKING_URI") else None
    if named is not None and not named.exists():  # reading would create it, folders and all
        raise InputError(
            f"MLFLOW_TRACKING_URI names the store {named}, which does not exist (a typo?); "
            f"`accelbench runs` reads a store and creates none: unset it to read {store}"
        )
    try:
        with _mlflow_logs_held():
            parent, children = pipeline_summary(root)
            view = (
                MlflowClient().get_experiment(parent.info.experiment_id).tags.get(VIEW_TAG)
                if parent is not None
                else None
            )
    except Exception as exc:  # MlflowException, requests and sqlite errors, ...
        raise TrackingUnreachable(_unreadable(tracking_uri(root), exc)) from exc
    if parent is None:
        return f"No pipeline run in {redact(tracking_uri(root))} yet: run `dvc repro`."
    link = pipeline_path(parent.info.experiment_id, parent, view)
    uri = redact(tracking_uri(root))  # the `MLflow:` line and the link show no secret
    where = (  # on the server itself; this checkout's store through `make ui`
        f"in the UI, fastest first: {uri.rstrip('/')}{link}"
        if is_server(uri)
        else f"in the UI (`make ui`), fastest first: http://127.0.0.1:5000{link}"
    )
    # fastest first (as the UI's view); variants without a steady epoch after them, in order
    ranked = sorted(children, key=lambda r: r.data.metrics.get("steady_epoch_s", math.inf))
    skipped = [r for r in children if r.data.tags.get("status") == "skipped"]
    lines = [
        f"MLflow: {uri}, experiment `{EXPERIMENT}`",
        f"Pipeline run `{parent.info.run_name}` ({parent.info.run_id}), status {parent.info.status}",
        f"Its variants {where}",
        "",
        "| " + " | ".join(SUMMARY_COLUMNS).format(baseline=_speedup_baseline(children)) + " |",
        "|" + "---|" * len(SUMMARY_COLUMNS),
        *(_summary_row(run) for run in ranked),
    ]
    if skipped:
        lines += ["", "Skipped on this machine:"]
        lines += [
            f"- {r.info.run_name}: {r.data.tags.get('skip_reason', 'no reason recorded')}"
            for r in skipped
        ]
    return "\n".join(lines)
