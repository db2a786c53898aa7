"""Pointers into the docs that resolve (issue 21): docs/modelling.md was split into four pages
and docstrings kept pointing at sections that had moved. Every pointer of these forms must
name an existing page and, when it names one, an existing section:

* in the package's source (docstrings, comments, messages), in ``problems/``, in the docs'
  example scripts and in the prose of the pages: ``docs/X.md``, ``docs/X.md#anchor``, ``docs/X.md, "Title"`` (or
  ``'Title'``, ``section "Title"``, ``section N``); a title matches a heading of the page
  that begins with it (case and backticks ignored), ``section N`` a heading numbered ``N.``;
* in README.md and docs/**/*.md: relative Markdown links ``[text](path)``,
  ``[text](path#anchor)`` and ``[text](#anchor)``, the path relative to the page.

Anchors are the ids mkdocs gives the headings: Python-Markdown's ``toc`` extension (as
configured in mkdocs.yml) when ``markdown`` is installed, else the same slug rule here.
``mkdocs build --strict`` checks the Markdown links too, but only where mkdocs is installed;
this test needs nothing beyond the standard library.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS_DIR = ROOT / "docs"
PY_SOURCES = sorted([*(ROOT / "ssca_solver").rglob("*.py"), *(ROOT / "problems").rglob("*.py"),
                     *(DOCS_DIR / "examples").rglob("*.py")])
PAGES = sorted([ROOT / "README.md", *DOCS_DIR.rglob("*.md")])

# docs/X.md, an optional #anchor, and an optional section named after it: , "Title" /
# 'Title' / section "Title" / section N (a message string may escape its quotes: \"Title\")
PY_POINTER = re.compile(
    r"docs/(?P<page>[\w/-]+\.md)(?:#(?P<anchor>[\w-]+))?"
    r"(?:,?\s*(?:section\s+)?(?:\\?(?P<q>[\"'])(?P<title>[^\"'\n]{1,80}?)\\?(?P=q)"
    r"|(?<=section )(?P<number>\d+)\b))?")
MD_LINK = re.compile(r"\[[^\]\n]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _slugify(text: str) -> str:
    """Python-Markdown's toc.slugify (separator "-"), for when markdown is not installed."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _plain(text: str) -> str:
    """A heading's text as rendered: links to their text, no code ticks or emphasis."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[`*]", "", text).strip()


def _headings_without_markdown(text: str) -> list[tuple[str, str]]:
    out, seen, fenced = [], {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = HEADING.match(line)
        if fenced or not m:
            continue
        title = _plain(m.group(2))
        slug = _slugify(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.append((title, slug if n == 0 else f"{slug}_{n}"))
    return out


@lru_cache(maxsize=None)
def headings(page: Path) -> tuple[tuple[str, str], ...]:
    """(title, anchor) of every heading of ``page``, as mkdocs renders them."""
    text = page.read_text()
    try:
        import markdown
    except ImportError:
        return tuple(_headings_without_markdown(text))
    # the extensions mkdocs adds by default (fenced_code: a "# comment" in a code block is
    # no heading) and those of mkdocs.yml
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code", "admonition"])
    md.convert(text)

    def walk(tokens):
        for tok in tokens:
            yield (_plain(tok["name"]), tok["id"])
            yield from walk(tok["children"])

    return tuple(walk(md.toc_tokens))


def _norm(title: str) -> str:
    return re.sub(r"\s+", " ", _plain(title)).strip().lower()


def check_target(page: Path, anchor: str | None = None, title: str | None = None,
                 number: str | None = None) -> str | None:
    """Why the pointer to ``page`` (with an anchor, a section title or number) is broken, or
    None when it resolves."""
    if not page.is_file():
        return f"no file {page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}"
    if page.suffix != ".md" or not (anchor or title or number):
        return None
    hs = headings(page)
    # an anchor is a heading's id or an HTML element's (<a id="..."></a> in the text)
    ids = {a for _, a in hs} | set(re.findall(r'\bid="([^"]+)"', page.read_text()))
    if anchor and anchor not in ids:
        return f"{page.name} has no heading with the anchor #{anchor}"
    if title and not any(_norm(t).startswith(_norm(title)) for t, _ in hs):
        return f"{page.name} has no section {title!r}"
    if number and not any(re.match(rf"{number}\.\s", t) for t, _ in hs):
        return f"{page.name} has no section numbered {number}"
    return None


def python_pointers(path: Path):
    """(line, text, page, anchor, title, number) of the ``docs/X.md`` pointers in a file."""
    text = path.read_text()
    for m in PY_POINTER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield (line, m.group(0), DOCS_DIR / m.group("page"), m.group("anchor"),
               m.group("title"), m.group("number"))


def markdown_links(page: Path):
    """(line, target, file, anchor) of the relative links of a Markdown page, outside code."""
    fenced = False
    for i, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in MD_LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):          # http:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            yield i, target, (page.parent / path).resolve() if path else page, anchor or None


def broken_pointers() -> list[str]:
    out = []
    for src in [*PY_SOURCES, *PAGES]:             # the pages' prose names sections this way too
        for line, text, page, anchor, title, number in python_pointers(src):
            why = check_target(page, anchor, title, number)
            if why:
                out.append(f"{src.relative_to(ROOT)}:{line}: {text!r}: {why}")
    for page in PAGES:
        for line, target, path, anchor in markdown_links(page):
            why = check_target(path, anchor)
            if why:
                out.append(f"{page.relative_to(ROOT)}:{line}: ({target}): {why}")
    return out


def test_every_docs_pointer_resolves():
    broken = broken_pointers()
    assert not broken, "pointers into the docs that do not resolve:\n" + "\n".join(broken)


def test_the_pointers_are_found():
    """The scan sees the pointers it is meant to check (a regex that matched nothing would
    pass the test above vacuously)."""
    found = [p for src in PY_SOURCES for p in python_pointers(src)]
    assert len(found) >= 20
    assert any(title for *_, title, _ in found)
    assert sum(1 for page in PAGES for _ in markdown_links(page)) >= 50


def test_a_broken_pointer_fails(tmp_path):
    page = DOCS_DIR / "engines.md"
    assert check_target(page) is None
    assert check_target(page, title="Threads") is None
    assert check_target(page, title="No such section") is not None
    assert check_target(page, anchor="no-such-anchor") is not None
    assert check_target(DOCS_DIR / "no-such-page.md") is not None
    src = tmp_path / "m.py"
    src.write_text('"""See docs/engines.md, "Threads"; docs/engines.md#nowhere;\n'
                   'docs/walkthrough.md, section 2 and (docs/modelling.md, \\"Gone\\")."""\n')
    got = [(line, title, anchor, number) for line, _, _, anchor, title, number
           in python_pointers(src)]
    assert got == [(1, "Threads", None, None), (1, None, "nowhere", None),
                   (2, None, None, "2"), (2, "Gone", None, None)]
    md = tmp_path / "p.md"
    md.write_text("# A `b` c\n[x](#a-b-c) [y](p.md#nowhere) `[z](gone.md)` [w](https://e.org)\n")
    links = list(markdown_links(md))
    assert [t for _, t, _, _ in links] == ["#a-b-c", "p.md#nowhere"]
    assert check_target(md, "a-b-c") is None and check_target(md, "nowhere") is not None


