"""The laptop's link and the budget cap, on an ``ssh`` cluster on the lab's three hosts: a cell
goes on through a 10 s cut; cut for good, a running cell says so in one line. Then, its kernel
SIGKILLed and the laptop's own watchdog killed, the head's watchdog stops every host at the
cap; once the laptop is back, its ledger is the head's."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from cluster_processes import new_kernel, settings, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.remote import headguard

pytestmark = pytest.mark.slow

RATE = 360.0          # $/h per host: 3 hosts burn 30 cents a second
INTERVAL_S = 1.0      # the watchdogs' metering interval
AHEAD_S = 100.0       # the cap is set this far ahead of the spend when the laptop goes
BLINK_S = 10.0        # a cut the session rides out
LOST_WITHIN_S = 75.0  # a cell says its cluster is out of reach: SSH's keepalive (15 s), Ray Client's grace (30 s)
HELD_S = 60.0         # how long a reader's $ must stay put while the cluster is not heard from
KERNEL = """
import sys, time, gpugeek_jupyter as gg
gg.up('guarded', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour={rate},
      pip_index_url={index!r})
print('up-done', flush=True)
sys.stdin.readline()
print('cell', gg.run("print('working', flush=True)\\nimport time\\ntime.sleep(20)\\n6 * 7", workers=3).shown(),
      flush=True)
sys.stdin.readline()
began = time.monotonic()
try:
    gg.run("print('working', flush=True)\\nimport time\\ntime.sleep(600)", workers=3)
except gg.GpugeekError as exc:
    print(f'after {{time.monotonic() - began:.0f}} s: {{exc}}', flush=True)
