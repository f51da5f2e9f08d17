"""The built site (``make docs`` → ``site/``) reads offline: no page loads a script, a style, a
font or an image over http(s), and plotly.js and the search index are the site's own.

Run by ``make docs`` after the build (the main suite leaves this folder out: it has no site).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parents[2] / "site"

# what a browser fetches by itself while showing a page: <script src>, <link href> (styles, fonts,
# icons), <img>/<source>/<iframe>/<embed> src, @import and url() in styles, @font-face sources
LOADS = (
    re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.I),
    re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?\s*(?:https?:)?//", re.I),
    re.compile(r"<(?:img|source|iframe|embed|video|audio)\b[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.I),
    re.compile(r"@import\s+(?:url\()?\s*[\"']?\s*(?:https?:)?//", re.I),
    re.compile(r"url\(\s*[\"']?\s*(?:https?:)?//", re.I),
)


def remote_loads(text: str) -> list[str]:
    """Each place in an HTML or CSS text that makes a browser fetch from another host."""
    return [m.group(0) for pattern in LOADS for m in pattern.finditer(text)]


def test_the_check_sees_each_kind_of_remote_load():
    """The check itself, against pages that do load from the network (and ones that do not)."""
    for bad in ('<script src="https://cdn.plot.ly/plotly-3.0.1.min.js"></script>',
                "<script src='//unpkg.com/x.js'></script>",
                '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">',
                "<style>@import url(https://fonts.googleapis.com/css2?family=Lato);</style>",
                "@font-face { font-family: X; src: url('https://example.com/x.woff2') }",
                '<img src="http://example.com/a.png">'):
        assert remote_loads(bad), bad
    for good in ('<script src="_static/plotly.min.js"></script>', '<a href="https://github.com/x">x</a>',
                 '<link rel="stylesheet" href="../_static/furo.css">', "url(data:image/svg+xml;utf8,x)"):
        assert not remote_loads(good), good


@pytest.fixture(scope="module")
def site() -> Path:
    if not (SITE / "index.html").exists():
        pytest.fail("no site/index.html: run `make docs` (this test checks its pages)")
    return SITE


def test_no_page_loads_anything_over_the_network(site):
    found = {}
    for path in [*site.rglob("*.html"), *site.rglob("*.css")]:
        loads = remote_loads(path.read_text(errors="replace"))
        if loads:
            found[str(path.relative_to(site))] = loads[:3]
    assert not found, found


def test_plotly_and_search_are_the_sites_own(site):
    assert (site / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    assert (site / "searchindex.js").exists() and (site / "search.html").exists()
    figures = [p for p in site.rglob("*.html") if "Plotly.newPlot" in p.read_text(errors="replace")]
    if os.environ.get("GPUGEEK_DOCS_NOTEBOOKS") == "required":     # the notebooks rendered with outputs
        assert figures, "the rendered notebooks carry figures"
    for page in figures:
        assert re.search(r"<script[^>]*src=\"[./]*_static/plotly\.min\.js", page.read_text()), page


def test_the_version_is_shown(site):
    from importlib.metadata import version

    assert f"gpugeek-jupyter {version('gpugeek-jupyter')}" in (site / "index.html").read_text()
