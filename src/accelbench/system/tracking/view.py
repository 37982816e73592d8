"""The runs as the MLflow UI shows them: the saved view of the newest pipeline's variants
(`VIEW_ID`, rewritten whenever a pipeline run starts: fastest first, the headline figures as
the first columns), and the links `make ui` and `accelbench runs` print.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from accelbench.system.tracking.outage import logs_held, tracking_errors
from accelbench.system.tracking.store import EXPERIMENT, ROLE_TAG, environment_defaults, is_server

# Run ids, comma-separated, on a pipeline run: its variants where some trained under an earlier
# pipeline run (compare re-ran alone); a DVC experiment's and its baseline's (`baseline.py`).
VARIANT_RUNS_TAG = "accelbench.variant_runs"
COMPARED_RUNS_TAG = "accelbench.compared_runs"
WHOSE_TAG = "experiment"  # on each row of an experiment's view: the experiment or its baseline

# MLflow 3's UI picks its GenAI or model-training view by this query parameter (else the last
# choice, GenAI at first), no longer by the experiment's `mlflow.experimentKind` tag.
TRAINING_VIEW = "workflowType=machine_learning"
MAKE_UI_URL = "http://127.0.0.1:5000"  # where `make ui` serves by default

# MLflow 3.17's UI keeps a saved view as an experiment tag `mlflow.sharedViewState.<id>` and
# opens it from a link's `viewStateShareKey=<id>`: filter, sort and columns (order, widths),
# which no URL parameter sets. A link that also carries a facet makes the UI ignore the view.
VIEW_ID = "accelbench-newest-pipeline"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
VIEW_NAME = "newest pipeline: fastest first"
VIEW_SORT = "metrics.`steady_epoch_s`"  # ascending: the fastest variant first
BESIDE_SORT = "tags.`mlflow.runName`"  # beside its baseline: by variant, then newest first
BESIDE_WHOSE_WIDTH = 170  # "baseline 1a2b3c4" whole; a reused run's longer text on hover
BESIDE_PARAM_WIDTH = 110  # wide enough for the group's header, "Parameters"
# The first columns: who is fastest, as text with its interval (wide enough at 1600 px beside
# the Assistant panel); then whether a variant trained and why not, and the numbers to sort by.
VIEW_COLUMNS = {  # column -> width (px), None: the UI's
    "tags.`steady_epoch`": 172,  # "2.600 s (2.576–2.789 s)"
    "tags.`speedup`": 160,  # "90.0× (85.8–94.1×)"
    "metrics.`test_accuracy`": 107,
    "tags.`time_to_target`": 172,  # "1.287 s (1.285–1.288 s)"
    "tags.`status`": 80,
    "tags.`skip_reason`": 220,  # the whole reason on hover
    "duration": 90,
    "tags.`speedup_vs_fp32`": 150,
    "metrics.`steady_epoch_s`": None,
    "metrics.`speedup_vs_cpu`": None,
}


def variants_filter(pipeline_run_id: str, variant_runs: Sequence[str] = ()) -> str:
    """The runs-table filter for a pipeline run's variants: its children, or `variant_runs`."""
    if variant_runs:
        ids = ", ".join(f"'{run_id}'" for run_id in variant_runs)
        return f"attributes.run_id IN ({ids})"
    return f"tags.`mlflow.parentRunId` = '{pipeline_run_id}'"


def named_variant_runs(tags: Mapping[str, str]) -> list[str]:
    """The variant runs a pipeline run's tags name (VARIANT_RUNS_TAG); none: its children."""
    return [run_id for run_id in tags.get(VARIANT_RUNS_TAG, "").split(",") if run_id]


def shown_runs(tags: Mapping[str, str]) -> tuple[list[str], str]:
    """The variant runs a link to a pipeline run shows, and their order: an experiment's beside
    its baseline's by variant, else those it names (none: its children) fastest first."""
    if compared := [run_id for run_id in tags.get(COMPARED_RUNS_TAG, "").split(",") if run_id]:
        return compared, BESIDE_SORT
    return named_variant_runs(tags), VIEW_SORT


def variants_view(
    pipeline_run_id: str,
    variant_runs: Sequence[str] = (),
    name: str = VIEW_NAME,
    sort: str = VIEW_SORT,
    first: Mapping[str, int | None] | None = None,
) -> str:
    """The VIEW_TAG value: `pipeline_run_id`'s variants by `sort`, columns `first` first."""
    columns = {**(first or {}), **VIEW_COLUMNS}
    state = {
        "searchFilter": variants_filter(pipeline_run_id, variant_runs),
        "orderByKey": sort,
        "orderByAsc": True,
        "selectedColumns": [c for c in columns if c != "duration"],
        "columnOrder": list(columns),
        "columnWidths": {c: w for c, w in columns.items() if w is not None},
    }
    return json.dumps(
        {"name": name, "createdAt": get_current_time_millis(), "state": json.dumps(state)}
    )


def experiment_view(
    name: str, pipeline_run_id: str, rows: Sequence[str], params: Sequence[str] | None
) -> str:
    """The VIEW_TAG value for a DVC experiment: the variant runs `rows`, a first column saying
    whose each is; beside a baseline (`params` not None) a column per param that differs, and
    the rows by variant, else fastest first."""
    whose = {f"tags.`{WHOSE_TAG}`": BESIDE_WHOSE_WIDTH}
    differing = {f"params.`{param}`": BESIDE_PARAM_WIDTH for param in params or ()}
    sort = VIEW_SORT if params is None else BESIDE_SORT
    return variants_view(pipeline_run_id, rows, name, sort, whose | differing)


