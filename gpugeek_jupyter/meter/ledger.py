"""The ledger: node lifetimes and jobs, each with its price, and the sums every $ shown comes from.

A node row is written when Ray first reports the node (start time from Ray) and closed once:
by Ray's own end time, by a preemption, or when we stop the cluster. A rented cluster's rows are
its instances instead, from launch to the end of billing as its provider records them
(``instances.py``). Its price is fixed when it
is written — the offer's $/h under the pricing model the node was bought with — so a later
catalog change never rewrites what a past run cost. Cost = Σ $/h × hours alive.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .. import store
from ..raynodes import RayNode
from ..vocab import UNPRICED, NodePrice

if TYPE_CHECKING:  # pandas loads with the first table: the watchdog and the server need none
    import pandas as pd



def node_hours(until: str = "?", table: str = "", at: str | None = None) -> str:
    """SQL: a node's hours, an open one counting up to ``until`` (an SQL expression); with ``at``,
    its hours by that moment (a point of the cost chart's curve)."""
    end = f"COALESCE({table}ended, {until})"
    return f"MAX(0.0, {f'MIN({end}, {at})' if at else end} - {table}started) / 3600.0"


def node_usd(until: str = "?", table: str = "", at: str | None = None, rate: str | None = None) -> str:
    """SQL: a node's dollars so far — the one formula of spend: Σ of it over a cluster's nodes is
    what the ledger, the events, the status bar, the sidebar, ``status``, the tables and the cost
    chart show. ``at`` and ``rate``: by an earlier moment, at another $/h (``spend_curve``)."""
    return f"{rate or table + 'usd_per_hour'} * {node_hours(until, table, at)}"


# a cluster's $ so far (the time open nodes count up to, the cluster): ``spend``, and each event's $
_SPEND = f"SELECT COALESCE(SUM({node_usd()}), 0) FROM nodes WHERE cluster_id=?"


def sync_nodes(cluster_id: int, nodes: Iterable[RayNode], prices: Mapping[str, NodePrice]) -> int:
    """Record nodes Ray reports for the first time and close those Ray reports dead.

    ``prices`` maps an autoscaler node type to its price; ``"head"`` prices a head node that has
    no node type. Returns how many rows changed. Safe to call from several processes at once.
    """
    changed = 0
    with store.transaction() as db:
        for node in nodes:
            price = prices.get(node.node_type) or (prices.get("head") if node.is_head else None)
            price = price or UNPRICED
            node_type = node.node_type or ("head" if node.is_head else "unknown")
            cur = db.execute(
                "INSERT OR IGNORE INTO nodes (cluster_id, node_id, node_type, offer_id, pricing,"
                " usd_per_hour, on_demand_usd_per_hour, gpus, started) VALUES (?,?,?,?,?,?,?,?,?)",
                (cluster_id, node.node_id, node_type, price.offer_id, price.pricing,
                 price.usd_per_hour, price.on_demand_usd_per_hour, node.gpus, node.started),
            )
            changed += cur.rowcount
            if not node.alive and node.ended is not None:
                cur = db.execute(
                    "UPDATE nodes SET ended=?, end_reason=? WHERE cluster_id=? AND node_id=?"
                    " AND ended IS NULL",
                    (max(node.ended, node.started), node.death_reason or "removed",
                     cluster_id, node.node_id),
                )
                changed += cur.rowcount
    return changed


def end_node(cluster_id: int, node_id: str, at: float, reason: str) -> None:
    with store.transaction() as db:
        db.execute(
            "UPDATE nodes SET ended=MAX(?, started), end_reason=? WHERE cluster_id=? AND node_id=?"
            " AND ended IS NULL",
            (at, reason, cluster_id, node_id),
        )


def end_all_nodes(cluster_id: int, at: float, reason: str) -> None:
    """The cluster stopped: every node still open ends now."""
    with store.transaction() as db:
        db.execute(
            "UPDATE nodes SET ended=MAX(?, started), end_reason=? WHERE cluster_id=? AND ended IS NULL",
            (at, reason, cluster_id),
        )


def adopt(cluster_id: int, nodes: Iterable[Mapping], events: Iterable[Mapping]) -> None:
    """Another ledger's account of the cluster made this one's — the head watchdog's
    (``remote/headguard.py``): its node rows replace these (the same nodes, read from the same
    Ray, but closed where the head closed them) — save a row closed here that it still has open
    (a head ended before it could close it, a requeued Slurm job's earlier run: this ledger knew
    more) — and its events not yet here are added, unshown (a budget warning only if none was
    given here: both watchdogs warn)."""
    columns = ("node_id", "node_type", "offer_id", "pricing", "usd_per_hour", "on_demand_usd_per_hour", "gpus",
               "started", "ended", "end_reason")
    kept = {"ended": "COALESCE(excluded.ended, nodes.ended)",
            "end_reason": "CASE WHEN excluded.ended IS NULL THEN nodes.end_reason ELSE excluded.end_reason END"}
    updates = ", ".join(f"{c}={kept.get(c, f'excluded.{c}')}" for c in columns if c != "node_id")
    with store.transaction() as db:
        db.executemany(f"INSERT INTO nodes (cluster_id, {', '.join(columns)}) VALUES (?{',?' * len(columns)})"
                       f" ON CONFLICT(cluster_id, node_id) DO UPDATE SET {updates}",
                       [(cluster_id, *(n.get(c) for c in columns)) for n in nodes])
        have = {(round(r[0], 3), r[1]) for r in db.execute("SELECT at, kind FROM events WHERE cluster_id=?",
                                                            (cluster_id,))}
        if any(kind == "budget-warning" for _, kind in have):
            events = [e for e in events if e["kind"] != "budget-warning"]
        columns = ("at", "kind", "message", "user", "client", "host", "options", "usd")
        db.executemany(f"INSERT INTO events (cluster_id, {', '.join(columns)}) VALUES (?{',?' * len(columns)})",
                       [(cluster_id, *(e.get(c) for c in columns)) for e in events
                        if (round(e["at"], 3), e["kind"]) not in have])


# -- jobs ---------------------------------------------------------------------------------------

def job_started(cluster_id: int, job_id: str, name: str, at: float | None = None,
                workers: int | None = None, nodes: int | None = None, options: Mapping | None = None) -> None:
    """The job's row, and its "run-start" event with the run's ``options`` (one write that does
    not wait for the disk: every cell makes one)."""
    at = at or time.time()
    with store.transaction(durable=False) as db:
        db.execute(
            "INSERT INTO jobs (cluster_id, job_id, name, started, workers, nodes) VALUES (?,?,?,?,?,?)",
            (cluster_id, job_id, name, at, workers, nodes),
        )
        event(cluster_id, "run-start", f"{name} ({job_id})", at, {**(options or {}), "job": job_id}, db=db)


def job_ended(cluster_id: int, job_id: str, status: str = "finished", at: float | None = None) -> None:
    at = at or time.time()
    with store.transaction(durable=False) as db:
        ended = db.execute(
            "UPDATE jobs SET ended=?, status=? WHERE cluster_id=? AND job_id=? AND ended IS NULL RETURNING name",
            (at, status, cluster_id, job_id),
        ).fetchone()
        if ended is not None:
            event(cluster_id, "run-end", f"{ended['name']} ({job_id}) {status}", at,
                  {"job": job_id, "status": status}, db=db)


def stop_running_jobs(cluster_id: int, status: str, at: float | None = None) -> int:
    at = at or time.time()
    with store.transaction() as db:
        ended = db.execute(
            "UPDATE jobs SET ended=?, status=? WHERE cluster_id=? AND ended IS NULL RETURNING job_id, name",
            (at, status, cluster_id),
        ).fetchall()
        for job in ended:
            event(cluster_id, "run-end", f"{job['name']} ({job['job_id']}) {status}", at,
                  {"job": job["job_id"], "status": status}, db=db)
        return len(ended)


def running_jobs(cluster_id: int) -> int:
    return store.query(
        "SELECT COUNT(*) FROM jobs WHERE cluster_id=? AND ended IS NULL", (cluster_id,))[0][0]


def last_job_end(cluster_id: int) -> float | None:
    return store.query("SELECT MAX(ended) FROM jobs WHERE cluster_id=?", (cluster_id,))[0][0]


def job_placed(cluster_id: int, job_id: str, nodes: int) -> None:
    """How many nodes the job's workers run on, once its group is built."""
    with store.transaction(durable=False) as db:
        db.execute("UPDATE jobs SET nodes=? WHERE cluster_id=? AND job_id=?", (nodes, cluster_id, job_id))


def job_preempted(cluster_id: int, job_id: str) -> None:
    """The job stopped on a preemption notice, checkpointed, to resume elsewhere (not a failure)."""
    with store.transaction() as db:
        db.execute("UPDATE jobs SET preemptions=COALESCE(preemptions, 0)+1 WHERE cluster_id=? AND job_id=?",
                   (cluster_id, job_id))


def jobs_of(cluster_id: int) -> list[dict]:
    """Every job of a cluster, oldest first."""
    return [dict(r) for r in store.query(
        "SELECT * FROM jobs WHERE cluster_id=? ORDER BY started, job_id", (cluster_id,))]


def job_status(cluster_id: int, job_id: str) -> str | None:
    rows = store.query("SELECT status FROM jobs WHERE cluster_id=? AND job_id=?", (cluster_id, job_id))
    return rows[0][0] if rows else None


def running_job_starts(cluster_id: int) -> dict[str, float]:
    """The jobs running now: {name: when it started}."""
    return {r["name"]: r["started"] for r in store.query(
        "SELECT name, started FROM jobs WHERE cluster_id=? AND ended IS NULL ORDER BY started", (cluster_id,))}


def record_samples(cluster_id: int, job_id: str, samples: Iterable[dict]) -> int:
    """Workers' reports (≤ 1 Hz each): step, loss, samples/s, tokens/s, memory, GPU %."""
    import json

    rows = [(cluster_id, job_id, int(s.get("rank", 0)), float(s.get("t", time.time())), s.get("step"),
             json.dumps({k: v for k, v in s.items() if k not in ("rank", "t", "step")})) for s in samples]
    if rows:
        with store.transaction(durable=False) as db:
            db.executemany("INSERT INTO samples (cluster_id, job_id, rank, at, step, metrics)"
                           " VALUES (?,?,?,?,?,?)", rows)
    return len(rows)


def samples_frame(cluster_id: int, job_id: str | None = None) -> pd.DataFrame:
    import json

    import pandas as pd

    sql = "SELECT * FROM samples WHERE cluster_id=?" + (" AND job_id=?" if job_id else "") + " ORDER BY at"
    rows = store.query(sql, (cluster_id, job_id) if job_id else (cluster_id,))
    return pd.DataFrame([{"job_id": r["job_id"], "rank": r["rank"], "at": r["at"], "step": r["step"],
                          **json.loads(r["metrics"])} for r in rows])


# -- events -------------------------------------------------------------------------------------

# The audit log: every action on a cluster is an event, never rewritten or deleted (a notebook
# that has shown one says so in a table of its own). Each says who (the OS user, and which
# process: a kernel, the Jupyter server, the terminal, a watchdog), from where (the host), what
# (the exact options, JSON) and the cluster's $ at that moment.
# what a notebook prints once, unasked (a cloud head's launch refusals and spot fallback, a Slurm job's
# walltime near: guard/launches.py)
NEWS = ("budget-warning", "budget-stop", "idle-stop", "launch-refused", "spot-fallback", "walltime",
        "slurm-preempted", "requeued")
_EVENT = ("INSERT INTO events (cluster_id, at, kind, message, user, client, host, options, usd)"
          " SELECT ?,?,?,?,?,?,?,?, " + _SPEND.removeprefix("SELECT "))
_who: dict[str, str] = {}


def acting_as(kind: str) -> None:
    """Name this process in the events it writes: "kernel 3f2a…", "Jupyter server", "terminal"…"""
    _who["client"] = f"{kind} (pid {os.getpid()})"


def _stamp() -> tuple[str, str, str]:
    """(user, client, host) of this process."""
    if "user" not in _who:
        _who["user"] = getpass.getuser()
        _who["host"] = socket.gethostname()
        _who.setdefault("client", f"{Path(sys.argv[0]).name or 'python'} (pid {os.getpid()})")
    return _who["user"], _who["client"], _who["host"]


def event(cluster_id: int, kind: str, message: str, at: float | None = None, options: Mapping | None = None,
          db=None) -> None:
    """Append an event (in ``db``'s transaction if given, else in a durable one of its own)."""
    at = at or time.time()
    row = (cluster_id, at, kind, message, *_stamp(),
           json.dumps(options, sort_keys=True, default=str) if options is not None else None, at, cluster_id)
    if db is not None:
        db.execute(_EVENT, row)
        return
    with store.transaction() as db:
        db.execute(_EVENT, row)


def events(cluster_id: int, kind: str | None = None) -> list[dict]:
    sql = "SELECT * FROM events WHERE cluster_id=?" + (" AND kind=?" if kind else "") + " ORDER BY at"
    return [dict(r) for r in store.query(sql, (cluster_id, kind) if kind else (cluster_id,))]


def take_unshown_events(cluster_id: int) -> list[dict]:
    """The news (``NEWS``: budget warnings, autostops) no notebook has shown yet, now marked shown."""
    with store.transaction() as db:
        rows = [dict(r) for r in db.execute(
            f"SELECT * FROM events WHERE cluster_id=? AND kind IN ({','.join('?' * len(NEWS))})"
            " AND id NOT IN (SELECT event_id FROM events_shown) ORDER BY at", (cluster_id, *NEWS))]
        db.executemany("INSERT OR IGNORE INTO events_shown (event_id, at) VALUES (?,?)",
                       [(r["id"], time.time()) for r in rows])
    return rows


# -- the sums the watchdogs ask for every few seconds (SQL only) ---------------------------------

def spend(cluster_id: int, now: float | None = None) -> float:
    """Dollars so far: Σ $/h × hours over every node, open ones up to ``now`` (what
    ``costs.nodes_frame``'s ``usd`` column adds up to, in SQL: the watchdog asks every few seconds)."""
    now = time.time() if now is None else now
    return float(store.query(_SPEND, (now, cluster_id))[0][0])


def burn_rate(cluster_id: int) -> float:
    """$/h of the nodes alive now."""
    return float(store.query(
        "SELECT COALESCE(SUM(usd_per_hour), 0) FROM nodes WHERE cluster_id=? AND ended IS NULL",
        (cluster_id,))[0][0])
