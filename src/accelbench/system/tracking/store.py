"""Where the runs are kept: the store, its `accelbench` experiment, and the lock that sets
them up.

The repository's own store (`mlflow.db`) keeps its artifacts in `mlartifacts/` under a
*relative* location, so the two can move together (into a container, say). A DVC experiment
run in a throwaway copy tracks into the workspace's store, its artifacts through a link.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import filelock
import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from accelbench.core.console import log

T = TypeVar("T")
EXPERIMENT = "accelbench"
ROLE_TAG = "accelbench.role"  # "pipeline" or "variant"
KIND_TAG = "mlflow.experimentKind"
STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
WORKSPACE_ENV = "DVC_ROOT"  # DVC sets it for every stage: the workspace an experiment came from
STORE_LOCK = Path(".accelbench") / "mlflow.db.lock"  # in the workspace, beside its store
STORE_LOCK_TIMEOUT_S = 300
# A tracking server that is down must cost seconds, not MLflow's default minutes of retries.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def store_root(root: Path) -> Path:
    """The folder whose `mlflow.db` is the repository's store, for a stage running in `root`:
    $DVC_ROOT (the workspace, even for an experiment run in a throwaway copy), else `root`."""
    if not (workspace := os.environ.get(WORKSPACE_ENV)):
        return root
    if not Path(workspace).is_dir():  # queued on another machine or container path
        log(f"${WORKSPACE_ENV} {workspace} is not a folder here; tracking into {root / STORE}")
        return root
    return Path(workspace)


def workspace_root(start: Path, params: Path | None = None) -> Path:
    """The workspace of a command run in `start`: the nearest folder upwards that holds `.dvc/`
    from `start` or the params file, else the params file's folder, else `start`."""
    beside_params = [] if params is None else [(start / params).parent.resolve()]
    for origin in [start.resolve(), *beside_params]:
        for folder in (origin, *origin.parents):
            if (folder / ".dvc").is_dir():
                return folder
    return beside_params[0] if beside_params else start


def tracking_uri(root: Path) -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite store at an absolute path in the workspace."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(store_root(root) / STORE).resolve()}"
    )


def is_server(uri: str) -> bool:
    """Whether the tracking URI is a tracking server's (over HTTP), not a store of one's own."""
    return uri.startswith(("http://", "https://"))


def sqlite_path(uri: str) -> Path | None:
    """The file of a SQLite store's URI (None: not a SQLite file)."""
    if not uri.startswith("sqlite:///") or uri.startswith("sqlite:///:memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def environment_defaults() -> None:
    """MLflow's settings for accelbench, each unless the user set it: no telemetry, short HTTP
    retries, and no "View run ... at" lines (two per run logged to a server)."""
    quiet = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
    for key, value in (quiet | HTTP_DEFAULTS).items():
        os.environ.setdefault(key, value)


def setup(root: Path) -> str:
    """Point MLflow at the store and the `accelbench` experiment; returns the experiment id.
    Both are created under a file lock: two processes migrating one new SQLite database (`dvc
    queue start -j 2`) fail ("duplicate column name")."""
    environment_defaults()
    own_store = not os.environ.get("MLFLOW_TRACKING_URI")  # read before set_tracking_uri sets it
    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    workspace = store_root(root)
    if own_store:
        _link_artifacts(root, workspace)
    store = workspace / STORE if own_store else sqlite_path(uri)
    lock = workspace / STORE_LOCK if own_store else store and store.with_name(f"{store.name}.lock")
    with _locked(lock, store):
        experiment_id = _experiment_id(workspace, own_store)
        if own_store:
            relative_artifacts(workspace / STORE)
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


@contextmanager
def _locked(path: Path | None, store: Path | None) -> Iterator[None]:
    """Hold `path`'s lock, waiting up to STORE_LOCK_TIMEOUT_S; none where it cannot be made
    and the `store` is read-only to this process too (readers need no lock)."""
    if path is None:
        yield
        return
    lock: filelock.FileLock | None = filelock.FileLock(path, timeout=STORE_LOCK_TIMEOUT_S)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except filelock.Timeout:
        raise TimeoutError(
            f"{path}: held by another process for over {STORE_LOCK_TIMEOUT_S} s"
        ) from None
    except OSError as exc:
        read_only = store is not None and store.exists() and not os.access(store, os.W_OK)
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not read_only:
            raise
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _experiment_id(workspace: Path, own_store: bool) -> str:
    """The `accelbench` experiment's id, the experiment created if the store has none."""
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)  # creates and migrates the store
    if experiment is not None:
        return experiment.experiment_id
    artifacts = (workspace / ARTIFACTS).resolve().as_uri() if own_store else None
    try:
        # Earlier MLflow 3 UIs open a model-training experiment on its runs by this tag;
        # 3.17's goes by the link's workflowType (view.ui_path), which make ui prints.
        return mlflow.create_experiment(
            EXPERIMENT, artifact_location=artifacts, tags={KIND_TAG: "custom_model_development"}
        )
    except MlflowException as exc:  # a tracking server: another process created it first
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow.get_experiment_by_name(EXPERIMENT).experiment_id


def _link_artifacts(root: Path, workspace: Path) -> None:
    """In an experiment's copy of the repository, `mlartifacts` links to the workspace's."""
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
    MLflow copies an experiment's absolute artifact path into every run and logged model; a
    relative one resolves against the working directory, the repository root for every stage
    and `make ui`, wherever the store moved. Other locations are left alone."""
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


def run_in_store(client: MlflowClient, run_id: str) -> Any | None:
    """The run, or None where this store does not have it."""
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


# What a SQL store answers the second of two writers that insert one new row at once (MLflow's
# server reads, then inserts: two pipelines logging the same dataset into one server).
_CONFLICTS = ("UniqueViolation", "duplicate key value", "UNIQUE constraint failed")


def once_more_on_conflict(call: Callable[[], T]) -> T:
    """`call()`, and once more (finding the row) if a concurrent writer inserted it first."""
    try:
        return call()
    except MlflowException as exc:
        if not any(conflict in str(exc) for conflict in _CONFLICTS):
            raise
        return call()
