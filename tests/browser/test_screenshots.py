"""The pictures of README.md and docs/how-to/view.md, taken from the real UI: a notebook in a real JupyterLab starts a
simulated A100 cluster on this machine, runs a real ``%%gpugeek run`` job on it, shows the
cluster panel and the cost dashboard, and the Lab sidebar shows the cluster — each saved as a
PNG in docs/images/, clipped to what it shows.

Run by `make screenshots` (GPUGEEK_SCREENSHOTS=1); the browser suite skips it, so a test run
never rewrites the pictures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from lab import (
    PANEL,
    ROOT,
    error_outputs,
    open_notebook_in_lab,
    put_notebook,
    shutdown_sessions,
    start_run_all,
    wait_run_done,
)
from test_sidebar_table import SIDEBAR, cut_cells, open_card
from test_watch_in_lab import TABLE_JS

pytestmark = pytest.mark.skipif(not os.environ.get("GPUGEEK_SCREENSHOTS"),
                                reason="writes docs/images/: run by `make screenshots`")

IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1200, "height": 800}
NAME = "demo"
CELLS = [
    f"%load_ext gpugeek_jupyter\n%gpugeek up {NAME} --backend sim --gpu A100 --count 8 --workers 1 "
    "--budget 5 --idle 30",
    """%%gpugeek run --workers 2 --name regression
import time
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(4096, 32)
y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, loader = gg.prepare(model, optimizer, loader)

for xb, yb in gg.steps(loader, epochs=12):
    loss = nn.functional.mse_loss(model(xb), yb)
    gg.backward(loss)
    gg.log(loss=loss.item())
    time.sleep(0.02)
f'step {gg.step}: loss {loss.item():.4f}'""",
    f"%gpugeek status {NAME}",
    f"%gpugeek cost {NAME} --by job",
]


def save(target, name: str) -> Path:
    """``target`` (a locator, or the page with a clip) as docs/images/<name>.png."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    target.screenshot(path=str(path), animations="disabled")
    return path


def settle(page, locator) -> None:
    """Scroll ``locator`` into the notebook's view and let plotly finish its layout."""
    locator.scroll_into_view_if_needed()
    page.wait_for_timeout(800)


@pytest.fixture
def demo_page(browser, lab, monkeypatch):
    """A 1200×800 page; after it, the demo cluster stopped. Its kernel is gone by then, so the
    stop runs as the Lab's kernels do (their environment holds Ray's token for the cluster)."""
    monkeypatch.setenv("GPUGEEK_HOME", lab.env["GPUGEEK_HOME"])
    from gpugeek_jupyter.cluster import registry

    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        yield page
    finally:
        context.close()
        shutdown_sessions(lab)
        if registry.live(NAME) is not None:
            stopped = subprocess.run([sys.executable, "-c", f"import gpugeek_jupyter as gg; gg.down({NAME!r})"],
                                     env=lab.env, capture_output=True, text=True, timeout=120)
            assert stopped.returncode == 0, stopped.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_readme_pictures_of_the_real_ui(lab, demo_page):
    page = demo_page
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    path = put_notebook(lab, nb, "demo/demo.ipynb")
    open_notebook_in_lab(page, lab.base_url, lab.token, path)
    page.locator('.jp-SideBar [data-id="filebrowser"]').click()      # the notebook gets the width
    start_run_all(page)
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")

    # the job monitor, live, once its charts have a few seconds of points
    monitor = cells.nth(1).locator(".gpugeek-job")
    monitor.locator(".js-plotly-plot svg.main-svg").first.wait_for(timeout=180_000)
    page.wait_for_function(
        "(el) => { const m = /step (\\d+)\\/(\\d+)/.exec(el.innerText); return m && +m[1] >= 0.6 * +m[2]; }",
        arg=monitor.element_handle(), timeout=120_000)
    settle(page, monitor)
    shots = [save(monitor, "job-monitor")]
    table = monitor.locator(".gpugeek-workers").evaluate(TABLE_JS)      # as the picture shows it
    assert len(table["rows"]) == 2 and len({row[1] for row in table["rows"]}) == 1, table

    panel = cells.nth(2).locator(".gpugeek-cluster-panel")
    panel.locator(".gpugeek-spend").wait_for(timeout=120_000)
    dashboard = cells.nth(3).locator(".gpugeek-cost-dashboard")
    dashboard.locator(".jp-RenderedPlotly svg.main-svg").nth(2).wait_for(timeout=120_000)
    run = wait_run_done(page, timeout=120, path=path)
    assert run.executed == len(CELLS), run
    assert error_outputs(page, stderr=False) == []
    settle(page, panel)
    shots.append(save(panel, "cluster-panel"))

    # the dashboard is taller than 800 px: the page grows for this one picture
    page.set_viewport_size({"width": VIEWPORT["width"], "height": 1500})
    settle(page, dashboard)
    shots.append(save(dashboard, "cost-dashboard"))
    page.set_viewport_size(VIEWPORT)

    # the sidebar, opened from the status bar, the cluster's card expanded: header to card
    card = open_card(page, NAME)
    card.locator(".gpugeek-util-table").wait_for(timeout=30_000)      # the job's kernel drained the samples
    page.wait_for_timeout(800)
    assert cut_cells(card) == []
    top = page.locator(SIDEBAR).bounding_box()
    bottom = card.bounding_box()
    clip = {"x": top["x"], "y": top["y"], "width": top["width"],
            "height": bottom["y"] + bottom["height"] + 8 - top["y"]}
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "lab-sidebar.png"), clip=clip, animations="disabled")
    shots.append(IMAGES / "lab-sidebar.png")

    for shot in shots:
        assert shot.stat().st_size < 400_000, f"{shot} is {shot.stat().st_size} bytes"
