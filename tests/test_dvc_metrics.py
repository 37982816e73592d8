"""What `dvc metrics show` prints: one row per variant, the figures a user compares, in a
120-column terminal; per-class scores are a plot, not metrics."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelbench.report import markdown as report
from accelbench.report.prose import RUN_OF_RECORD  # whose figures the repository ships
from helpers import DVC, REPO, dvc_repo


def _h200_headline() -> dict:
    """The H200 run of record, with ddp given its two-GPU figures: every default variant
    trained, the widest table the defaults make."""
    headline = json.loads((REPO / "docs" / "results" / "h200" / "comparison.json").read_text())
    headline["ddp"] = {
        "speedup_vs_cpu": 175.83,
        "status": "trained",
        "steady_epoch_s": 0.084,
        "test_accuracy": 0.9936,
        "time_to_target_s": 21.3,
    }
    for name, steady in (("gpu_uncompiled", 0.175), ("amp_uncompiled", 0.141)):  # not in it
        headline[name] = {"status": "trained", "steady_epoch_s": steady, "test_accuracy": 0.9923,
                          "speedup_vs_cpu": 12.7 / steady, "time_to_target_s": 1.8}  # fmt: skip
    return headline


def _metrics_show(repo: Path) -> str:
    env = {**os.environ, "COLUMNS": "120", "DVC_NO_ANALYTICS": "1"}
    result = subprocess.run(
        [DVC, "metrics", "show"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_dvc_metrics_show_fits_120_columns_for_the_default_variants(tmp_path) -> None:
    repo = dvc_repo(tmp_path)
    headline = _h200_headline()
    assert set(headline) == set(yaml.safe_load((REPO / "params.yaml").read_text())["variants"])
    report.write_variant_metrics(repo / "reports" / report.METRICS_DIR, headline)
    # what train and evaluate write stays out of DVC's metrics
    (repo / "metrics" / "cpu").mkdir(parents=True)
    (repo / "metrics" / "cpu" / "eval.json").write_text('{"per_class": {"0": {"f1": 1}}}')

    shown = _metrics_show(repo)
    lines = shown.splitlines()
    assert max(map(len, lines)) <= 120, shown
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert set(rows) == {f"reports/metrics/{name}.json" for name in headline}
    assert lines[0].split()[1:] == sorted(
        ["speedup_vs_cpu", "steady_epoch_s", "test_accuracy", "time_to_target_s"]
    )
    assert rows["reports/metrics/gpu.json"][1] == "0.13196"  # steady_epoch_s, 5 digits
    assert "trained" not in shown and "per_class" not in shown

    # a skipped variant is a row of dashes, not a reason string
    headline["ddp"] = {key: None for key in headline["ddp"]} | {"status": "skipped"}
    report.write_variant_metrics(repo / "reports" / report.METRICS_DIR, headline)
    ddp = next(line for line in _metrics_show(repo).splitlines() if "ddp" in line)
    assert ddp.split()[1:] == ["-"] * 4


def test_what_a_user_commits_after_a_run_is_in_git_and_out_of_the_dvc_cache() -> None:
    """dvc.lock, compare's metrics and plot data: `cache: false`, and not ignored by git."""
    compare = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["compare"]
    metrics = {next(iter(m)): m[next(iter(m))] for m in compare["metrics"]}
    outs = {next(iter(o)): o[next(iter(o))] for o in compare["outs"] if isinstance(o, dict)}
    assert metrics["${dirs.reports}/metrics"]["cache"] is False
    assert outs["${dirs.reports}/plots"]["cache"] is False
    committed = ["dvc.lock", "reports/metrics/cpu.json", "reports/plots/epochs.csv"]
    outputs = ["reports/comparison.md", "reports/summary.png", "metrics/cpu/train.json"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *committed, *outputs],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert ignored == outputs


