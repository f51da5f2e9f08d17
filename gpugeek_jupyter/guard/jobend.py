"""A Slurm job's end near, as the head's watchdog sees it from inside the allocation: its walltime,
or the scheduler preempting it.

The batch step (``onhost/slurmjob.py``) hears the job's signal (``--signal=B:USR2@S``: before the
walltime, and at the start of a preemption's grace time where Slurm sends it then,
``preempt_send_user_signal``) and leaves its time in a file beside the head's watchdog. At its next
look the watchdog tells every node of the cluster when the job ends, in the cluster's KV store
(where a spot node's notice goes): a running cell checkpoints at its next step and stops. With
``up --requeue`` it then requeues the job, which runs again on an allocation of its own; the
notebook follows it there (``cells/walltime.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from ..backends.interface import BACKENDS, capable
from ..cluster.spec import ClusterSpec
from ..meter import allocation, ledger
from ..raynodes import ClusterUnreachable, read_nodes, send_notice
from ..units import clock
from . import launches
from .clusterjobs import ClusterJobs

NOTICE = "walltime-notice"     # the batch step leaves it in the head watchdog's folder (slurmjob.py)
REQUEUE_BEFORE_S = 30.0        # ``up --requeue``: the job requeued this long before its end at the latest


class JobEnd:
    """One Slurm cluster's job's end: each notice passed on once, the job requeued once."""

    def __init__(self, cluster_id: int, home: str, gcs: str, interval: float):
        self.cluster_id, self.gcs, self.interval = cluster_id, gcs, interval
        self.notice = Path(os.path.expanduser(home)) / NOTICE
        self.heard: float | None = None       # the notice passed on last (when the batch step heard it)
        self.ends: float | None = None        # … when the job ends, as Slurm said then
        self.requeued = False                 # ``up --requeue``: the job was requeued

    def look(self, record, cluster_jobs: ClusterJobs) -> None:
        self._tell(record)
        self._requeue(record, cluster_jobs)

    def _tell(self, record) -> None:
        """A new notice: every node told when the job ends — its walltime, or once the scheduler
        preempted it (``PreemptTime``), the end of its grace time; the event says which."""
        try:
            heard = float(self.notice.read_text())
        except (OSError, ValueError):
            return
        if heard == self.heard:
            return
        spec = ClusterSpec.from_json(record.spec)
        job = BACKENDS[spec.backend].job_record(spec)
        ends = job.walltime_end if job is not None and job.walltime_end else heard + allocation.NOTICE_S
        try:
            nodes = [n for n in read_nodes(self.gcs, timeout=max(1.0, self.interval)) if n.alive]
            for node in nodes:
                send_notice(self.gcs, node.node_id, ends)
        except ClusterUnreachable:
            return                       # told at the next look
        self.heard, self.ends = heard, ends
        told = (f"its {len(nodes)} node{'s' if len(nodes) != 1 else ''} told (a running cell checkpoints at its "
                f"next step)")
        if job is not None and job.preempted is not None:
            ledger.event(self.cluster_id, launches.PREEMPTED, f"Slurm job {spec.remote.job_id} preempted by the "
                         f"scheduler at {clock(job.preempted)}: it ends at {clock(ends)}, {told}",
                         options={"ends": ends, "preempted": job.preempted})
            return
        ledger.event(self.cluster_id, launches.WALLTIME, f"Slurm job {spec.remote.job_id} reaches its walltime at "
                     f"{clock(ends)}: {told}", options={"ends": ends})

    def _requeue(self, record, cluster_jobs: ClusterJobs) -> None:
        """``up --requeue``: once the notice is passed on and no cell works on the cluster any more
        (a running one checkpointed on it), or shortly before the job's end at the latest (a quarter
        of the notice, at most ``REQUEUE_BEFORE_S``), the job is requeued — Slurm never requeues a
        job that reached its time limit by itself, nor one a preemption cancels. That ends every
        process of the job, this watchdog too; the next run finds its ledger and the checkpoints in
        the shared home."""
        if self.heard is None or self.requeued:
            return
        spec = ClusterSpec.from_json(record.spec)
        if spec.slurm is None or not spec.slurm.requeue:
            return
        now = time.time()
        ends = self.ends or now
        working, _ = cluster_jobs.look(self.gcs, now, timeout=max(1.0, self.interval))
        if working and now < ends - min(REQUEUE_BEFORE_S, (ends - self.heard) / 4):
            return
        job = spec.remote.job_id
        ledger.event(self.cluster_id, launches.REQUEUED,
                     f"Slurm job {job} requeued before its end: it runs again in a new allocation, where "
                     f"a cell that checkpointed resumes" + (f" ({working} was still running)" if working else ""))
        self.requeued = True
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            ledger.event(self.cluster_id, "requeue-failed", f"scontrol requeue {job} failed "
                         f"({done.stderr.strip()[-300:]}): the job ends at {clock(ends)}")


def preempted_end(record, now: float | None = None) -> float | None:
    """A Slurm job the scheduler preempted: the end of its grace time while it is still ahead (the
    head's word, copied from its heartbeat wherever the cluster is read), for its countdown."""
    if not capable(record).scheduler:
        return None
    told = ledger.events(record.id, launches.PREEMPTED)
    ends = json.loads(told[-1]["options"] or "{}").get("ends") if told else None
    return ends if ends is not None and ends > (time.time() if now is None else now) else None
