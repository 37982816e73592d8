"""Open the MLflow UI in headless Chromium (Debian's `chromium`, driven by Playwright) as a user
would: the link `make ui` prints (the newest pipeline's variants, fastest first), the
experiment in its model-training view, the pipeline run's children, the compare view, the
charts and the models view.

    python tools/mlflow_ui.py --store mlflow.db --out docs/img/mlflow-compare.png \
        --runs-out docs/img/mlflow-runs.png

starts `mlflow server` on 127.0.0.1 (a free port) over the store, checks what a user should see,
saves screenshots of the first screen of the printed link (`--runs-out`), of the compare view
(`--out`) and beside it of the charts of the figures a user compares (`-chart.png`:
`--chart-metrics`), the models view (`-models.png`) and the report (`-artifacts.png`), then
stops the server. The test suite uses the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mlflow import MlflowClient

from accelbench.system.tracking.store import EXPERIMENT
from accelbench.system.tracking.view import (
    TRAINING_VIEW,
    VIEW_TAG,
    pipeline_path,
    pipeline_variants,
    ui_path,
)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(store: Path, timeout_s: float = 90) -> tuple[str, subprocess.Popen]:
    """`mlflow server` over a SQLite store on 127.0.0.1 (a free port), once it answers."""
    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    command = [
        str(mlflow),
        "server",
        "--backend-store-uri",
        f"sqlite:///{store.resolve()}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # From the store's folder: its artifact locations are relative to it (relative_artifacts).
    process = subprocess.Popen(
        command,
        env=env,
        cwd=store.resolve().parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError(
                f"mlflow server did not start: {process.stderr.read().decode()[-2000:]}"
            )
        time.sleep(0.5)
    return url, process


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def stop_server(process: subprocess.Popen, sig: int = 15) -> None:
    """Stop the server and its workers (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
    if process.stderr:
        process.stderr.close()


@contextlib.contextmanager
def mlflow_server(store: Path, timeout_s: float = 90) -> Iterator[str]:
    """A running server's URL for the duration of the block; always stopped."""
    url, process = start_server(store, timeout_s)
    try:
        yield url
    finally:
        stop_server(process)


# What a user compares: epoch time and accuracy per variant.
CHART_METRICS = ("steady_epoch_s", "eval_test_accuracy")
FIRST_SCREEN = {"width": 1500, "height": 900}  # the browser window of the link's screenshot

# Whether an element is inside the window and drawn on top there (not under a side panel).
_ON_SCREEN_JS = """e => {
    const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
    if (r.width === 0 || r.left < 0 || r.top < 0 || r.right > innerWidth || r.bottom > innerHeight)
        return false;
    const hit = document.elementFromPoint(x, y);
    return hit !== null && (e.contains(hit) || hit.contains(e));
}"""


def _close_assistant(page) -> None:
    """The assistant side panel, open on a first visit, hides a third of the page."""
    with contextlib.suppress(Exception):
        page.get_by_role("button", name="Close", exact=True).last.click(timeout=3000)
        page.get_by_role("button", name="Send message").wait_for(state="hidden", timeout=5000)


def first_screen(page, texts: list[str]) -> dict[str, bool]:
    """For each text: whether a user sees it without scrolling (the first cell showing it)."""
    return {
        text: page.get_by_text(text, exact=True).first.evaluate(_ON_SCREEN_JS) for text in texts
    }


def pipeline_runs(
    url: str, experiment: str = EXPERIMENT, pipeline: str | None = None
) -> tuple[str, Any, list[Any], str]:
    """Through the server: the experiment's id, the pipeline run (`pipeline`, else the newest),
    its variant runs, and the link to its variants `make ui` and `accelbench runs` print
    (relative to `url`), all as accelbench itself chooses them."""
    client = MlflowClient(tracking_uri=url)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in the store")
    parent, children = pipeline_variants(client, found.experiment_id, pipeline)
    if parent is None:
        raise SystemExit(
            f"--pipeline {pipeline}: no such pipeline run in the store"
            if pipeline
            else "no pipeline run in the store"
        )
    link = pipeline_path(found.experiment_id, parent, found.tags.get(VIEW_TAG))
    return found.experiment_id, parent, children, link


def see_variants(browser, link: str, children: list[Any], screenshot: Path) -> dict[str, str]:
    """The link `make ui` and `accelbench runs` print, in a window of FIRST_SCREEN: the text on
    the page (`variants`); for each trained variant its name, speedup and steady epoch
    (tags), whether each is on the first screen (`first_screen`); the variants top down
    (`order`). Saves the first screen to `screenshot`."""
    trained = [r for r in children if r.data.tags.get("status") == "trained"]
    page = browser.new_page(viewport=FIRST_SCREEN)
    page.goto(link)
    figures = [
        text
        for run in trained
        for text in (
            run.info.run_name,
            run.data.tags.get("speedup"),
            run.data.tags.get("steady_epoch"),
        )
        if text
    ]
    for text in figures:
        page.get_by_text(text, exact=True).first.wait_for(timeout=60_000)
    _close_assistant(page)
    page.wait_for_timeout(1000)
    tops = {
        run.info.run_name: page.get_by_text(run.info.run_name, exact=True).first.bounding_box()["y"]
        for run in trained
    }
    seen = {
        "variants": page.inner_text("body"),
        "first_screen": json.dumps(first_screen(page, figures)),
        "order": json.dumps(sorted(tops, key=tops.get)),
    }
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot))
    page.close()
    return seen