@pytest.mark.slow
def test_dvc_metrics_show_and_diff_work_without_the_dvc_cache(tmp_path) -> None:
    """A tiny `dvc repro` is diffed against the run committed with the repository (the run
    of record); after its own commit (dvc.lock and compare's figures, as
    docs/comparing-with-dvc.md says) and `make clean-history`, the figures are still shown,
    and diffed against that commit."""
    from test_pipeline import _dvc, _small_repo

    repo, mirror, _ = _small_repo(
        tmp_path, only_cpu=True, epochs=2, train_subset=512, test_subset=256
    )
    _dvc(repo, "repro", mirror=mirror)

    # the README's make targets over the same repository, as a user runs them (-o setup: the
    # copy has no .venv of its own; this interpreter's tools are on the PATH)
    from test_pipeline import _env

    def make(target: str, loads_all: bool = True) -> str:
        done = subprocess.run(
            ["make", "--no-print-directory", "-o", "setup", target],
            cwd=repo, env=_env(mirror), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert not loads_all or "failed to load" not in done.stderr, done.stderr
        return done.stdout

    def head_run(subject: str) -> str:
        """How the make targets name the commit HEAD's figures come from."""
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        return f"{sha} ({datetime.date.today().isoformat()}) {subject}"

    # before the user's first commit: their run against the one committed with the
    # repository (the run of record), whose figures HEAD holds
    committed = subprocess.run(
        ["git", "show", "HEAD:reports/metrics/cpu.json"], cwd=repo, capture_output=True, text=True
    )
    head_cpu = json.loads(committed.stdout)["steady_epoch_s"]
    committed_params = subprocess.run(
        ["git", "show", "HEAD:params.yaml"], cwd=repo, capture_output=True, text=True
    ).stdout
    metrics = make("metrics")
    said, diff = metrics.split("\n", 1)
    assert said == f"The workspace's figures against HEAD's, from {head_run('copy')}:"
    [line] = [
        line for line in diff.splitlines() if "cpu.json" in line and "steady_epoch_s " in line
    ]
    assert line.split()[2] == str(round(head_cpu, 5)), diff  # HEAD's, beside the workspace's
    assert float(line.split()[3]) != head_cpu
    # the plots too: the workspace's lines beside HEAD's; HEAD's confusion matrices are in the
    # DVC cache of the machine that ran it, so DVC says it failed to load those
    plots = make("plots", loads_all=False)
    assert f"dvc plots diff HEAD (HEAD's figures: {head_run('copy')})" in plots
    page = (repo / "dvc_plots" / "index.html").read_text()
    assert '"rev": "HEAD"' in page and '"rev": "workspace"' in page
    # and in markdown for a pull request: the params that differ, then the figures, each
    # with HEAD's value beside the workspace's; nothing else on stdout
    said, *tables = make("compare-md").splitlines()
    assert said == f"Compared with HEAD's figures, from {head_run('copy')}:"
    assert all(line.startswith("|") for line in tables if line), tables
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in tables if line]
    assert ["Path", "Param", "HEAD", "workspace"] in rows
    epochs = yaml.safe_load(committed_params)["train"]["epochs"]
    assert ["params.yaml", "train.epochs", str(epochs), "2"] in rows  # DVC: no Change here
    assert ["Path", "Metric", "HEAD", "workspace", "Change"] in rows
    [cpu] = [row for row in rows if row[:2] == ["reports/metrics/cpu.json", "steady_epoch_s"]]
    assert float(cpu[2]) == round(head_cpu, 5) and float(cpu[3]) != head_cpu
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "a run"], cwd=repo, check=True)
    tracked = subprocess.run(
        ["git", "ls-files", "dvc.lock", "reports"], cwd=repo, capture_output=True, text=True
    ).stdout.split()
    assert tracked == [
        "dvc.lock", "reports/metrics/cpu.json", "reports/plots/epochs.csv",
        "reports/plots/per_class.csv",
    ]  # fmt: skip
    subprocess.run(["make", "--no-print-directory", "clean-history", "YES=1"], cwd=repo, check=True)
    assert not (repo / ".dvc" / "cache").exists()

    shown = _metrics_show(repo)
    assert "reports/metrics/cpu.json" in shown and "steady_epoch_s" in shown
    assert _dvc(repo, "metrics", "diff", mirror=mirror).stdout.strip() == ""  # as committed
    cpu = repo / "reports" / "metrics" / "cpu.json"
    figures = json.loads(cpu.read_text())
    cpu.write_text(json.dumps(figures | {"steady_epoch_s": 2 * figures["steady_epoch_s"]}))
    diff = _dvc(repo, "metrics", "diff", "HEAD", mirror=mirror).stdout
    [line] = [line for line in diff.splitlines() if "steady_epoch_s " in line]
    assert line.split()[:2] == ["reports/metrics/cpu.json", "steady_epoch_s"]

    metrics = make("metrics")
    assert "reports/metrics/cpu.json" in metrics and "No figures committed" not in metrics
    assert "Skipped here" not in metrics  # the copy's params.yaml has cpu alone
    assert f"against HEAD's, from {head_run('a run')}:" in metrics  # the user's now
    exps = make("exps")
    assert "cpu" in exps and "steady epoch s" in exps
    assert exps.splitlines()[0] == f"HEAD's figures: {head_run('a run')}"
    assert max(len(line) for line in exps.splitlines()) <= 120
    plots = make("plots")  # the plot data as committed: the workspace's alone
    assert "dvc plots show" in plots and "dvc plots diff" not in plots
    page = (repo / "dvc_plots" / "index.html").read_text()
    assert "cdn.jsdelivr" not in page and "vegaEmbed" in page

    # a HEAD without figures: nothing to diff against, said as such (DVC prints "failed to
    # load some metrics for following revisions: 'HEAD'")
    subprocess.run(["git", "rm", "-r", "-q", "--cached", "reports/metrics"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "no figures"], cwd=repo, check=True)
    assert "No figures committed yet to diff against" in make("metrics")


