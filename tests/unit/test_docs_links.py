"""Every relative Markdown link in README.md and docs/*.md points at a file that exists,
and every ``#anchor`` at a heading of its page (GitHub's anchors); the README links every
docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text lower-cased, punctuation dropped
    (letters, digits, ``_``, ``-`` and spaces kept), spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page: one per heading (repeats get -1, -2, …), and
    explicit ``<a name=…>``/``<a id=…>``."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(page.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the page's prose, code spans left out."""
    out = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        prose = _CODE_SPAN.sub("", line)
        out += [(number, t) for t in _LINK.findall(prose)]
        m = _REF_DEF.match(prose)
        if m:
            out.append((number, m.group(1)))
    return out


def dead_links(page: Path) -> list[str]:
    """What is wrong with each relative link of ``page``, one line each."""
    problems = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, …
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {dest.name} has no heading with anchor #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    assert dead_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(ROOT / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_the_check_finds_a_dead_file_a_dead_anchor_and_ignores_code(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## `loss_spike` — `rules/x.py`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title: the *first* one\n\n## Title: the first one\n\n"
        "[ok](other.md) [ok](other.md#loss_spike--rulesxpy) [ok](#title-the-first-one-1)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad here](#nowhere)\n"
        "`[in code](missing-too.md)` [web](https://example.com/x.md)\n"
        "```\n[in a block](missing-three.md)\n```\n")
    problems = dead_links(page)
    assert len(problems) == 3, problems
    assert "missing.md" in problems[0] and "#nope" in problems[1] and "#nowhere" in problems[2]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Selection: racing on fresh seeds inside the search",
     "selection-racing-on-fresh-seeds-inside-the-search"),
    ("5. Compile: cold vs warm trials (`bench/compile.py`)",
     "5-compile-cold-vs-warm-trials-benchcompilepy"),
    ("`loss_spike` — `sweeps/rules/loss_spike.py`", "loss_spike--sweepsrulesloss_spikepy"),
    ("Hugging Face `transformers.Trainer`", "hugging-face-transformerstrainer"),
])
def test_anchors_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
