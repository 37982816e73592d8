"""An edit re-runs the stages that run the edited code, and no other: asked of DVC itself.

A copy of the workspace gets placeholder outputs for every stage and `dvc commit`s them, so
`dvc.lock` records today's code; then one file is edited and `dvc status` says which stages
are out of date. (tests/test_dvc_yaml.py checks that each stage's deps are its import
closure; this checks what that buys: training does not re-run for an edit elsewhere.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import DVC, REPO

# each case runs `dvc status` in a fresh repository; one worker: its module fixture runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dvc_edits")]

TRAINING = {
    f"train@{name}" for name in yaml.safe_load((REPO / "params.yaml").read_text())["variants"]
}


def _committed_workspace(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy2(REPO / name, repo / name)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([DVC, "init", "-q"], cwd=repo, check=True)
    outs = yaml.safe_load(
        subprocess.run(
            [sys.executable, "-c", _OUTS_SCRIPT],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    for path in outs:  # a folder output (no suffix) holds one file; a file output is a file
        target = repo / path
        if target.suffix:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("{}\n")
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / "placeholder").write_text("x\n")
    subprocess.run([DVC, "commit", "-f", "-q"], cwd=repo, check=True, capture_output=True)
    return repo


# Every stage's outputs as DVC resolves them (foreach expanded, ${vars} filled in).
_OUTS_SCRIPT = """
import yaml
from dvc.repo import Repo
with Repo(".") as repo:
    outs = sorted({str(o.def_path) for s in repo.index.stages for o in s.outs})
print(yaml.safe_dump(outs))
"""


def _out_of_date(repo) -> set[str]:
    status = subprocess.run(
        [DVC, "status", "--json"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(status))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    repo = _committed_workspace(tmp_path_factory.mktemp("edits"))
    assert _out_of_date(repo) <= {"env"}, "a fresh commit leaves only the always-run env stage"
    return repo


EDITS = [
    # (file edited, stages that must re-run, stages that must not)
    ("src/accelbench/data/download.py", {"download"}, TRAINING),
    ("src/accelbench/data/mnist.py", {"download", "prepare"}, TRAINING),
    ("src/accelbench/stages/evaluate.py", {"evaluate@cpu"}, TRAINING),
    ("src/accelbench/stages/compare.py", {"compare"}, TRAINING),
    ("src/accelbench/report/pipeline_time.py", {"compare"}, TRAINING),
    ("src/accelbench/report/markdown.py", {"compare"}, TRAINING),
    # not vacuous: an edit to the training step re-runs every training stage
    ("src/accelbench/training/engine.py", TRAINING, {"download", "prepare"}),
]


@pytest.mark.parametrize(("path", "reruns", "stays"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edit_reruns_only_the_stages_that_run_it(workspace, path, reruns, stays) -> None:
    repo = workspace
    edited = repo / path
    original = edited.read_text()
    try:
        edited.write_text(original + "\n# an edit\n")
        changed = _out_of_date(repo) - {"env"}
    finally:
        edited.write_text(original)
    assert reruns <= changed, f"{path}: {sorted(reruns - changed)} should re-run"
    assert not stays & changed, f"{path}: {sorted(stays & changed)} re-run for nothing"