def _cpu_only_workspace(tmp_path: Path) -> Path:
    """A repository whose HEAD holds the run of record's figures (and its results page), and
    whose workspace holds a CPU-only run's, as compare writes them: cpu's figures, each CUDA
    variant's file empty (skipped)."""
    repo = dvc_repo(tmp_path)
    for name in ["reports/metrics", RUN_OF_RECORD.removesuffix(".md")]:
        shutil.copytree(REPO / name, repo / name)
    shutil.copy2(REPO / RUN_OF_RECORD, repo / RUN_OF_RECORD)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "the H200 run"], cwd=repo, check=True)
    cpu = json.loads((REPO / "reports" / "metrics" / "cpu.json").read_text())
    here = {"cpu": {key: 2 * value for key, value in cpu.items()}}
    reason = "needs CUDA but no NVIDIA driver found (NVML could not start): no GPU on this machine"
    skipped = {"status": "skipped", "reason": reason}
    names = [path.stem for path in (repo / "reports" / "metrics").glob("*.json")]
    here |= {name: skipped for name in names if name != "cpu"}
    report.write_variant_metrics(repo / "reports" / report.METRICS_DIR, here)
    return repo


def test_make_metrics_shows_the_variants_trained_here_and_names_the_skipped(tmp_path) -> None:
    """A CPU-only run against the committed H200 run of record: `dvc metrics diff` listed
    about 50 rows, most `-` (issue #40); `make metrics` lists cpu's figures beside HEAD's and
    names the variants skipped here in one line, pointing to HEAD's figures for them."""
    from helpers import load_script

    repo = _cpu_only_workspace(tmp_path)
    for name in ("Makefile", "uv.lock", "tools/metrics_diff.py"):  # `make metrics`, untracked
        (repo / name).parent.mkdir(exist_ok=True)
        shutil.copy2(REPO / name, repo / name)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "COLUMNS": "120", "ACCELBENCH_ENV": sys.prefix}
    make = ["make", "--no-print-directory", "-o", "setup", "metrics"]  # the tests' environment
    shown = subprocess.run(make, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    said, header, *rows, skipped = shown.stdout.splitlines()
    assert said.startswith("The workspace's figures against HEAD's, from ")
    assert said.endswith(" the H200 run:")
    assert header.split() == ["Path", "Metric", "HEAD", "workspace", "Change"]
    assert {row.split()[0] for row in rows} == {"reports/metrics/cpu.json"}
    assert len(rows) == len(json.loads((REPO / "reports" / "metrics" / "cpu.json").read_text()))
    assert skipped == (
        "Skipped here (reports/comparison.md says why): amp, amp_uncompiled, ddp, gpu, "
        f"gpu_dataloader, gpu_uncompiled; HEAD's figures for them: {RUN_OF_RECORD}"
    )
    assert (REPO / RUN_OF_RECORD).is_file()
    raw = subprocess.run(  # DVC's own diff stays as it is
        [DVC, "metrics", "diff"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    ).stdout.splitlines()
    assert sum(line.split()[3:4] == ["-"] for line in raw) > 40

    # no results page holds HEAD's figures (a run committed by a user): DVC's diff has them
    tool_module = load_script(REPO / "tools" / "metrics_diff.py")
    shutil.rmtree(repo / "docs")
    head = tool_module.head_figures(repo)
    assert tool_module.skipped_line(repo, ["gpu"], head).endswith(
        "; HEAD's figures for them: `dvc metrics diff` lists them"
    )
    assert tool_module.skipped_line(repo, ["ddp"], head).endswith(
        "; HEAD has no figures for them either"  # skipped on the H200 too: one GPU
    )
    # a workspace as HEAD has it: no run here since
    subprocess.run(["git", "checkout", "-q", "--", "reports"], cwd=repo, check=True)
    same = subprocess.run(make, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert same.stdout.splitlines()[1] == (
        "the same: no run here since (`make repro` writes this machine's)"
    )


def test_make_exps_lists_the_variants_in_params_order() -> None:
    """As the report's table does (it was alphabetical: amp, cpu, ddp, gpu, ...)."""
    from helpers import load_script

    exp_table = load_script(REPO / "tools" / "exp_table.py")
    variants = {"cpu": {}, "gpu": {}, "amp": {}}
    metrics = {
        f"reports/metrics/{name}.json": {"data": {"steady_epoch_s": seconds}}
        for name, seconds in (("amp", 0.07), ("gpu", 0.13), ("cpu", 12.7), ("extra", 1.0))
    }
    shown = [{"rev": "workspace", "name": None, "data": {
        "params": {"params.yaml": {"data": {"variants": variants}}}, "metrics": metrics}}]  # fmt: skip
    rows = [line.split()[0] for line in exp_table.table(shown).splitlines()[2:]]
    assert rows == ["cpu", "gpu", "amp", "extra"]  # one params no longer names goes last


def test_make_exps_names_a_variant_a_revision_lacks_once() -> None:
    """The baseline of an experiment that added cpu_bf16 read `variants.cpu_bf16.device=None
    variants.cpu_bf16.precision=None ...`: a `None` per key of a variant it never had."""
    from helpers import load_script

    exp_table = load_script(REPO / "tools" / "exp_table.py")

    def revision(name: str, variants: dict, lr: float) -> dict:
        params = {"train": {"lr": lr}, "variants": variants}
        return {"rev": name, "name": name, "data": {
            "params": {"params.yaml": {"data": params}}, "metrics": {}}}  # fmt: skip

    cpu = {"device": "cpu", "precision": "fp32"}
    shown = [
        revision("main", {"cpu": cpu}, 0.001),
        revision("bf16", {"cpu": cpu, "cpu_bf16": {"device": "cpu", "precision": "bf16"}}, 0.002),
    ]
    main, _, _, bf16 = exp_table.table(shown).splitlines()[:4]
    assert main == "main  train.lr=0.001  variants.cpu_bf16=-"
    assert bf16 == (
        "bf16  train.lr=0.002  variants.cpu_bf16.device=cpu  variants.cpu_bf16.precision=bf16"
    )