time.sleep(600)
"""


def _head_ledger(head, spec: ClusterSpec, name: str) -> tuple[dict, list[dict]]:
    """The head watchdog's own ledger, read from its file on the head's disk (which the laptop
    reaches as the lab's folder: no network needed while the laptop is cut off)."""
    db = head.file(spec.remote["guard_home"].replace("~", "/root", 1)) / "state.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        cluster = dict(conn.execute("SELECT * FROM clusters WHERE name=? ORDER BY id DESC", (name,)).fetchone())
        nodes = [dict(r) for r in conn.execute("SELECT * FROM nodes WHERE cluster_id=? ORDER BY node_id",
                                               (cluster["id"],))]
    return cluster, nodes


def _holds(host) -> list[int]:
    """Processes on the host running the tunnel's hold (``sleep`` of ``tunnel.HOLD_S``), found by
    their command line in the host's namespace, whatever their environment."""
    import psutil

    from gpugeek_jupyter.remote.tunnel import HOLD_S

    found = []
    for pid in host.pids():
        try:
            if psutil.Process(pid).cmdline()[-2:] == ["sleep", str(HOLD_S)]:
                found.append(pid)
        except psutil.Error:
            continue
    return found


def _terminal(home, *args: str) -> dict:
    """``gpugeek ARGS`` from a terminal of this machine (no kernel), its JSON."""
    import json

    done = subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GPUGEEK_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _row(seen: dict, name: str) -> dict:
    return next(c for c in seen["clusters"] if c["name"] == name)


def _spend(nodes: list[dict], now: float) -> float:
    return sum(n["usd_per_hour"] * ((n["ended"] or now) - n["started"]) / 3600 for n in nodes)


def _until(kernel, what: str, timeout: float) -> str:
    """The kernel's next line of output that contains ``what`` (one line per print)."""
    said, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = kernel.stdout.readline()
        if not line:        # the kernel ended
            raise AssertionError(f"{said}\n{kernel.stderr.read()[-3000:]}")
        said.append(line.strip())
        if what in line:
            return line.strip()
    raise AssertionError(f"no {what!r} from the kernel within {timeout} s: {said}")


def test_the_laptops_link_cut_and_the_heads_watchdog_at_the_budget_with_the_laptop_gone(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(hosts=hosts, key=str(lab.key), rate=RATE, index=lab.index_url)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    record = spec = None
    try:
        _until(kernel, "up-done", 180)
        record = registry.live("guarded")
        spec = ClusterSpec.from_json(record.spec)
        assert headguard.guarded(record), "the head's watchdog was not started"
        on_head = [p for p in lab.hosts[0].pids_with(onhost.MARKER, record.marker)]
        assert on_head, "no process of ours on the head"
        wait_until(lambda: headguard.beating(record), 20, "the head watchdog's heartbeat")

        # the network blinks while a cell runs: the cell goes on and answers
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        _until(kernel, "working", 60)
        lab.cut_laptop()
        time.sleep(BLINK_S)              # the blink itself: the link stays cut this long
        lab.reconnect_laptop()
        assert _until(kernel, "cell", 90) == "cell 42"

        # a cap some way ahead, set from this other process (the head is told through the tunnel)
        budget = ledger.spend(record.id) + 3 * RATE * AHEAD_S / 3600
        gg.limits("guarded", budget=budget)
        wait_until(lambda: (headguard.heartbeat(record) or {}).get("budget") == pytest.approx(budget), 10,
                   "the head taking the new cap")
        # the laptop goes: its network (a cell running), its watchdog, then its kernel
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        _until(kernel, "working", 60)
        lab.cut_laptop()
        gone = time.monotonic()
        os.kill(record.watchdog_pid, signal.SIGKILL)
        try:
            lost = _until(kernel, "after", LOST_WITHIN_S + 15)
            print(f"\n{lost}")
            assert "'guarded' does not answer from here" in lost and "run on its head" in lost, lost
            assert int(lost.split()[1]) <= LOST_WITHIN_S
            kernel.send_signal(signal.SIGKILL)
            assert _head_ledger(lab.hosts[0], spec, "guarded")[0]["stopped"] is None, \
                "the cap came before the laptop was gone"
            wait_until(lambda: not any(h.strays(ssh_sessions=False) for h in lab.hosts),
                       AHEAD_S + 30, "every host free of the cluster's processes (by namespace)")
            print(f"\nevery host stopped {time.monotonic() - gone:.1f} s after the laptop went "
                  f"(cap {AHEAD_S:.0f} s of burn ahead)")
            wait_until(lambda: not _holds(lab.hosts[0]), 10, "the tunnel's hold on the head to go with its stop")
            head, head_nodes = _head_ledger(lab.hosts[0], spec, "guarded")
            assert head["stop_reason"] == "budget cap reached", head
            spent = _spend(head_nodes, time.time())
            burn = sum(n["usd_per_hour"] for n in head_nodes)
            print(f"head's ledger: ${spent:.3f} spent against a ${budget:.3f} cap "
                  f"(one interval is ${burn * INTERVAL_S / 3600:.3f})")
            assert len(head_nodes) == 3 and all(n["ended"] for n in head_nodes)
            assert spent <= budget + burn * INTERVAL_S / 3600, "spend passed the cap by more than one interval"

            # the terminal asks while the link is still cut: the last word, its $ held, the head's guard named
            first = _row(_terminal(gpugeek_home, "clusters", "--json"), "guarded")
            print(f"with the link still cut: {first['status']}")
            assert first["state"] == "running" and "last heard from the cluster at" in first["status"], first
            assert f"its own watchdog on the head (pid {first['guard']['pid']} on root@{lab.hosts[0].address}) " \
                   f"enforces the ${budget:,.2f} cap" in first["status"], first["status"]
            assert first["spent_usd"] <= budget
            time.sleep(HELD_S)       # the $ must stay put this long: there is nothing to poll for
            later = _row(_terminal(gpugeek_home, "clusters", "--json"), "guarded")
            assert later["spent_usd"] == first["spent_usd"], f"the $ grew while unheard: {first} → {later}"
        finally:
            lab.reconnect_laptop()

        # the laptop is back, no kernel running: the terminal asks first, and gets the head's word
        began = time.monotonic()
        row = _row(_terminal(gpugeek_home, "clusters", "--json"), "guarded")
        print(f"the terminal's first `gpugeek clusters`, the head's ledger copied over SSH: "
              f"{time.monotonic() - began:.1f} s; ${row['spent_usd']:.3f} against the head's ${spent:.3f}")
        assert time.monotonic() - began < 30
        assert row["state"] == "stopped" and row["stop_reason"] == "budget cap reached", row
        assert row["spent_usd"] == pytest.approx(spent, rel=0.01)
        folder = lab.hosts[0].file(spec.remote["token_path"].replace("~", "/root", 1)).parent
        assert not folder.exists(), "the head kept the stopped cluster's folder after its ledger was copied"
        assert _terminal(gpugeek_home, "cost", "guarded", "--json")["total_usd"] == pytest.approx(spent, rel=0.01)
        said = new_kernel("import gpugeek_jupyter as gg\ns = gg.status('guarded')\nprint(s.phase.value, s.spend_usd)",
                          gpugeek_home)
        phase, usd = said.stdout.split()[-2:]
        assert phase == "stopped" and float(usd) == pytest.approx(spent, rel=0.01), said.stdout + said.stderr
        # then this kernel's own cost: the same dollars, to the cent
        report = gg.cost("guarded")
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
            shutil.rmtree(lab.hosts[0].file(spec.remote["token_path"].replace("~", "/root", 1)).parent,
                          ignore_errors=True)
