"""ipywidgets, our live figure (a plotly output inside an ipywidgets Output) and a static plotly
figure render in Lab.

Proves the frontends of the venv's labextensions load in an isolated JupyterLab.
"""

from __future__ import annotations

import nbformat
import pytest
from lab import error_outputs, put_notebook, run_notebook_in_lab, screenshot

CELLS = [
    'import ipywidgets as w; w.IntProgress(value=3, max=10, description="steps")',
    "import plotly.graph_objects as go\nfrom gpugeek_jupyter.widgets._base import LiveFigure\n"
    "f = LiveFigure(go.Figure(go.Scatter(y=[0, 0]))); f.show(go.Figure(go.Scatter(y=[3, 1, 2]))); f",
    "import plotly.graph_objects as go; go.Figure(go.Scatter(y=[1,2]))",
]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_widgets_and_plotly_render(lab, page):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    path = put_notebook(lab, nb, "widgets/render.ipynb")

    run = run_notebook_in_lab(page, lab.base_url, lab.token, path, timeout=120)
    assert run.prompts == ["[1]:", "[2]:", "[3]:"], run

    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-cell")
    # ipywidgets 8: the progress bar is .widget-hprogress (no .widget-progress), its fill a
    # .progress-bar whose width is the value's share
    progress = cells.nth(0).locator(".widget-hprogress")
    progress.wait_for()
    assert progress.locator(".widget-label").inner_text() == "steps"
    assert "width: 30%" in progress.locator(".progress-bar").get_attribute("style")

    # the live figure: a widget (an Output) whose content plotly's mime renderer draws; redrawn once
    widget_svg = cells.nth(1).locator(".jupyter-widgets .jp-RenderedPlotly.js-plotly-plot svg.main-svg")
    widget_svg.first.wait_for()
    assert cells.nth(1).locator(".scatterlayer .trace .point").count() == 3

    # static figure: jupyterlab-plotly's mime renderer (application/vnd.plotly.v1+json)
    static_svg = cells.nth(2).locator(".jp-RenderedPlotly.js-plotly-plot svg.main-svg")
    static_svg.first.wait_for()
    assert cells.nth(2).locator(".scatterlayer .trace .point").count() == 2

    screenshot(page, "widgets_render")
    assert error_outputs(page) == []
