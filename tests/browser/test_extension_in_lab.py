"""The JupyterLab extension in a real Lab: the status-bar ticker and the clusters sidebar follow a
real local cluster whose kernel is gone, Shut down from the sidebar stops every process of it, and
the quickstart notebook runs to the end in the browser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from itertools import pairwise
from pathlib import Path

import cluster_processes
import nbformat
import pytest
from lab import (
    PANEL,
    POLL_S,
    error_outputs,
    open_notebook_in_lab,
    put_notebook,
    screenshot,
    start_run_all,
    wait_run_done,
)

ROOT = Path(__file__).parent.parent.parent
STATUS = ".gpugeek-statusbar"
USD_PER_HOUR = 72.0   # the local cluster's price here: 2 cents a second, so every poll moves the ticker


def gpugeek_api(lab, path: str, method: str = "GET") -> dict:
    request = urllib.request.Request(f"{lab.base_url}/gpugeek/{path}", method=method,
                                     headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def status_text(page) -> str:
    return page.locator(STATUS).inner_text().strip()


def dollars(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\$([\d,]+\.\d\d)", text)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ticker_and_sidebar_follow_a_cluster_and_shut_it_down(lab, page, monkeypatch):
    home = Path(lab.env["GPUGEEK_HOME"])
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    from gpugeek_jupyter.cluster import registry
    from gpugeek_jupyter.meter import ledger

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    path = put_notebook(lab, notebook, "ext/attach-here.ipynb")
    open_notebook_in_lab(page, lab.base_url, lab.token, path)
    page.wait_for_function(f"() => document.querySelector('{STATUS}')?.innerText.includes('no clusters')")

    # a kernel starts a cluster and goes away: the cluster runs on, an orphan
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f"[cluster]\nlocal_usd_per_hour = {USD_PER_HOUR}\n")
    try:
        started = subprocess.run(
            [sys.executable, "-c", "import gpugeek_jupyter as gg; gg.up('lab-local', dashboard=True)"],
            env={**os.environ, "GPUGEEK_HOME": str(home)}, capture_output=True, text=True, timeout=180)
    finally:
        (home / "config.toml").unlink()   # the price is fixed in the cluster's spec at `up`
    assert started.returncode == 0, started.stderr[-2000:]
    up_at = time.monotonic()
    record = registry.live("lab-local")
    ours = cluster_processes.of_cluster(record)
    assert record.watchdog_pid in [p.pid for p in ours] and len(ours) >= 3

    # the ticker shows it, priced, within a poll or two of `up` returning
    page.wait_for_function(
        f"() => /^1 cluster · \\$[\\d.]+ · \\$72\\.00\\/h$/.test(document.querySelector('{STATUS}').innerText.trim())",
        timeout=30_000)
    seen_after = time.monotonic() - up_at
    assert seen_after <= 2 * POLL_S + 2.0, f"the ticker took {seen_after:.1f} s (poll interval {POLL_S} s)"
    # ... and refreshes every poll interval: its dollars (2 cents a second) change at every poll
    changes, last, until = [], status_text(page), time.monotonic() + 6
    while time.monotonic() < until:
        page.wait_for_timeout(100)
        now = status_text(page)
        if now != last:
            changes.append(time.monotonic())
            last = now
    gaps = [b - a for a, b in pairwise(changes)]
    assert len(changes) >= 4 and max(gaps) <= POLL_S + 1.0, (changes, gaps)
    api = gpugeek_api(lab, "clusters")
    assert abs(dollars(status_text(page))[0] - api["spent_usd"]) <= 0.01 + USD_PER_HOUR / 3600 * (POLL_S + 1)

    # the sidebar: the cluster's card, opened from the status bar
    page.locator(STATUS).click()
    card = page.locator('#gpugeek-sidebar .gpugeek-cluster[data-name="lab-local"]')
    card.wait_for()
    assert card.get_attribute("data-state") == "running"
    text = card.inner_text()
    assert "local" in text and "$72.00/h" in text and "orphan" in text, text
    assert card.locator(".gpugeek-sim-badge").is_hidden()
    # who enforces its budget and idle stop: this machine's watchdog, the process of that pid
    guard = card.locator(".gpugeek-cluster-guard")
    assert guard.get_attribute("data-by") == "here", guard.inner_text()
    assert f"guarded by this machine's watchdog (pid {record.watchdog_pid}," in guard.inner_text()

    # Ray's dashboard opens in a new tab (it asks for Ray's token itself)
    with page.context.expect_page() as opened:
        card.locator(".gpugeek-dashboard").click()
    dashboard = opened.value
    dashboard.wait_for_load_state()
    assert dashboard.url.startswith(record.spec["dashboard_url"]) and "Ray Dashboard" in dashboard.title()
    dashboard.close()

    # "Insert attach code" puts the re-attaching cell into the open notebook
    card.locator(".gpugeek-attach").click()
    page.wait_for_function(f"""() => [...document.querySelectorAll('{PANEL} .jp-Notebook-cell .cm-content')]
        .some(e => e.innerText.includes('%gpugeek up lab-local'))""", timeout=10_000)
    screenshot(page, "ext-1-status-bar-and-sidebar")

    # Shut down, confirmed in Lab's dialog: every process of the cluster ends
    card.locator(".gpugeek-shutdown").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "lab-local" in dialog.inner_text()
    screenshot(page, "ext-2-confirm-shut-down")
    dialog.locator("button.jp-mod-accept").click()
    toast = page.locator(".Toastify__toast", has_text="final cost")
    toast.wait_for(timeout=60_000)
    assert cluster_processes.still_running(ours, wait=15) == [], "processes of the cluster run on"
    final = registry.get(record.id)
    assert final.stopped is not None and final.stop_reason == "down (from JupyterLab)"
    shown = dollars(toast.inner_text())
    assert shown and abs(shown[0] - ledger.spend(record.id)) <= 0.01, toast.inner_text()
    page.wait_for_function(f"() => document.querySelector('{STATUS}').innerText.includes('no clusters')",
                           timeout=10_000)
    stopped_card = page.locator('#gpugeek-sidebar .gpugeek-cluster[data-name="lab-local"]')
    assert stopped_card.get_attribute("data-state") == "stopped"
    screenshot(page, "ext-3-after-shut-down")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_quickstart_runs_to_the_end_in_lab(lab, page):
    path = put_notebook(lab, ROOT / "notebooks" / "quickstart.ipynb", "quickstart.ipynb")
    open_notebook_in_lab(page, lab.base_url, lab.token, path)
    start_run_all(page)
    # while its local cluster is up, the ticker counts it
    page.wait_for_function(f"() => /^1 cluster · /.test(document.querySelector('{STATUS}').innerText.trim())",
                           timeout=180_000)
    screenshot(page, "quickstart-1-cluster-up")
    run = wait_run_done(page, timeout=360, path=path)
    code_cells = page.locator(f"{PANEL} .jp-CodeCell").count()
    assert run.executed == code_cells == 8, run
    assert error_outputs(page) == [], error_outputs(page)
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")
    outputs = page.locator(f"{PANEL} .jp-OutputArea").all_inner_texts()
    assert "Started a local Ray instance" not in "\n".join(outputs)   # nothing ran Ray after `down`
    assert re.search(r"loss [\d.]+ → [\d.]+ after \d+ steps on 2 workers", "\n".join(outputs))
    assert "stopped: local" in cells.nth(8).inner_text()
    page.wait_for_function(f"() => document.querySelector('{STATUS}').innerText.includes('no clusters')",
                           timeout=15_000)
    screenshot(page, "quickstart-2-done")
