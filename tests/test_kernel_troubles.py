"""What a kernel does in the background and must not drop unseen: the watcher's look for a stop
made elsewhere, the notes of its cells (the idle clock) and its job's device readings. Each
failure is counted; a streak of 3 is said at the next ``%gpugeek`` command; the idle clock is told
which cell notes it lacked."""

from __future__ import annotations

import sqlite3

import pytest

from gpugeek_jupyter import api, store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.kernel import connection, session
from gpugeek_jupyter.kernel.session import Connection, current
from gpugeek_jupyter.meter import ledger


@pytest.fixture(autouse=True)
def no_troubles():
    current().troubles.clear()
    yield
    current().troubles.clear()


def _cluster(name: str) -> registry.ClusterRecord:
    record = registry.create(name, "local", ClusterSpec("local").to_json(), simulated=False, budget_usd=None,
                             idle_minutes=10)
    registry.attach(record.id)
    return record


def test_a_watcher_that_cannot_read_the_registry_says_so(gpugeek_home, tmp_path):
    record = _cluster("w")
    unreadable = tmp_path / "not-a-database"
    unreadable.write_text("this is not SQLite")
    seen = Connection("127.0.0.1:1", unreadable, record.id)
    for _ in range(2):
        connection.watch_once(current(), seen)
    assert not any("registry" in line for line in api.news()), "said before a streak of 3"
    connection.watch_once(current(), seen)
    said = [line for line in api.news() if "reading the registry" in line]
    assert len(said) == 1 and "a stop made elsewhere" in said[0] and "3 times" in said[0], said
    assert not any("reading the registry" in line for line in api.news()), "said twice for one streak"
    connection.watch_once(current(), Connection("127.0.0.1:1", store.path(), record.id))
    assert session.WATCHER not in current().troubles, "a good look ends the streak"


def test_cell_notes_that_fail_are_counted_said_and_told_to_the_idle_clock(gpugeek_home, monkeypatch):
    record = _cluster("n")
    real = registry.cell_ran

    def refused(**kwargs):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(registry, "cell_ran", refused)
    for _ in range(4):
        monkeypatch.setattr(session, "_cells_heard", [True, 0.0])   # past the once-a-second throttle
        session._cell_starts()
    said = [line for line in api.news() if "noting this notebook's cells" in line]
    assert len(said) == 1 and "idle clock" in said[0] and "database is locked" in said[0], said
    monkeypatch.setattr(registry, "cell_ran", real)
    monkeypatch.setattr(session, "_cells_heard", [True, 0.0])
    session._cell_starts()
    told = ledger.events(record.id, "activity")
    assert len(told) == 1 and "4 notes" in told[0]["message"] and "the idle clock lacked them" in told[0]["message"]
    assert registry.last_cell(record.id) is not None


def test_readings_that_cannot_be_copied_never_fail_the_cell_and_are_said(gpugeek_home, monkeypatch):
    from gpugeek_jupyter.cells import jobs

    def broken():
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(jobs, "drain_telemetry", broken)
    monkeypatch.setattr(current(), "group", object())
    for _ in range(3):
        assert api.drain_telemetry() == 0
    said = [line for line in api.news() if "node samplers' readings" in line]
    assert len(said) == 1 and "disk I/O error" in said[0], said
