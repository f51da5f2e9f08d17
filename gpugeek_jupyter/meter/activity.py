"""Whether a cluster is doing work, for the idle autostop, and why — said in ``status``.

A cluster is busy while a job runs and its devices work (a GPU at ``GPU_BUSY_PERCENT`` or more;
on a node without GPUs, ``CPU_BUSY_CORES`` cores' worth of its Ray workers' CPU — the host's
where that was not read), and while a notebook attached to it runs cells. A job whose devices
sat below that for the whole idle window is a stalled loop (a ``time.sleep``, a dead data
loader, a wait on a peer that is gone): it counts as idle, so a GPU at 0 % stops billing.
Without a job, Ray's own idle clock says whether tasks ran.

The evidence is the node samplers' readings in the ledger (one a second per device, brought in
by the notebook while its cells run). A job with no readings at all is taken as working while a
notebook is attached (it may not have reached a sampler yet) and as idle once none is: its
workers went with their notebook.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .. import store
from ..raynodes import RayNode
from . import ledger

GPU_BUSY_PERCENT = 10.0      # NVML's utilisation: a kernel ran in this share of the last interval
CPU_BUSY_CORES = 0.5         # a node's workers' CPU time, in cores: a training loop keeps a core busy
READINGS_LAG_S = 15.0        # readings reach the ledger with the notebook's drains, a few seconds late
RECENT_S = 5.0               # "working: GPUs at most …" says the readings of the last few seconds


@dataclass(frozen=True)
class Idleness:
    since: float | None      # idle since when (None: busy now)
    why: str                 # what the judgement rests on, for people


def judge(cluster_id: int, nodes: Iterable[RayNode], previous: float | None, window_s: float, *,
          ray_worked: bool = False, last_cell: float | None = None, notebook: bool = False,
          readings: Readings | None = None, held: Callable[[], bool] = lambda: False,
          now: float | None = None, working: str | None = None, job_ended: float | None = None) -> Idleness:
    """Is the cluster idle, since when, and why. ``previous`` is the last look's ``since``, carried
    forward; ``window_s`` the idle window; ``ray_worked`` whether Ray saw a node work since the
    last look; ``last_cell`` when an attached notebook last ran a cell, ``notebook`` whether one is
    attached now; ``readings`` the devices' readings kept from the last look (the watchdog's:
    it then reads only what came since); ``held`` asks whether all Ray calls busy is placement
    groups' reservations (``raynodes.held_by_placement_groups``: warm worker groups between
    cells) — a request to the GCS, made only when no job runs. ``working``: why the cluster says
    a job of its own works (its step moved lately: ``guard/clusterjobs.py``), whichever kernel
    started it — it decides where no notebook's readings can (the laptop away, its kernel dead),
    so a stalled loop under a live notebook is still seen stalled; ``job_ended``: when the
    cluster's jobs last ended (no idle clock before that)."""
    now = time.time() if now is None else now
    jobs = ledger.running_job_starts(cluster_id)
    if jobs:
        name, started = max(jobs.items(), key=lambda item: item[1])
        read = (readings or Readings(cluster_id)).update(started)
        idleness = _job(name, started, read, window_s, notebook, now)
        if working and idleness.since is not None and not notebook:
            # the readings come in with a notebook's drains: without one, the cluster's own word
            return Idleness(None, working)
    elif working:
        return Idleness(None, working)
    else:
        only_groups = held()
        idleness = _no_job(cluster_id, nodes, None if ray_worked and not only_groups else previous, only_groups, now,
                           job_ended)
    if idleness.since is not None and last_cell is not None and last_cell > idleness.since:
        return Idleness(last_cell, "since a notebook's last cell")
    return idleness


def _job(name: str, started: float, read: Readings, window_s: float, notebook: bool, now: float) -> Idleness:
    if read.busy_at is not None and now - read.busy_at <= min(READINGS_LAG_S, window_s / 2):
        return Idleness(None, f"job {name!r} working: {read.said(read.recent_top)}")
    if read.first is None:                  # no readings
        if notebook:
            return Idleness(None, f"job {name!r} running (no device readings yet)")
        return Idleness(started, f"job {name!r} has no device readings and no notebook attached")
    return Idleness(max(started, read.busy_at or read.first), f"job {name!r} stalled: {read.said(read.quiet_top)}")


