"""The commit-message habit (CONTRIBUTING.md) as the hook that `make hooks` installs checks it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO

CHECK = [sys.executable, str(REPO / "tools" / "commit_msg.py")]
GOOD = "Move the flat package into role folders\n\nThe layers were invisible.\n"


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("x" * 73 + "\n\nwhy\n", "73 characters; at most 72"),
        ("Moved the files\n\nwhy\n", "use the imperative"),
        ("Adding a test\n\nwhy\n", "use the imperative"),
        ("Fixes the DDP hang\n\nwhy\n", "use the imperative"),  # CONTRIBUTING.md's own example
        ("tests: moved the helper\n\nwhy\n", "use the imperative"),  # the word after a scope
        ("Fix the hang.\n\nwhy\n", "full stop"),
        ("Fix the hang\nwhy\n", "no blank line"),
        ("Fix the hang\n", "no body"),
        ("Fix the hang\n\n# only a comment\n", "no body"),
    ],
)
def test_a_message_off_the_habit_is_refused_by_the_hook(tmp_path, message, problem) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f").write_text("x")
    env_git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True)
    hooks = ["-c", f"core.hooksPath={REPO / '.githooks'}"]
    done = subprocess.run(
        [*env_git, *hooks, "commit", "-q", "-F", "-"],
        cwd=tmp_path,
        input=message,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and problem in done.stderr, done.stderr
    assert "git commit --no-verify" in done.stderr  # the way past it, named where it stops


def test_users_setup_leaves_their_commit_messages_alone() -> None:
    """`make repro` (setup) once installed the hook, and the README's own `git commit -m
    baseline` was refused; only `make hooks`, the contributors' step, installs it."""
    environ = {"PATH": os.environ["PATH"], "ACCELBENCH_ENV": sys.prefix}
    plans = {
        goal: subprocess.run(
            ["make", "-n", goal], cwd=REPO, env=environ, capture_output=True, text=True, check=True
        ).stdout
        for goal in ("setup", "repro", "test", "hooks")
    }
    assert all("hooksPath" not in plans[goal] for goal in ("setup", "repro", "test")), plans
    assert "git config core.hooksPath .githooks" in plans["hooks"]


def test_an_empty_message_is_refused() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from commit_msg import problems

    assert problems("# only Git's comments\n") == ["the subject (first line) is empty"]


def test_a_message_on_the_habit_commits(tmp_path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True)
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
         f"core.hooksPath={REPO / '.githooks'}", "commit", "-q", "-F", "-"],
        cwd=tmp_path, input=GOOD, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "subject",
    [
        "Embed the fonts", "Speed up the step", "Merge branch 'x'", "Ping the server on start",
        "Proceed on a missing GPU", "Process the queue", "Focus the report", "Pass the seed",
        "Use the lock", "Reseed the RNG per rank", "Re-embed the fonts",
        "docs/pipeline.md: fix the example", "Windows: fix paths",
    ],
)  # fmt: skip
def test_imperatives_that_look_past_and_merges_pass(tmp_path, subject) -> None:
    message = tmp_path / "msg"
    message.write_text(f"{subject}\n\nwhy\n")
    assert subprocess.run([*CHECK, str(message)]).returncode == 0


def test_a_range_names_the_commit_at_fault(tmp_path) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    for i, message in enumerate((GOOD, "Fixed it\n\nwhy\n")):
        (tmp_path / "f").write_text(str(i))
        subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], cwd=tmp_path, check=True)
    done = subprocess.run(
        [*CHECK, "--range", "HEAD~1..HEAD"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1 and "use the imperative" in done.stderr
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    assert done.stderr.startswith(head)


def test_make_hooks_says_what_it_did(tmp_path) -> None:
    """`make hooks` was silent, and did nothing where core.hooksPath was set already."""
    import shutil

    for name in ("Makefile", "uv.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull}

    def hooks() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "--no-print-directory", "hooks"],
            cwd=tmp_path, env=env, capture_output=True, text=True,
        )  # fmt: skip

    assert "commit messages are checked now" in hooks().stdout
    assert "commit messages are checked already" in hooks().stdout
    subprocess.run(["git", "config", "core.hooksPath", "/elsewhere"], cwd=tmp_path, check=True)
    refused = hooks()
    assert refused.returncode != 0
    assert "core.hooksPath is /elsewhere already, left as it is" in refused.stderr
