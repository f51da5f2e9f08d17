"""``run``: a cell as a job on the active cluster's warm worker group.

Each run is a ledger job (so ``cost --by job`` and idle autostop see it), its workers' reports
are stored as samples, and a worker that dies is survived up to ``max_failures`` times: the group
is rebuilt and the cell runs again, resuming from its last checkpoint (``gg.steps`` skips the
steps already taken). The rebuilt workers start with an empty namespace — only ``push``ed
variables come back — so a cell meant to survive failures defines what it trains.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import fields, replace

from ..backends.interface import capable
from ..cluster import registry
from ..cluster.processes import kernel_gone, this_kernel
from ..cluster.registry import ClusterRecord
from ..config import home
from ..errors import GpugeekError
from ..group import placement
from ..group.driver import NODE_DEATH_S
from ..group.link import StoppedElsewhere
from ..group.results import Interrupted, RemoteError, WorkerDied
from ..group.workergroup import WorkerGroup
from ..kernel import connection
from ..kernel.session import current
from ..meter import ledger, telemetry
from ..provision.actions import Cluster
from ..provision.up import up
from ..units import number
from ..workers import oom
from ..workers.cell import calls_gg
from ..workers.options import Report, RunOptions, gg_only, options
from . import away, shipping, walltime
from .driving import driver
from .fetching import say_written
from .leaving import leave_with_this_kernel
from .linegroup import LineGroup
from .warm import Group
from .watch import JobWatch, Watcher

NODE_GONE_S = 60.0     # after a notice's deadline, how long Ray may take to see the node gone


def _cluster() -> ClusterRecord:
    """The active cluster, or the local default started now (and said so)."""
    name = current().active
    record = registry.live(name) if name else None
    if record is None:
        live = registry.all_records(include_stopped=False)
        record = next((r for r in live if capable(r).kernel_joins == "driver"), None)
        if record is None:
            print("no cluster yet: starting the local one (`%gpugeek up` chooses another)", flush=True)
            record = registry.live(up().name)
        else:
            Cluster(record.name).connect()
    return record


def _shape(opts: RunOptions) -> tuple:
    """What a group is built for; every other flag is read per cell and keeps the namespace."""
    return opts.workers, opts.gpus_per_worker, opts.collective_timeout


def _reusable(group: Group | None, opts: RunOptions, record: ClusterRecord) -> bool:
    """Whether the warm ``group`` can run a cell of ``opts`` on cluster ``record`` (as just read):
    not broken, built for the same shape, connected to the same address."""
    return (group is not None and not group.broken and _shape(group.options) == _shape(opts)
            and group.address == record.address)


def group_for(opts: RunOptions, record: ClusterRecord | None = None) -> tuple[Group, ClusterRecord]:
    """The warm group of this size on the active cluster (``record``: as just read), built if needed."""
    session = current()
    record = record or _cluster()
    if connection.settle(record) and session.group is not None and not _refound(session.group, record):
        print("note: the worker group was gone when the cluster answered again: a new one starts (variables "
              "defined on the old one are gone)", flush=True)
    old = session.group
    if old is not None and not _reusable(old, opts, record):
        if _shape(old.options) != _shape(opts) and old.address == record.address:
            # refused before the warm group goes
            driver().never_fits(opts.workers, opts.gpus_per_worker, capable(record).grows)
            if not old.broken:
                print("note: a different number of workers, GPUs or collective timeout — a new worker group; "
                      "variables defined on the old one are gone", flush=True)
        old.stop()
        session.group = None
    if session.group is None:
        group = _group(opts, record)
        group.start()
        session.group = group
        leave_with_this_kernel()
        for note in group.notes:
            print(f"note: {note}", flush=True)
    elif session.group.warming:     # `up --workers`: its start under way on the keeper
        session.group.start()
    return session.group, record


def warm_start(record: ClusterRecord, workers: int) -> None:
    """``up --workers N`` on a cluster with a keeper: this kernel's worker group starts there while
    ``up`` returns, and the first cell of that shape finds it started. On your own hosts N workers
    (one GPU each where the hosts have GPUs); on a cloud's nodes, one per GPU of the N nodes."""
    if connection.line() is None:
        return      # a Ray driver builds its group with its first cell
    gpus = int(capable(record).worker_gpus(record))
    each = 1 if capable(record).your_hosts else max(1, gpus)      # a cloud's N nodes: a worker per GPU
    opts = options(workers=workers * each, gpus_per_worker=1 if gpus else 0)
    session = current()
    if session.group is not None:
        session.group.stop()
    group = _group(opts, record)
    try:
        group.begin()
    except GpugeekError as exc:        # up itself went well: the first cell starts the group
        print(f"note: the worker group could not be started ahead ({exc}); the first cell starts it", flush=True)
        return
    session.group = group
    leave_with_this_kernel()
    print(f"the worker group starts on the head while you go on: the first `%%gpugeek run --workers "
          f"{opts.workers}` cell runs on it{' (a GPU each)' if gpus else ''}", flush=True)


