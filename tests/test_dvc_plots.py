"""`dvc plots show` as a user sees it: one plot per figure with every variant in it, each image
once, and a page that renders with the network cut off (the offline template `make plots`
uses), checked in headless Chromium."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from accelbench.core.results import ClassScores, EpochRecord
from accelbench.report import dvc_plots
from helpers import DVC, REPO, dvc_repo
from test_report import epoch

sys.path.insert(0, str(REPO / "tools"))
import mlflow_ui

ACROSS_VARIANTS = [  # dvc.yaml's top-level plots of data, in its order
    "Training time per epoch (s, log scale)",
    "Test accuracy per epoch",
    "Training loss per epoch",
    "F1 per digit (test set)",
]


def _epochs(seconds: list[float]) -> list[EpochRecord]:
    return [epoch(i + 1, s, 0.9 + i / 100, train_loss=1 / (i + 1)) for i, s in enumerate(seconds)]


def _per_class(f1: float) -> dict[str, ClassScores]:
    return {str(d): ClassScores(precision=f1, recall=f1, f1_score=f1) for d in range(10)}


def test_plot_data_is_long_form_one_row_per_variant_and_epoch(tmp_path) -> None:
    epochs = {"cpu": _epochs([12.0, 11.5]), "gpu": _epochs([0.9, 0.1]), "amp": []}
    epochs["gpu"][1] = replace(epochs["gpu"][1], test_accuracy=math.nan)  # a blank cell
    paths = dvc_plots.write_plot_data(tmp_path, epochs, {"cpu": _per_class(0.98)})

    assert paths == [tmp_path / "epochs.csv", tmp_path / "per_class.csv"]
    lines = (tmp_path / "epochs.csv").read_text().splitlines()
    assert lines[0] == "variant,epoch,train_time_s,test_accuracy,train_loss"
    assert [line.split(",")[:2] for line in lines[1:]] == [
        ["cpu", "1"],
        ["cpu", "2"],
        ["gpu", "1"],
        ["gpu", "2"],
    ]  # fmt: skip  (amp, skipped, adds no row)
    assert lines[4].split(",")[3] == ""
    per_class = (tmp_path / "per_class.csv").read_text().splitlines()
    assert per_class[0] == "variant,digit,precision,recall,f1" and len(per_class) == 11
    assert per_class[-1] == "cpu,9,0.98,0.98,0.98"


@pytest.mark.slow
def test_offline_template_inlines_vega_and_keeps_dvcs_placeholders() -> None:
    page = dvc_plots.html_template()
    assert "{plot_divs}" in page and "{refresh_tag}" in page
    assert "{scripts}" not in page  # where DVC would put its CDN script tags
    assert not re.search(r"<script[^>]+src=", page) and "cdn.jsdelivr" not in page
    assert "window.vegaEmbed=" in page.replace(" ", "") and len(page) > 300_000


def _repo_with_plot_data(tmp_path: Path) -> tuple[Path, list[str]]:
    """dvc.yaml, params.yaml and the plot templates, with the files the plots read: compare's
    across-variant data for two trained variants, cpu's confusion matrix and the summary."""
    repo = dvc_repo(tmp_path)
    shutil.copytree(REPO / ".dvc" / "plots", repo / ".dvc" / "plots")
    dvc_plots.write_plot_data(
        repo / "reports" / dvc_plots.PLOTS_DIR,
        {"cpu": _epochs([12.0, 11.5, 11.4]), "gpu": _epochs([0.9, 0.1, 0.1])},
        {"cpu": _per_class(0.98), "gpu": _per_class(0.99)},
    )
    (repo / "metrics" / "cpu").mkdir(parents=True)
    (repo / "metrics" / "cpu" / "confusion.csv").write_text(
        "actual,predicted\n" + "".join(f"{d},{d}\n" for d in range(10))
    )
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([1, 2], [2, 1])
    fig.savefig(repo / "reports" / "summary.png")
    plt.close(fig)
    variants = list(yaml.safe_load((REPO / "params.yaml").read_text())["variants"])
    return repo, variants


