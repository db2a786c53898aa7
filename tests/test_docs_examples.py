"""Code in the docs that runs (issue 21): every ```python block of README.md and of the
Markdown pages under docs/ carries an HTML comment on the line before it, and a block
without one fails ``test_every_python_block_is_marked``. The markers:

    <!-- test: NAME -->              run by this test
    <!-- test: NAME slow -->         run only under ``pytest -m slow`` (a long example)
    <!-- test: NAME needs:flwr -->   run when the module (an optional extra) imports, or
                                     the data set is installed (needs:fashion-mnist), else
                                     skipped; one of NEEDS
    <!-- test: skip REASON -->       never run: REASON must begin with one of SKIP_REASONS,
                                     the short list of things a test machine cannot have

Blocks of the same NAME in one file form one example, run in order in one namespace (a
later block continues an earlier one): a fragment gets its setup from an earlier block of
its name. When a block is followed by an output block (```text, or a bare ```), or an output
block further down is marked ``<!-- output -->`` (after a sentence such as "It prints:"),
what the code prints must match it, line for line (trailing spaces ignored); as in doctest's
ELLIPSIS, ``...`` in the output block matches any text (times, and figures that depend on
the path the solver took, such as round counts). Print rounded or qualitative results, so
the page does not go stale. The blocks run in a temporary directory (files they write go
there) with the repository root importable (``problems``), with matplotlib's Agg backend.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if p.exists()]
MARK = re.compile(r"^<!--\s*test:\s*([A-Za-z0-9_.-]+)((?:\s+[a-z_:-]+)*)\s*-->$")
SKIP = re.compile(r"^<!--\s*test:\s*skip\s+(.*?)\s*-->$")
OUTPUT = re.compile(r"^<!--\s*output\s*-->$")
FENCE = re.compile(r"^```\s*([A-Za-z0-9_+-]*)")
FLAGS = {"slow"}
# what a block may need and a machine may lack: the modules of optional extras (CI installs
# them) and the Fashion-MNIST files of the Debian package; without it the block is skipped
NEEDS = {"flwr", "jax", "matplotlib", "torch", "fashion-mnist", "dp_accounting"}
# what a test machine cannot be expected to have: a data set that is not shipped, machines
# of a real deployment, a framework the library does not depend on
SKIP_REASONS = ("needs Fashion-MNIST", "needs MNIST", "needs a Flower deployment",
                "needs torch")


class Block:
    def __init__(self, doc: Path, line: int, code: str, expected):
        self.doc, self.line, self.code, self.expected = doc, line, code, expected


def _is_python(line: str) -> bool:
    m = FENCE.match(line.strip())
    return bool(m) and m.group(1).lower() in ("python", "py", "python3", "pycon")


def _fence(lines, i):
    """(the block's text, dedented, the index after its closing fence) for the fence opening
    at i (an indented fence, in a list item, is dedented by its own indent)."""
    body = []
    j = i + 1
    while j < len(lines) and lines[j].strip() != "```":
        body.append(lines[j])
        j += 1
    if j == len(lines):
        raise ValueError(f"line {i + 1}: the block is not closed")
    return textwrap.dedent("\n".join(body) + "\n"), j + 1


def _marked_lines(lines) -> set:
    """Indices of the python fences that a marker (test or skip) precedes."""
    return {i + 1 for i, line in enumerate(lines)
            if (MARK.match(line.strip()) or SKIP.match(line.strip()))
            and i + 1 < len(lines) and _is_python(lines[i + 1])}


def unmarked(doc: Path) -> list[int]:
    """1-based line numbers of the python blocks of ``doc`` that no marker precedes."""
    lines = doc.read_text().splitlines()
    marked = _marked_lines(lines)
    return [i + 1 for i, line in enumerate(lines) if _is_python(line) and i not in marked]


def skipped(doc: Path) -> list[tuple[int, str]]:
    """(line, reason) of the blocks of ``doc`` marked ``<!-- test: skip REASON -->``."""
    lines = doc.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = SKIP.match(line.strip())
        if m:
            if i + 1 >= len(lines) or not _is_python(lines[i + 1]):
                raise ValueError(f"{doc.name}:{i + 1}: the marker must be followed by a "
                                 "```python block on the next line")
            out.append((i + 1, m.group(1)))
    return out


def parse(doc: Path) -> dict:
    """{name: (flags, [Block, ...])} of the blocks of ``doc`` marked to run."""
    lines = doc.read_text().splitlines()
    out: dict = {}
    last = None
    for i, line in enumerate(lines):
        if OUTPUT.match(line.strip()):
            if i + 1 >= len(lines) or lines[i + 1].strip() not in ("```", "```text"):
                raise ValueError(f"{doc.name}:{i + 1}: <!-- output --> must be followed by a "
                                 "```text block on the next line")
            if last is None or last.expected is not None:
                raise ValueError(f"{doc.name}:{i + 1}: <!-- output --> has no run block "
                                 "without an output before it")
            last.expected, _ = _fence(lines, i + 1)
            continue
        m = MARK.match(line.strip())
        if not m or SKIP.match(line.strip()):
            continue
        name, flags = m.group(1), set(m.group(2).split())
        if name == "skip":
            raise ValueError(f"{doc.name}:{i + 1}: a skip marker needs a reason")
        bad = {f for f in flags if f not in FLAGS and not
               (f.startswith("needs:") and f[len("needs:"):] in NEEDS)}
        if bad:
            raise ValueError(f"{doc.name}:{i + 1}: unknown flag(s) {sorted(bad)}; flags are "
                             f"{sorted(FLAGS)} and needs:MODULE for MODULE in {sorted(NEEDS)}")
        j = i + 1
        if j >= len(lines) or not _is_python(lines[j]):
            raise ValueError(f"{doc.name}:{i + 1}: the marker must be followed by a ```python "
                             "block on the next line")
        code, k = _fence(lines, j)
        while k < len(lines) and not lines[k].strip():
            k += 1
        expected = None
        if k < len(lines) and lines[k].strip() in ("```", "```text"):
            expected, _ = _fence(lines, k)
        old_flags, blocks = out.get(name, (set(), []))
        last = Block(doc, j + 2, code, expected)
        blocks.append(last)
        out[name] = (old_flags | flags, blocks)
    return out


def matches(got: str, expected: str) -> bool:
    """Whether printed text ``got`` matches the page's output block ``expected``: line for
    line, trailing spaces ignored, ``...`` standing for any text (newlines included)."""
    got = "\n".join(_lines(got))
    parts = "\n".join(_lines(expected)).split("...")
    pattern = ".*?".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, got, flags=re.DOTALL) is not None


def _examples():
    params, later = [], []
    for doc in DOCS:
        for name, (flags, blocks) in parse(doc).items():
            marks = [pytest.mark.slow] if "slow" in flags else []
            needs = sorted(f[len("needs:"):] for f in flags if f.startswith("needs:"))
            page = doc.relative_to(ROOT).as_posix().removeprefix("docs/")
            # the examples run in this one process: those that start JAX's threads go last,
            # after every example that forks clients (transport="process")
            (later if "jax" in needs else params).append(
                pytest.param(blocks, needs, marks=marks, id=f"{page}::{name}"))
    return params + later


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.rstrip("\n").splitlines()]


@pytest.mark.parametrize("blocks, needs", _examples())
def test_marked_docs_example_runs_and_prints_what_the_page_shows(blocks, needs, monkeypatch,
                                                                  tmp_path):
    for need in needs:
        if need == "fashion-mnist":
            from ssca_solver.datasets import FASHION_MNIST_DIR
            if not FASHION_MNIST_DIR.is_dir():
                pytest.skip(f"needs Fashion-MNIST in {FASHION_MNIST_DIR}")
        else:
            pytest.importorskip(need)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.syspath_prepend(str(ROOT))
    namespace = {"__name__": "__docs_example__"}
    # an example's np.set_printoptions must not leak into the next one (a page that set
    # precision=4 changed what a later page's block printed, depending on the test order)
    import numpy as np

    saved = np.get_printoptions()
    try:
        _run_blocks(blocks, namespace)
    finally:
        np.set_printoptions(**saved)
    if "matplotlib.pyplot" in sys.modules:               # figures the example left open
        sys.modules["matplotlib.pyplot"].close("all")


def _run_blocks(blocks, namespace):
    for b in blocks:
        out = io.StringIO()
        where = f"{b.doc.relative_to(ROOT)}:{b.line}"
        with contextlib.redirect_stdout(out):
            exec(compile(b.code, where, "exec"), namespace)      # noqa: S102
        if b.expected is not None:
            assert matches(out.getvalue(), b.expected), (
                f"{where}: the block printed\n{out.getvalue()}\nbut the page shows\n"
                f"{b.expected}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_python_block_is_marked(doc):
    """A python block that is neither run nor skipped for a listed reason fails here."""
    lines = unmarked(doc)
    assert not lines, (
        f"{doc.relative_to(ROOT)}: the ```python blocks at lines {lines} have no marker; put "
        "<!-- test: NAME --> (or NAME slow, NAME needs:MODULE) on the line before each, or "
        f"<!-- test: skip REASON --> with REASON one of {SKIP_REASONS}")
    for line, reason in skipped(doc):
        assert reason.startswith(SKIP_REASONS), (
            f"{doc.relative_to(ROOT)}:{line}: skip reason {reason!r} is not a genuine external "
            f"need; allowed: {SKIP_REASONS}")
    parse(doc)                                 # malformed markers fail here, naming the line


def test_the_marked_examples_are_found():
    """The markers parse, and the examples of issue 21 are marked: two worked examples with
    their modelling inline, the README's first model."""
    names = {f"{doc.name}::{name}" for doc in DOCS for name in parse(doc)}
    for wanted in ("worked-examples.md::group-fairness", "worked-examples.md::neyman-pearson",
                   "engines.md::threads-inprocess", "README.md::first-model"):
        assert wanted in names, sorted(names)


def test_no_docs_example_is_left_to_the_slow_tests():
    """CI runs ``python -m pytest -q``, which deselects the slow tests: a block marked slow
    would never run there and could drift from the library unnoticed. Every example runs in
    the default suite (a long one in a shorter form that still checks its claim)."""
    slow = [f"{doc.relative_to(ROOT)}::{name}" for doc in DOCS
            for name, (flags, _) in parse(doc).items() if "slow" in flags]
    assert not slow, f"docs examples marked slow (they never run in CI): {slow}"


def test_parse_reads_markers_flags_and_outputs(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("text\n<!-- test: a -->\n```python\nx = 1\nprint(x)\n```\n```text\n1\n```\n"
                   "<!-- test: a slow -->\n```python\nprint(x + 1)\n```\n\n"
                   "<!-- test: b needs:jax -->\n```python\npass\n```\nmore text\n"
                   "- item\n  <!-- test: c -->\n  ```python\n  if True:\n      y = 2\n  ```\n")
    got = parse(doc)
    assert set(got) == {"a", "b", "c"} and got["a"][0] == {"slow"}
    assert got["b"][0] == {"needs:jax"}
    a1, a2 = got["a"][1]
    assert a1.code == "x = 1\nprint(x)\n" and a1.expected == "1\n" and a1.line == 4
    assert a2.expected is None and got["b"][1][0].expected is None
    assert got["c"][1][0].code == "if True:\n    y = 2\n"
    assert unmarked(doc) == [] and skipped(doc) == []
    doc.write_text("<!-- test: e -->\n```python\nprint(3)\n```\nIt prints:\n<!-- output -->\n"
                   "```text\n3\n```\n")
    assert parse(doc)["e"][1][0].expected == "3\n"
    doc.write_text("It prints:\n<!-- output -->\n```text\n3\n```\n")
    with pytest.raises(ValueError, match="no run block"):
        parse(doc)
    doc.write_text("<!-- test: c -->\n\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="page.md:1: the marker must be followed"):
        parse(doc)
    doc.write_text("<!-- test: c fast -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown flag"):
        parse(doc)
    doc.write_text("<!-- test: c needs:tensorflow -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown flag"):
        parse(doc)


def test_unmarked_and_skipped_blocks_are_found(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("a\n```python\nx = 1\n```\n<!-- test: skip needs torch -->\n```python\n"
                   "import torch\n```\n<!-- a comment -->\n```py\ny = 2\n```\n"
                   "<!-- test: d -->\n```python\npass\n```\n```bash\nls\n```\n")
    assert unmarked(doc) == [2, 10]
    assert skipped(doc) == [(5, "needs torch")]
    assert set(parse(doc)) == {"d"}            # the skipped block is not run


def test_output_blocks_match_line_for_line_with_ellipsis():
    assert matches("a 1\nb 2  \n", "a 1\nb 2\n")
    assert not matches("a 1\nb 3\n", "a 1\nb 2\n")
    assert not matches("a 1\nb 2\nc\n", "a 1\nb 2\n")
    assert matches("time: 0.96 s\nstatus ok\n", "time: ... s\nstatus ok\n")
    assert not matches("time: 0.96 s\nstatus bad\n", "time: ... s\nstatus ok\n")
    assert matches("head\nx\ny\ntail\n", "head\n...\ntail\n")
    assert matches("(a+b) [1]\n", "(a+b) [1]\n")          # regex characters are literal


def test_the_docs_site_builds_with_warnings_as_errors(tmp_path):
    """``mkdocs build --strict`` (the [docs] extra; skipped without it): a broken link or
    anchor, or a docstring mkdocstrings cannot parse, fails the build. The API reference has
    an entry for every name of ``ssca_solver.__all__``, or names it in its text (the front
    doors made by ``front_door``, an alias, a module, the version)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    import ssca_solver

    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    html = (site / "api" / "index.html").read_text()
    documented = set(re.findall(r'id="ssca_solver\.([A-Za-z_]+)"', html))
    api_text = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in ssca_solver.__all__
               if name not in documented and f"`ss.{name}`" not in api_text]
    assert not missing, f"the API reference has no entry for {missing}"
    for page in ("getting-started", "modelling", "statuses", "solver-settings", "running",
                 "benchmarks", "examples"):
        assert (site / page / "index.html").exists(), page
    assert not (site / "results").exists()          # kept for the source's pointers only
    assert list((site / "benchmarks" / "results").glob("*.png"))   # mkdocs_hooks.py copied them