def on_its_gpus(opts: RunOptions, record: ClusterRecord, asked: float | None) -> RunOptions:
    """A cell's workers take one GPU each where the cluster's machines have GPUs and CPUs where they
    have none, unless ``--gpus-per-worker`` says; CPUs asked for on a GPU cluster are said once."""
    gpus = capable(record).worker_gpus(record)
    if asked is None:
        return replace(opts, gpus_per_worker=1.0 if gpus else 0.0)
    if not opts.gpus_per_worker and gpus:
        print(f"note: the workers run on CPUs (--gpus-per-worker 0), though the cluster's machines have "
              f"{gpus:g} GPU{'s' if gpus != 1 else ''} each", flush=True)
    return opts


def _refound(group: Group, record: ClusterRecord) -> bool:
    """The warm group found again after this kernel connected anew; a link that fails meanwhile
    is said, and the group kept for the next cell (it is out of reach, not gone)."""
    try:
        return group.refind()
    except away.link_errors() as exc:
        raise GpugeekError(f"cluster {record.name!r} does not answer from here ({type(exc).__name__}) — "
                           f"run the cell again once it does: its worker group is kept") from None
    except Exception:  # noqa: BLE001 - rank 0 found but not answering: that group runs no cell
        group.broken = True
        return False


def _group(opts: RunOptions, record: ClusterRecord) -> Group:
    """A new group for this kernel: held by its remote cluster's keeper, or by this kernel itself."""
    cluster_id = record.id
    flags = {"sample_gpus": not record.simulated, "notices": capable(record).notices, "grows": capable(record).grows,
             "on_node_samples": lambda s: telemetry.record_node_samples(cluster_id, s)}
    line = connection.line()
    if line is not None:
        group = LineGroup(opts, record.address, cluster_id, line, **flags)
    else:
        rejoin = lambda: connection.rejoin(registry.get(cluster_id))    # noqa: E731 - a Ray Client's way back
        group = WorkerGroup(opts, record.address, link=away.KernelLink(rejoin), **flags)
    group.keep_s = record.idle_minutes * 60 if record.idle_minutes else None
    return group


def check_adoptable(group_id: str, adopted_by: str | None = None) -> None:
    """Refuses a group whose kernel (the one that started it, or the last to adopt it) still runs
    on this machine; another machine's kernel cannot be seen from here, and is taken as gone."""
    owner = adopted_by or group_id.rsplit(":", 1)[0]
    if owner == this_kernel() or kernel_gone(owner) is not False:
        return
    raise GpugeekError(f"the worker group {group_id!r} belongs to a kernel that still runs here ({owner}): "
                       f"it keeps its group — attach without --adopt to follow its job")


def adopt(group_id: str) -> Group:
    """This kernel takes over the warm group ``group_id`` of a kernel that is gone: the next cells
    run on it, with its variables. The group this kernel had, if any, is stopped."""
    session, record = current(), _cluster()
    group = _group(options(), record)
    group.adopt(group_id, this_kernel())
    if session.group is not None and session.group.group_id != group_id:
        print("note: this kernel's own worker group was stopped: the adopted one runs its cells now", flush=True)
        session.group.stop()
    session.group = group
    leave_with_this_kernel()
    return group


def drain_telemetry() -> int:
    """Bring the node samplers' latest reports into the ledger (between cells too); not again
    within a second of the last time (a sampler has nothing newer: it samples at most at 1 Hz)."""
    group = current().group
    if group is None or group.broken or not connection.steady():
        return 0
    return group.drain_telemetry(every=telemetry.MIN_INTERVAL_S)


def reset() -> bool:
    """Stop the worker group (its namespace goes with it); the next run builds a new one. An old
    group's placement group that would not go is tried again, and if it still holds, the
    connection is made anew: it goes with the job that owns it."""
    session = current()
    stopped = session.group is not None
    if stopped:
        session.group.stop()
        session.group = None
    if session.line is not None:        # the keeper tries its groups' placement groups again itself
        return stopped
    had = len(placement.held())
    held = placement.release_held(connection.connected_address())
    if held and session.connection is not None:
        print(f"note: an old worker group's placement group would not go ({held[-1].why}); connecting again, "
              f"which ends the job that owns it", flush=True)
        connection.reconnect(registry.get(session.connection.cluster_id))
        placement.forget_held()
    return stopped or had > 0


