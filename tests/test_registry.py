"""The registry and ledger database: atomic writes, even when the writer is killed mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

from cluster_processes import wait_until

from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.raynodes import RayNode
from gpugeek_jupyter.vocab import NodePrice

WRITER = """
import sys, time
from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import ledger
record = registry.create("w", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
print(record.id, flush=True)
i = 0
while True:   # each transaction writes a job and its event: both or neither
    with store.transaction() as db:
        db.execute("INSERT INTO jobs (cluster_id, job_id, name, started) VALUES (?,?,?,?)",
                   (record.id, f"j{i}", "x" * 5000, time.time()))
        db.execute("INSERT INTO events (cluster_id, at, kind, message) VALUES (?,?,?,?)",
                   (record.id, time.time(), "job", "y" * 5000))
    i += 1
"""


def test_a_writer_killed_mid_write_loses_nothing_committed(gpugeek_home):
    proc = subprocess.Popen([sys.executable, "-c", WRITER], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    cluster_id = int(proc.stdout.readline())

    def committed() -> int:
        with sqlite3.connect(store.path()) as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE cluster_id=?", (cluster_id,)).fetchone()[0]
    wait_until(lambda: committed() >= 50, 30, "the writer to commit 50 jobs")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(store.path()) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    jobs = store.query("SELECT COUNT(*) FROM jobs WHERE cluster_id=?", (cluster_id,))[0][0]
    events = store.query("SELECT COUNT(*) FROM events WHERE cluster_id=?", (cluster_id,))[0][0]
    assert jobs > 10 and jobs == events, (jobs, events)
    assert registry.get(cluster_id).name == "w"


def test_state_dir_and_database_are_private(gpugeek_home):
    store.connect()
    assert (gpugeek_home.stat().st_mode & 0o777) == 0o700
    assert (store.path().stat().st_mode & 0o777) == 0o600


def _node(node_id, started, ended=None, gpus=8.0, node_type="a100x8-spot"):
    return RayNode(node_id=node_id, node_type=node_type, alive=ended is None, is_head=False,
                   started=started, ended=ended, idle_s=None, raylet_socket="",
                   resources={"GPU": gpus})


def test_ledger_prices_lifetimes_jobs_and_spot_savings():
    record = registry.create("l", "sim", {}, simulated=True, budget_usd=None, idle_minutes=None)
    prices = {"a100x8-spot": NodePrice("o", "spot", 3.0, 30.0),
              "a100x8-on-demand": NodePrice("o", "on-demand", 30.0, 30.0)}
    t0 = 1_000_000.0
    ledger.sync_nodes(record.id, [_node("a", t0), _node("b", t0)], prices)
    ledger.end_node(record.id, "a", t0 + 1800, "preempted")                 # half an hour of spot
    ledger.sync_nodes(record.id, [_node("a", t0, ended=t0 + 1900)], prices)  # Ray's later verdict loses
    ledger.sync_nodes(record.id, [_node("c", t0 + 1800, node_type="a100x8-on-demand")], prices)
    ledger.job_started(record.id, "j1", "train", at=t0 + 1800)
    ledger.job_ended(record.id, "j1", at=t0 + 3600)
    now = t0 + 3600
    nodes = costs.nodes_frame(record.id, now).set_index("node_id")
    assert nodes.loc["a", "end_reason"] == "preempted" and nodes.loc["a", "usd"] == 1.5
    assert nodes.loc["b", "usd"] == 3.0 and nodes.loc["c", "usd"] == 15.0
    assert ledger.spend(record.id, now) == 19.5
    assert ledger.burn_rate(record.id) == 33.0                  # b (spot) + c (on-demand) alive
    by_pricing = costs.cost_table(record.id, "pricing", now).set_index("pricing")
    assert by_pricing.loc["spot", "spot_saved_usd"] == (30 - 3) * 1.5
    by_job = costs.cost_table(record.id, "job", now)
    assert by_job.loc[0, "usd"] == 3.0 * 0.5 + 30.0 * 0.5        # b and c during the job's half hour



def test_spend_is_one_formula_the_ledger_the_tables_and_the_sidebar_agree():
    """``ledger.node_usd`` is the one formula of a node's dollars: the ledger's spend, the node
    table, and the server's summary and detail (status bar, sidebar) agree to the cent, and no
    other module multiplies a node's rate by its lifetime (a projection — $/day at this rate, an
    offer's cost for the same work — is not spend)."""
    import re
    from pathlib import Path

    from gpugeek_jupyter.guard import board

    record = registry.create("one", "sim", {}, simulated=True, budget_usd=None, idle_minutes=None)
    prices = {"a100x8-spot": NodePrice("o", "spot", 3.0, 30.0)}
    t0 = 1_000_000.0
    ledger.sync_nodes(record.id, [_node("a", t0), _node("b", t0 + 60)], prices)
    ledger.end_node(record.id, "a", t0 + 1234, "preempted")
    now = t0 + 4321
    spent = ledger.spend(record.id, now)
    assert spent > 0
    assert costs.nodes_frame(record.id, now)["usd"].sum() == spent
    assert board._money([record.id], now)[record.id]["spent_usd"] == spent
    assert sum(r["usd"] for r in board.detail("one", now)["node_rows"]) == spent
    package = Path(ledger.__file__).resolve().parent.parent
    elsewhere = [f"{p.relative_to(package)}:{i}" for p in sorted(package.rglob("*.py")) if p.name != "ledger.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if "usd_per_hour" in line and "*" in line and re.search(r"ended|started|3600|\[\"hours\"\]", line)]
    assert not elsewhere, f"a node's dollars computed outside meter/ledger.py: {elsewhere}"

def test_what_a_running_cluster_learns_is_merged_into_its_spec_keeping_another_writers_keys():
    """A reopened tunnel's line (the watchdog's process) goes in beside what the kernel wrote of
    the rest of the spec after both read it: neither write loses the other's key."""
    record = registry.create("merge", "ssh", {"remote": {"hosts": ["root@10.0.0.1"]}}, simulated=False,
                             budget_usd=None, idle_minutes=None)
    read_by_kernel = registry.get(record.id).spec
    registry.update(record.id, spec={**read_by_kernel, "remote": {**read_by_kernel["remote"], "guard_pid": 7}})
    registry.update(record.id, session_id=42, remote={"line_address": "127.0.0.1:5000"})
    got = registry.get(record.id)
    assert got.spec["remote"] == {"hosts": ["root@10.0.0.1"], "guard_pid": 7, "line_address": "127.0.0.1:5000"}
    assert got.session_id == 42


def test_overlapping_jobs_share_the_cluster_cost():
    record = registry.create("j", "sim", {}, simulated=True, budget_usd=None, idle_minutes=None)
    t0 = 2_000_000.0
    ledger.sync_nodes(record.id, [_node("a", t0, node_type="x")], {"x": NodePrice("o", "on-demand", 10.0)})
    ledger.job_started(record.id, "j1", "one", at=t0)
    ledger.job_started(record.id, "j2", "two", at=t0 + 1800)
    ledger.job_ended(record.id, "j1", at=t0 + 3600)
    ledger.job_ended(record.id, "j2", at=t0 + 3600)
    by_job = costs.cost_table(record.id, "job", t0 + 3600).set_index("job_id")
    assert by_job.loc["j1", "usd"] == 5.0 + 2.5 and by_job.loc["j2", "usd"] == 2.5
    assert by_job["usd"].sum() == ledger.spend(record.id, t0 + 3600)


def test_a_cluster_whose_up_died_half_way_is_failed_not_starting(gpugeek_home):
    """A record its ``up`` never marked ready is starting while the kernel that runs ``up`` lives;
    once that kernel is gone (killed, its machine off) it is failed, and says what to do — not
    "starting" for ten minutes, which would keep the sidebar from stopping what may be billing."""
    import socket

    from gpugeek_jupyter.guard.lifecycle import phase_of, state_of
    from gpugeek_jupyter.vocab import ClusterPhase

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = registry.create("up-here", "aws", {}, simulated=False, budget_usd=None, idle_minutes=None,
                            started_by=f"{socket.gethostname()}:{os.getpid()}")
    died = registry.create("up-died", "aws", {}, simulated=False, budget_usd=None, idle_minutes=None,
                           started_by=f"{socket.gethostname()}:{gone.pid}")
    assert phase_of(alive) is ClusterPhase.STARTING
    assert phase_of(died) is ClusterPhase.FAILED
    said = state_of(died).describe("up-died")
    assert said.startswith("failed: its `up` ended half-way") and "`%gpugeek down up-died`" in said, said
    registry.update(died.id, ready=died.created + 1)      # an `up` that finished: its kernel may go
    assert phase_of(registry.get(died.id)) is ClusterPhase.RUNNING
