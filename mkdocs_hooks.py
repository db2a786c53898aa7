"""mkdocs hooks (mkdocs.yml: ``hooks:``): the pages link the benchmarks' committed figures
where they live, ``../benchmarks/results/NAME.png`` (so the links also work on GitHub and in a
clone). That folder is outside ``docs/``, so the site build adds those figures as files of the
site under ``benchmarks/results/`` and points the pages' links there; a link to a figure that
does not exist is still reported (and fails ``mkdocs build --strict``)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent
FIGURES = "benchmarks/results"
LINK = re.compile(r"\]\(\.\./" + re.escape(FIGURES) + r"/([^)\s]+)\)")


def on_files(files, config):
    for png in sorted((ROOT / FIGURES).glob("*.png")):
        files.append(File.generated(config, f"{FIGURES}/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown, page, config, files):
    # only pages at the top of docs/ link ../benchmarks/...; the site's copy is one level down
    if "/" in page.file.src_uri:
        return markdown
    return LINK.sub(lambda m: f"]({FIGURES}/{m.group(1)})", markdown)