def run(source: str, *, push: dict | None = None, pull: list[str] | None = None,
        all_ranks: bool = False, name: str | None = None, max_failures: int = 0, plan=None,
        watch: type[JobWatch] | None = None, **flags):
    """Run ``source`` on every worker; returns (rank 0's last value, pulled variables).

    ``watch`` makes, per job, what watches it (the notebook's job monitor): it gets the workers'
    reports as they arrive and the end, and can never break the job. Long because it is the job's
    one story — ledger row, group, retries after a dead worker, the end — told in order."""
    opts = options(name=name, **flags)
    max_failures = number(max_failures, "--max-failures", whole=True, least=0)
    unused = gg_only(opts)
    if unused and not calls_gg(source):
        what = "this script" if opts.argv else "this cell"
        print(f"note: {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} for the gg helper, and {what} never "
              f"calls gg — they do nothing here; set your framework's own (bf16=True, gradient_checkpointing=True, "
              f"gradient_accumulation_steps=…)", flush=True)
    began = time.time()
    record = _cluster()
    opts = on_its_gpus(opts, record, asked=flags.get("gpus_per_worker"))
    opts = _checkpoints(opts, record, name or "cell-" + hashlib.sha1(source.encode()).hexdigest()[:10])
    # where the job runs: the notebook's folder on this machine, as torchrun runs a script in its
    # caller's; in the copy of --working-dir on nodes that are not the notebook's, where what it
    # writes is named at its end (a walk of that folder: only there)
    here = capable(record).runs_here
    opts = replace(opts, folder=os.getcwd() if here else None,
                   name_writes=not here and bool(record.spec.get("working_dir")))
    job_id = uuid.uuid4().hex[:12]
    cluster_id = record.id
    warm = current().group
    job_name = name or f"cell {warm.cells + 1 if warm is not None and not warm.broken else 1}"
    flat = ((f.name, getattr(opts, f.name)) for f in fields(opts))     # asdict's deep copy costs per cell
    said = {k: v for k, v in (*flat, ("push", sorted(push) if push else None), ("pull", pull),
                               ("all_ranks", all_ranks), ("max_failures", max_failures), ("name", job_name))
            if v not in (None, False, [])}
    # a warm group of this shape answers where its workers run: one write for the job, not two
    placed = len({i["node_id"] for i in warm.info}) if _reusable(warm, opts, record) and warm.info else None
    start_row = _once(lambda: ledger.job_started(cluster_id, job_id, job_name, at=began, workers=opts.workers,
                                                 nodes=placed, options=said))
    # the group is built first: building it is the job's work (the idle autostop). On a warm group
    # the row is written while the workers run the cell; a Ray Client's link is settled first
    session = current()
    if placed is None or (session.connection is not None and session.connection.client):
        start_row()
    # what rank 0 keeps with the cell's journal: another kernel finds the job by it (``attach``)
    job = {"id": job_id, "name": job_name, "kernel": this_kernel(),
           "started": began, "pull": pull or []}
    watcher = Watcher(watch(cluster_id=cluster_id, job_id=job_id, name=job_name, workers=opts.workers,
                             simulated=record.simulated) if watch else None)

    def on_samples(samples: list[Report]) -> None:
        ledger.record_samples(cluster_id, job_id, samples)
        watcher.update(samples)

    status = "failed"
    failures = 0
    try:
        with connection.cell_running():     # the watcher never shuts Ray down under it
            group, record = group_for(opts, record)
            if shipping.bring_modules(record, group, source, push, opts.script_dir):
                start_row()       # a new group is built: the job's work
                group, record = group_for(opts)
            if (nodes := len({i["node_id"] for i in group.info})) != placed:
                start_row()
                ledger.job_placed(cluster_id, job_id, nodes=nodes)
            while True:
                try:
                    result = group.run(source, opts, push=push, pull=pull, all_ranks=all_ranks,
                                       on_samples=on_samples, job=job, on_sent=start_row)
                    say_written(result)
                    status = "finished"
                    return result
                except WorkerDied as died:
                    failures += 1
                    if failures > max_failures:
                        reset()      # the survivors may be stuck waiting for the dead one
                        raise GpugeekError(f"{died} — the group was stopped (its variables are gone); "
                                           f"--max-failures K re-runs the cell (resuming from checkpoints)") from None
                    print(f"{died}; rebuilding the group and running the cell again "
                          f"(failure {failures} of {max_failures} allowed)", flush=True)
                    node = group.info[died.rank]["node_id"] if died.rank < len(group.info) else None
                    reset()
                    opts = replace(_after_a_loss(opts, node, record, job_name), retry=opts.retry + 1)
                    group, _ = group_for(opts)
                except RemoteError as error:
                    if error.preempted is not None and capable(record).scheduler:
                        if not (record.spec.get("slurm") or {}).get("requeue"):
                            raise GpugeekError(walltime.ends(record, job_id, job_name, error.preempted)) from None
                        reset()
                        record = walltime.requeued(record, job_id, job_name, error.preempted)
                        group, record = group_for(opts, record)
                        opts = replace(opts, retry=opts.retry + 1)
                        continue
                    if error.preempted is not None:    # checkpointed on a notice: not a failure
                        group = _resume_after_preemption(record, job_id, job_name, error.preempted, opts)
                        opts = replace(opts, retry=opts.retry + 1)
                        continue
                    if "OutOfMemoryError" in error.traceback_text or "out of memory" in error.traceback_text:
                        planned = plan.memory.per_gpu(opts.workers)["total"] if plan is not None else None
                        error.extra = oom.diagnosis(error.traceback_text.strip().splitlines()[-1], opts,
                                                    error.memory, planned)
                    raise
                except (Exception, SystemExit) as error:   # Ray's calls exit when it shuts down under them
                    # a Ray Client that gave up (the link is down), or a stop begun elsewhere
                    link_down = isinstance(error, ConnectionError) and capable(record).tunnelled
                    stopped = isinstance(error, StoppedElsewhere)
                    if isinstance(error, GpugeekError) or (group.connected() and not link_down and not stopped):
                        raise
                    group.broken = True      # its cluster was stopped under the cell, or is out of reach
                    raise GpugeekError(away.lost(record, job_id)) from None
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except GpugeekError as error:
        status = "interrupted" if isinstance(error, Interrupted) else "failed"
        raise
    finally:
        start_row()          # a job refused before its cell went out has its row too
        ledger.job_ended(cluster_id, job_id, status)
        watcher.finish(status)