def visit_link(url: str, screenshot: Path, experiment: str = EXPERIMENT) -> dict[str, str]:
    """Only the printed link to the newest pipeline's variants (see `see_variants`), and the
    link itself (`link`)."""
    from playwright.sync_api import sync_playwright

    _, _, children, link = pipeline_runs(url, experiment)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        seen = see_variants(browser, url + link, children, screenshot)
        browser.close()
    return seen | {"link": url + link}


def visit(
    url: str,
    screenshot: Path,
    experiment: str = EXPERIMENT,
    chart_metrics: tuple[str, ...] = CHART_METRICS,
    pipeline: str | None = None,
    runs_screenshot: Path | None = None,
) -> dict[str, str]:
    """Walk the UI; return the text a user saw on each page (and save screenshots): first the
    link `make ui` and `accelbench runs` print (`see_variants`; its first screen saved to
    `runs_screenshot`, else beside `screenshot` as -runs.png), then the experiment, the
    pipeline run's children, charts, models, the compare view and the report."""
    from playwright.sync_api import sync_playwright

    experiment_id, parent, children, link = pipeline_runs(url, experiment, pipeline)
    child_ids = json.dumps([r.info.run_id for r in children])
    runs_screenshot = runs_screenshot or screenshot.with_name(f"{screenshot.stem}-runs.png")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        seen = see_variants(browser, url + link, children, runs_screenshot) | {"link": url + link}
        page = browser.new_page(viewport={"width": 1500, "height": 1500})
        page.goto(f"{url}/#/experiments")
        page.get_by_text(experiment, exact=True).first.wait_for(timeout=60_000)
        seen["experiments"] = page.inner_text("body")

        # The experiment in the model-training view: the pipeline run, its children under it
        # (skipped ones too).
        page.goto(url + ui_path(experiment_id))
        page.get_by_text(parent.info.run_name[:20]).first.wait_for(timeout=60_000)
        page.locator("[data-testid='runs-table'] button, [role='gridcell'] button").first.click()
        for child in children:
            page.get_by_text(child.info.run_name, exact=True).first.wait_for(timeout=30_000)
        seen["runs"] = page.inner_text("body")

        # The same runs as charts, one per figure compared (children only: the parent's
        # figures are the report's).
        page.goto(f"{url}{ui_path(experiment_id)}&compareRunsMode=CHART")
        search = page.get_by_placeholder("Search metric charts")
        search.wait_for(timeout=60_000)
        with contextlib.suppress(Exception):  # the assistant side panel hides a third of the page
            page.locator("button[aria-label*='lose' i]").last.click(timeout=2000)
        search.fill(f"^({'|'.join(chart_metrics)})$")  # a regular expression
        for metric in chart_metrics:
            page.get_by_text(metric, exact=True).first.wait_for(timeout=30_000)
        page.wait_for_timeout(1500)
        seen["chart"] = page.inner_text("body")
        page.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-chart.png")))

        # The variants' models, with the evaluation logged against each and its dataset (a
        # page of its own, wide: the table draws only the columns in view).
        models = browser.new_page(viewport={"width": 2400, "height": 900})
        models.goto(f"{url}/#/experiments/{experiment_id}/models?{TRAINING_VIEW}")
        models.get_by_text("eval_test_accuracy").first.wait_for(timeout=60_000)
        with contextlib.suppress(Exception):
            models.locator("button[aria-label*='lose' i]").last.click(timeout=2000)
        seen["models"] = models.inner_text("body")
        models.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-models.png")))
        models.close()

        page.goto(
            f"{url}/#/compare-runs?runs={quote(child_ids)}"
            f"&experiments={quote(json.dumps([experiment_id]))}&{TRAINING_VIEW}"
        )
        page.get_by_text("test_accuracy").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        seen["compare"] = page.inner_text("body")
        with contextlib.suppress(Exception):  # the assistant side panel hides a third of the page
            page.locator("button[aria-label*='lose' i]").last.click(timeout=2000)
        with contextlib.suppress(Exception):  # only the params that differ, then the metrics
            page.get_by_text("Show diff only").first.click(timeout=2000)
            page.get_by_text("Run details", exact=True).last.evaluate("e => e.scrollIntoView()")
            page.wait_for_timeout(500)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=False)

        # The pipeline run's report, read through the server from the store's artifacts.
        page.goto(
            f"{url}/#/experiments/{experiment_id}/runs/{parent.info.run_id}/artifacts"
            f"?{TRAINING_VIEW}"
        )
        page.get_by_text("comparison.md", exact=True).first.click(timeout=60_000)
        page.get_by_text("accelbench comparison").first.wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        seen["artifacts"] = page.inner_text("body")
        page.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-artifacts.png")))
        browser.close()
    seen["children"] = json.dumps({r.info.run_name: r.data.tags.get("status") for r in children})
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/mlflow-compare.png"))
    parser.add_argument(
        "--runs-out",
        type=Path,
        default=Path("docs/img/mlflow-runs.png"),
        help="the first screen of the link `make ui` prints (default: %(default)s)",
    )
    parser.add_argument(
        "--chart-metrics",
        nargs="+",
        default=list(CHART_METRICS),
        help="the metrics charted in -chart.png (default: %(default)s)",
    )
    parser.add_argument("--pipeline", metavar="RUN_ID", help="this pipeline run, not the newest")
    args = parser.parse_args()
    with mlflow_server(args.store) as url:
        seen = visit(
            url,
            args.out,
            chart_metrics=tuple(args.chart_metrics),
            pipeline=args.pipeline,
            runs_screenshot=args.runs_out,
        )
    hidden = [text for text, shown in json.loads(seen["first_screen"]).items() if not shown]
    print(
        f"children: {seen['children']}\nfastest first: {seen['order']}\n"
        f"screenshots: {args.runs_out}, {args.out}"
        + (f"\nWARNING: not on the first screen: {hidden}" if hidden else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
