"""The registry of clusters: one row per ``up``, kept after ``down`` as history.

A name is reusable once its cluster has stopped; at most one live cluster holds a name. The
kernels attached to a cluster are recorded by pid (+ start time, against pid reuse), which is how
``clusters()`` tells an orphan — alive, still billing, no notebook attached — from one in use.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, fields
from pathlib import Path

from .. import store
from ..config import home
from . import processes

KERNELS_LOOK_EVERY_S = 1.0   # a kernel looks this often for a stop of its cluster begun elsewhere
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")   # a cluster's name: also a path and URL part


@dataclass
class ClusterRecord:
    id: int
    name: str
    backend: str
    simulated: bool
    address: str | None
    spec: dict
    session_id: int | None
    pids: list[int]
    temp_dir: str | None
    watchdog_pid: int | None
    budget_usd: float | None
    idle_minutes: float | None
    idle_since: float | None
    created: float
    ready: float | None
    stopping: float | None
    stopped: float | None
    stop_reason: str | None
    start_failed: str | None = None   # its `up` failed and so did stopping what had started
    idle_why: str | None = None       # what the watchdog's idle_since rests on (meter/activity.py)
    heard: float | None = None        # when this machine last had the cluster's word
    guard: str | None = None          # JSON: who enforced the limits when it was last heard
    started_by: str | None = None     # the kernel (host:pid) whose `up` started it

    @property
    def live(self) -> bool:
        return self.stopped is None

    @property
    def marker(self) -> str:
        """Set in the environment of every process we start for this cluster."""
        return f"{home()}#{self.id}"


def from_row(row) -> ClusterRecord:
    """A row as a record; columns a later version added are left out, so an older watchdog still
    running on an upgraded database keeps working."""
    data = {k: v for k, v in dict(row).items() if k in _FIELDS}
    data["simulated"] = bool(data["simulated"])
    data["spec"] = json.loads(data["spec"])
    data["pids"] = json.loads(data["pids"])
    return ClusterRecord(**data)


_FIELDS = {f.name for f in fields(ClusterRecord)}


def create(name: str, backend: str, spec: dict, *, simulated: bool, budget_usd: float | None,
           idle_minutes: float | None, started_by: str | None = None) -> ClusterRecord:
    with store.transaction() as db:
        if db.execute("SELECT 1 FROM clusters WHERE name=? AND stopped IS NULL", (name,)).fetchone():
            raise ValueError(f"a live cluster is already named {name!r}")
        cur = db.execute(
            "INSERT INTO clusters (name, backend, simulated, spec, budget_usd, idle_minutes, created, started_by)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (name, backend, int(simulated), json.dumps(spec), budget_usd, idle_minutes, time.time(), started_by),
        )
        cluster_id = cur.lastrowid
    return get(cluster_id)


def update(cluster_id: int, *, remote: dict | None = None, **fields) -> None:
    """Set columns of the cluster's row. ``remote``: keys merged into the stored spec's ``remote``
    in the same transaction — what a running cluster learns later (a reopened tunnel's line), so
    that a write from another process of the rest of the spec is kept."""
    for key in ("spec", "pids"):
        if key in fields:
            fields[key] = json.dumps(fields[key])
    with store.transaction() as db:
        if remote:
            row = db.execute("SELECT spec FROM clusters WHERE id=?", (cluster_id,)).fetchone()
            spec = json.loads(fields.get("spec") or row[0])
            spec["remote"] = {**(spec.get("remote") or {}), **remote}
            fields["spec"] = json.dumps(spec)
        if fields:
            columns = ", ".join(f"{key}=?" for key in fields)
            db.execute(f"UPDATE clusters SET {columns} WHERE id=?", (*fields.values(), cluster_id))


def heard_from(cluster_id: int, at: float, guard: dict | None = None) -> None:
    """This machine had the cluster's word at ``at`` (its nodes read, or the head's ledger
    copied), with who enforced its limits then (kept as it was when ``guard`` is None)."""
    with store.transaction(durable=False) as db:
        if guard is None:
            db.execute("UPDATE clusters SET heard=? WHERE id=?", (at, cluster_id))
        else:
            db.execute("UPDATE clusters SET heard=?, guard=? WHERE id=?", (at, json.dumps(guard), cluster_id))


def note_idleness(cluster_id: int, since: float | None, why: str) -> None:
    """The watchdog's view of the idle clock (each look: not worth waiting for the disk)."""
    with store.transaction(durable=False) as db:
        db.execute("UPDATE clusters SET idle_since=?, idle_why=? WHERE id=?", (since, why, cluster_id))


def get(cluster_id: int) -> ClusterRecord:
    rows = store.query("SELECT * FROM clusters WHERE id=?", (cluster_id,))
    if not rows:
        raise KeyError(cluster_id)
    return from_row(rows[0])


