"""The one SQLite database in ``$GPUGEEK_HOME``: clusters, nodes, jobs, events, samples, attachments.

It is the only place state lives, so a restarted kernel, the watchdog process and the server
extension all read the same truth. Every write is one transaction (``with transaction():``):
a process killed mid-write leaves the database as it was before that write began. WAL mode
lets readers go on while the watchdog writes; ``synchronous=FULL`` makes a committed write
survive a crash of the machine, not just of the process (except the per-cell records written
with ``transaction(durable=False)``, which survive the process).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .config import home

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT NOT NULL,
    backend       TEXT NOT NULL,
    simulated     INTEGER NOT NULL DEFAULT 0,
    address       TEXT,
    spec          TEXT NOT NULL,          -- JSON: node types with their offers and $/h
    session_id    INTEGER,                -- the process session every Ray process we own is in
    pids          TEXT NOT NULL DEFAULT '[]',
    temp_dir      TEXT,
    watchdog_pid  INTEGER,
    budget_usd    REAL,
    idle_minutes  REAL,
    idle_since    REAL,                   -- idle since (the watchdog's view, meter/activity.py)
    idle_why      TEXT,                   -- what that rests on: "job 'x' stalled: GPUs at most 0 %"
    created       REAL NOT NULL,
    ready         REAL,
    stopping      REAL,
    stopped       REAL,
    stop_reason   TEXT,
    start_failed  TEXT,                   -- `up` failed, and so did stopping what it had started
    heard         REAL,                   -- when this machine last had the cluster's word
    guard         TEXT,                   -- JSON: the guard that enforced the limits then (guard/lifecycle.py)
    started_by    TEXT                    -- the kernel (host:pid) whose `up` started it
);
CREATE INDEX IF NOT EXISTS clusters_by_name ON clusters(name, stopped);

CREATE TABLE IF NOT EXISTS nodes (
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    node_id       TEXT NOT NULL,
    node_type     TEXT NOT NULL,
    offer_id      TEXT,
    pricing       TEXT NOT NULL,
    usd_per_hour  REAL NOT NULL,
    on_demand_usd_per_hour REAL,
    gpus          REAL NOT NULL DEFAULT 0,
    started       REAL NOT NULL,
    ended         REAL,
    end_reason    TEXT,
    PRIMARY KEY (cluster_id, node_id)
);

CREATE TABLE IF NOT EXISTS jobs (
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    job_id        TEXT NOT NULL,
    name          TEXT NOT NULL,
    started       REAL NOT NULL,
    ended         REAL,
    status        TEXT NOT NULL DEFAULT 'running',
    workers       INTEGER,
    nodes         INTEGER,
    preemptions   INTEGER DEFAULT 0,      -- stopped on a notice and resumed: not failures
    PRIMARY KEY (cluster_id, job_id)
);

CREATE TABLE IF NOT EXISTS events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    at            REAL NOT NULL,
    kind          TEXT NOT NULL,
    message       TEXT NOT NULL,
    shown         INTEGER NOT NULL DEFAULT 0,   -- unused since events_shown (kept: older databases have it)
    user          TEXT,                   -- who: the OS user
    client        TEXT,                   -- … and which process: a kernel, the Jupyter server, the terminal
    host          TEXT,                   -- from where
    options       TEXT,                   -- what: the action's exact options, JSON
    usd           REAL                    -- the cluster's $ at that moment
);

-- a notebook printed this event (news: budget warnings, autostops): events are never updated
CREATE TABLE IF NOT EXISTS events_shown (
    event_id      INTEGER PRIMARY KEY REFERENCES events(id),
    at            REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS samples (
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    job_id        TEXT NOT NULL,
    rank          INTEGER NOT NULL,
    at            REAL NOT NULL,
    step          INTEGER,
    metrics       TEXT NOT NULL           -- JSON: loss, samples_per_s, tokens_per_s, memory, GPU %
);
CREATE INDEX IF NOT EXISTS samples_by_job ON samples(cluster_id, job_id, at);

CREATE TABLE IF NOT EXISTS node_samples (
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    node_id       TEXT NOT NULL,
    at            REAL NOT NULL,
    device        TEXT NOT NULL,          -- 'host' or 'gpu0', 'gpu1', ... (NVML's index)
    metrics       TEXT NOT NULL           -- JSON: cpu_percent, mem_* or gpu_util, gpu_mem_*, power_w
);
CREATE INDEX IF NOT EXISTS node_samples_by_time ON node_samples(cluster_id, at);

CREATE TABLE IF NOT EXISTS attachments (
    cluster_id    INTEGER NOT NULL REFERENCES clusters(id),
    pid           INTEGER NOT NULL,
    create_time   REAL NOT NULL,
    since         REAL NOT NULL,
    last_cell     REAL,                   -- when the notebook last ran a cell (the idle autostop)
    PRIMARY KEY (cluster_id, pid)
);
"""

_local = threading.local()


def path() -> Path:
    return home() / "state.db"


def connect(durable: bool = True) -> sqlite3.Connection:
    """A connection for this thread to this ``$GPUGEEK_HOME``'s database, schema in place; with
    ``durable=False`` one whose commits do not wait for the disk (see ``transaction``)."""
    cache = getattr(_local, "connections", None)
    if cache is None:
        cache = _local.connections = {}
    # several calls a cell: the cached one after one stat (a home deleted meanwhile is made anew)
    key = (os.environ.get("GPUGEEK_HOME"), os.environ.get("HOME"), durable)
    known = cache.get(key)
    if known is not None and os.path.exists(known[0]):
        return known[1]
    db = path()
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute("PRAGMA foreign_keys=ON")
    with _transaction(conn):
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        _add_missing_columns(conn)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.chmod(0o600)
    cache[key] = (str(db), conn)
    return conn


ADDED_COLUMNS = {"jobs": {"workers": "INTEGER", "nodes": "INTEGER", "preemptions": "INTEGER DEFAULT 0"},
                 "clusters": {"start_failed": "TEXT", "idle_why": "TEXT", "heard": "REAL", "guard": "TEXT",
                              "started_by": "TEXT"},
                 "attachments": {"last_cell": "REAL"},
                 "events": {"user": "TEXT", "client": "TEXT", "host": "TEXT", "options": "TEXT", "usd": "REAL"}}


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """A database made by an earlier version gains the columns added since (never loses any)."""
    for table, columns in ADDED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def transaction(durable: bool = True) -> Iterator[sqlite3.Connection]:
    """All writes inside commit together or not at all (``BEGIN IMMEDIATE`` … ``COMMIT``).

    ``durable=False`` commits without waiting for the disk (``synchronous=NORMAL``, for records
    written at every cell: job rows, workers' reports, telemetry — an fsync can take milliseconds
    on a busy disk). Such a commit survives the process being killed, and the database stays
    whole; only a crash of the machine can lose the latest of them (those since the last durable
    commit or checkpoint synced the log). Money — nodes, clusters, events — is always durable."""
    with _transaction(connect(durable)) as conn:
        yield conn


def query(sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
    return connect().execute(sql, params).fetchall()
