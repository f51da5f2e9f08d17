"""A remote cluster this machine has not heard from: its dollars stop at its last word, every
reader says since when and who guards it, and ``down --forget`` closes a record whose machines are
gone. (On the lab, with a real head: tests/lab/test_head_guard.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.guard import board
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.raynodes import RayNode
from gpugeek_jupyter.vocab import NodePrice

RATE = 36.0   # $/h a node: a cent a second


def _remote(name: str, heard_ago: float, guard: dict | None = None, budget: float | None = 50.0):
    now = time.time()
    record = registry.create(name, "ssh", ClusterSpec("ssh").to_json(), simulated=False, budget_usd=budget,
                             idle_minutes=None)
    registry.update(record.id, address="127.0.0.1:1", ready=now - 1000)
    nodes = [RayNode(f"{i:02d}" * 14, "host", True, i == 0, now - 1000, None, None, "", {"CPU": 1.0})
             for i in range(3)]
    ledger.sync_nodes(record.id, nodes, {"host": NodePrice("", "on-demand", RATE, RATE)})
    registry.heard_from(record.id, now - heard_ago, guard)
    return registry.get(record.id), now


def _row(name: str, now: float) -> dict:
    return next(c for c in board.overview(now)["clusters"] if c["name"] == name)


def test_a_cluster_not_heard_from_is_counted_to_its_last_word_and_says_so(gpugeek_home):
    head = {"by": "head", "pid": 4242, "host": "root@10.0.0.1", "beat": time.time() - 120}
    _, now = _remote("quiet", heard_ago=120, guard=head)
    to_heard = 3 * RATE * (1000 - 120) / 3600
    row = _row("quiet", now)
    assert row["spent_usd"] == pytest.approx(to_heard, rel=1e-6)
    assert _row("quiet", now + 60)["spent_usd"] == pytest.approx(to_heard, rel=1e-6), "the $ grew unheard"
    said = row["status"]
    assert "last heard from the cluster at" in said and f"${to_heard:,.2f} then (an estimate" in said, said
    assert "its own watchdog on the head (pid 4242 on root@10.0.0.1) enforces the $50.00 cap" in said, said
    assert "not enforced" not in said
    assert row["guard_by"] == "head" and row["guarded_by"] == \
        "the head's watchdog (pid 4242 on root@10.0.0.1, heartbeat 2m00s ago)", row["guarded_by"]
    unreachable = _row("quiet", now + settings().unreachable_after_s + 1)["status"]
    assert "unreachable since" in unreachable and "if its head still runs, its own watchdog on the head" in unreachable
    assert row["unheard_since"] == pytest.approx(now - 120)
    _remote("heard", heard_ago=1)
    assert _row("heard", now)["unheard_since"] is None and "last heard" not in _row("heard", now)["status"]


def test_down_forget_closes_the_record_at_its_last_word_and_the_terminal_offers_it(gpugeek_home):
    record, now = _remote("gone", heard_ago=300)
    done = subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", "down", "gone", "--forget"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "forgot 'gone'" in done.stdout
    closed = registry.get(record.id)
    assert closed.stopped == pytest.approx(now - 300, abs=1) and closed.stop_reason.startswith("forgotten")
    frame = costs.nodes_frame(record.id)
    assert (frame["ended"] == closed.stopped).all(), "a node ended later than its cluster was last heard from"
    cost = json.loads(subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", "cost", "gone", "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)
    assert cost["total_usd"] == pytest.approx(3 * RATE * (1000 - 300) / 3600, rel=1e-6)
    assert [e["kind"] for e in ledger.events(record.id)][-1] == "forget"
    local = registry.create("here", "local", ClusterSpec("local").to_json(), simulated=False, budget_usd=None,
                            idle_minutes=None)
    refused = subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", "down", "here", "--forget"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "runs here" in refused.stderr and registry.get(local.id).live
