"""Every relative link in README.md and docs/ (pages, images, #anchors) resolves: the file
exists, and an anchor names a heading of that page as GitHub spells it."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def prose(text: str) -> str:
    """The page without fenced blocks and code spans: what a renderer reads links from."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, markup and punctuation
    dropped, lowercase, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """Every heading's anchor on ``page`` (a repeated one also as -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: pathlib.Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


def test_the_slugs_follow_githubs_rule() -> None:
    assert slug("5. The events file and the recovery timeline") == "5-the-events-file-and-the-recovery-timeline"
    assert slug("How often to save: `every`") == "how-often-to-save-every"
    assert slug("How does the kernel compare with ISA-L's own code?") == (
        "how-does-the-kernel-compare-with-isa-ls-own-code"
    )
    assert slug("The rendezvous at scale (`scripts/bench_rendezvous.py`)") == (
        "the-rendezvous-at-scale-scriptsbench_rendezvouspy"
    )


def test_the_docs_have_links_to_check() -> None:
    assert (ROOT / "docs" / "index.md") in PAGES
    assert sum(len(links(page)) for page in PAGES) > 100


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: pathlib.Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
