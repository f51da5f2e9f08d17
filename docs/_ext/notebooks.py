"""The example notebooks on the site, with the outputs their tests produced.

``tests/test_notebooks.py`` runs each notebook of ``notebooks/`` and keeps the executed copy
(``$GPUGEEK_NOTEBOOK_ARTIFACTS``, default ``artifacts/notebooks/``). The build copies those into
the source tree; it never runs a notebook. A notebook with no executed copy gets a page that says
so: outputs are never made up. Where the copies are required (``gpugeek_notebooks_required``,
as ``make test`` builds) a missing or stale one is a warning, and the strict build fails on it.

The copies are made to read offline: widget views show their HTML fallback (the panels' static
HTML), a plotly figure shows as its HTML (the one plotly made of it beside its JSON, or made here from
that JSON where it has none), and
plotly.js comes from the site (the installed ``plotly`` package's bundle), not from its CDN.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import nbformat
from sphinx.util import logging

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# the tag of `to_html(include_plotlyjs="cdn")`: the site loads its own copy instead
CDN_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']https?://[^\"']*plotly[^\"']*[\"'][^>]*>\s*</script>", re.I)
PAGES = {"quickstart.ipynb": "tutorial"}     # else: examples/


def executed_dir() -> Path:
    return Path(os.environ.get("GPUGEEK_NOTEBOOK_ARTIFACTS") or ROOT / "artifacts" / "notebooks")


def for_the_site(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Outputs as a static page shows them (module docstring); none added, none dropped."""
    import plotly.io

    nb.metadata.pop("widgets", None)          # the live state: no widget manager on the site
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and "text/html" in data:
                del data[WIDGET_VIEW]
            if PLOTLY_JSON in data:         # myst-nb renders no plotly JSON: the HTML of the same figure
                figure = data.pop(PLOTLY_JSON)
                if "text/html" not in data:
                    data["text/html"] = plotly.io.from_json(json.dumps(figure)).to_html(
                        full_html=False, include_plotlyjs=False)
            if "text/html" in data:
                html = data["text/html"]
                html = "".join(html) if isinstance(html, list) else html
                data["text/html"] = CDN_SCRIPT.sub("", html)
    return nb


def copy_notebooks(app, config) -> None:
    """Each notebook of ``notebooks/`` → its page, from its executed copy (or a page saying none)."""
    found = executed_dir()
    for source in sorted((ROOT / "notebooks").glob("*.ipynb")):
        folder = Path(app.srcdir) / PAGES.get(source.name, "examples")
        folder.mkdir(exist_ok=True)
        page = folder / source.name
        missing = folder / (source.stem + ".md")
        for stale in (page, missing):
            stale.unlink(missing_ok=True)
        executed = found / source.name
        if executed.exists() and executed.stat().st_mtime >= source.stat().st_mtime:
            nb = for_the_site(nbformat.read(executed, as_version=4))
            nbformat.write(nb, page)
            continue
        why = "is older than the notebook" if executed.exists() else "is missing"
        say = log.warning if config.gpugeek_notebooks_required else log.info
        say(f"notebooks/{source.name}: its executed copy {executed} {why}, so its page shows no outputs; "
            "run `pytest tests/test_notebooks.py` first")
        title = nbformat.read(source, as_version=4).cells[0].source.splitlines()[0].lstrip("# ")
        missing.write_text(f"# {title}\n\n```{{warning}}\nNo executed copy of `notebooks/{source.name}` was found "
                           f"when this site was built: run `pytest tests/test_notebooks.py` and build again.\n```\n")


def copy_plotly(app, exception) -> None:
    """plotly.js from the installed package into the site, where the pages' figures load it."""
    if exception is None and app.builder.format == "html":
        import plotly

        bundle = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        shutil.copyfile(bundle, Path(app.outdir) / "_static" / "plotly.min.js")


def plotly_where_needed(app, pagename, templatename, context, doctree) -> None:
    """Only pages that draw a figure load the ~5 MB of plotly.js, in the page's head: the figures'
    inline scripts call ``Plotly.newPlot`` where they stand, and the theme puts its scripts last."""
    if "Plotly.newPlot" in context.get("body", ""):
        src = context["pathto"]("_static/plotly.min.js", 1)
        context["metatags"] = context.get("metatags", "") + f'\n    <script src="{src}"></script>'


def setup(app):
    app.add_config_value("gpugeek_notebooks_required", False, "env", bool)
    app.connect("config-inited", copy_notebooks)
    app.connect("html-page-context", plotly_where_needed)
    app.connect("build-finished", copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
