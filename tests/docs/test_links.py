"""Every relative link in docs/ and README.md points to a file that exists, and every #anchor to a heading in it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from .markdown import REPO, anchors, links, pages

MARKDOWN_FILES = [*pages(), REPO / "README.md"]
EXTERNAL = ("http://", "https://", "mailto:")


def broken_links(page: Path) -> list[str]:
    """'file:line: target (why)' for each link of `page` that does not resolve."""
    problems = []
    for line, target in links(page):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / unquote(path_part)).resolve() if path_part else page
        where = f"{page.relative_to(REPO)}:{line}: {target}"
        if not destination.exists():
            problems.append(f"{where} (no such file: {destination})")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where} (no heading with anchor #{anchor} in {destination.name})")
    return problems


@pytest.mark.parametrize("page", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path, monkeypatch):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading\n")
    page.write_text(
        "See [ok](other.md#a-code-heading), [gone](missing.md), [bad anchor](other.md#nope), "
        "[self](#title) and `[not a link](nowhere.md)`.\n\n# Title\n\n```\n[in code](nowhere.md)\n```\n"
    )
    monkeypatch.setattr("tests.docs.test_links.REPO", tmp_path)
    problems = broken_links(page)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == ["missing.md", "other.md#nope"]


def test_every_docs_page_is_linked_from_the_index():
    index = REPO / "docs" / "index.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for _, target in links(index)}
    orphans = [str(page.relative_to(REPO)) for page in pages() if page != index and page.resolve() not in linked]
    assert not orphans, f"pages not linked from docs/index.md: {orphans}; add them to its learning order."
