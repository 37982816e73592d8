"""`make ui`'s first screen as a new user on a CPU-only laptop sees it (issue #40): the real
`accelbench ui` over the store of a tiny real CPU run (cpu trained, gpu and amp skipped),
opened from the link it prints, in a fresh headless Chromium of 1600×1000.

What accelbench sets is asserted: the key columns whole (the first beside the panel MLflow opens), the
skipped variants listed with why, MLflow's server without its job runner and telemetry. What
MLflow 3.17 lets no setting change is marked xfail(strict): the test fails, and says so, the
day an MLflow upgrade makes it pass. With $ACCELBENCH_SCREENSHOT_DIR set, the screenshots go
there (docs/img/mlflow-first-screen-cpu*.png and mlflow-experiment-beside-baseline.png are
made so); else to the test's folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pytest
from mlflow.tracking import MlflowClient

from accelbench.data import mnist
from accelbench.data.datasets import DATASETS
from accelbench.data.prepared import prepare
from accelbench.system.tracking import outage
from accelbench.system.tracking.store import EXPERIMENT
from helpers import REPO, repo_params_raw, run_all_stages, small_params, write_fake_mnist

sys.path.insert(0, str(REPO / "tools"))
import mlflow_ui

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("first_screen")]  # one worker:
# the module's server and run start once

if mlflow_ui.chromium_path() is None and os.environ.get("ACCELBENCH_REQUIRE_BROWSER") != "1":
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

WINDOW = {"width": 1600, "height": 1000}  # a laptop's browser, full screen
KEY_COLUMNS = ("Run Name", "steady_epoch", "speedup", "test_accuracy", "time_to_target")
FASTEST = KEY_COLUMNS[:3]  # who is fastest, by how much: whole beside the Assistant too

# For each column: whether it is whole: its header inside the table's visible part and drawn
# on top at both ends (not cut by the table's edge, nor under a side panel), and no text of
# its cells cut short (an ellipsis).
_WHOLE_JS = """names => Object.fromEntries(names.map(name => {
    const header = [...document.querySelectorAll('[role=columnheader]')]
        .find(h => h.innerText.trim() === name);
    if (!header) return [name, false];
    const r = header.getBoundingClientRect(), grid = header.closest('[role=grid], [role=treegrid]');
    const g = (grid || document.body).getBoundingClientRect(), y = r.top + r.height / 2;
    const onTop = x => { const hit = document.elementFromPoint(x, y); return !!hit && header.contains(hit); };
    const id = header.getAttribute('col-id');
    const cells = [...document.querySelectorAll(`[role=gridcell][col-id="${CSS.escape(id)}"]`)];
    const cut = cells.some(c => [c, ...c.querySelectorAll('*')]
        .some(e => e.clientWidth > 1 && e.scrollWidth > e.clientWidth + 1));  // 1 px: hidden text
    return [name, r.left >= g.left && r.right <= g.right + 1 && r.right <= innerWidth
        && onTop(r.left + 3) && onTop(r.right - 3) && cells.length > 0 && !cut];
}))"""


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny real pipeline's inputs on the CPU: fake digits, prepared, and the variants cpu
    (trains 2 epochs), gpu and amp (skipped on a machine without CUDA, as on the laptop)."""
    folder = tmp_path_factory.mktemp("digits")
    mirror, prepared = folder / "mirror", folder / "prepared"
    checksums = write_fake_mnist(mirror)
    prepare(prepared, DATASETS["mnist"], lambda f: mnist.prepare_into(mirror, f, checksums))
    variants = {
        k: v for k, v in repo_params_raw()["variants"].items() if k in {"cpu", "gpu", "amp"}
    }
    return prepared, variants


