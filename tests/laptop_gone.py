"""For tests where the laptop goes away from a remote cluster: what the head's own watchdog wrote
(read from the head's disk, which this machine reaches as the lab's folder: no network needed),
what a terminal here says, and the tunnel's hold on the head, found by command line."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import psutil

from gpugeek_jupyter.cluster.spec import ClusterSpec


def head_ledger(head, spec: ClusterSpec, name: str) -> tuple[dict, list[dict], list[dict]]:
    """The head watchdog's record of the cluster, its nodes and its events, from its file."""
    db = head.file(spec.remote.guard_home.replace("~", "/root", 1)) / "state.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        cluster = dict(conn.execute("SELECT * FROM clusters WHERE name=? ORDER BY id DESC", (name,)).fetchone())
        nodes = [dict(r) for r in conn.execute("SELECT * FROM nodes WHERE cluster_id=? ORDER BY node_id",
                                               (cluster["id"],))]
        events = [dict(r) for r in conn.execute("SELECT * FROM events WHERE cluster_id=? ORDER BY at",
                                                (cluster["id"],))]
    return cluster, nodes, events


def spend(nodes: list[dict], now: float) -> float:
    """Σ lifetimes × rate, from the nodes' rows."""
    return sum(n["usd_per_hour"] * ((n["ended"] or now) - n["started"]) / 3600 for n in nodes)


def holds(host) -> list[int]:
    """Processes on the host running the tunnel's hold (``sleep`` of ``tunnel.HOLD_S``), found by
    their command line in the host's namespace, whatever their environment."""
    from gpugeek_jupyter.remote.tunnel import HOLD_S

    found = []
    for pid in host.pids():
        try:
            if psutil.Process(pid).cmdline()[-2:] == ["sleep", str(HOLD_S)]:
                found.append(pid)
        except psutil.Error:
            continue
    return found


def terminal(home, *args: str) -> dict:
    """``gpugeek ARGS --json`` from a terminal of this machine (no kernel)."""
    done = subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", *args, "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "GPUGEEK_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def row(seen: dict, name: str) -> dict:
    """One cluster's row of ``gpugeek clusters --json`` (its newest run)."""
    return max((c for c in seen["clusters"] if c["name"] == name), key=lambda c: c["id"])