def _plots_show(repo: Path, out: str, *args: str) -> Path:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    result = subprocess.run(
        [DVC, "plots", "show", "-o", out, *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return repo / out / "index.html"


def _div_ids(html: str) -> list[str]:
    return re.findall(r'<div id = "([^"]*)">', html)


@pytest.mark.slow
def test_dvc_plots_show_draws_each_figure_once_with_every_variant(tmp_path) -> None:
    repo, variants = _repo_with_plot_data(tmp_path)
    html = _plots_show(repo, "plots").read_text()

    ids = _div_ids(html)
    assert ids == [re.sub(r"\W", "_", title) for title in ACROSS_VARIANTS] + [
        f"metrics_{name}_confusion_csv" for name in variants
    ]
    time_spec = html[html.index(f'<div id = "{ids[0]}"') : html.index(f'<div id = "{ids[1]}"')]
    assert '"variant": "cpu"' in time_spec and '"variant": "gpu"' in time_spec
    # titled by its variant, not by the CSV's path (cpu's is the one with data here)
    assert '"text": "Confusion matrix of cpu (test set)"' in html
    assert '"text": "metrics/cpu/confusion.csv"' not in html
    assert re.findall(r'<img src="([^"]+)"', html) == ["static/workspace_reports_summary.png"]


chromium_missing = [
    what
    for what, ok in (
        ("Debian's chromium", mlflow_ui.chromium_path() is not None),
        ("playwright", importlib.util.find_spec("playwright") is not None),
    )
    if not ok
]


def _open_offline(page_path: Path, screenshot: Path) -> tuple[dict[str, int], list[str], str]:
    """Open a `dvc plots show` page with every request but file:// refused; return, per plot
    div, how many data marks it drew, the refused URLs and the page text."""
    from playwright.sync_api import sync_playwright

    refused: list[str] = []

    def route(request_route) -> None:
        if request_route.request.url.startswith("file://"):
            request_route.continue_()
        else:
            refused.append(request_route.request.url)
            request_route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=mlflow_ui.chromium_path(), args=mlflow_ui.CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.route("**/*", route)
        page = context.new_page()
        ids = _div_ids(page_path.read_text())
        page.goto(page_path.as_uri())
        page.wait_for_load_state("load")
        page.wait_for_timeout(1500)  # vega-embed renders asynchronously
        marks = page.evaluate(  # data marks drawn: lines, points, cells (not axes, legends)
            """ids => Object.fromEntries(ids.map(id => [id,
                document.getElementById(id).querySelectorAll('g.role-mark path').length]))""",
            ids,
        )
        text = page.inner_text("body")
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    return marks, refused, text


@pytest.mark.browser
@pytest.mark.skipif(
    bool(chromium_missing) and os.environ.get("ACCELBENCH_REQUIRE_BROWSER") != "1",
    reason=f"needs {', '.join(chromium_missing)} (.ci/run installs them)",
)
def test_dvc_plots_page_renders_offline_with_the_bundled_template(tmp_path) -> None:
    repo, _ = _repo_with_plot_data(tmp_path)
    template = tmp_path / "offline.html"
    template.write_text(dvc_plots.html_template())

    offline = _plots_show(repo, "offline", "--html-template", str(template))
    marks, refused, text = _open_offline(offline, tmp_path / "offline.png")
    assert refused == []  # nothing asked of the network
    drawn = [re.sub(r"\W", "_", title) for title in ACROSS_VARIANTS] + ["metrics_cpu_confusion_csv"]
    for plot in drawn:  # 3 epochs (or 10 digits) of 2 variants; 10 confusion cells
        assert marks[plot] >= 6, (plot, marks)
    assert "Loading" not in text and (tmp_path / "offline.png").stat().st_size > 20_000

    # DVC's own page asks a CDN for Vega: with the network cut off, not one plot is drawn
    default = _plots_show(repo, "default")
    marks, refused, _ = _open_offline(default, tmp_path / "default.png")
    assert any("cdn.jsdelivr.net" in url for url in refused), refused
    assert not any(marks.values()), marks


@pytest.mark.parametrize("template", ["variants", "variants_log"])
@pytest.mark.parametrize("epochs", [2, 3, 10])
def test_the_epoch_axis_labels_whole_epochs_once_each(template, epochs) -> None:
    """With 2 epochs Vega put a tick at 1.5, which the integer format wrote as a second "2"
    (a walkthrough saw an axis reading 1, 2, 2)."""
    import json

    import vl_convert

    spec = (REPO / ".dvc" / "plots" / f"{template}.json").read_text()
    rows = [{"epoch": i, "train_time_s": 10.0 + i, "variant": "cpu", "rev": "workspace"}
            for i in range(1, epochs + 1)]  # fmt: skip
    spec = spec.replace('"<DVC_METRIC_DATA>"', json.dumps(rows))
    for placeholder, value in (("X", "epoch"), ("Y", "train_time_s"), ("TITLE", "t")):
        spec = spec.replace(f"<DVC_METRIC_{placeholder}>", value)
    spec = spec.replace("<DVC_METRIC_X_LABEL>", "epoch").replace("<DVC_METRIC_Y_LABEL>", "s")
    svg = vl_convert.vegalite_to_svg(spec)
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    x_labels = labels[: labels.index("epoch")]  # the x axis is drawn first, then its title
    assert x_labels == [str(i) for i in range(1, epochs + 1)], x_labels
