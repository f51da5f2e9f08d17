"""The panels of a free local cluster in a real JupyterLab, as the quickstart shows them: the
panel of ``up`` (taken over by the one of ``status``) ends disabled and says stopped after
``down``; the cost dashboard says the cluster is free instead of charting $0; the job's figure
draws memory and throughput on axes from 0, without a warm-up or tail spike."""

from __future__ import annotations

import nbformat
import pytest
from lab import PANEL, error_outputs, put_notebook, run_notebook_in_lab, screenshot, training_cell

CELLS = [
    "%load_ext gpugeek_jupyter\n%gpugeek up",
    training_cell("small", epochs=4),
    "%gpugeek status",
    "%gpugeek cost --by job",
    "%gpugeek down",
]

# plotly's own axes and traces of the job's figure (the last plot of the job's cell)
FIGURE_JS = """(cell) => {
  const plots = cell.querySelectorAll('.js-plotly-plot');
  const p = plots[plots.length - 1];
  const axis = name => p._fullLayout[name].range;
  return {memory: axis('yaxis3'), speed: axis('yaxis2'), x: axis('xaxis2'),
          rates: p._fullData.filter(t => t.xaxis === 'x2').map(t => Array.from(t.y))};
}"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_free_cluster_s_panels_in_lab(lab, page):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    path = put_notebook(lab, nb, "panels/free.ipynb")
    run = run_notebook_in_lab(page, lab.base_url, lab.token, path, timeout=240)
    assert run.executed == len(CELLS), run
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")
    assert "stopped: local" in cells.nth(4).inner_text()

    # both panels, the one `status` took over from included, say stopped and offer no shut-down
    for index in (0, 2):
        panel = cells.nth(index).locator(".gpugeek-cluster-panel")
        page.wait_for_function("(el) => el.innerText.includes('stopped (down)')", arg=panel.element_handle(),
                               timeout=30_000)
        button = panel.locator("button", has_text="Stopped")
        assert button.is_disabled() and panel.locator("button", has_text="Shut down").count() == 0
    screenshot(page, "panels-1-stopped", cells.nth(0).locator(".gpugeek-cluster-panel"))

    # the dashboard: one line that the cluster is free, and no spend chart
    dashboard = cells.nth(3).locator(".gpugeek-cost-dashboard")
    dashboard.locator(".js-plotly-plot").first.wait_for(timeout=30_000)   # utilisation, drawn
    assert "free: every node at $0/h, no $ to chart" in dashboard.locator(".gpugeek-free").inner_text()
    titles = dashboard.locator(".gtitle").all_text_contents()
    assert not [t for t in titles if "cost" in t or "spend" in t], titles
    screenshot(page, "panels-2-free-dashboard", dashboard)

    # the job's figure: memory and samples/s from 0; no point far off its worker's others
    job = cells.nth(1)
    job.locator(".jp-RenderedPlotly svg.main-svg").first.wait_for(timeout=30_000)
    figure = job.evaluate(FIGURE_JS)
    assert figure["memory"][0] == 0 and figure["speed"][0] == 0, figure
    for rates in figure["rates"]:
        steady = sorted(rates)[len(rates) // 2]
        assert rates and max(rates) < 3 * steady and min(rates) > steady / 3, rates
    screenshot(page, "panels-3-job-figure", job)
    assert error_outputs(page, stderr=False) == []
