"""The sidebar's node table at the width JupyterLab gives the sidebar by default: a simulated
A100 cluster's rows (the longest node types and prices we show) fit, every cell's text whole —
above all the $/h column, which is what the table is for."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from cluster_processes import new_kernel
from lab import open_notebook_in_lab, put_notebook, screenshot
from test_extension_in_lab import STATUS

NAME = "lab-table"
SIDEBAR = "#gpugeek-sidebar"

# Every cell of the table: its text, whether its own box cuts the text (scrollWidth over
# clientWidth), and whether it reaches past the card's detail box, the part of the sidebar
# the table has to fit in (its overflow scrolls out of sight).
CELLS_JS = """(table) => {
  const detail = table.closest('.gpugeek-cluster-detail');
  if (detail === null) return null;   // the card re-rendered it while it was read: read it again
  const box = detail.getBoundingClientRect();
  const heads = [...table.querySelectorAll('thead th')].map(th => th.innerText.trim());
  return [...table.querySelectorAll('th, td')].map(cell => {
    const r = cell.getBoundingClientRect();
    return {column: heads[cell.cellIndex], text: cell.innerText.trim(),
            cut: cell.scrollWidth > cell.clientWidth, outside: r.right > box.right + 0.5 || r.left < box.left - 0.5};
  });
}"""


def cells_of(table) -> list[dict]:
    """Each cell of ``table`` measured; a table the card replaced while it was read (it re-renders
    at every poll) is read again, as the locator finds the new one."""
    for _ in range(20):
        cells = table.evaluate(CELLS_JS)
        if cells is not None:
            return cells
    raise AssertionError("the table was replaced at every one of 20 reads")


def cut_cells(card) -> list[dict]:
    """The cells of ``card``'s tables (nodes, and utilisation once sampled) cut or out of sight."""
    cells = [c for table in card.locator(".gpugeek-table").all() for c in cells_of(table)]
    return [c for c in cells if c["cut"] or c["outside"]]


def open_card(page, name: str):
    """Open the GPU clusters sidebar from the status bar and expand ``name``'s card; return it."""
    page.wait_for_function(f"() => /^1 cluster/.test(document.querySelector('{STATUS}')?.innerText.trim())",
                           timeout=30_000)
    page.locator(STATUS).click()
    card = page.locator(f'{SIDEBAR} .gpugeek-cluster[data-name="{name}"]')
    card.wait_for()
    card.locator("button[aria-expanded]").click()
    card.locator(".gpugeek-nodes-table tbody tr").first.wait_for()
    return card


@pytest.fixture
def sim_cluster(lab, monkeypatch):
    """A simulated A100×8 cluster (a head and one worker node) whose kernel is gone."""
    home = Path(lab.env["GPUGEEK_HOME"])
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    import gpugeek_jupyter as gg
    from gpugeek_jupyter.cluster import registry

    started = new_kernel(f"import gpugeek_jupyter as gg; gg.up({NAME!r}, backend='sim', gpu='A100', count=8, "
                         "workers=1)", home, timeout=240)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield registry.live(NAME)
    finally:
        if registry.live(NAME) is not None:
            gg.down(NAME)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_node_table_fits_the_sidebar_and_no_cell_is_cut(lab, page, sim_cluster):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    open_notebook_in_lab(page, lab.base_url, lab.token, put_notebook(lab, notebook, "table/side.ipynb"))
    card = open_card(page, NAME)
    page.wait_for_function(f"() => document.querySelectorAll('{SIDEBAR} .gpugeek-nodes-table tbody tr').length === 2",
                           timeout=30_000)
    width = page.locator(SIDEBAR).bounding_box()["width"]
    assert width < 320, f"the sidebar is {width} px wide: not JupyterLab's default"
    cells = cells_of(card.locator(".gpugeek-nodes-table"))
    screenshot(page, "sidebar-node-table", card)
    rates = [c["text"] for c in cells if c["column"] == "$/h" and c["text"] != "$/h"]
    assert len(rates) == 2 and any(r != "$0.00" for r in rates), rates
    bad = cut_cells(card)
    assert bad == [], f"cells cut or out of sight at {width} px: {bad}"
    detail = card.locator(".gpugeek-cluster-detail")
    assert detail.evaluate("(d) => d.scrollWidth <= d.clientWidth"), "the table scrolls sideways"
