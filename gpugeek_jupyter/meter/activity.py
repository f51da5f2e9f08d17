"""Whether a cluster is doing work, for the idle autostop, and why — said in ``status``.

A cluster is busy while a job runs and its devices work (a GPU at ``GPU_BUSY_PERCENT`` or more;
on a node without GPUs, ``CPU_BUSY_CORES`` cores' worth of CPU), and while a notebook attached to
it runs cells. A job whose devices sat below that for the whole idle window is a stalled loop
(a ``time.sleep``, a dead data loader, a wait on a peer that is gone): it counts as idle, so a
GPU at 0 % stops billing. Without a job, Ray's own idle clock says whether tasks ran.

The evidence is the node samplers' readings in the ledger (one a second per device, brought in
by the notebook while its cells run). A job with no readings at all is taken as working while a
notebook is attached (it may not have reached a sampler yet) and as idle once none is: its
workers went with their notebook.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from .. import store
from ..raynodes import RayNode
from . import ledger

GPU_BUSY_PERCENT = 10.0      # NVML's utilisation: a kernel ran in this share of the last interval
CPU_BUSY_CORES = 0.5         # a node's CPU time, in cores: a training loop keeps a core busy
READINGS_LAG_S = 15.0        # readings reach the ledger with the notebook's drains, a few seconds late


@dataclass(frozen=True)
class Idleness:
    since: float | None      # idle since when (None: busy now)
    why: str                 # what the judgement rests on, for people


def judge(cluster_id: int, nodes: Iterable[RayNode], previous: float | None, window_s: float, *,
          ray_worked: bool = False, last_cell: float | None = None, notebook: bool = False,
          now: float | None = None) -> Idleness:
    """Is the cluster idle, since when, and why. ``previous`` is the last look's ``since``, carried
    forward; ``window_s`` how far back the devices' readings are read (the idle window);
    ``ray_worked`` whether Ray saw a node work since the last look; ``last_cell`` when an attached
    notebook last ran a cell, ``notebook`` whether one is attached now."""
    now = time.time() if now is None else now
    jobs = ledger.running_job_starts(cluster_id)
    if jobs:
        name, started = max(jobs.items(), key=lambda item: item[1])
        idleness = _job(cluster_id, name, started, previous, window_s, notebook, now)
    else:
        idleness = _no_job(cluster_id, nodes, None if ray_worked else previous, now)
    if idleness.since is not None and last_cell is not None and last_cell > idleness.since:
        return Idleness(last_cell, "since a notebook's last cell")
    return idleness


def _job(cluster_id: int, name: str, started: float, previous: float | None, window_s: float,
         notebook: bool, now: float) -> Idleness:
    read = Readings(cluster_id, max(started, now - window_s))
    if read.busy_at is not None:
        if now - read.busy_at <= min(READINGS_LAG_S, window_s / 2):
            return Idleness(None, f"job {name!r} working: {read.level}")
        return Idleness(read.busy_at, f"job {name!r} stalled: {read.level}")
    if read.first is None:                  # no readings
        if notebook:
            return Idleness(None, f"job {name!r} running (no device readings yet)")
        return Idleness(started, f"job {name!r} has no device readings and no notebook attached")
    since = max(started, read.first)
    if previous is not None and started <= previous < since:
        since = previous                     # still below the bar since an earlier look
    return Idleness(since, f"job {name!r} stalled: {read.level}")


def _no_job(cluster_id: int, nodes: Iterable[RayNode], previous: float | None, now: float) -> Idleness:
    """Ray's account: every node idle (it reports how long a node had been idle when it last
    changed state, so the time is carried forward), and not before the last job ended."""
    alive = [n for n in nodes if n.alive]
    if not alive:
        return Idleness(None, "no node alive")
    if any(n.idle_s is None for n in alive):
        return Idleness(None, "no job; Ray tasks are running")
    since = previous if previous is not None else now - min(n.idle_s for n in alive)
    last_job = ledger.last_job_end(cluster_id)
    return Idleness(max(since, last_job) if last_job else since, "no job running")


class Readings:
    """The devices' readings since ``since``: when one last worked (``busy_at``), when the first
    came (``first``), and the highest, said for people (``level``). GPUs where a node has them;
    its CPUs where it has none."""

    SQL = """
        SELECT node_id, device, MIN(at) AS first,
               MAX(CASE WHEN device = 'host' THEN {cores} ELSE json_extract(metrics, '$.gpu_util') END) AS top,
               MAX(CASE WHEN (device = 'host' AND {cores} >= :cores)
                          OR (device <> 'host' AND json_extract(metrics, '$.gpu_util') >= :gpu)
                        THEN at END) AS busy_at
        FROM node_samples WHERE cluster_id = :cluster AND at >= :since
        GROUP BY node_id, device
    """.format(cores="json_extract(metrics, '$.cpu_percent') / 100.0 * COALESCE(json_extract(metrics, '$.cpus'), 1)")

    def __init__(self, cluster_id: int, since: float):
        rows = store.query(self.SQL, {"cluster": cluster_id, "since": since,
                                      "cores": CPU_BUSY_CORES, "gpu": GPU_BUSY_PERCENT})
        with_gpus = {r["node_id"] for r in rows if r["device"] != "host"}
        rows = [r for r in rows if r["device"] != "host" or r["node_id"] not in with_gpus]
        self.first = min((r["first"] for r in rows), default=None)
        self.busy_at = max((r["busy_at"] for r in rows if r["busy_at"] is not None), default=None)
        tops = [r["top"] for r in rows if r["top"] is not None]
        if not tops:
            self.level = "no device readings"
        elif with_gpus:
            self.level = f"GPUs at most {max(tops):.0f} %"
        else:
            self.level = f"CPUs at most {max(tops):.1f} cores busy"
