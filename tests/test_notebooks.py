from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["01-price-and-plan.ipynb"])
def test_notebook_runs_top_to_bottom(name, tmp_path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={
        "metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    mimes = {m for o in outputs for m in o.get("data", {})}
    assert "application/vnd.plotly.v1+json" in mimes, "the price–performance chart rendered"
    assert any("best:" in o.get("data", {}).get("text/html", "") for o in outputs)
