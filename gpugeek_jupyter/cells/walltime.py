"""A cell on a Slurm cluster at its job's walltime: it checkpointed on the scheduler's notice
(``gg.steps``, as on a spot node's), and either resumes in the next cluster the user starts, or —
``up --requeue`` — in the job's own next run, which this kernel waits for and reaches again."""

from __future__ import annotations

from ..backends.interface import BACKENDS
from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..kernel import connection
from ..meter import ledger
from ..units import clock


def ends(record: ClusterRecord, job_id: str, job_name: str, preempted: dict) -> str:
    """The cell checkpointed on its scheduler's notice: the whole allocation ends at its walltime,
    so the cell resumes in the next cluster, from that checkpoint. What to say, and the ledger's."""
    ledger.job_preempted(record.id, job_id)
    ends = clock(preempted["deadline"])
    ledger.event(record.id, "job-preempted", f"job {job_name!r} checkpointed at step {preempted['step']} on the "
                                             f"walltime's notice (the job ends at {ends})")
    return (f"cluster {record.name!r} reaches its walltime at {ends}: the cell checkpointed at step "
            f"{preempted['step']} and stopped — `%gpugeek up` a cluster again (with a longer --time) and run the "
            f"cell again: it resumes from there")


def requeued(record: ClusterRecord, job_id: str, job_name: str, preempted: dict) -> ClusterRecord:
    """The cell checkpointed on its scheduler's notice and the job is requeued (``up --requeue``):
    every process of it ends, and it runs again on an allocation of its own. This kernel waits for
    that run (its worker group already stopped), reaches its head again, and the cell resumes
    there from its checkpoint. The stop button ends the wait and leaves the job queued (the
    cluster is live: ``down`` cancels it)."""
    ledger.job_preempted(record.id, job_id)
    step, ends = preempted["step"], clock(preempted["deadline"])
    ledger.event(record.id, "job-preempted", f"job {job_name!r} checkpointed at step {step} on the walltime's "
                                             f"notice; the Slurm job is requeued, and the cell resumes in its next run")
    print(f"cluster {record.name!r} reaches its walltime at {ends}: the cell checkpointed at step {step}, and its "
          f"Slurm job is requeued — the cell resumes from there once the job runs again (not counted as a failure)",
          flush=True)
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