def _start_ui(root: Path, port: int) -> tuple[subprocess.Popen, str]:
    """`accelbench ui` in `root`, as `make ui` runs it; the link it prints first, once the
    server answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.pop("DO_NOT_TRACK", None)  # as a user's shell: accelbench ui sets what it needs
    log = root / "ui.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "accelbench.cli", "ui", "--port", str(port)],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while not mlflow_ui.healthy(f"http://127.0.0.1:{port}"):
        if process.poll() is not None or time.monotonic() > deadline:
            mlflow_ui.stop_server(process) if process.poll() is None else None
            raise RuntimeError(f"accelbench ui did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    first = log.read_text().splitlines()[0]
    assert first.startswith("Open http://"), first
    return process, first.split()[1]


def _screenshot_dir(root: Path) -> Path:
    folder = Path(os.environ.get("ACCELBENCH_SCREENSHOT_DIR") or root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def seen(tmp_path_factory, laptop) -> dict:
    """What a new user saw, and the server's processes while they looked."""
    from playwright.sync_api import sync_playwright

    root = tmp_path_factory.mktemp("laptop")
    with pytest.MonkeyPatch.context() as patch:  # conftest's per-test settings, for the module
        patch.setenv("MLFLOW_TRACKING_URI", "")  # undone at the end, whatever the stages set
        patch.delenv("MLFLOW_TRACKING_URI")  # this checkout's own store, as `make repro`
        patch.setenv("ACCELBENCH_SLOTS_DIR", str(root / "slots"))
        patch.setattr(outage, "_outage", None)
        patch.chdir(root)
        prepared, variants = laptop
        run_all_stages(root, small_params(variants), prepared)  # compare logs the figures
    mlflow.set_tracking_uri(None)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    process, link = _start_ui(root, mlflow_ui.free_port())
    shots = _screenshot_dir(root)
    try:
        server = psutil.Process(process.pid)
        seen = {
            "runs": runs,
            "processes": [p.cmdline() for p in [server, *server.children(recursive=True)]],
            "environ": server.environ(),
        }
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=mlflow_ui.chromium_path(), args=mlflow_ui.CHROMIUM_ARGS
            )
            page = browser.new_context(viewport=WINDOW).new_page()  # a first visit
            page.goto(link)
            page.get_by_text(runs["cpu"].data.tags["steady_epoch"], exact=True).wait_for()
            page.wait_for_timeout(3000)  # MLflow opens its Assistant after the first render
            seen["assistant"] = page.get_by_placeholder("Ask a question").is_visible()
            seen["banner"] = page.get_by_text("You're viewing a shared view").is_visible()
            seen["whole"] = page.evaluate(_WHOLE_JS, list(FASTEST))
            page.screenshot(path=str(shots / "mlflow-first-screen-cpu.png"))

            mlflow_ui._close_assistant(page)  # as the user then does: X, top right
            page.wait_for_timeout(1000)
            seen["whole_closed"] = page.evaluate(_WHOLE_JS, list(KEY_COLUMNS))
            seen["skipped_on_screen"] = {
                text: page.get_by_text(text, exact=True).first.evaluate(mlflow_ui._ON_SCREEN_JS)
                for name in ("gpu", "amp")
                for text in (name, runs[name].data.tags["skip_reason"])
            } | {
                "skipped": page.get_by_text("skipped", exact=True).first.evaluate(
                    mlflow_ui._ON_SCREEN_JS
                )
            }
            page.screenshot(path=str(shots / "mlflow-first-screen-cpu-closed.png"))

            page.get_by_role("link", name="cpu", exact=True).first.click()
            page.get_by_text("About this run").wait_for()
            seen["run_page_genai"] = page.get_by_text("Evaluation runs", exact=True).is_visible()
            browser.close()
    finally:
        mlflow_ui.stop_server(process)
    return seen


def test_every_key_column_is_whole_on_the_first_screen(seen) -> None:
    """`time_to_target` was cut off: the Assistant panel MLflow opens on a first visit took a
    third of the window. Who is fastest and by how much is whole with it open (an H200 run's
    intervals leave no room for more), every key column once it is closed."""
    assert seen["whole"] == dict.fromkeys(FASTEST, True)
    assert seen["whole_closed"] == dict.fromkeys(KEY_COLUMNS, True)


def test_the_skipped_variants_are_listed_with_why(seen) -> None:
    assert seen["runs"]["gpu"].data.tags["status"] == "skipped"
    assert seen["skipped_on_screen"] == dict.fromkeys(seen["skipped_on_screen"], True)


def test_the_server_runs_without_job_runner_or_telemetry(seen) -> None:
    """`make ui` started 12 processes in 2.5 GiB: MLflow's job runner and its workers."""
    assert len(seen["processes"]) <= 2, seen["processes"]  # mlflow server, its uvicorn
    assert not any("jobs" in " ".join(cmd) for cmd in seen["processes"])
    assert seen["environ"]["MLFLOW_DISABLE_TELEMETRY"] == seen["environ"]["DO_NOT_TRACK"] == "true"


