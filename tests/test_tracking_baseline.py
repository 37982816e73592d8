"""After `dvc exp run`, MLflow's view shows the experiment beside its baseline (issue #40): the
link showed one row, nothing saying it was the experiment nor what it differed from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from mlflow.tracking import MlflowClient

from accelbench.report.runs import summary_markdown
from accelbench.system.tracking.baseline import (
    BASELINE_REV_ENV,
    Beside,
    differing_params,
)
from accelbench.system.tracking.store import EXPERIMENT
from accelbench.system.tracking.view import (
    VIEW_ID,
    VIEW_TAG,
    WHOSE_TAG,
    training_view,
    ui_path,
)
from helpers import repo_params_raw, run_all_stages, small_params


def _run(name: str, **params: str) -> SimpleNamespace:
    return SimpleNamespace(
        info=SimpleNamespace(run_name=name, run_id=f"id-{name}"),
        data=SimpleNamespace(params=params),
    )


def test_the_params_that_differ_are_compared_variant_by_variant() -> None:
    """`variant.precision` differs between cpu and amp, not between an experiment and its
    baseline: only what differs for the same variant counts, a param one side lacks too."""
    ours = [_run("cpu", **{"train.lr": "0.002", "variant.precision": "fp32"}), _run("amp")]
    theirs = [
        _run("cpu", **{"train.lr": "0.001", "variant.precision": "fp32", "train.seed": "0"}),
        _run("gpu", **{"train.lr": "5"}),  # not in the experiment: nothing to compare with
    ]
    assert differing_params(ours, theirs) == ("train.lr", "train.seed")
    assert differing_params(ours, ours) == ()


def test_the_line_says_what_the_experiment_is_beside() -> None:
    baseline = SimpleNamespace(info=SimpleNamespace(run_name="pipeline 2026-12-05 10:00:00"))
    beside = Beside("lr-high", "1a2b3c4d5e", baseline, ("train.lr",))
    assert beside.line() == (
        "experiment lr-high beside its baseline, pipeline run `pipeline 2026-12-05 10:00:00` "
        "of commit 1a2b3c4; params that differ: train.lr"
    )
    assert Beside("lr-high", "1a2b3c4d5e", None).line() == (
        "no baseline run in this store for experiment lr-high (no finished `dvc repro` of its "
        "baseline commit 1a2b3c4): MLflow shows the experiment alone"
    )


def _git_commit(folder: Path) -> str:
    """`folder` as a git repository with one commit; its id."""
    folder.mkdir()
    (folder / "README").write_text("a checkout\n")
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"],
    ):
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=True
    ).stdout.strip()


def _state(client: MlflowClient, experiment_id: str) -> dict:
    return json.loads(json.loads(client.get_experiment(experiment_id).tags[VIEW_TAG])["state"])


@pytest.mark.slow
def test_a_dvc_experiment_is_shown_beside_its_baseline(
    tmp_path, prepared, mlflow_store, monkeypatch, capsys
) -> None:
    """A tiny real `dvc repro` (cpu trains, gpu is skipped), then `dvc exp run -S
    train.lr=0.002` as DVC runs its stages: the view lists both pipelines' variants, each
    row saying whose, with a column for train.lr alone; the link and `accelbench runs` open
    it. An experiment from a commit the store has no run of is shown alone, and says so."""
    root = tmp_path / "checkout"
    commit = _git_commit(root)
    monkeypatch.setenv("DVC_STAGE", "compare")  # stages as `dvc repro` runs them
    raw = repo_params_raw()["variants"]
    variants = {name: raw[name] for name in ("cpu", "gpu")}
    run_all_stages(root, small_params(variants), prepared)  # the baseline
    client = MlflowClient()
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    baseline = {r.info.run_name: r.info.run_id for r in client.search_runs([experiment_id])}
    capsys.readouterr()

    monkeypatch.setenv("DVC_EXP_NAME", "lr-high")
    monkeypatch.setenv(BASELINE_REV_ENV, commit)
    run_all_stages(root, small_params(variants, lr=0.002), prepared)
    printed = capsys.readouterr().err

    state = _state(client, experiment_id)
    rows = client.search_runs(
        [experiment_id], state["searchFilter"], order_by=[f"{state['orderByKey']} ASC"]
    )
    shown = [(r.info.run_name, r.data.tags[WHOSE_TAG], r.data.params["train.lr"]) for r in rows]
    short = commit[:7]
    assert shown == [  # by variant, the experiment's run above its baseline's
        ("cpu", "lr-high", "0.002"),
        ("cpu", f"baseline {short}", "0.001"),
        ("gpu", "lr-high", "0.002"),
        ("gpu", f"baseline {short}", "0.001"),
    ]
    assert {r.info.run_id for r in rows} >= {baseline["cpu"], baseline["gpu"]}
    params = [c for c in state["columnOrder"] if c.startswith("params.")]
    assert params == ["params.`train.lr`"]  # exactly the params that differ
    assert state["columnOrder"][0] == f"tags.`{WHOSE_TAG}`"
    assert {"tags.`steady_epoch`", "tags.`speedup`", "tags.`status`"} <= set(state["columnOrder"])
    assert set(state["selectedColumns"]) <= set(state["columnOrder"])

    link = training_view("http://ui", tmp_path / "mlflow.db")[0]
    assert link.endswith(f"viewStateShareKey={VIEW_ID}")  # the saved view above
    where = printed.index("compare: experiment lr-high")
    beside, there = printed[where:].splitlines()[:2]
    assert beside.startswith(
        "compare: experiment lr-high beside its baseline, pipeline run `pipeline "
    ) and beside.endswith(f"of commit {short}; params that differ: train.lr")
    assert there == f"compare: in MLflow: {link.replace('http://ui', 'http://127.0.0.1:5000')}"
    summary = summary_markdown(root)
    assert "in the UI (`make ui`), beside its baseline's: http://127.0.0.1:5000" in summary
    assert beside.removeprefix("compare: e") in summary

    # the view gone (another store's copy wrote its own): the link filters the same rows
    client.set_experiment_tag(experiment_id, VIEW_TAG, "{}")
    fallback = training_view("http://ui", tmp_path / "mlflow.db")[0]
    query = parse_qs(urlsplit(fallback.split("#", 1)[1]).query)
    assert query["searchFilter"] == [state["searchFilter"]]
    assert query["orderByKey"] == [state["orderByKey"]]
    assert ui_path(experiment_id).split("?")[0] in fallback

    # an experiment of a commit this store has no `dvc repro` of: alone, and it says so
    monkeypatch.setenv("DVC_EXP_NAME", "seed-1")
    monkeypatch.setenv(BASELINE_REV_ENV, "f" * 40)
    run_all_stages(root, small_params(variants, seed=1), prepared)
    printed = capsys.readouterr().err
    assert (
        "compare: no baseline run in this store for experiment seed-1 (no finished `dvc repro` "
        "of its baseline commit fffffff): MLflow shows the experiment alone"
    ) in printed
    state = _state(client, experiment_id)
    rows = client.search_runs([experiment_id], state["searchFilter"])
    assert sorted((r.info.run_name, r.data.tags[WHOSE_TAG]) for r in rows) == [
        ("cpu", "seed-1"),
        ("gpu", "seed-1"),
    ]
    assert not [c for c in state["columnOrder"] if c.startswith("params.")]
    # the link opens that view, not a filter of its own (the UI's default columns)
    assert training_view("http://ui", tmp_path / "mlflow.db")[0].endswith(
        f"viewStateShareKey={VIEW_ID}"
    )
