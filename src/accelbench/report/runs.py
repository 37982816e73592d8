"""`accelbench runs`: the newest pipeline run's variants in MLflow, fastest first, as a
Markdown table with the link to them in the UI."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from accelbench.core.console import AccelbenchError, InputError, redact
from accelbench.report import prose
from accelbench.system.tracking.baseline import beside_of
from accelbench.system.tracking.logs import FIGURE_TAGS, SPEEDUP_BASELINE_TAG, figure_text
from accelbench.system.tracking.outage import describe_failure, logs_held, remedy, tracking_errors
from accelbench.system.tracking.store import (
    EXPERIMENT,
    STORE,
    is_server,
    setup,
    sqlite_path,
    store_root,
    tracking_uri,
)
from accelbench.system.tracking.view import VIEW_TAG, pipeline_path, pipeline_variants, ui_url


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


def _summary_row(run: Any) -> list[str]:
    metrics, tags = run.data.metrics, run.data.tags
    # compare's evaluation of the trained model; else the last epoch the run logged (an
    # older run, or one whose evaluation was not logged)
    accuracy = metrics.get("eval_test_accuracy", metrics.get("test_accuracy"))
    figures, status = _figures(run), tags.get("status", "")
    # a training stopped part way (or running, or left RUNNING by a killed process) is no
    # trained variant, whatever its `status` tag says
    if status == "trained":
        status = _UNFINISHED.get(run.info.status, status)
    cells = [
        run.info.run_name,
        figures["speedup"],  # over the report's baseline
        figures["steady_epoch"],
        f"{100 * accuracy:.2f}%" if accuracy is not None else None,  # as the report writes it
        figures["time_to_target"],
        status,
        tags.get("device_name", tags.get("device", "")),
        run.info.status,
        run.info.run_id,
    ]
    return ["n/a" if c is None else c for c in cells]


_UNFINISHED = {"KILLED": "interrupted", "FAILED": "failed", "RUNNING": "unfinished"}

SUMMARY_COLUMNS = (  # as the table's first line reads
    "variant | speedup vs {baseline} (95% interval) | steady epoch (95% interval) | test accuracy"
    " | time to target | result | device | run status | run id"
)


def _speedup_baseline(runs: list[Any]) -> str:
    """The variant the runs' speedups are over, as compare tagged them."""
    named = {r.data.tags[SPEEDUP_BASELINE_TAG] for r in runs if SPEEDUP_BASELINE_TAG in r.data.tags}
    return "/".join(sorted(named)) or "the baseline"  # one, unless runs compared over several


def summary_markdown(root: Path) -> str:
    """`accelbench runs`: the newest pipeline run's variants, fastest first, and the link to
    them in the UI. Reading creates no store where there is none."""
    store = store_root(root) / STORE
    if not os.environ.get("MLFLOW_TRACKING_URI") and not store.exists():
        return f"No MLflow store at {store} yet: run `dvc repro` in {store.parent}."
    named = sqlite_path(tracking_uri(root)) if os.environ.get("MLFLOW_TRACKING_URI") else None
    if named is not None and not named.exists():  # reading would create it, folders and all
        raise InputError(
            f"MLFLOW_TRACKING_URI names the store {named}, which does not exist (a typo?); "
            f"`accelbench runs` reads a store and creates none: unset it to read {store}"
        )
    try:
        with logs_held():
            parent, children = pipeline_summary(root)
            client = MlflowClient()
            view = beside = None
            if parent is not None:
                view = client.get_experiment(parent.info.experiment_id).tags.get(VIEW_TAG)
                beside = beside_of(client, parent)  # a DVC experiment's: beside its baseline
    except tracking_errors() as exc:
        uri = tracking_uri(root)
        why = f"cannot read MLflow tracking at {uri} ({describe_failure(exc)}); {remedy(uri, exc)}"
        raise TrackingUnreachable(why) from exc
    if parent is None:
        return f"No pipeline run in {redact(tracking_uri(root))} yet: run `dvc repro`."
    link = pipeline_path(parent.info.experiment_id, parent, view)
    uri = redact(tracking_uri(root))  # the `MLflow:` line and the link show no secret
    order = "beside its baseline's" if beside and beside.baseline else "fastest first"
    where = "in the UI" if is_server(uri) else "in the UI (`make ui`)"
    # fastest first (as the UI's view); variants without a steady epoch after them, in order
    ranked = sorted(children, key=lambda r: r.data.metrics.get("steady_epoch_s", math.inf))
    skipped = [r for r in children if r.data.tags.get("status") == "skipped"]
    head = SUMMARY_COLUMNS.format(baseline=_speedup_baseline(children)).split(" | ")
    lines = [
        f"MLflow: {uri}, experiment `{EXPERIMENT}`",
        f"Pipeline run `{parent.info.run_name}` ({parent.info.run_id}), status {parent.info.status}",
        f"Its variants {where}, {order}: {ui_url(uri, link)}",
        *([beside.line()[:1].upper() + beside.line()[1:]] if beside else []),
        "",
        *prose.table(head, map(_summary_row, ranked)),
    ]
    if skipped:
        lines += ["", "Skipped on this machine:"]
    for r in skipped:
        lines.append(f"- {r.info.run_name}: {r.data.tags.get('skip_reason', 'no reason recorded')}")
    return "\n".join(lines)