def _once(write):
    """``write``, done at the first call only."""
    done = []

    def once() -> None:
        if not done:
            done.append(True)
            write()
    return once


def _checkpoints(opts: RunOptions, record: ClusterRecord, key: str) -> RunOptions:
    """Where the job's checkpoints go — per job name, else per cell text (``key``): re-running the
    same cell resumes, another cell does not. ``gg``'s, with ``--checkpoint-every``, in
    ``--checkpoint-dir``, else the cluster's storage (``up --storage``), else this kernel's home
    (one host only). A framework's own are copied beside them (``workers/saves.py``) only into a
    ``--checkpoint-dir`` or the storage: elsewhere its own ``output_dir`` is all there is."""
    storage = record.spec.get("storage")     # ClusterSpec's, read without building one: every cell asks
    root = opts.checkpoint_dir or (f"{storage}/checkpoints/{key}" if storage else None)
    if opts.checkpoint_every and not opts.checkpoint_dir:
        opts = replace(opts, checkpoint_dir=root or str(home() / "checkpoints" / key))
    return replace(opts, keep_dir=root)


def _resume_after_preemption(record: ClusterRecord, job_id: str, job_name: str, preempted: dict,
                             opts: RunOptions) -> Group:
    """The job stopped on a preemption notice right after a checkpoint: wait for the node to go
    (a group built before would land on it again), then a new group on the nodes left."""
    ledger.job_preempted(record.id, job_id)
    ledger.event(record.id, "job-preempted", f"job {job_name!r} checkpointed at step {preempted['step']} on a "
                                             f"preemption notice; it resumes once the node is gone")
    print(f"preemption notice: checkpointed at step {preempted['step']}; resuming once the node is gone "
          "(not counted as a failure)", flush=True)
    reset()
    driver().wait_gone(preempted["nodes"], preempted["deadline"] + NODE_GONE_S)
    return group_for(opts)[0]


def _after_a_loss(opts: RunOptions, node_id: str | None, record: ClusterRecord, job_name: str) -> RunOptions:
    """A worker died. If its node died with it, wait for Ray to find the node gone (a group built
    before would be placed on it again); then the cell resumes on the workers the cluster still
    holds — fewer than before if a node is gone and none replaced it — and says so."""
    cluster = driver()
    if node_id is not None and not cluster.node_answers(node_id):
        cluster.wait_gone([node_id], time.time() + NODE_DEATH_S)
        ledger.event(record.id, "node-lost", f"job {job_name!r} lost the node {node_id[:12]} it ran on")
    kind, each = ("GPU", opts.gpus_per_worker) if opts.gpus_per_worker else ("CPU", 1)
    room = cluster.room(kind, each)
    if room >= opts.workers:
        return opts
    if room == 0:
        raise GpugeekError(f"no {kind} is left on cluster {record.name!r} for the cell to resume on — "
                           f"`%gpugeek scale` it, then run the cell again (it resumes from its checkpoint)")
    print(f"note: the cluster now holds {room} of the {opts.workers} workers (a node is gone): the cell resumes "
          f"on {room}; a later cell with --workers {opts.workers} needs the cluster scaled back", flush=True)
    return replace(opts, workers=room)
