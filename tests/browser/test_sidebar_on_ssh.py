"""The sidebar on a cluster of other machines: an ``ssh`` cluster on two hosts of the multi-host lab
(``tests/netlab.py``), started by a kernel that is gone. JupyterLab's server is never part of the
cluster: it shows the cluster's card from the registry and ledger, and Shut down from the sidebar
stops every process of ours on every host over SSH, and the cluster's tunnel here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import netlab
import pytest
from lab import open_notebook_in_lab, put_notebook, screenshot
from test_extension_in_lab import STATUS, dollars

RATE = 7.2     # $/h per host
NAME = "lab-ssh"


@pytest.fixture(scope="module")
def hosts():
    with netlab.fixture(2) as made:
        yield made


def _ours(hosts, record) -> dict[str, list[int]]:
    """The processes on each host but its own sshd, counted by namespace, never by Ray's word."""
    return {h.name: h.strays() for h in hosts.hosts}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sidebar_shows_an_ssh_cluster_and_shuts_it_down_on_every_host(lab, page, hosts, monkeypatch):
    home = Path(lab.env["GPUGEEK_HOME"])
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    import gpugeek_jupyter as gg
    from gpugeek_jupyter.cluster import processes, registry
    from gpugeek_jupyter.meter import costs, ledger

    # a kernel on the "laptop" starts the cluster on the two hosts and goes away
    names = ",".join(f"root@{h.address}" for h in hosts.hosts)
    code = (f"import gpugeek_jupyter as gg; gg.up({NAME!r}, backend='ssh', hosts={names!r}, "
            f"ssh_key={str(hosts.key)!r}, cpus_per_host=1, usd_per_hour={RATE}, pip_index_url={hosts.index_url!r})")
    started = subprocess.run([sys.executable, "-c", code], env={**os.environ, "GPUGEEK_HOME": str(home)},
                             capture_output=True, text=True, timeout=240)
    assert started.returncode == 0, started.stderr[-2000:]
    record = registry.live(NAME)
    try:
        before = _ours(hosts, record)
        assert all(before.values()), f"Ray is not running on every host: {before}"
        assert processes.alive(record.session_id), "the cluster's tunnel is not running"

        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
        open_notebook_in_lab(page, lab.base_url, lab.token, put_notebook(lab, notebook, "ssh/side.ipynb"))
        ticker = r"/^1 cluster · \$[\d.]+ · \$14\.40\/h$/"      # two hosts at $7.20/h
        page.wait_for_function(f"() => {ticker}.test(document.querySelector('{STATUS}').innerText.trim())",
                               timeout=30_000)
        page.locator(STATUS).click()
        card = page.locator(f'#gpugeek-sidebar .gpugeek-cluster[data-name="{NAME}"]')
        card.wait_for()
        assert card.get_attribute("data-state") == "running"
        text = card.inner_text()
        assert "ssh" in text and "2 nodes" in text and "$14.40/h" in text and "orphan" in text, text
        # the card's detail: a metered row for each host, read from the ledger the watchdog keeps
        card.locator("button[aria-expanded]").click()
        table = card.locator(".gpugeek-nodes-table")
        table.wait_for()
        page.wait_for_function(
            "() => document.querySelectorAll('#gpugeek-sidebar .gpugeek-nodes-table tbody tr').length === 2",
            timeout=10_000)
        screenshot(page, "ssh-1-sidebar-card")

        # Shut down from the sidebar: the server reaches every host over SSH and stops what we started
        card.locator(".gpugeek-shutdown").click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for()
        assert NAME in dialog.inner_text()
        dialog.locator("button.jp-mod-accept").click()
        toast = page.locator(".Toastify__toast", has_text="final cost")
        toast.wait_for(timeout=90_000)
        deadline = time.monotonic() + 15
        while any((left := _ours(hosts, record)).values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(left.values()), f"processes of ours left on the hosts: {left}"
        assert not processes.alive(record.session_id), "the tunnel outlived the shut down"
        final = registry.get(record.id)
        assert final.stopped is not None and final.stop_reason == "down (from JupyterLab)"
        # the toast's dollars are the ledger's: each host's lifetime × the rate
        nodes = costs.nodes_frame(record.id)
        assert len(nodes) == 2 and nodes["ended"].notna().all()
        expected = sum((r.ended - r.started) / 3600 * RATE for r in nodes.itertuples())
        assert ledger.spend(record.id) == pytest.approx(expected, rel=1e-9)
        shown = dollars(toast.inner_text())
        assert shown and abs(shown[0] - expected) <= 0.01, toast.inner_text()
        page.wait_for_function(f"() => document.querySelector('{STATUS}').innerText.includes('no clusters')",
                               timeout=10_000)
        screenshot(page, "ssh-2-after-shut-down")
    finally:
        if registry.live(NAME) is not None:
            gg.down(NAME)
