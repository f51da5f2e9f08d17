"""The example notebooks run to the end, and their executed copies are kept for the docs site.

Each executed notebook is written to ``$GPUGEEK_NOTEBOOK_ARTIFACTS`` (default
``artifacts/notebooks/``): the site renders those outputs and never runs a notebook itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parent.parent
NOTEBOOKS = ROOT / "notebooks"


def executed_dir() -> Path:
    """Where executed copies go: the docs build reads them from the same place."""
    return Path(os.environ.get("GPUGEEK_NOTEBOOK_ARTIFACTS") or ROOT / "artifacts" / "notebooks")


def _execute(name, tmp_path):
    """Run the notebook in a fresh kernel; a copy that ran without error is kept for the site."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={
        "metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors, [e.get("evalue") for e in errors]
    out = executed_dir()
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / name)
    return nb


def _run(name, tmp_path):
    nb = _execute(name, tmp_path)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    mimes = {m for o in outputs for m in o.get("data", {})}
    # a plotly figure, or a dashboard widget whose HTML fallback carries its figures
    assert "application/vnd.plotly.v1+json" in mimes or any(
        "Plotly.newPlot" in str(o.get("data", {}).get("text/html", "")) for o in outputs), "the chart rendered"
    text = "\n".join(str(v) for o in outputs for v in [o.get("text", ""), *o.get("data", {}).values()])
    return text


@pytest.mark.slow
def test_quickstart_notebook(tmp_path):
    """The tutorial of the site: the whole loop in ten cells, on a local cluster."""
    text = _run("quickstart.ipynb", tmp_path)
    assert "best:" in text
    assert "stopped: local" in text


@pytest.mark.slow
def test_price_and_plan_notebook(tmp_path):
    text = _run("01-price-and-plan.ipynb", tmp_path)
    assert "best:" in text
    assert "best_ckpt_min" in text
    assert "--residency EU: left out 1 region(s) of unknown location" in text


@pytest.mark.slow
def test_clusters_and_cost_notebook(tmp_path):
    text = _run("02-clusters-and-cost.ipynb", tmp_path)
    assert "16 GPUs declared" in text and "simulated" in text
    assert "preempted node" in text and "a100x8-on-demand" in text
    assert "spot saved $" in text
    assert "InstanceMarketOptions" in text and "ray.io/v1" in text
    assert "stopped: rehearsal" in text


@pytest.mark.slow
def test_distributed_training_notebook(tmp_path):
    import re

    text = _run("03-distributed-training.ipynb", tmp_path)
    assert "2 workers on cpu" in text
    first, last = map(float, re.search(r"loss (\d+\.\d+) → (\d+\.\d+) after", text).groups())
    assert last < first, "the model trained"
    assert "tiny-gpt" in text, "the cells are jobs in the ledger"


@pytest.mark.slow
def test_frameworks_notebook(tmp_path):
    """Trainer, Accelerate, Lightning and a torchrun script, each unchanged, on 2 workers; only
    rank 0 speaks in the cell."""
    import re

    text = _run("05-frameworks.ipynb", tmp_path)
    assert "rank 0 of world size 2: ParallelMode.DISTRIBUTED" in text and "rank 1 of" not in text
    assert "resume point: checkpoint-20" in text
    assert "2 processes, DistributedType.MULTI_CPU" in text
    # each job's summary is its own: the script reported nothing, so no step or loss of the cell before
    assert not re.search(r"demo-train\.py: finished[^\n]*step", text), text
    assert "global_rank 0 of world_size 2" in text and "global_rank 1" not in text
    assert "script: 2 ranks, 20 steps" in text


NOTEBOOK_04 = "04-watch-cost-and-utilisation.ipynb"


def _figure_titles(nb) -> list[str]:
    titles = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            figure = output.get("data", {}).get("application/vnd.plotly.v1+json")
            if figure:
                title = figure.get("layout", {}).get("title", {})
                titles.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return titles


def _check_watch_outputs(nb) -> None:
    titles = _figure_titles(nb)
    assert any(t.startswith("regression — finished (simulated $)") for t in titles), titles
    assert any("spend and budget — SIMULATED" in t for t in titles), titles
    assert any("no GPU telemetry" in t for t in titles), titles     # said, not invented
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) >= 3, "the cluster panel (up, status) and the cost dashboard"
    assert all("text/html" in o["data"] and "text/plain" in o["data"] for o in widgets), "fallbacks"
    summary = next(o for o in outputs if "<progress" in str(o.get("data", {}).get("text/html", "")))
    assert "step 384/384" in summary["data"]["text/plain"]


@pytest.mark.slow
def test_watch_cost_and_utilisation_notebook(tmp_path):
    _check_watch_outputs(_execute(NOTEBOOK_04, tmp_path))


def test_the_saved_watch_notebook_keeps_its_static_figures():
    """Opened without a kernel (nbviewer, GitHub), the notebook still shows what happened."""
    _check_watch_outputs(nbformat.read(NOTEBOOKS / NOTEBOOK_04, as_version=4))
