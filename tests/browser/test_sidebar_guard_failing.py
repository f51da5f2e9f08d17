"""The sidebar while a cluster's watchdog cannot see it: a local cluster's real watchdog given each
fault in turn (``tests/faulty_watchdog.py``: the registry unreadable, a ledger write refused, Ray's
GCS not answering, the node reader raising). After 3 failed looks the card is marked unwatched and
its status says the watchdog is failing and why; once the fault goes, the card is itself again.
(The money-safe stop each fault leads to: tests/test_guard_failing.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from cluster_processes import settings, wait_until
from lab import open_notebook_in_lab, put_notebook, screenshot
from test_extension_in_lab import STATUS

FAULTY = Path(__file__).resolve().parent.parent / "faulty_watchdog.py"
CARD = '#gpugeek-sidebar .gpugeek-cluster[data-name="faulty"]'
FAULTS = {"registry": "unable to open database file", "ledger-write": "disk I/O error",
          "gcs": "connection refused", "reader": "the node reader broke"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_card_says_the_watchdog_is_failing_for_each_fault(lab, page, monkeypatch, tmp_path):
    home = Path(lab.env["GPUGEEK_HOME"])
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    import gpugeek_jupyter as gg
    from gpugeek_jupyter.cluster import processes, registry
    from gpugeek_jupyter.kernel import connection

    settings(home, meter_interval_s=0.5)
    gg.up("faulty")
    record = registry.live("faulty")
    connection.disconnect(record)
    processes.stop_processes([p for p in processes.session_processes(
        record.watchdog_pid, record.created, record.marker) if p.pid == record.watchdog_pid], grace=2)
    switch = tmp_path / "fault"
    with open(tmp_path / "watchdog.log", "w") as out:
        proc = subprocess.Popen([sys.executable, str(FAULTY), "any", str(switch), str(record.id)],
                                env={**os.environ, "GPUGEEK_HOME": str(home)}, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        registry.update(record.id, watchdog_pid=proc.pid)
        wait_until(switch.with_suffix(".seen").exists, 30, "the watchdog's first look")
        open_notebook_in_lab(page, lab.base_url, lab.token,
                             put_notebook(lab, nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")]),
                                          "faults/sidebar.ipynb"))
        page.locator(STATUS).click()
        card = page.locator(CARD)
        card.wait_for()
        status, guard = card.locator(".gpugeek-cluster-status"), card.locator(".gpugeek-cluster-guard")
        assert "gpugeek-mod-unwatched" not in card.get_attribute("class")
        assert f"guarded by this machine's watchdog (pid {proc.pid}," in guard.inner_text(), guard.inner_text()
        for fault, error in FAULTS.items():
            switch.write_text(fault)
            page.wait_for_function(
                "([card, error]) => { const c = document.querySelector(card);"
                " return c.classList.contains('gpugeek-mod-unwatched')"
                " && c.querySelector('.gpugeek-cluster-status').innerText.includes(error); }",
                arg=[CARD, error], timeout=20_000)
            said = status.inner_text()
            print(f"\n{fault}: {said}")
            assert "failing: " in said, said
            screenshot(page, f"sidebar-guard-failing-{fault}")
            switch.unlink()
            page.wait_for_function(
                "card => !document.querySelector(card).classList.contains('gpugeek-mod-unwatched')",
                arg=CARD, timeout=20_000)
    finally:
        (home / "config.toml").unlink(missing_ok=True)
        gg.down("faulty")
        proc.wait(timeout=30)
