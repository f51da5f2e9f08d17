"""The jobs a cluster tells of itself: each worker group's rank 0 writes its running (or last)
job into the cluster's KV store (``workers/journal.py``), so a watchdog — the head's while the
laptop is away, or this machine's after its kernel died — sees a job working that no notebook
watches, and knows when it ended: the idle clock starts there, not before."""

from __future__ import annotations

from ..cluster.processes import kernel_gone
from ..meter import ledger
from ..raynodes import JOB_PREFIX, ClusterUnreachable, kv_all
from ..units import clock

STALLED_AFTER_S = 120.0    # a running job whose step has not moved this long is no proof of work


class ClusterJobs:
    """What one watchdog saw of the cluster's jobs, look after look."""

    def __init__(self, cluster_id: int):
        self.cluster_id = cluster_id
        self._steps: dict[str, tuple[object, float]] = {}    # key → (step, when it was first seen)
        self._said: set[tuple[str, float]] = set()

    def look(self, address: str, now: float, timeout: float) -> tuple[str | None, float | None]:
        """(why the cluster works — a job whose step moved lately — or None; when its jobs last
        ended). A job's end is said once as an event, and closes its ledger row here if the
        kernel that ran it could not (it died)."""
        try:
            told = kv_all(address, JOB_PREFIX, timeout=timeout)
        except ClusterUnreachable:
            return None, None
        working, ended = None, None
        for key, job in told.items():
            if job.get("running") and now - job.get("at", 0) <= 3 * job.get("every", 2.0) + 10.0:
                step = job.get("step")
                if self._steps.get(key, (None, 0.0))[0] != step or key not in self._steps:
                    self._steps[key] = (step, now)
                if now - self._steps[key][1] <= STALLED_AFTER_S:
                    working = f"job {job.get('name')!r} working on the cluster" + \
                        (f" (step {step})" if step is not None else "")
            elif job.get("ended") and job.get("state") != "preempted":    # a preempted job resumes elsewhere
                ended = max(ended or 0.0, job["ended"])
                self._ended(job)
        return working, ended

    def _ended(self, job: dict) -> None:
        mark = (str(job.get("job")), float(job["ended"]))
        if mark in self._said:
            return
        self._said.add(mark)
        if job.get("job") and ledger.job_status(self.cluster_id, job["job"]) == "running" \
                and kernel_gone(job.get("kernel")) is not False:     # a live kernel closes its own job
            ledger.job_ended(self.cluster_id, job["job"], job.get("state") or "finished", at=job["ended"])
        if not any(e.get("options") and f'"{job.get("job")}"' in e["options"]
                   for e in ledger.events(self.cluster_id, "job-ended")):
            ledger.event(self.cluster_id, "job-ended",
                         f"job {job.get('name')!r} {job.get('state') or 'ended'} on the cluster at "
                         f"{clock(job['ended'])} (step {job.get('step')}): the idle clock starts there",
                         at=job["ended"], options={"job": job.get("job"), "state": job.get("state")})
