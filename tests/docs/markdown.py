"""Reading the docs' Markdown: fenced code blocks with their run markers, links, and heading anchors.

The convention (documented in docs/index.md): a fenced block runs in CI when the line right before its opening
fence is a marker comment:

    <!-- run -->            the block runs (python or bash), in page order, in one namespace per page
    <!-- run: ray -->       the same, and the page needs Ray (its test carries the `ray` marker)
    <!-- file: NAME -->     the block's text is written to NAME (relative to the page's working folder) first

All blocks of one page share a fresh temporary working folder; python blocks share one namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*(?:(?P<run>run)(?::\s*(?P<options>[\w, -]+?))?|file:\s*(?P<file>\S+))\s*-->\s*$")
RUNNABLE_LANGS = ("python", "bash")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^()\s]+(?:\([^()\s]*\)[^()\s]*)*)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^()\s]+)")
INLINE_CODE = re.compile(r"(`+).*?\1")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.+?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"(?P<id>[^\"]+)\"")


@dataclass
class Block:
    """One fenced code block: where it is, its language, text, and what its marker asks for."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    run: bool = False
    options: set[str] = field(default_factory=set)
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page under docs/, sorted."""
    return sorted(DOCS.rglob("*.md"))


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of `page`, with their markers."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence = match["fence"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        block = Block(page, start + 1, match["lang"], "\n".join(body) + "\n")
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        if marker and marker["run"]:
            block.run = True
            block.options = {o.strip() for o in (marker["options"] or "").split(",") if o.strip()}
        elif marker and marker["file"]:
            block.file = marker["file"]
        found.append(block)
        i += 1
    return found


def runnable_blocks(page: Path) -> list[Block]:
    """The blocks of `page` that CI runs or writes, in page order."""
    return [b for b in blocks(page) if b.run or b.file]


def _prose_lines(text: str, keep_inline_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; inline code is removed unless asked to keep it."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match["fence"]
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        out.append((number, line if keep_inline_code else INLINE_CODE.sub("", line)))
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code."""
    found = []
    for number, line in _prose_lines(page.read_text()):
        for pattern in (LINK, IMAGE):
            for match in pattern.finditer(line):
                found.append((number, match["target"].strip("<>")))
    return found


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (except - and _), spaces to -."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text)
    return "".join(ch for ch in text.strip().lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may point to in `page`: heading slugs (with GitHub's -1, -2 for repeats) and <a id>."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(page.read_text(), keep_inline_code=True):
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading["text"])
            count = seen.get(slug, 0)
            found.add(slug if count == 0 else f"{slug}-{count}")
            seen[slug] = count + 1
        found.update(m["id"] for m in HTML_ANCHOR.finditer(line))
    return found
