"""Check a commit message against the project's habit: a subject of at most 72 characters in
the imperative, a blank line, then a body that says why.

    python tools/commit_msg.py .git/COMMIT_EDITMSG     # what the commit-msg hook runs
    python tools/commit_msg.py --range origin/main..   # every commit in a range

Exit 0 when every message passes, 1 with one line per problem otherwise. Merge commits,
`fixup!`/`squash!` commits and Git's own reverts are left alone.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72
# Subjects start with a verb in the imperative ("Add", "Fix"), not a past tense, a gerund or
# a third person ("Fixed", "Fixing", "Fixes"); the sets hold imperatives that end alike.
_NOT_IMPERATIVE = re.compile(r"^\S*(ed|ing|[^su]s)$", re.IGNORECASE)
_LEFT_ALONE = re.compile(r"^(Merge |fixup! |squash! |Revert \")")
_IMPERATIVE_ED_ING = {
    "bed", "bleed", "breed", "embed", "exceed", "feed", "heed", "need", "proceed", "seed",
    "shed", "shred", "speed", "succeed", "bring", "cling", "fling", "ping", "ring", "sing",
    "spring", "sting", "string", "swing", "wing", "wring", "alias", "bias", "canvas",
}  # fmt: skip


def problems(message: str) -> list[str]:
    """What is wrong with `message` (comment lines, as Git strips them, ignored)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["the subject (first line) is empty"]
    subject = lines[0]
    if _LEFT_ALONE.match(subject):
        return []
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject is {len(subject)} characters; at most {MAX_SUBJECT}")
    words = subject.lower().split()
    if len(words) > 1 and words[0].endswith(":"):  # a scope ("docs/pipeline.md: fix ...")
        words = words[1:]
    first = words[0].strip(":")
    # Suffixes, so that "reseed" and "re-embed" pass as "seed" and "embed" do.
    if _NOT_IMPERATIVE.match(first) and not first.endswith(tuple(_IMPERATIVE_ED_ING)):
        found.append(
            f"the subject starts with {first!r}: use the imperative (Fix, not Fixed, Fixing "
            "or Fixes)"
        )
    if subject.rstrip().endswith("."):
        found.append("the subject ends with a full stop")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line after the subject")
    if not any(line.strip() for line in lines[2:]):
        found.append("no body: say why the change is made")
    return found


def _range_messages(spec: str) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["git", "log", "--format=%h%x00%B%x01", spec], capture_output=True, text=True, check=True
    ).stdout
    entries = [e.strip("\n") for e in out.split("\x01") if e.strip()]
    return [tuple(e.split("\x00", 1)) for e in entries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", type=Path, help="a commit message file")
    parser.add_argument("--range", help="check every commit in this git revision range")
    args = parser.parse_args(argv)
    if (args.file is None) == (args.range is None):
        parser.error("give one of a message file and --range")
    if args.file is not None:
        messages = [("message", args.file.read_text())]
    else:
        messages = _range_messages(args.range)
    failed = False
    for name, message in messages:
        for problem in problems(message):
            print(f"{name}: {problem}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
