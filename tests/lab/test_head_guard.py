"""The budget cap holds with the laptop gone: an ``ssh`` cluster on the lab's three hosts, its
kernel SIGKILLed, the laptop's own watchdog killed and the laptop cut off the network. The head's
watchdog stops every host at the cap; once the laptop is back, its ledger is the head's."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_processes import settings, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import headguard, onhost, processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.meter import ledger

pytestmark = pytest.mark.slow

RATE = 360.0          # $/h per host: 3 hosts burn 30 cents a second
INTERVAL_S = 1.0      # the watchdogs' metering interval
AHEAD_S = 20.0        # the cap is set this far ahead of the spend when the laptop goes


def _head_ledger(spec: ClusterSpec, name: str) -> tuple[dict, list[dict]]:
    """The head watchdog's own ledger, read from its file (the lab's hosts share this machine's
    disk; its root's home is this one's)."""
    db = Path(os.path.expanduser(spec.remote["guard_home"])) / "state.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        cluster = dict(conn.execute("SELECT * FROM clusters WHERE name=? ORDER BY id DESC", (name,)).fetchone())
        nodes = [dict(r) for r in conn.execute("SELECT * FROM nodes WHERE cluster_id=? ORDER BY node_id",
                                               (cluster["id"],))]
    return cluster, nodes


def _spend(nodes: list[dict], now: float) -> float:
    return sum(n["usd_per_hour"] * ((n["ended"] or now) - n["started"]) / 3600 for n in nodes)


def test_the_heads_watchdog_stops_every_host_at_the_budget_with_the_laptop_gone(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    names = ",".join(f"root@{h.address}" for h in lab.hosts)
    kernel = subprocess.Popen(
        [sys.executable, "-c", "import time, gpugeek_jupyter as gg\n"
         f"gg.up('guarded', backend='ssh', hosts={names!r}, ssh_key={str(lab.key)!r}, cpus_per_host=1, "
         f"usd_per_hour={RATE})\nprint('ready', flush=True)\ntime.sleep(600)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    record = spec = None
    try:
        said = []
        while not said or said[-1] != "ready":
            line = kernel.stdout.readline()
            if not line:        # the kernel ended before its cluster was up
                raise AssertionError(f"{said}\n{kernel.stderr.read()[-3000:]}")
            said.append(line.strip())
        record = registry.live("guarded")
        spec = ClusterSpec.from_json(record.spec)
        assert headguard.guarded(record), "the head's watchdog was not started"
        on_head = [p for p in lab.hosts[0].pids_with(onhost.MARKER, record.marker)]
        assert on_head, "no process of ours on the head"
        wait_until(lambda: headguard.beating(record), 20, "the head watchdog's heartbeat")

        # a cap 20 s of burn ahead, set from this other process (the head is told through the tunnel)
        budget = ledger.spend(record.id) + 3 * RATE * AHEAD_S / 3600
        gg.limits("guarded", budget=budget)
        wait_until(lambda: (headguard.heartbeat(record) or {}).get("budget") == pytest.approx(budget), 10,
                   "the head taking the new cap")
        # the laptop goes: its kernel, its watchdog, its network
        kernel.send_signal(signal.SIGKILL)
        os.kill(record.watchdog_pid, signal.SIGKILL)
        lab.cut_laptop()
        gone = time.monotonic()
        try:
            wait_until(lambda: not any(h.pids_with(onhost.MARKER, record.marker) for h in lab.hosts),
                       AHEAD_S + 45, "every host free of the cluster's processes")
            print(f"\nevery host stopped {time.monotonic() - gone:.1f} s after the laptop went "
                  f"(cap {AHEAD_S:.0f} s of burn ahead)")
            head, head_nodes = _head_ledger(spec, "guarded")
            assert head["stop_reason"] == "budget cap reached", head
            spent = _spend(head_nodes, time.time())
            burn = sum(n["usd_per_hour"] for n in head_nodes)
            print(f"head's ledger: ${spent:.3f} spent against a ${budget:.3f} cap "
                  f"(one interval is ${burn * INTERVAL_S / 3600:.3f})")
            assert len(head_nodes) == 3 and all(n["ended"] for n in head_nodes)
            assert spent <= budget + burn * INTERVAL_S / 3600, "spend passed the cap by more than one interval"
            assert registry.get(record.id).stopped is None, "the laptop could not have known yet"
        finally:
            lab.reconnect_laptop()

        # the laptop is back: whatever asks first (here: cost) copies the head's ledger
        began = time.monotonic()
        report = gg.cost("guarded")
        print(f"the laptop's cost, with the head's ledger copied over SSH: {time.monotonic() - began:.1f} s")
        assert time.monotonic() - began < 15, "the laptop waited on a GCS that is gone"
        mine = registry.get(record.id)
        assert mine.stopped == pytest.approx(head["stopped"]) and mine.stop_reason == "budget cap reached"
        local = ledger.nodes_frame(record.id).sort_values("node_id")
        assert [(r.node_id, r.started, r.ended, r.usd_per_hour) for r in local.itertuples()] == \
            [(n["node_id"], n["started"], n["ended"], n["usd_per_hour"]) for n in head_nodes]
        assert report.total_usd == pytest.approx(spent, rel=1e-9), "the laptop's dollars are not the head's"
        assert any(e["kind"] == "budget-stop" for e in ledger.events(record.id))
        assert not processes.alive(record.session_id), "the tunnel outlived the cluster"
    finally:
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
        if record is not None and registry.get(record.id).stopped is None:
            lab.reconnect_laptop()
            gg.down("guarded")
        if spec is not None:
            shutil.rmtree(Path(os.path.expanduser(spec.remote["token_path"])).parent, ignore_errors=True)
