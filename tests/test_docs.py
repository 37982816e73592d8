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


def test_the_layout_names_every_module() -> None:
    """docs/development.md's Layout left out system/slots.py and training/compile_cache.py."""
    text = (REPO / "docs" / "development.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    package = REPO / "src" / "accelbench"
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py"]
    named = {p: f"`{p.stem if p.parent.name == 'stages' else p.name}`" for p in modules}
    missing = [str(p.relative_to(package)) for p, name in named.items() if name not in layout]
    assert missing == [], f"docs/development.md's Layout does not name {missing}"