def ui_path(
    experiment_id: str,
    pipeline_run_id: str | None = None,
    view: str | None = None,
    variant_runs: Sequence[str] = (),
    sort: str = VIEW_SORT,
) -> str:
    """The experiment's runs in the UI's model-training view, relative to the server's URL;
    with `pipeline_run_id` its variants, through the saved `view` where it shows them, else
    by the link's own filter and `sort`."""
    runs = f"/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"
    if pipeline_run_id is None:
        return runs
    wanted = variants_filter(pipeline_run_id, variant_runs)
    try:  # the saved view's search filter
        shown = json.loads(json.loads(view)["state"])["searchFilter"]
    except (TypeError, ValueError, KeyError):  # no view, or not one of ours
        shown = None
    if shown == wanted:
        return f"{runs}&viewStateShareKey={VIEW_ID}"
    facets = {"searchFilter": wanted, "orderByKey": sort, "orderByAsc": "true"}
    return f"{runs}&{urlencode(facets, quote_via=quote)}"


def ui_url(uri: str, path: str) -> str:
    """`path` on the tracking server at `uri`, or through `make ui` for a store of one's own."""
    return f"{uri.rstrip('/')}{path}" if is_server(uri) else MAKE_UI_URL + path


def pipeline_path(experiment_id: str, pipeline: Any | None, view: str | None) -> str:
    """`ui_path` for a pipeline run as MLflow's client returns it (None: there is none yet)."""
    if pipeline is None:
        return ui_path(experiment_id)
    rows, sort = shown_runs(pipeline.data.tags)
    return ui_path(experiment_id, pipeline.info.run_id, view, rows, sort)


# The experiment's id, the newest active pipeline run (NULL: none), the saved view and the tags
# that name its variant runs: one read of a store the UI has not opened.
_NEWEST_PIPELINE = """
SELECT e.experiment_id, r.run_uuid,
    (SELECT value FROM experiment_tags WHERE experiment_id = e.experiment_id AND key = :view),
    (SELECT value FROM tags WHERE run_uuid = r.run_uuid AND key = :named),
    (SELECT value FROM tags WHERE run_uuid = r.run_uuid AND key = :compared)
FROM experiments AS e LEFT JOIN runs AS r ON r.run_uuid = (
    SELECT runs.run_uuid FROM runs JOIN tags ON tags.run_uuid = runs.run_uuid
    WHERE runs.experiment_id = e.experiment_id AND runs.lifecycle_stage = 'active'
        AND tags.key = :role AND tags.value = 'pipeline'
    ORDER BY runs.start_time DESC LIMIT 1
)
WHERE e.name = :experiment
"""


def training_view(base_url: str, store: Path) -> tuple[str, str]:
    """Where `make ui` sends a user, and what it shows in words: the newest pipeline's variants,
    read from the SQLite `store` without writing to it; else the experiment, or the list."""
    keys = {"view": VIEW_TAG, "named": VARIANT_RUNS_TAG, "compared": COMPARED_RUNS_TAG}
    keys |= {"role": ROLE_TAG, "experiment": EXPERIMENT}
    try:
        with closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as db:
            row = db.execute(_NEWEST_PIPELINE, keys).fetchone()
    except sqlite3.Error:  # no store yet, or not one of MLflow's
        row = None
    if not row:
        return (
            f"{base_url}/#/experiments?{TRAINING_VIEW}",
            "no runs yet: `make repro` records them; reload the page after it",
        )
    experiment_id, pipeline, view, named, compared = row
    if not pipeline:
        return base_url + ui_path(str(experiment_id)), "the experiment: no pipeline run yet"
    rows, sort = shown_runs({VARIANT_RUNS_TAG: named or "", COMPARED_RUNS_TAG: compared or ""})
    url = base_url + ui_path(str(experiment_id), pipeline, view, rows, sort)
    if sort == BESIDE_SORT:
        return url, "the newest pipeline run, a DVC experiment: its variants beside its baseline's"
    return url, "the newest pipeline run: its variants, fastest first"


def server_view_url(uri: str) -> str:
    """The newest pipeline's variants on the server at `uri`; its URL alone if unreadable."""
    base = uri.rstrip("/")
    environment_defaults()
    try:
        with logs_held():
            client = MlflowClient(uri)
            if (experiment := client.get_experiment_by_name(EXPERIMENT)) is None:
                return f"{base}/#/experiments?{TRAINING_VIEW}"
            pipeline = pipeline_variants(client, experiment.experiment_id)[0]
    except tracking_errors():  # down, or refusing: the server's own page says why
        return base
    return base + pipeline_path(experiment.experiment_id, pipeline, experiment.tags.get(VIEW_TAG))


def pipeline_variants(
    client: MlflowClient, experiment_id: str, pipeline_id: str | None = None
) -> tuple[Any, list[Any]]:
    """A pipeline run (`pipeline_id`, else the newest) and its variant runs: those it names
    from earlier pipeline runs, then its children; (None, []) where there is none."""

    def oldest_first(filter_string: str) -> list[Any]:
        order = ["attributes.start_time ASC"]
        return client.search_runs([experiment_id], filter_string=filter_string, order_by=order)

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
    children = oldest_first(variants_filter(parent.info.run_id))
    if named := named_variant_runs(parent.data.tags):
        own = {run.info.run_id for run in children}
        earlier = oldest_first(variants_filter(parent.info.run_id, named))
        children = [run for run in earlier if run.info.run_id not in own] + children
    return parent, children
