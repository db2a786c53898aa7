"""Draw docs/img/result_plot.png, the figure of docs/walkthrough.md section 6.

Runs the walkthrough's own code blocks, read from the Markdown file: those of section 1 (data
and functions) and section 2 (the problem, its solves and the CVXPY reference; their output is
discarded), then section 6's block, in a temporary directory (it writes diabetes.npz and
diabetes.png there), and saves the Figure that block made as ``fig``. Needs the plot extra
(``pip install -e ".[plot]"``); run from anywhere:

    python docs/make_result_plot.py
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
WALKTHROUGH = DOCS / "walkthrough.md"
OUT = DOCS / "img" / "result_plot.png"


def blocks(text: str, section: str) -> list[str]:
    """The ```python blocks of the section whose heading starts with ``section`` ("## 2.")."""
    parts = re.split(r"^(?=## )", text, flags=re.M)
    part = next(p for p in parts if p.startswith(section))
    return re.findall(r"^```python\n(.*?)^```", part, flags=re.M | re.S)


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    text = WALKTHROUGH.read_text()
    setup = blocks(text, "## 1.") + blocks(text, "## 2.")
    (plot_block,) = blocks(text, "## 6.")
    sys.path.insert(0, str(ROOT))            # the walkthrough imports the examples package
    namespace: dict = {"__name__": "__walkthrough__"}
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                for code in setup:
                    exec(compile(code, str(WALKTHROUGH), "exec"), namespace)
            exec(compile(plot_block, str(WALKTHROUGH), "exec"), namespace)
        finally:
            os.chdir(here)
    OUT.parent.mkdir(exist_ok=True)
    namespace["fig"].savefig(OUT, dpi=80)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