def live(name: str) -> ClusterRecord | None:
    """The live cluster of that name; read at every cell, so a row read as before is not parsed
    again (a copy of the record it made: a caller may change its own)."""
    rows = store.query("SELECT * FROM clusters WHERE name=? AND stopped IS NULL", (name,))
    if not rows:
        return None
    raw = tuple(rows[0])
    parsed = _parsed.get(name)
    if parsed is None or parsed[0] != raw:
        parsed = _parsed[name] = (raw, from_row(rows[0]))
    return copy.copy(parsed[1])


_parsed: dict[str, tuple[tuple, ClusterRecord]] = {}     # name → (the row as last read, its record)


def latest(name: str) -> ClusterRecord | None:
    rows = store.query("SELECT * FROM clusters WHERE name=? ORDER BY id DESC LIMIT 1", (name,))
    return from_row(rows[0]) if rows else None


def all_records(include_stopped: bool = True) -> list[ClusterRecord]:
    sql = "SELECT * FROM clusters" + ("" if include_stopped else " WHERE stopped IS NULL")
    return [from_row(r) for r in store.query(sql + " ORDER BY id")]


STALE_STOP_S = 120


def claim_stop(cluster_id: int) -> bool:
    """Whoever flips ``stopping`` first (kernel or watchdog) does the shutdown; the other waits.

    A claim older than two minutes is stale — its holder died mid-stop — and may be taken over.
    """
    now = time.time()
    with store.transaction() as db:
        cur = db.execute(
            "UPDATE clusters SET stopping=? WHERE id=? AND stopped IS NULL"
            " AND (stopping IS NULL OR stopping < ?)", (now, cluster_id, now - STALE_STOP_S))
        return cur.rowcount == 1


def release_stop(cluster_id: int) -> None:
    with store.transaction() as db:
        db.execute("UPDATE clusters SET stopping=NULL WHERE id=? AND stopped IS NULL", (cluster_id,))


def mark_stopped(cluster_id: int, reason: str, at: float | None = None) -> None:
    with store.transaction() as db:
        db.execute("UPDATE clusters SET stopped=?, stop_reason=? WHERE id=? AND stopped IS NULL",
                   (at or time.time(), reason, cluster_id))
        db.execute("DELETE FROM attachments WHERE cluster_id=?", (cluster_id,))


def stop_started(db: Path, cluster_id: int) -> bool:
    """Whether a stop of the cluster has begun, read from a given database (any thread); an
    unreadable database raises (``sqlite3.Error``): its caller counts that and says it."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        row = conn.execute("SELECT stopping, stopped FROM clusters WHERE id=?", (cluster_id,)).fetchone()
    return bool(row and (row[0] or row[1]))


# -- kernels attached ---------------------------------------------------------------------------

def attach(cluster_id: int, pid: int | None = None) -> None:
    pid, now = pid or os.getpid(), time.time()
    started = processes.process_started(pid) or now
    with store.transaction() as db:
        db.execute("INSERT INTO attachments (cluster_id, pid, create_time, since, last_cell) VALUES (?,?,?,?,?)"
                   " ON CONFLICT (cluster_id, pid) DO UPDATE SET create_time=excluded.create_time,"
                   " since=excluded.since", (cluster_id, pid, started, now, now))


def detach(cluster_id: int, pid: int | None = None) -> None:
    with store.transaction() as db:
        db.execute("DELETE FROM attachments WHERE cluster_id=? AND pid=?",
                   (cluster_id, pid or os.getpid()))


def cell_ran(pid: int | None = None, at: float | None = None) -> None:
    """A notebook ran a cell: every cluster it is attached to counts as in use (the idle autostop)."""
    with store.transaction(durable=False) as db:
        db.execute("UPDATE attachments SET last_cell=? WHERE pid=?", (at or time.time(), pid or os.getpid()))


def attached_to(pid: int | None = None) -> list[int]:
    """The clusters a process (this one) is attached to."""
    return [r[0] for r in store.query("SELECT cluster_id FROM attachments WHERE pid=?", (pid or os.getpid(),))]


def last_cell(cluster_id: int) -> float | None:
    """When a notebook attached to the cluster last ran a cell."""
    return store.query("SELECT MAX(last_cell) FROM attachments WHERE cluster_id=?", (cluster_id,))[0][0]


def attached_kernels(cluster_id: int) -> list[int]:
    """Pids of processes attached to the cluster that are still the same processes."""
    alive = []
    for row in store.query("SELECT pid, create_time FROM attachments WHERE cluster_id=?", (cluster_id,)):
        started = processes.process_started(row["pid"])
        if started is not None and abs(started - row["create_time"]) < 1.0 and processes.alive(row["pid"]):
            alive.append(row["pid"])
    return alive