# Where MLflow 3.17 decides each (its built UI, mlflow/server/js/build/static/js/ in the
# environment; the sources' names in parentheses).
UI_JS = "mlflow/server/js/build/static/js/"


@pytest.mark.xfail(
    strict=True,
    reason="MLflow 3.17 opens its Assistant once per browser on localhost, 127.0.0.1 or ::1, "
    f"and no server setting stops it ({UI_JS}main.c2f5f8d4.js, the source's AssistantFloatingButton: "
    "isLocalServer, mlflow.assistant.fab.autoOpenedOnFirstLoad)",
)
def test_no_assistant_panel_on_the_first_screen(seen) -> None:
    assert not seen["assistant"]


@pytest.mark.xfail(
    strict=True,
    reason="MLflow 3.17's runs table takes its columns from the browser's storage or from a "
    "saved view opened by viewStateShareKey, which always shows the banner; URL parameters "
    f"set only filter and sort ({UI_JS}3878.0467b2c4.chunk.js: sharedViewActive; "
    "3793.0117dc93.chunk.js: the facets searchFilter, orderByKey, ...)",
)
def test_no_shared_view_banner_on_the_first_screen(seen) -> None:
    assert not seen["banner"]


@pytest.mark.xfail(
    strict=True,
    reason="MLflow 3.17 opens a run page in the browser's last workflow, GenAI at first: the "
    "runs table's links drop workflowType, and the experiment's mlflow.experimentKind tag is "
    f"no longer read ({UI_JS}main.c2f5f8d4.js: localStorage mlflow.workflowType, initialValue "
    "genai; the feature flag that ignores the tag is fixed to true)",
)
def test_a_run_page_opens_in_model_training(seen) -> None:
    assert not seen["run_page_genai"]


def _git_checkout(root: Path) -> str:
    """`root` as a git checkout with one commit: the baseline an experiment is run from."""
    root.mkdir()
    (root / "README").write_text("a checkout\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                "commit", "-qm", "baseline"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_an_experiment_opens_beside_its_baseline(tmp_path, laptop) -> None:
    """After `dvc repro` and `dvc exp run -S train.lr=0.002` (tiny real runs on the CPU, as DVC
    runs their stages), the link `make ui` prints opens both pipelines' variants, by variant,
    each row saying whose it is, train.lr the one param column: whole beside the Assistant.
    Its screenshot is docs/img/mlflow-experiment-beside-baseline.png."""
    from playwright.sync_api import sync_playwright

    root = tmp_path / "checkout"
    commit = _git_checkout(root)
    prepared, variants = laptop
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.setenv("DVC_STAGE", "compare")  # as `dvc repro` runs the stages
        patch.chdir(root)
        run_all_stages(root, small_params(variants), prepared)
        patch.setenv("DVC_EXP_NAME", "lr-high")
        patch.setenv("DVC_EXP_BASELINE_REV", commit)
        run_all_stages(root, small_params(variants, lr=0.002), prepared)
    mlflow.set_tracking_uri(None)
    process, link = _start_ui(root, mlflow_ui.free_port())
    shots = _screenshot_dir(tmp_path)
    whose = ["lr-high", f"baseline {commit[:7]}"]
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=mlflow_ui.chromium_path(), args=mlflow_ui.CHROMIUM_ARGS
            )
            page = browser.new_context(viewport=WINDOW).new_page()
            page.goto(link)
            page.get_by_text(whose[1], exact=True).first.wait_for()
            page.wait_for_timeout(3000)  # MLflow opens its Assistant after the first render
            whole = page.evaluate(_WHOLE_JS, ["Run Name", "experiment", "train.lr"])
            order = page.evaluate(
                "() => [...document.querySelectorAll('[role=gridcell][col-id*=experiment]')]"
                ".map(c => c.innerText.trim())"
            )
            page.screenshot(path=str(shots / "mlflow-experiment-beside-baseline.png"))
            browser.close()
    finally:
        mlflow_ui.stop_server(process)
    assert whole == {"Run Name": True, "experiment": True, "train.lr": True}
    assert order == whose * 3  # amp, cpu, gpu: the experiment's run above its baseline's
