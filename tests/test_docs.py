"""The README and docs/: every relative link leads to a file or folder of the repository.
(The run folders under docs/results/ keep reports as the runs wrote them, without their
figures: they are records, not pages.)"""

from __future__ import annotations

import re

from helpers import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_relative_links_find_their_targets() -> None:
    docs = REPO / "docs"
    pages = [REPO / "README.md", *sorted(docs.glob("*.md")), *sorted(docs.glob("results/*.md"))]
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in pages
        for target in _relative_links(page.read_text())
        if not (page.parent / target).exists()
    ]
    assert len(pages) > 10
    assert not broken, broken


def test_a_link_is_read_with_its_anchor_and_urls_left_out() -> None:
    text = "[a](docs/x.md#part) [b](https://example.org/y) [c](../z/) [d](mailto:me@x)"
    assert _relative_links(text) == ["docs/x.md", "../z/"]
