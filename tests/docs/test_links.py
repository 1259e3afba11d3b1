"""The documents (README.md, docs/**/*.md): every relative link resolves, to a file and, where it
names one, to a heading or an explicit anchor; no document speaks of how parbench was developed
(rounds, stops, tracker items, helpers, sessions)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.M)
EXPLICIT_ANCHOR = re.compile(r"<a\s[^>]*?(?:id|name)=\"([^\"]+)\"", re.I)

#: Words that tell the history of the work instead of describing the product.
HISTORY = [
    r"\bissues?\s+#?\d+",
    r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\d+(?:st|nd|rd|th)"
    r"|next|this|last|previous|earlier|later)\s+(?:GPU\s+)?stops?\b",
    r"\bstops?\s+\d+\b",
    r"\b(?:this|next|last|previous|earlier|development|dev|review|work)\s+rounds?\b",
    r"\b(?:in|since|until|before|after|from|during)\s+round\s+\d+\b",
    r"\bhelpers?\b",
    r"\bthis session\b",
    r"\btracker\b",
    r"(?<![\w&/#(\[])#\d+\b",
]


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else p.name


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans, line count kept."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    out = set(EXPLICIT_ANCHOR.findall(text))
    for line in prose(text.replace("`", "")).splitlines():
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


def links(path: Path) -> list[tuple[int, str]]:
    text = prose(path.read_text(encoding="utf-8"))
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for rx in (LINK, HTML_LINK):
            out += [(lineno, m.group(1)) for m in rx.finditer(line)]
    out += [(text[: m.start()].count("\n") + 1, m.group(1)) for m in REF_LINK.finditer(text)]
    return out


def broken(path: Path) -> list[str]:
    bad = []
    for lineno, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{rel(path)}:{lineno}: {target}"
        if not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading or anchor #{anchor} in {rel(dest)}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_relative_link_resolves(doc):
    bad = broken(doc)
    assert not bad, "broken links:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_no_document_tells_the_history_of_its_development(doc):
    text = prose(doc.read_text(encoding="utf-8"))
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for rx in HISTORY:
            hits += [f"{rel(doc)}:{lineno}: {m.group(0)!r} in: {line.strip()[:120]}"
                     for m in re.finditer(rx, line, re.I)]
    assert not hits, "documents speak to users about the product, not about how it was built:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_are_for(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## Part two\n\n## Part two\n")
    a = tmp_path / "a.md"
    a.write_text("[ok](b.md#part-two) [dup](b.md#part-two-1) [bad](b.md#nope) [gone](c.md)\n"
                 "`[in code](nowhere.md)` [web](https://example.com) [here](#missing)\n")
    assert broken(a) == ["a.md:1: b.md#nope: no heading or anchor #nope in b.md", "a.md:1: c.md: no such file",
                         "a.md:2: #missing: no heading or anchor #missing in a.md"]
    line = "Since the eighth stop (issue 12, #31), the helper reran it in this session."
    assert sum(bool(re.search(rx, line, re.I)) for rx in HISTORY) >= 5
    fine = "Rounds over all cells; round-robin; the second round of a repeat; tests.regress_helpers:X; (#anchor)"
    assert not [rx for rx in HISTORY if re.search(rx, fine, re.I)]
