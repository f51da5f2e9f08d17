"""A cluster's life as the registry records it — starting, running, failed, stopping, stopped —
and the one way it ends.

Whoever stops a cluster (a notebook's ``down``, the watchdog, JupyterLab's shut-down button)
first claims the stop in the registry, so it happens exactly once. The watchdog and the Jupyter
server use this module; it never touches a kernel's Ray connection (a kernel passes its own
``before_stop`` to drop it) and loads no pandas.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..backends.interface import BACKENDS, capable
from ..backends.rented import instances_of
from ..clouds import CLOUDS
from ..clouds.base import CloudUnanswered
from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..config import home, settings
from ..errors import GpugeekError
from ..meter import allocation, ledger
from ..meter.instances import all_ended, sync_instances
from ..raynodes import ClusterUnreachable, read_nodes
from ..remote import headguard, tunnel
from ..units import clock, duration
from ..vocab import ClusterPhase
from . import health
from .jobend import preempted_end

STARTING_AT_MOST_S = 600   # an `up` still unfinished after this died half-way (its kernel was killed)
HEARD_WINDOW_S = 30.0      # a remote cluster not heard from for longer: its $ counted to its last word
CATCH_UP_EVERY_S = 5.0     # how often one process asks a head whose watchdog here is gone (``catch_up``)
CATCH_UP_UNREACHABLE_S = 60.0   # … and one unreachable for ``unreachable_after_min``: its machines may be gone
_caught_up: dict[int, float] = {}
WATCHDOG_GRACE_S = 2.0
# a watchdog's stop waits this long before it stops the nodes, so that a kernel still connected
# lets go first (it looks every KERNELS_LOOK_EVERY_S; a running cell sees the stop within its
# drain's 3 s; then it shuts its Ray connection, which takes a second or two): a Ray driver whose
# cluster dies under it can be ended by Ray itself, and a notebook's kernel with it
LET_GO_S = registry.KERNELS_LOOK_EVERY_S + 5.0


def phase_of(record: ClusterRecord) -> ClusterPhase:
    if record.stopped:
        return ClusterPhase.STOPPED
    if record.stopping:
        return ClusterPhase.STOPPING
    if record.start_failed or up_died(record):
        return ClusterPhase.FAILED
    if record.ready is None and time.time() - record.created < STARTING_AT_MOST_S:
        return ClusterPhase.STARTING
    return ClusterPhase.RUNNING


def up_died(record: ClusterRecord) -> bool:
    """Its ``up`` ended half-way: the kernel that ran it is gone and it was never ready (the
    notebook's machine lost power, the kernel was killed). What it had started may run and bill."""
    return record.ready is None and processes.kernel_gone(record.started_by) is True


UP_DIED = "its `up` ended half-way (the kernel that ran it is gone)"


def starting(record: ClusterRecord) -> bool:
    """``up`` is still bringing the cluster up (it marks it ready at the end): a stop now would
    race it."""
    return phase_of(record) is ClusterPhase.STARTING


@dataclass(frozen=True)
class ClusterState:
    """Where a cluster is, as values: its phase, and for a live one whether a notebook is
    attached and whether its watchdog (budget cap, idle stop) still runs."""

    phase: ClusterPhase
    orphan: bool = False
    watchdog_gone: bool = False
    stop_reason: str | None = None
    stopped_at: float | None = None
    failure: str | None = None
    guard_failing: dict | None = None    # the watchdog's failed looks (``health``), while they go on
    unheard_since: float | None = None   # a remote cluster this machine has not heard from since then
    guard: dict | None = None            # who enforced its limits when it was last heard
    budget: float | None = None
    watchdog_pid: int | None = None      # this machine's watchdog for it
    walltime_end: float | None = None    # a scheduler's job: when it ends at its time limit, or
    preempted: bool = False              # … at its grace time's end, the scheduler having preempted it

    def describe(self, name: str, now: float | None = None, spent_then: float | None = None) -> str:
        """One line for people: ``running — orphan: no notebook attached``. ``spent_then``: the
        $ at the moment a remote cluster was last heard from."""
        now = time.time() if now is None else now
        if self.phase is ClusterPhase.STOPPED:
            return f"stopped ({self.stop_reason}) {duration(now - (self.stopped_at or now))} ago"
        text = self.phase.value
        if self.walltime_end is not None and self.phase is ClusterPhase.RUNNING:
            left = self.walltime_end - now
            ends = "preempted by the scheduler: its job ends" if self.preempted else "walltime ends"
            text += (f" — {ends} at {clock(self.walltime_end)} (in {duration(left)})" if left > 0
                     else f" — walltime reached at {clock(self.walltime_end)}")
        if self.phase is ClusterPhase.FAILED:
            text += (f": {self.failure} — it may still be running and billing; "
                     f"`%gpugeek down {name}` tries the stop again")
        if self.orphan:
            text += " — orphan: no notebook attached"
        unreachable = self.unheard_since is not None and now - self.unheard_since > settings().unreachable_after_s
        if self.unheard_since is not None:
            at = clock(self.unheard_since)
            text += f" — unreachable since {at}" if unreachable else f" — last heard from the cluster at {at}"
            if spent_then is not None:
                text += f", ${spent_then:,.2f} then (an estimate: its nodes are counted to that moment)"
        head = self.guard if self.guard and self.guard.get("by") == "head" else None
        if head is not None and (self.watchdog_gone or self.unheard_since is not None):
            limits = f"the ${self.budget:,.2f} cap and the idle stop" if self.budget else "the idle stop"
            where = f"watchdog on the head (pid {head.get('pid')} on {head.get('host')})"
            text += (f"; if its head still runs, its own {where} enforces {limits}" if unreachable
                     else f"; its own {where} enforces {limits}")
        elif self.watchdog_gone:
            text += " — not watched: its watchdog is gone, budget and idle stop are not enforced"
        elif self.guard_failing:
            text += health.describe(self.guard_failing)
        return text


    def guarded_by(self, now: float | None = None, heard: float | None = None) -> str | None:
        """Who enforces the budget and idle stop now, as a fact: the head's watchdog (its pid, host
        and heartbeat's age) or this machine's (its pid and last look, ``heard``); None when nothing
        does (the watchdog is gone and no head guards) or the cluster is not live."""
        now = time.time() if now is None else now
        if self.guard_by == "head":
            guard, beat = self.guard, self.guard.get("beat")
            age = f", heartbeat {duration(max(0.0, now - beat))} ago" if beat else ""
            return f"the head's watchdog (pid {guard.get('pid')} on {guard.get('host')}{age})"
        if self.guard_by == "here":
            age = f", last look {duration(max(0.0, now - heard))} ago" if heard else ", not looked yet"
            return f"this machine's watchdog (pid {self.watchdog_pid}{age})"
        return None

    @property
    def guard_by(self) -> str | None:
        """``head``, ``here`` or None: ``guarded_by`` in a word (a table's column, a metric's label)."""
        if not self.phase.live:
            return None
        if self.guard and self.guard.get("by") == "head":
            return "head"
        return "here" if self.watchdog_pid and not self.watchdog_gone else None


def state_of(record: ClusterRecord, attached: list[int] | None = None, now: float | None = None) -> ClusterState:
    """``attached`` saves a second look at the attached kernels when the caller has them."""
    phase = phase_of(record)
    if not phase.live:
        return ClusterState(phase, stop_reason=record.stop_reason, stopped_at=record.stopped)
    if phase is ClusterPhase.RUNNING:
        orphan = not (registry.attached_kernels(record.id) if attached is None else attached)
    else:
        orphan = False
    gone = bool(record.watchdog_pid) and not processes.alive(record.watchdog_pid)
    return ClusterState(phase, orphan=orphan, watchdog_gone=gone,
                        failure=record.start_failed or (UP_DIED if up_died(record) else None),
                        guard_failing=health.failing(record.id), unheard_since=unheard_since(record, now),
                        guard=json.loads(record.guard) if record.guard else None, budget=record.budget_usd,
                        watchdog_pid=record.watchdog_pid, preempted=bool(grace := preempted_end(record, now)),
                        walltime_end=grace or (record.spec.get("remote") or {}).get("walltime_end"))


def unheard_since(record: ClusterRecord, now: float | None = None) -> float | None:
    """When a live remote cluster was last heard from, once that is over ``HEARD_WINDOW_S`` ago
    (its nodes are then counted to that moment: nothing here knows they ran on); else None."""
    if not record.live or not capable(record).tunnelled or record.heard is None:
        return None
    now = time.time() if now is None else now
    return record.heard if now - record.heard > HEARD_WINDOW_S else None


def counted_until(record: ClusterRecord, now: float) -> float:
    """The moment a cluster's open nodes are counted to: now, or its last word (``unheard_since``)."""
    since = unheard_since(record, now)
    return now if since is None else min(now, since)


def catch_up(record: ClusterRecord) -> ClusterRecord:
    """A remote cluster whose watchdog here is gone (this machine slept, or was off): the head's
    ledger first, over SSH within its connect timeout — its dollars and a stop it made become
    this machine's — then, for a cluster still live, this machine's watchdog again, so that the
    tunnel and the sync resume. Tried at most once every ``CATCH_UP_EVERY_S`` per process
    (``CATCH_UP_UNREACHABLE_S`` once it is unreachable), and by
    one process at a time. Returns the record as it is then."""
    if not needs_catch_up(record):
        return record
    now = time.monotonic()
    since = unheard_since(record)
    every = CATCH_UP_UNREACHABLE_S if since is not None and time.time() - since > settings().unreachable_after_s \
        else CATCH_UP_EVERY_S
    if now - _caught_up.get(record.id, -every) < every:
        return record
    _caught_up[record.id] = now
    lock = home() / "guards" / f"{record.id}.lock"
    lock.parent.mkdir(mode=0o700, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        record = registry.get(record.id)
        if not record.live or (record.watchdog_pid and processes.alive(record.watchdog_pid)):
            return record        # another reader got there first
        pulled = headguard.pull(record)
        record = registry.get(record.id)
        if pulled is not None and record.live:
            start_watchdog(record)
            record = registry.get(record.id)
        elif pulled is not None and ClusterSpec.from_json(record.spec).slurm is not None:
            # the head closed its ledger as it stopped, a moment before the job ended: Slurm's record says when
            meter_instances(record, record.stop_reason)
    return record


def needs_catch_up(record: ClusterRecord) -> bool:
    """A live remote cluster with a watchdog on its head and none running here."""
    return (record.live and capable(record).tunnelled and headguard.guarded(record)
            and not (record.watchdog_pid and processes.alive(record.watchdog_pid)))


def start_watchdog(record: ClusterRecord) -> None:
    """The cluster's own watchdog process, in a session of its own (it outlives the kernel)."""
    log_dir = Path(record.temp_dir) if record.temp_dir and Path(record.temp_dir).is_dir() else home()
    env = {**os.environ, "GPUGEEK_HOME": str(home()), processes.MARKER: record.marker}
    proc = processes.start_detached(
        [sys.executable, "-m", "gpugeek_jupyter.guard.watchdog", str(record.id)], env,
        log_dir / "gpugeek-watchdog.log")
    registry.update(record.id, watchdog_pid=proc.pid)


def sync_ledger(record: ClusterRecord) -> None:
    """Pull what the cluster's machines cost into the ledger (cheap; the kernel and the watchdog
    both do it). A cluster that does not answer is left as the ledger has it — unless its head
    keeps a ledger of its own (``headguard``) and answers over SSH: then that one is copied, with
    a stop the head made while this machine was away. A rented cluster is metered from its
    provider's list of instances whether its head answers or not."""
    if not record.address or record.stopped or record.address.startswith("ray://"):
        return      # a cluster we reach only as a Ray Client (someone else's): its GCS is not ours to read
    rented = meter_instances(record)
    gone = machines_gone(record) if rented else None
    if gone and not registry.get(record.id).stopping:
        shutdown(record, gone, sync=False)
        return
    try:
        if capable(record).tunnelled and not tunnel.forwards(record.address):
            raise ClusterUnreachable(f"nothing answers through the tunnel at {record.address} — `%gpugeek doctor` "
                                     "checks the cluster; `down` stops it")
        nodes = read_nodes(record.address, timeout=3)
    except ClusterUnreachable:
        if headguard.guarded(record):
            headguard.pull(record)
        return
    if rented is None:
        ledger.sync_nodes(record.id, nodes, ClusterSpec.from_json(record.spec).prices())


def meter_instances(record: ClusterRecord, reason: str | None = None) -> bool | None:
    """A rented cluster's instances into the ledger, as its provider lists them (``meter/instances.py``:
    billed from launch, boot and set-up included, not from when Ray saw the node); a Slurm
    cluster's nodes as Slurm records its job (``meter/allocation.py``: from the job's start to its
    end). Returns None for a cluster metered from Ray's node table, False when the provider or
    the scheduler did not answer (its open rows keep counting), True once metered."""
    spec = ClusterSpec.from_json(record.spec)
    if spec.slurm is not None:
        return _meter_job(record, spec, reason)
    cloud = CLOUDS.get(spec.backend)
    if cloud is None or not cloud.lists_instances or not spec.node_types:
        return None
    try:
        found = instances_of(record)
    except CloudUnanswered:
        return False
    sync_instances(record.id, found, spec.prices(), {t.name: float(t.gpu_count) for t in spec.node_types},
                   time.time(), cloud.billing_minimum_s, reason)
    return True


def _meter_job(record: ClusterRecord, spec: ClusterSpec, reason: str | None) -> bool:
    """Slurm's record read at most every ``SLURM_LOOK_EVERY_S`` per process once the job's rows
    are in (a login over SSH each time; a running job's open rows count on meanwhile), and at
    every stop."""
    now = time.monotonic()
    if reason is None and now - _slurm_looked.get(record.id, -SLURM_LOOK_EVERY_S) < SLURM_LOOK_EVERY_S:
        return True
    job = BACKENDS[spec.backend].job_record(spec)
    if job is None:
        return False
    _slurm_jobs[record.id] = job
    nodes, prices = job.instances(), spec.prices()
    if nodes:
        _slurm_looked[record.id] = now
    gpus = {"head": float(spec.slurm.gpus_per_node), "host": float(spec.slurm.gpus_per_node)}
    if sync_instances(record.id, nodes, prices, gpus, time.time(), 0.0, reason, recorded_end_wins=True) and \
            not ledger.events(record.id, METERED_BY_SLURM):
        rate = prices["host"].usd_per_hour
        ledger.event(record.id, METERED_BY_SLURM,
                     f"metered from Slurm's record of job {job.job} ({allocation.SOURCES[job.source]}): its "
                     f"{len(job.nodes)} node{'s' if len(job.nodes) != 1 else ''} from the job's start to its end"
                     + (f", × ${rate:,.2f}/h each" if rate is not None else ""))
    return True


METERED_BY_SLURM = "metered-by-slurm"
SLURM_LOOK_EVERY_S = 15.0
_slurm_looked: dict[int, float] = {}
_slurm_jobs: dict[int, allocation.JobRecord] = {}     # each Slurm cluster's job, as last read here


def requeued(record: ClusterRecord) -> bool:
    """Whether the cluster's Slurm job, as last read here, was requeued since this machine last
    reached its head: it waits to run again, or runs on an allocation not followed yet (its head
    answers nowhere meanwhile, and that is no sign of trouble)."""
    job = _slurm_jobs.get(record.id)
    return job is not None and job.restarts > ClusterSpec.from_json(record.spec).remote.restarts


def machines_gone(record: ClusterRecord) -> str | None:
    """Why a rented cluster is over, when every instance it had has ended with no stop of ours:
    its head's watchdog stopped it while this machine was away (and ended itself, its ledger with
    it), or someone did in the provider's console. A Slurm cluster's, when its job has ended (its
    walltime, an ``scancel``, the head's stop). The stop that follows ends what runs here."""
    spec = ClusterSpec.from_json(record.spec)
    if spec.slurm is not None:        # a job requeued is pending again, its rows all ended: not over
        job = _slurm_jobs.get(record.id)
        return (f"its Slurm job {spec.remote.job_id} has ended, as Slurm records it"
                if job is not None and job.done and all_ended(record.id) else None)
    cloud = CLOUDS.get(spec.backend)
    if cloud is None or not cloud.lists_instances or not all_ended(record.id):
        return None
    return f"every instance has ended, as {cloud.name} lists them (stopped from its head or by hand)"


def shutdown(record: ClusterRecord, reason: str, *, from_watchdog: bool = False, sync: bool = True,
             grace: float = 3.0, before_stop: Callable[[ClusterRecord], None] | None = None,
             stop: Callable[..., None] | None = None) -> bool:
    """Stop the cluster's jobs and nodes and close its ledger. Exactly once, whoever calls it:
    returns False when another stop was under way (after waiting for it).

    Nodes are billed until their processes are gone (the time is taken after the stop). If the
    stop itself fails (``ray down`` errors, say) the cluster is *not* marked stopped — it may still
    be billing — the claim is released, the failure recorded, the watchdog left running, and the
    error raised. ``before_stop`` runs once the stop is ours (a kernel drops its Ray connection);
    ``stop`` stands in for the backend's (the head's watchdog stops the nodes through Ray).
    """
    if not registry.claim_stop(record.id):
        wait_stopped(record.id)
        return False
    ledger.stop_running_jobs(record.id, f"stopped: {reason}")
    if sync:
        sync_ledger(record)
    if before_stop is not None:
        before_stop(record)
    if from_watchdog and registry.attached_kernels(record.id):
        time.sleep(LET_GO_S)
    try:
        (stop or BACKENDS[record.backend].stop)(record, grace=grace)
    except BaseException as exc:
        registry.release_stop(record.id)
        ledger.event(record.id, "stop-failed", f"stopping failed ({exc}) — the cluster may still be running")
        raise
    at = time.time()
    meter_instances(record, reason)   # a rented cluster's instances end where its provider says billing did
    ledger.end_all_nodes(record.id, at, reason)
    registry.mark_stopped(record.id, reason, at)
    ledger.event(record.id, "down", reason, at=at, options={"reason": reason, "grace_s": grace})
    if record.watchdog_pid and not from_watchdog:
        # only now: a watchdog outlives a failed stop, to keep metering what may still be billing
        processes.stop_processes(
            [p for p in processes.session_processes(record.watchdog_pid, record.created, record.marker)
             if p.pid == record.watchdog_pid], grace=WATCHDOG_GRACE_S)
    return True


def forget(record: ClusterRecord, by: str) -> float:
    """``down NAME --forget``: close the record of a remote cluster whose machines are gone (ended
    in the provider's console, say) and cannot be stopped from here. Each node ends at the last
    moment it was known to run (``heard``), and so does the cluster; what this machine runs for it
    (the tunnel, the watchdog) is stopped, so nothing dials its addresses. Returns that moment."""
    if not registry.claim_stop(record.id):
        wait_stopped(record.id)
        raise GpugeekError(f"cluster {record.name!r} is being stopped elsewhere — look again in a minute")
    at = min(record.heard or time.time(), time.time())
    said = clock(at)
    reason = f"forgotten ({by}): not heard from since {said}"
    for session in (record.session_id, record.watchdog_pid):
        if session:
            processes.stop_session(session, record.created, record.marker, grace=1)
    ledger.end_all_nodes(record.id, at, reason)
    registry.mark_stopped(record.id, reason, at)
    ledger.event(record.id, "forget", f"{reason}: its nodes end then; if its machines still run, they bill "
                                      f"until ended with their provider", options={"heard": at})
    return at


def forget_hint(record: ClusterRecord) -> str:
    """What a failed stop of a remote cluster adds: how to close a record whose machines are gone."""
    if not capable(record).tunnelled:
        return ""
    return (f" — if its machines are gone (ended in the provider's console), `down {record.name} --forget` "
            f"closes its record at the last moment it was heard from")


def wait_stopped(cluster_id: int, timeout: float = 60) -> None:
    """Wait for a stop another process claimed: until it is done, or it gave up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = registry.get(cluster_id)
        if record.stopped is not None or record.stopping is None:
            return
        time.sleep(0.2)