def _no_job(cluster_id: int, nodes: Iterable[RayNode], previous: float | None, held: bool,
            now: float, job_ended: float | None = None) -> Idleness:
    """Ray's account: every node idle (it reports how long a node had been idle when it last
    changed state, so the time is carried forward), and not before the last job ended. Nodes that
    only warm worker groups hold (``held``) are idle for this: Ray calls them busy for good."""
    alive = [n for n in nodes if n.alive]
    if not alive:
        return Idleness(None, "no node alive")
    last_job = max(ledger.last_job_end(cluster_id) or 0.0, job_ended or 0.0)
    if held:
        return Idleness(max(previous if previous is not None else now, last_job),
                        "no job running; warm workers wait for the next cell")
    if any(n.idle_s is None for n in alive):
        return Idleness(None, "no job; Ray tasks are running")
    since = previous if previous is not None else now - min(n.idle_s for n in alive)
    return Idleness(max(since, last_job), "no job running")


class Readings:
    """A running job's device readings, as they reach the ledger: when a device last worked
    (``busy_at``), when the first reading came (``first``), the highest reading since the last
    busy one (``quiet_top``) and in the newest batch (``recent_top``). GPUs where a node has them,
    its CPUs (in cores) where it has none. Kept between looks, it reads only the rows added since
    (by rowid: a late batch is still read), so a long window costs nothing more."""

    SQL = """
        SELECT rowid, node_id, device, at,
               CASE WHEN device = 'host'
                    THEN COALESCE(json_extract(metrics, '$.work_cores'), json_extract(metrics, '$.cpu_percent')
                                  / 100.0 * COALESCE(json_extract(metrics, '$.cpus'), 1))
                    ELSE json_extract(metrics, '$.gpu_util') END AS level
        FROM node_samples WHERE rowid > ? AND +cluster_id = ? AND +at >= ? ORDER BY rowid
    """   # the "+"s keep SQLite on the rowid (the new rows only), off the index by time

    def __init__(self, cluster_id: int):
        self.cluster_id = cluster_id
        self._job_started: float | None = None

    def update(self, started: float) -> Readings:
        """Read what came since the last update, for the job that started at ``started``."""
        if started != self._job_started:              # another job: start afresh
            self._job_started, self._upto, self._gpu_nodes = started, 0, set()
            self.first = self.busy_at = self.quiet_top = self.recent_top = None
        rows = store.query(self.SQL, (self._upto, self.cluster_id, started))
        if not rows:
            return self
        self._upto = rows[-1]["rowid"]
        self._gpu_nodes |= {r["node_id"] for r in rows if r["device"] != "host"}
        batch = [r for r in rows if r["level"] is not None
                 and (r["device"] != "host" or r["node_id"] not in self._gpu_nodes)]
        if not batch:
            return self
        self.first = min([r["at"] for r in batch] + ([self.first] if self.first is not None else []))
        newest = max(r["at"] for r in batch)
        self.recent_top = max(self._shown(r) for r in batch if r["at"] >= newest - RECENT_S)
        busy = [r["at"] for r in batch if self._busy(r)]
        if busy and (self.busy_at is None or max(busy) > self.busy_at):
            self.busy_at, self.quiet_top = max(busy), None
        quiet = [self._shown(r) for r in batch if not self._busy(r) and r["at"] > (self.busy_at or 0.0)]
        if quiet:
            self.quiet_top = max(quiet + ([self.quiet_top] if self.quiet_top is not None else []))
        return self

    @staticmethod
    def _busy(row) -> bool:
        return row["level"] >= (CPU_BUSY_CORES if row["device"] == "host" else GPU_BUSY_PERCENT)

    def _shown(self, row) -> float:
        """A reading as ``said`` shows it: GPU % where the job has GPUs (a CPU node's counts as 0)."""
        if not self._gpu_nodes:
            return row["level"]
        return row["level"] if row["device"] != "host" else 0.0

    def said(self, level: float | None) -> str:
        if level is None:
            return "no device readings"
        return f"GPUs at most {level:.0f} %" if self._gpu_nodes else f"CPUs at most {level:.1f} cores busy"
