"""A cell on a Slurm cluster at its job's end — its walltime, or the scheduler preempting it: it
checkpointed on the scheduler's notice (``gg.steps``, as on a spot node's), and either resumes in
the next cluster the user starts, or — ``up --requeue`` — in the job's own next run, which this
kernel waits for and reaches again."""

from __future__ import annotations

from ..backends.interface import BACKENDS
from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..kernel import connection
from ..meter import ledger
from ..units import clock

EARLY_S = 5.0     # a notice's end this much before the job's time limit: the scheduler preempted it


def preempted(record: ClusterRecord, deadline: float) -> bool:
    """The job ends before its time limit (as Slurm said it when the job started): a preemption,
    whose grace time ends at ``deadline``. No time limit known: only a preemption signals early."""
    limit = (record.spec.get("remote") or {}).get("walltime_end")
    return limit is None or deadline < limit - EARLY_S


def _end(early: bool, deadline: float) -> str:
    """The job's end, said: "reaches its walltime at 14:02" or, ``early`` (``preempted``), "is
    preempted by the scheduler (its job ends at 14:02)"."""
    if early:
        return f"is preempted by the scheduler (its job ends at {clock(deadline)})"
    return f"reaches its walltime at {clock(deadline)}"


def ends(record: ClusterRecord, job_id: str, job_name: str, notice: dict) -> str:
    """The cell checkpointed on its scheduler's notice: the whole allocation ends (its walltime, or
    the scheduler's preemption), so the cell resumes in the next cluster, from that checkpoint.
    What to say, and the ledger's."""
    ledger.job_preempted(record.id, job_id)
    early = preempted(record, notice["deadline"])
    ledger.event(record.id, "job-preempted", f"job {job_name!r} checkpointed at step {notice['step']} on the "
                                             f"{'preemption' if early else 'walltime'}'s notice (the job ends at "
                                             f"{clock(notice['deadline'])})")
    longer = "" if early else " with a longer --time"
    return (f"cluster {record.name!r} {_end(early, notice['deadline'])}: the cell checkpointed at step "
            f"{notice['step']} and stopped — `%gpugeek up` a cluster again{longer} and run the "
            f"cell again: it resumes from there")


def requeued(record: ClusterRecord, job_id: str, job_name: str, notice: dict) -> ClusterRecord:
    """The cell checkpointed on its scheduler's notice and the job is requeued (``up --requeue``):
    every process of it ends, and it runs again on an allocation of its own. This kernel waits for
    that run (its worker group already stopped), reaches its head again, and the cell resumes
    there from its checkpoint. The stop button ends the wait and leaves the job queued (the
    cluster is live: ``down`` cancels it)."""
    ledger.job_preempted(record.id, job_id)
    step = notice["step"]
    early = preempted(record, notice["deadline"])
    ledger.event(record.id, "job-preempted", f"job {job_name!r} checkpointed at step {step} on the "
                                             f"{'preemption' if early else 'walltime'}'s notice; the Slurm job is "
                                             f"requeued, and the cell resumes in its next run")
    print(f"cluster {record.name!r} {_end(early, notice['deadline'])}: the cell checkpointed at step {step}, and "
          f"its Slurm job is requeued — the cell resumes from there once the job runs again (not counted as a "
          f"failure)", flush=True)
    connection.let_go()
    try:
        moved = BACKENDS[record.backend].wait_moved(record, say=print)
    except KeyboardInterrupt:
        print(f"note: no longer waiting — the job stays queued; `%gpugeek up {record.name}` reaches it once it runs, "
              f"and the cell run again resumes from step {step}", flush=True)
        raise
    connection.connect(moved)
    print(f"cluster {moved.name!r} runs again: resuming the cell", flush=True)
    return registry.get(moved.id)