@pytest.mark.parametrize("title", ["Per-sample functions", "`Threads`: limits", "A, b & c!"])
def test_the_fallback_slugs_are_those_of_markdown(title):
    markdown = pytest.importorskip("markdown")
    md = markdown.Markdown(extensions=["toc"])
    md.convert(f"# {title}\n")
    assert _headings_without_markdown(f"# {title}\n")[0][1] == md.toc_tokens[0]["id"]


def test_the_fallback_finds_the_headings_markdown_finds():
    """Without ``markdown`` the test reads the headings itself: the same anchors, page by
    page (code blocks' ``# comments`` are no headings in either)."""
    pytest.importorskip("markdown")
    for page in PAGES:
        assert ([a for _, a in _headings_without_markdown(page.read_text())]
                == [a for _, a in headings(page)]), page.name


def test_the_benchmarks_page_is_written_from_the_results():
    """docs/benchmarks.md is what ``python benchmarks/make_page.py`` writes from
    benchmarks/results/*.json: a result published without regenerating the page, or a page
    edited by hand, fails here. The table of commits and dates at the top is left out of the
    comparison (it reads git, which a source tree without its history lacks)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_page", ROOT / "benchmarks" /
                                                  "make_page.py")
    make_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_page)

    def body(text: str) -> str:
        head, _, rest = text.partition("## Where and when")
        return head + rest.partition("\n## ")[2]

    assert body((DOCS_DIR / "benchmarks.md").read_text()) == body(make_page.page()), (
        "docs/benchmarks.md is out of date: run python benchmarks/make_page.py")
