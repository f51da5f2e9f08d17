"""A watchdog that cannot see its cluster says so, and still holds the budget — on a real local
cluster, its real watchdog process given one fault at a time (``faulty_watchdog.py``).

For each fault: after 3 failed looks the failing state is an event, in status and the board
(the sidebar's and the terminal's source) and in the metrics; and the cluster is stopped when the
last known burn would reach the cap — checked from outside, by when the head's processes ended
against Ray's own record of when the head started, at the configured $/h.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_processes import of_cluster, settings, still_running, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.guard import board, health
from gpugeek_jupyter.kernel import connection
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.raynodes import use_token_auth
from gpugeek_jupyter.server import metrics

pytestmark = pytest.mark.slow

USD_PER_S = 10.0            # $36,000/h
INTERVAL_S = 0.5
AHEAD_S = 20.0              # the budget is set this far ahead of the spend when the fault begins: past the
                            # three failed looks that say "failing", even on a loaded machine (9 s was not)
FAULTY = Path(__file__).resolve().parent / "faulty_watchdog.py"


def _head_started(address: str) -> float:
    """When Ray's node table says the head started (not the ledger's word)."""
    from ray._raylet import GcsClient

    use_token_auth()   # our clusters require Ray's token; this only switches Ray's client to send it
    return min(info.start_time_ms for info in GcsClient(address=address).get_all_node_info(timeout=5).values()) / 1000


@pytest.mark.parametrize("fault", ["registry", "ledger-write", "gcs", "reader"])
def test_a_failing_watchdog_says_so_and_stops_at_the_projected_moment(gpugeek_home, tmp_path, fault):
    settings(gpugeek_home, local_usd_per_hour=USD_PER_S * 3600, meter_interval_s=INTERVAL_S)
    name = f"f-{fault}"
    gg.up(name)
    record = registry.live(name)
    connection.disconnect(record)        # no kernel attached: the stop does not wait for one to let go
    started = _head_started(record.address)
    processes.stop_processes([p for p in processes.session_processes(
        record.watchdog_pid, record.created, record.marker) if p.pid == record.watchdog_pid], grace=2)
    switch, log = tmp_path / "fault", tmp_path / "watchdog.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(FAULTY), fault, str(switch), str(record.id)],
                                env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)}, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        registry.update(record.id, watchdog_pid=proc.pid)
        wait_until(switch.with_suffix(".seen").exists, 30, "the watchdog's first look")
        budget = ledger.spend(record.id) + USD_PER_S * AHEAD_S
        registry.update(record.id, budget_usd=budget)
        time.sleep(2 * INTERVAL_S)      # a look with the budget in it
        switch.touch()
        on = time.time()
        # three failed looks at 0.5 s: about 2 s alone, up to 10 s and more with the lab suite beside it
        state = wait_until(lambda: health.failing(record.id), 20, "the failing state")
        said = time.time() - on
        assert state["looks"] >= 3 and state["budget"] == pytest.approx(budget)
        assert wait_until(lambda: ledger.events(record.id, "guard-failing"), 5, "the event")
        row = next(c for c in board.overview()["clusters"] if c["name"] == name)
        assert "failing: " in row["status"] and row["guard_failing"]["looks"] >= 3, row["status"]
        assert "its watchdog is failing" in gg.status(name).state
        scraped = metrics.scrape().decode()
        assert f'gpugeek_guard_failing{{backend="local",cluster="{name}"}}' in scraped

        def head_gone():   # counted from /proc by the head's session, whatever marker a process carries
            return not [pid for pid in still_running(of_cluster(record)) if pid != proc.pid]
        wait_until(head_gone, AHEAD_S + 30, "the money-safe stop")
        died = time.time()
        measured = USD_PER_S * (died - started)
        print(f"\n{fault}: said after {said:.1f} s; budget ${budget:.2f}, measured ${measured:.2f} "
              f"(one interval = ${USD_PER_S * INTERVAL_S:.2f})")
        # the stop is meant for the last look before the cap (the next look plus 1 s to stop the
        # nodes would pass it): no earlier than that and one more interval, no later than 2
        # intervals past the cap
        assert budget - USD_PER_S * (INTERVAL_S + 1.0 + INTERVAL_S) <= measured, "the stop came early"
        assert measured <= budget + USD_PER_S * 2 * INTERVAL_S, "the stop came late"
        proc.wait(timeout=30)
        final = registry.get(record.id)
        assert final.stopped and final.stop_reason.startswith("budget cap reached"), final.stop_reason
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        said_there = [line for line in log.read_text().splitlines() if line.startswith("watchdog")]
        print("the watchdog said:\n" + "\n".join(said_there))
        if registry.get(record.id).stopped is None:
            gg.down(name)
    assert not still_running(of_cluster(record)), "a process of its sessions outlived the stop (counted from /proc)"
