"""Code in the docs that runs (issue 21): every ```python block of README.md and docs/*.md
marked by an HTML comment on the line before it,

    <!-- test: NAME -->          (or <!-- test: NAME slow --> for a long one: pytest -m slow)

is executed by this test; blocks of the same NAME in one file form one example, run in
order in one namespace (a later block continues an earlier one). When the block is followed
by an output block (```text, or a bare ```), what the code prints must equal it, line for
line (trailing spaces ignored): print rounded or qualitative results, never timings, so the
page does not go stale. The blocks run from the repository root (``problems`` importable),
with matplotlib's Agg backend.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.exists()]
MARK = re.compile(r"^<!--\s*test:\s*([A-Za-z0-9_.-]+)((?:\s+[a-z]+)*)\s*-->\s*$")
FLAGS = {"slow"}


class Block:
    def __init__(self, doc: Path, line: int, code: str, expected):
        self.doc, self.line, self.code, self.expected = doc, line, code, expected


def _fence(lines, i):
    """(the block's text, the index after its closing fence) for the fence opening at i."""
    body = []
    j = i + 1
    while j < len(lines) and lines[j].strip() != "```":
        body.append(lines[j])
        j += 1
    if j == len(lines):
        raise ValueError(f"line {i + 1}: the block is not closed")
    return "\n".join(body) + "\n", j + 1


def parse(doc: Path) -> dict:
    """{name: (flags, [Block, ...])} of the marked blocks of ``doc``."""
    lines = doc.read_text().splitlines()
    out: dict = {}
    for i, line in enumerate(lines):
        m = MARK.match(line.strip())
        if not m:
            continue
        name, flags = m.group(1), set(m.group(2).split())
        if flags - FLAGS:
            raise ValueError(f"{doc.name}:{i + 1}: unknown flag(s) {sorted(flags - FLAGS)}")
        j = i + 1
        if j >= len(lines) or lines[j].strip() != "```python":
            raise ValueError(f"{doc.name}:{i + 1}: the marker must be followed by a ```python "
                             "block on the next line")
        code, k = _fence(lines, j)
        while k < len(lines) and not lines[k].strip():
            k += 1
        expected = None
        if k < len(lines) and lines[k].strip() in ("```", "```text"):
            expected, _ = _fence(lines, k)
        old_flags, blocks = out.get(name, (set(), []))
        blocks.append(Block(doc, j + 2, code, expected))
        out[name] = (old_flags | flags, blocks)
    return out


def _examples():
    params = []
    for doc in DOCS:
        for name, (flags, blocks) in parse(doc).items():
            marks = [pytest.mark.slow] if "slow" in flags else []
            params.append(pytest.param(blocks, id=f"{doc.name}::{name}", marks=marks))
    return params


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.rstrip("\n").splitlines()]


@pytest.mark.parametrize("blocks", _examples())
def test_marked_docs_example_runs_and_prints_what_the_page_shows(blocks, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.syspath_prepend(str(ROOT))
    namespace = {"__name__": "__docs_example__"}
    for b in blocks:
        out = io.StringIO()
        where = f"{b.doc.relative_to(ROOT)}:{b.line}"
        with contextlib.redirect_stdout(out):
            exec(compile(b.code, where, "exec"), namespace)      # noqa: S102
        if b.expected is not None:
            assert _lines(out.getvalue()) == _lines(b.expected), (
                f"{where}: the block printed\n{out.getvalue()}\nbut the page shows\n"
                f"{b.expected}")


def test_the_marked_examples_are_found():
    """The markers parse (a malformed one fails here, naming its line), and the examples of
    issue 21 are marked: two worked examples with their modelling inline."""
    names = {f"{doc.name}::{name}" for doc in DOCS for name in parse(doc)}
    for wanted in ("worked-examples.md::group-fairness", "worked-examples.md::neyman-pearson",
                   "engines.md::threads-inprocess"):
        assert wanted in names, sorted(names)


def test_parse_reads_markers_flags_and_outputs(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("text\n<!-- test: a -->\n```python\nx = 1\nprint(x)\n```\n```text\n1\n```\n"
                   "<!-- test: a slow -->\n```python\nprint(x + 1)\n```\n\n"
                   "<!-- test: b -->\n```python\npass\n```\nmore text\n")
    got = parse(doc)
    assert set(got) == {"a", "b"} and got["a"][0] == {"slow"} and got["b"][0] == set()
    a1, a2 = got["a"][1]
    assert a1.code == "x = 1\nprint(x)\n" and a1.expected == "1\n" and a1.line == 4
    assert a2.expected is None and got["b"][1][0].expected is None
    doc.write_text("<!-- test: c -->\n\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="page.md:1: the marker must be followed"):
        parse(doc)
    doc.write_text("<!-- test: c fast -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown flag"):
        parse(doc)
