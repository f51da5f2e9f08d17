"""What one kernel holds between cells, in one object: the cluster its commands mean when they
name none, its connection to a cluster, its warm worker group, the plan it made last, and the
modules its jobs send to a remote cluster.

Everything else lives in the registry and ledger (SQLite), which every process shares; this is
the only per-kernel state, so a kernel restart loses exactly this and ``up NAME`` rebuilds it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..errors import GpugeekError
from ..meter import ledger
from ..units import clock

if TYPE_CHECKING:
    from ..line.wire import Line
    from ..sizing.planner import Plan


@dataclass(frozen=True)
class Connection:
    """The cluster this kernel drives (made by ``connection.connect``): as a Ray driver, through
    its keeper over the line, or — asked for by ``--address ray://…`` — as a Ray Client."""

    address: str      # as ``ray.init`` was given it (Ray rewrites 127.0.0.1 to the host's IP)
    db: Path          # the registry it was made from (the watcher reads it from its own thread)
    cluster_id: int
    kind: str = "driver"    # "driver", "line" (a remote cluster's keeper) or "client" (a Ray Client)

    @property
    def client(self) -> bool:
        return self.kind == "client"

    @property
    def remote(self) -> bool:
        """Its workers run on machines that are not this kernel's (its modules must be sent)."""
        return self.kind != "driver"


class WarmGroup(Protocol):
    """What the session needs of a warm worker group (the part of ``cells/warm.py``'s ``Group``
    this room may name): to mark it lost with its connection, to stop it, and to leave it
    (stopped unless a job runs there: True then) when this kernel moves to another cluster."""

    broken: bool
    job: dict | None      # the running cell's job (its id)

    def stop(self) -> None: ...

    def leave(self) -> bool: ...


@dataclass
class Shipment:
    """What this kernel's jobs send along to a remote cluster (``environment``): the modules
    checked against its workers, and those that travel with the job."""

    cluster_id: int | None = None
    checked: dict[str, str] = field(default_factory=dict)       # module → the version checked
    shipped: dict = field(default_factory=dict)                 # module → versions.KernelModule

    def for_cluster(self, cluster_id: int | None) -> Shipment:
        if cluster_id != self.cluster_id:
            self.cluster_id, self.checked, self.shipped = cluster_id, {}, {}
        return self


@dataclass
class Trouble:
    """A background read or write of this kernel's that keeps failing (``trouble``): counted, and
    said once per streak at the next ``%gpugeek`` command."""

    count: int = 0
    since: float = 0.0
    error: str = ""
    said: bool = False


TROUBLE_SAID_AFTER = 3
WATCHER = "reading the registry for a stop made elsewhere"
CELL_NOTES = "noting this notebook's cells in the registry"
READINGS = "copying the node samplers' readings into the ledger"
_WHAT_IT_COSTS = {
    WATCHER: "a stop made elsewhere (the watchdog, JupyterLab, a terminal) is not seen here meanwhile",
    CELL_NOTES: "the idle clock does not see these cells and may count this notebook idle",
    READINGS: "a job's device readings, which the idle clock and the monitor read, are missing",
}


@dataclass
class KernelSession:
    active: str | None = None                 # the cluster commands mean by default
    connection: Connection | None = None      # the cluster this process drives
    line: Line | None = None                  # its line to a remote cluster's keeper (``connection``)
    group: WarmGroup | None = None            # the warm workers `%%gpugeek run` uses
    last_plan: Plan | None = None             # an out-of-memory diagnosis compares against it
    cells_running: int = 0                    # a cell's Ray calls under way in the main thread
    stop_seen: bool = False                   # a stop began elsewhere while one ran: it lets go
    shipment: Shipment = field(default_factory=Shipment)   # the kernel's modules its jobs send
    troubles: dict[str, Trouble] = field(default_factory=dict)   # what keeps failing in the background


_SESSION = KernelSession()
CELL_NOTE_EVERY_S = 1.0     # the registry hears of this notebook's cells at most this often
_cells_heard = [False, 0.0]  # hooked into IPython yet; when a cell was last noted


def current() -> KernelSession:
    return _SESSION


def attach(record: ClusterRecord) -> None:
    """This notebook looks after the cluster, and the cluster's idle autostop hears of its cells:
    a notebook in use keeps its cluster up (``meter/activity.py``)."""
    registry.attach(record.id)
    if _cells_heard[0]:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.events.register("pre_run_cell", _cell_starts)
        _cells_heard[0] = True


def _cell_starts(info=None) -> None:
    now = time.time()
    if now - _cells_heard[1] < CELL_NOTE_EVERY_S:
        return
    _cells_heard[1] = now
    try:
        registry.cell_ran(at=now)
    except Exception as exc:  # noqa: BLE001 - the user's cell goes first: counted and said (`trouble`)
        trouble(CELL_NOTES, exc)
        return
    lost = fine(CELL_NOTES)
    if lost is not None:     # the idle clock is told what it lacked, on every cluster attached here
        for cluster_id in registry.attached_to():
            ledger.event(cluster_id, "activity", f"{lost.count} notes of a notebook's cells (pid {os.getpid()}) were "
                         f"lost between {clock(lost.since)} and "
                         f"{clock(now)} ({lost.error}): the idle clock lacked them")


def trouble(what: str, exc: BaseException) -> None:
    """One more failure of a background read or write (``WATCHER``, ``CELL_NOTES``, ``READINGS``)."""
    kept = _SESSION.troubles.setdefault(what, Trouble())
    if kept.count == 0:
        kept.since = time.time()
    kept.count += 1
    kept.error = f"{type(exc).__name__}: {exc}"


def fine(what: str) -> Trouble | None:
    """It worked again: the streak it ends, if there was one."""
    return _SESSION.troubles.pop(what, None)


def troubles_to_say() -> list[str]:
    """A line for each streak of ``TROUBLE_SAID_AFTER`` or more failures not said yet."""
    lines = []
    for what, kept in _SESSION.troubles.items():
        if kept.count >= TROUBLE_SAID_AFTER and not kept.said:
            kept.said = True
            lines.append(f"gpugeek: {what} has failed {kept.count} times since "
                         f"{clock(kept.since)} ({kept.error}) — "
                         f"{_WHAT_IT_COSTS[what]}")
    return lines


def live_cluster(name: str | None = None) -> ClusterRecord:
    """The live cluster a command means: the one named, else this kernel's active one, else the
    only live one; one line saying which exist otherwise."""
    name = name or _SESSION.active
    if name is None:
        live = registry.all_records(include_stopped=False)
        if len(live) == 1:
            return live[0]
        names = ", ".join(r.name for r in live) or "none"
        raise GpugeekError(f"which cluster? none is active in this kernel — live clusters: {names}")
    record = registry.live(name)
    if record is None:
        past = registry.latest(name)
        if past is not None:
            raise GpugeekError(f"cluster {name!r} stopped ({past.stop_reason}) — `%gpugeek up {name}` starts it again")
        live = ", ".join(r.name for r in registry.all_records(include_stopped=False)) or "none"
        raise GpugeekError(f"no cluster named {name!r} — live clusters: {live}")
    return record


def any_cluster(name: str | None = None) -> ClusterRecord:
    """Like ``live_cluster``, but a named cluster that has stopped is its latest run (status and
    cost describe the past too)."""
    name = name or _SESSION.active
    if name is None:
        return live_cluster(None)
    record = registry.live(name) or registry.latest(name)
    if record is None:
        raise GpugeekError(f"no cluster named {name!r} — `%gpugeek clusters` lists them")
    return record
