"""The views in a real JupyterLab: a notebook provisions a sim cluster, runs a short job, shows the
cluster panel and the cost dashboard — and the browser sees the live job monitor (progress bar,
plotly loss chart), the static summary and figure the job leaves, the panel's non-zero simulated
dollars, and the dashboard's cost table and figures."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import nbformat
import pytest
from lab import (
    PANEL,
    error_outputs,
    open_notebook_in_lab,
    put_notebook,
    screenshot,
    start_run_all,
    training_cell,
    wait_run_done,
)

# The job waits at step 128 until the test has seen its live monitor and writes this file: on a
# loaded machine the browser may draw the chart after a free-running job has already ended.
HOLD = Path(tempfile.gettempdir()) / f"gpugeek-watch-hold-{os.getpid()}"
CELLS = [
    "%load_ext gpugeek_jupyter\n%gpugeek up lab-sim --backend sim --gpu A100 --count 8 --workers 1 --budget 5",
    training_cell("lab-job", epochs=8, hold=str(HOLD)),
    "%gpugeek status",
    "%gpugeek cost --by pricing",
    "%gpugeek down lab-sim",
]


TABLE_JS = """(table) => ({
  caption: table.previousElementSibling?.textContent || '',
  rows: [...table.querySelectorAll('tr')].slice(1).map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent)),
})"""

# The job's figure as drawn: its annotations (panel titles and notes), axis titles, tick labels
# and each subplot's plot area (its drag rectangle), as page boxes.
FIGURE_JS = """(root) => {
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; };
  const texts = (selector) => [...root.querySelectorAll(selector)].map(e => ({text: e.textContent, ...box(e)}));
  return {
    annotations: texts('g.annotation'),
    axisTitles: texts('.infolayer text[class^="x"][class$="title"]'),
    ticks: texts('.xtick text'),
    lossPoints: [...root.querySelectorAll('.subplot.xy .scatterlayer .trace')].map(
      t => t.querySelectorAll('.point').length),
    areas: Object.fromEntries([...root.querySelectorAll('.draglayer > g')].map(
      g => [g.getAttribute('class'), box(g.querySelector('rect.nsewdrag'))])),
  };
}"""


def _overlap(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def check_job_figure(drawn: dict, steps: int) -> None:
    """The finished job's figure on the page: the no-GPU note inside the GPU panel's plot area,
    every panel by step, the loss at every logged step of each rank (or, where the reports did not
    carry them, at each report, as the panel's title says), and no panel title running into an
    axis title or tick label."""
    boxes = {a["text"]: a for a in drawn["annotations"]}
    loss = next(text for text in boxes if text.startswith("loss"))
    assert loss in ("loss", "loss · at each report"), loss
    assert drawn["lossPoints"] == [steps] * 2 if loss == "loss" else \
        len(drawn["lossPoints"]) == 2 and min(drawn["lossPoints"]) >= 2, (loss, drawn["lossPoints"])
    note, gpu = boxes["no GPU on these workers"], drawn["areas"]["x4y4"]
    assert gpu["x0"] <= note["x0"] and note["x1"] <= gpu["x1"] and gpu["y0"] <= note["y0"] \
        and note["y1"] <= gpu["y1"], (note, drawn["areas"])
    assert not _overlap(note, drawn["areas"]["xy"])
    assert [t["text"] for t in drawn["axisTitles"] if t["text"]] == ["step", "step"], drawn["axisTitles"]
    titles = [boxes[t] for t in (loss, "samples/s", "memory (GiB)", "GPU utilisation (%)")]
    for title in titles:
        crossed = [t for t in drawn["axisTitles"] + drawn["ticks"] if _overlap(title, t)]
        assert not crossed, (title, crossed)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sim_cluster_job_monitor_and_panel_in_lab(lab, page):
    HOLD.unlink(missing_ok=True)
    try:
        watch_a_sim_cluster_job(lab, page)
    finally:
        HOLD.unlink(missing_ok=True)


def watch_a_sim_cluster_job(lab, page) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    path = put_notebook(lab, nb, "watch/watch.ipynb")
    open_notebook_in_lab(page, lab.base_url, lab.token, path)
    start_run_all(page)
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")

    # while the job runs (held at step 128): the monitor with its progress bar and live loss chart
    monitor = cells.nth(1).locator(".gpugeek-job")
    monitor.locator(".widget-hprogress").wait_for(timeout=180_000)
    monitor.locator(".js-plotly-plot svg.main-svg").first.wait_for(timeout=30_000)
    page.wait_for_function(
        "(el) => /step \\d+\\/256/.test(el.innerText)", arg=monitor.element_handle(), timeout=30_000)
    # the rank table: every rank as of one step, the one its caption names
    page.wait_for_function("(el) => el.querySelectorAll('.gpugeek-workers tr').length >= 3",
                           arg=monitor.element_handle(), timeout=30_000)
    table = monitor.locator(".gpugeek-workers").evaluate(TABLE_JS)
    screenshot(page, "watch-1-live-job-monitor", monitor)
    assert [row[0] for row in table["rows"]] == ["0", "1"], table
    assert {row[1] for row in table["rows"]} == {re.search(r"as of step (\d+)", table["caption"]).group(1)}, table
    panel = cells.nth(0).locator(".gpugeek-cluster-panel")
    assert "SIMULATED" in panel.inner_text()
    HOLD.touch()                                   # the job goes on to its end

    # the cluster panel of `status`, before `down` runs, shows dollars above zero
    status = cells.nth(2).locator(".gpugeek-cluster-panel")
    status.wait_for(timeout=120_000)
    spend = status.locator(".gpugeek-spend")
    spend.wait_for()
    dollars = float(re.sub(r"[$,]", "", spend.inner_text()))
    screenshot(page, "watch-2-cluster-panel", status)
    assert dollars > 0, spend.inner_text()
    assert "SIMULATED" in status.inner_text() and "budget" in status.inner_text()

    # the cost dashboard of `cost`: its summary, the table grouped as asked, and its three figures
    dashboard = cells.nth(3).locator(".gpugeek-cost-dashboard")
    dashboard.wait_for(timeout=120_000)
    dashboard.locator(".jp-RenderedPlotly svg.main-svg").nth(2).wait_for(timeout=30_000)
    text = dashboard.inner_text()
    assert "lab-sim: $" in text and "simulated" in text and "on-demand" in text, text
    assert dashboard.locator(".gpugeek-cost-table").count() == 1
    screenshot(page, "watch-3-cost-dashboard", dashboard)

    run = wait_run_done(page, timeout=120, path=path)
    assert run.executed == len(CELLS), run

    # what the job left: a static summary with a progress bar, and the per-worker figure
    done = cells.nth(1)
    summary = done.locator(".gpugeek-job-done")
    summary.wait_for()
    assert summary.locator("progress").get_attribute("value") == "256"    # 1024 samples per rank ÷ 32 × 8 epochs
    assert "lab-job: finished" in summary.inner_text() and "(simulated)" in summary.inner_text()
    done.locator(".jp-RenderedPlotly svg.main-svg").first.wait_for(timeout=30_000)
    assert done.locator(".gpugeek-job").count() == 0, "the live widget was replaced"
    figure = done.locator(".jp-RenderedPlotly").first
    figure.scroll_into_view_if_needed()
    screenshot(page, "watch-5-job-figure", figure)
    check_job_figure(figure.evaluate(FIGURE_JS), steps=256)
    assert "stopped: lab-sim" in cells.nth(4).inner_text()
    # the panel's own refresh (every 2 s, from a thread in the kernel) ends on the stop
    page.wait_for_function("(el) => el.innerText.includes('stopped (down)')",
                           arg=status.element_handle(), timeout=30_000)
    screenshot(page, "watch-4-after-the-run")
    assert float(re.sub(r"[$,]", "", status.locator(".gpugeek-spend").inner_text())) >= dollars
    assert error_outputs(page, stderr=False) == []
