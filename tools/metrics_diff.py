"""`make metrics`: the figures of the variants trained here beside HEAD's, then one line naming
the variants skipped here.

    python tools/metrics_diff.py RUN    (what `make metrics` runs; RUN: the Makefile's HEAD_RUN)

`dvc metrics diff` lists every figure that differs between HEAD and the workspace. On a
machine without a GPU the CUDA variants are skipped and their files are empty, so against the
committed H200 run of record it listed about 50 rows, most of them `-`. This runs DVC's diff
on the files of the variants trained here (`--targets`) and names the skipped ones (an empty
file) in one line, with where HEAD's figures for them are: the run of record's page when HEAD's
figures are that run's (its comparison.json holds the same figures), else `dvc metrics diff`.
Plain `dvc metrics diff` stays DVC's own.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelbench.report.prose import RUN_OF_RECORD

METRICS_DIR = "reports/metrics"  # dvc.yaml's compare metrics: one file per variant
COMPARISON_MD = "reports/comparison.md"  # compare's report: why each variant was skipped
MATCHED = "steady_epoch_s"  # the figure that identifies the run of record


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def _figures(text: str | None) -> dict[str, Any] | None:
    try:
        payload = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def workspace_figures(root: Path) -> dict[str, dict[str, Any]]:
    """Each variant's figures in the workspace's metrics files (a skipped variant's: none)."""
    found = {}
    for path in sorted((root / METRICS_DIR).glob("*.json")):
        figures = _figures(path.read_text()) if path.is_file() else None
        if figures is not None:
            found[path.stem] = figures
    return found


def head_figures(root: Path) -> dict[str, dict[str, Any]]:
    """Each variant's figures as HEAD has them (none committed: empty)."""
    listed = _git(root, "ls-tree", "--name-only", "HEAD", f"{METRICS_DIR}/") or ""
    found = {}
    for name in listed.split():
        path = Path(name)
        if path.suffix == ".json":
            figures = _figures(_git(root, "show", f"HEAD:{name}"))
            if figures is not None:
                found[path.stem] = figures
    return found


def results_page(root: Path, head: Mapping[str, Mapping[str, Any]]) -> Path | None:
    """The run of record's page if HEAD's figures are that run's: its comparison.json (in the
    folder of the page's name) has every steady epoch that HEAD's files have (None: not so)."""
    wanted = {name: f[MATCHED] for name, f in head.items() if isinstance(f.get(MATCHED), float)}
    comparison = root / RUN_OF_RECORD.removesuffix(".md") / "comparison.json"
    recorded = _figures(comparison.read_text()) if comparison.is_file() else None
    same = bool(wanted) and all(
        isinstance(entry := (recorded or {}).get(name), dict)
        and isinstance(entry.get(MATCHED), float)
        and math.isclose(entry[MATCHED], steady, rel_tol=1e-9)
        for name, steady in wanted.items()
    )
    return Path(RUN_OF_RECORD) if same and (root / RUN_OF_RECORD).is_file() else None


def skipped_line(root: Path, skipped: list[str], head: Mapping[str, Mapping[str, Any]]) -> str:
    """One line naming the variants this run has no figures for, and where HEAD's are."""
    line = f"Skipped here ({COMPARISON_MD} says why): {', '.join(skipped)}"
    if not any(head.get(name) for name in skipped):
        return f"{line}; HEAD has no figures for them either"
    page = results_page(root, head)
    return f"{line}; HEAD's figures for them: {page or '`dvc metrics diff` lists them'}"


def main(root: Path, head_run: str) -> int:
    head = head_figures(root)
    if not head:
        print(
            "No figures committed yet to diff against: commit them after a run "
            "(docs/comparing-with-dvc.md)."
        )
        return 0
    print(f"The workspace's figures against HEAD's, from {head_run}:")
    workspace = workspace_figures(root)
    if workspace == head:
        print("the same: no run here since (`make repro` writes this machine's)")
        return 0
    trained = [name for name, figures in workspace.items() if figures]
    skipped = [name for name in workspace if name not in trained]
    sys.stdout.flush()  # before DVC's table
    if trained:
        command = ["dvc", "metrics", "diff"]
        if skipped:  # else DVC's diff as it is: a variant since removed from params.yaml too
            command += ["--targets", *(f"{METRICS_DIR}/{name}.json" for name in trained)]
        done = subprocess.run(command, cwd=root)
        if done.returncode != 0:
            return done.returncode
    if skipped:
        print(skipped_line(root, skipped, head))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} RUN (`make metrics` runs it, RUN naming HEAD's run)")
    sys.exit(main(Path.cwd(), sys.argv[1]))
