"""A DVC experiment beside its baseline in MLflow: after `dvc exp run`, the saved view lists
the experiment's variant runs and its baseline's, each saying whose it is, with a column per
param (of those the runs hold) that differs. The baseline is the newest FINISHED pipeline run
of a `dvc repro` of the commit in `$DVC_EXP_BASELINE_REV`, by each run's git commit tag.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from accelbench.core.console import redact
from accelbench.system.tracking.dead_runs import BY_HAND_TAG
from accelbench.system.tracking.outage import tolerant
from accelbench.system.tracking.runs import EXP_NAME_TAG
from accelbench.system.tracking.store import (
    ROLE_TAG,
    once_more_on_conflict,
    run_in_store,
    setup,
    tracking_uri,
)
from accelbench.system.tracking.view import (
    COMPARED_RUNS_TAG,
    VIEW_TAG,
    WHOSE_TAG,
    experiment_view,
    named_variant_runs,
    pipeline_path,
    pipeline_variants,
    ui_url,
)

COMMIT_TAG = "mlflow.source.git.commit"
BASELINE_REV_ENV = "DVC_EXP_BASELINE_REV"  # DVC sets it for every stage of `dvc exp run`
# On an experiment's pipeline run, by its compare: its baseline commit, pipeline run (empty:
# none in the store) and the params that differ (comma-separated).
BASELINE_COMMIT_TAG = "accelbench.baseline_commit"
BASELINE_RUN_TAG = "accelbench.baseline_run"
DIFFERING_TAG = "accelbench.params_differ"


@dataclass(frozen=True)
class Beside:
    """A DVC experiment's pipeline run and what the view shows it beside."""

    experiment: str  # the DVC experiment's name
    commit: str  # its baseline commit
    baseline: Any | None  # the baseline's pipeline run; None: the store has none
    differing: tuple[str, ...] = ()  # the params that differ between the two, sorted
    link: str = ""  # to the view in the UI

    def line(self) -> str:
        """The one line a user reads where the link is printed."""
        short = self.commit[:7] or "unknown"
        if self.baseline is None:
            return (
                f"no baseline run in this store for experiment {self.experiment} (no finished "
                f"`dvc repro` of its baseline commit {short}): MLflow shows the experiment alone"
            )
        differ = ", ".join(self.differing) or "none of the params the variant runs hold"
        return (
            f"experiment {self.experiment} beside its baseline, pipeline run "
            f"`{self.baseline.info.run_name}` of commit {short}; params that differ: {differ}"
        )


def find_baseline(client: MlflowClient, experiment_id: str, pipeline: Any, commit: str) -> Any:
    """The newest FINISHED pipeline run of a `dvc repro` of `commit` before `pipeline`, or None."""
    found = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{ROLE_TAG}` = 'pipeline' and tags.`{COMMIT_TAG}` = '{commit}' "
            f"and tags.`{EXP_NAME_TAG}` IS NULL and tags.`{BY_HAND_TAG}` IS NULL "
            f"and attributes.run_id != '{pipeline.info.run_id}' "
            f"and attributes.start_time <= {pipeline.info.start_time} "
            "and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0] if found else None


def differing_params(ours: Sequence[Any], theirs: Sequence[Any]) -> tuple[str, ...]:
    """The params (one of the two lacks too) that differ between two pipelines' runs of the
    same variant (by run name); sorted."""
    by_name = {run.info.run_name: run.data.params for run in theirs}
    differ: set[str] = set()
    for run in ours:
        if (other := by_name.get(run.info.run_name)) is not None:
            mine = run.data.params
            differ |= {key for key in mine.keys() | other.keys() if mine.get(key) != other.get(key)}
    return tuple(sorted(differ))


@tolerant
def show_beside_baseline(root: Path, pipeline_run_id: str) -> Beside | None:
    """Where `pipeline_run_id` is a DVC experiment's: find its baseline, mark whose each variant
    run is, and point the saved view at both pipelines' variants (the experiment's alone
    without a baseline). None for a pipeline run of no experiment."""
    experiment_id = setup(root)
    client = MlflowClient()
    pipeline, ours = pipeline_variants(client, experiment_id, pipeline_run_id)
    experiment = pipeline.data.tags.get(EXP_NAME_TAG) if pipeline is not None else None
    if not experiment:
        return None
    commit = os.environ.get(BASELINE_REV_ENV) or pipeline.data.tags.get(COMMIT_TAG, "")
    baseline = find_baseline(client, experiment_id, pipeline, commit) if commit else None
    theirs = pipeline_variants(client, experiment_id, baseline.info.run_id)[1] if baseline else []
    beside = Beside(experiment, commit, baseline, differing_params(ours, theirs))
    own = [run.info.run_id for run in ours]
    rows = own + [run.info.run_id for run in theirs if run.info.run_id not in own]
    # whose each row is: the experiment's, the baseline's, or both (a run the experiment reused)
    said = f"baseline {commit[:7]}"
    whose = {run.info.run_id: said for run in theirs}
    whose |= {
        run_id: f"{said}, reused by {experiment}" if run_id in whose else experiment
        for run_id in own
    }
    for run_id, text in whose.items():
        client.set_tag(run_id, WHOSE_TAG, text)
    tags = {
        BASELINE_COMMIT_TAG: commit,
        BASELINE_RUN_TAG: baseline.info.run_id if baseline else "",
        DIFFERING_TAG: ",".join(beside.differing),
    }
    if baseline is not None:
        tags[COMPARED_RUNS_TAG] = ",".join(rows)
        view = experiment_view(
            f"{experiment} beside its baseline", pipeline_run_id, rows, beside.differing
        )
    else:
        named = named_variant_runs(pipeline.data.tags)  # as the link finds them: its children
        view = experiment_view(f"{experiment}: no baseline", pipeline_run_id, named, None)
    for key, value in tags.items():
        client.set_tag(pipeline_run_id, key, value)
    once_more_on_conflict(lambda: client.set_experiment_tag(experiment_id, VIEW_TAG, view))
    path = pipeline_path(experiment_id, client.get_run(pipeline_run_id), view)
    return replace(beside, link=ui_url(redact(tracking_uri(root)), path))  # no secret in it


def beside_of(client: MlflowClient, pipeline: Any) -> Beside | None:
    """What an experiment's compare found (`show_beside_baseline`), from its pipeline run's
    tags; None for one compare has not shown beside a baseline."""
    tags = pipeline.data.tags
    if not tags.get(EXP_NAME_TAG) or BASELINE_COMMIT_TAG not in tags:
        return None
    baseline_id = tags.get(BASELINE_RUN_TAG)
    baseline = run_in_store(client, baseline_id) if baseline_id else None  # None: deleted since
    differing = tuple(p for p in tags.get(DIFFERING_TAG, "").split(",") if p)
    return Beside(tags[EXP_NAME_TAG], tags[BASELINE_COMMIT_TAG], baseline, differing)
