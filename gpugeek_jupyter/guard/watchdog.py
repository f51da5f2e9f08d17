"""The cluster's watchdog: meters it, and stops it at the budget cap or after the idle timeout.

``python -m gpugeek_jupyter.guard.watchdog CLUSTER_ID`` runs in a session of its own, started by
``up``; it does not depend on the kernel, so a killed or closed notebook cannot leave a cluster
billing past its budget. Every interval it copies Ray's node table into the ledger, prices it,
and acts:

- spend ≥ 80 % of the budget → a warning event (shown by the next ``%gpugeek`` call and status);
- spend would pass the budget before the next look (one loop period plus the time a stop takes)
  → wait until what is left of it is what the stop burns, then stop jobs and shut the cluster
  down, so that the stop ends at the cap;
- idle for ``idle`` minutes → shut it down: no job and every node idle by Ray's clock, or a job
  whose devices sat unused (a stalled loop), and no notebook running cells (``meter/activity.py``);
- a head we started on this machine has died → close the ledger and stop what is left;
- a remote head no longer answers through its SSH tunnel and the tunnel is what dropped (the
  laptop slept, the network blinked) → open it again on the same local ports, so the kernel's
  Ray Client reconnects within its grace period and the cluster is metered on.

A remote cluster's head runs this watch too (``guard/headwatch.py``), and while its heartbeat comes
that one enforces the limits: this one then tells it what only this machine sees (its idleness
verdict), passes a stop it began on to the kernels here, and once the cluster stops answering
copies the head's ledger (``headguard.pull``) — and so learns of a stop made while it was away.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

from ..backends.interface import BACKENDS, capable
from ..cluster import processes, registry
from ..cluster.spec import ClusterSpec
from ..config import BUDGET_WARN_AT, settings
from ..errors import GpugeekError
from ..meter import activity, ledger
from ..raynodes import ClusterUnreachable, held_by_placement_groups, read_nodes
from ..remote import headguard, tunnel
from ..units import clock
from . import health
from .clusterjobs import ClusterJobs
from .launches import copy_news
from .lifecycle import machines_gone, meter_instances, requeued, shutdown

UNREACHABLE_LIMIT = 3   # consecutive failed reads before a head of ours counts as gone
UNREACHABLE = "unreachable"   # why a watchdog ended with its (remote) cluster still live
STOP_ALLOWANCE_S = 1.0  # how long a budget stop takes to end the nodes (SIGKILL after 0.5 s)
BUDGET_STOP_GRACE_S = 0.5
FOLLOW_EVERY_S = 10.0   # a requeued scheduler job: how often its next run is looked for
DEFAULT_IDLE_WINDOW_MIN = 10.0   # how far back devices are read where no idle stop is set (for status)


class Watch:
    """The state one watchdog carries between looks."""

    def __init__(self, cluster_id: int, interval: float):
        self.cluster_id = cluster_id
        self.interval = interval
        self.warned = bool(ledger.events(cluster_id, "budget-warning"))
        self.misses = 0
        self.unmetered_said = False
        self.idle_seen: dict[str, float] = {}
        self.readings = activity.Readings(cluster_id)   # a running job's device readings, read as they come
        self.period = interval
        self.stop = None                 # the backend's stop (the head's watchdog has its own)
        self.stop_allowance = STOP_ALLOWANCE_S
        self.head_stopping = False       # the head's watchdog began a stop (passed on to the kernels here)
        self.failures = 0                # looks in a row that failed (``health``)
        self.failing_since: float | None = None
        self.blind: str | None = None    # this look could not reach the cluster's GCS: why
        self.known: health.Known | None = None
        self.guard_kind = "here"         # this machine's watchdog ("head": the head's)
        self.beat: dict = {}             # the head watchdog's last fresh heartbeat
        self.unreached_since: float | None = None   # the cluster's GCS has not answered since
        self.unreachable_after = settings().unreachable_after_s
        self.cluster_jobs = ClusterJobs(cluster_id)   # the jobs the cluster tells of (no notebook needed)
        self.followed = -FOLLOW_EVERY_S                # when a moved head was last looked for
        self.follow_failed: str | None = None

    def look(self) -> str | None:
        """One pass; returns why the cluster stopped, or None to keep watching."""
        self.blind = None
        record = registry.get(self.cluster_id)
        if record.stopped:
            return record.stop_reason
        if record.stopping and not self.head_stopping:
            return None                     # someone else is stopping it; watch until it is done
        nodes = self._read(record)
        if isinstance(nodes, str):
            return nodes
        rented = meter_instances(record)         # a rented cluster: its provider's record
        if rented is None and nodes is not None:
            ledger.sync_nodes(self.cluster_id, nodes, ClusterSpec.from_json(record.spec).prices())
        elif rented and (gone := machines_gone(record)):
            shutdown(record, gone, from_watchdog=True, sync=False, stop=self.stop)   # (or another stop did)
            return "ended"
        now = time.time()
        on_head = nodes is not None and self._head_guards(record, now)
        if nodes is not None:
            registry.heard_from(self.cluster_id, now, self._guard(record, on_head))
        if record.budget_usd:
            stopped = self._budget(record, now, enforce=not on_head)
            if stopped:
                return stopped
        if nodes is not None:
            idle = self._idleness(record, nodes, now)
            if on_head:
                self._tell_head(record, idle)
            elif record.idle_minutes and idle.since is not None and now - idle.since >= record.idle_minutes * 60:
                ledger.event(self.cluster_id, "idle-stop",
                             f"idle for {record.idle_minutes:g} min ({idle.why}) — shutting the cluster down"
                             f"{_and_then(record)}", options={"idle": record.idle_minutes})
                if shutdown(record, f"idle {record.idle_minutes:g} min", from_watchdog=True, stop=self.stop):
                    return "idle"
        return None

    def _guard(self, record, on_head: bool) -> dict:
        """Who enforces the limits now: the head's watchdog (its heartbeat is fresh), else this one."""
        if on_head:
            remote = ClusterSpec.from_json(record.spec).remote   # a scheduler's job: its first node, not the login
            head = (f"{remote.head_ip} (job {remote.job_id})" if remote.job_id else remote.head) or "the head"
            return {"by": "head", "pid": self.beat.get("pid"), "host": head, "beat": self.beat.get("at")}
        return {"by": self.guard_kind, "pid": os.getpid(), "host": socket.gethostname()}

    def _head_guards(self, record, now: float) -> bool:
        """Whether the head's watchdog enforces the limits (its heartbeat is fresh); a stop it began
        is claimed here, so that the kernels attached here let go of the cluster first."""
        if not headguard.guarded(record):
            return False
        beat = headguard.heartbeat(record, timeout=max(1.0, self.interval))
        if not headguard.fresh(beat, now):
            return False
        self.beat = beat
        copy_news(self.cluster_id, beat.get("news") or [])     # what the head's autoscaler could not launch
        if beat.get("stopping") and not self.head_stopping and registry.claim_stop(self.cluster_id):
            self.head_stopping = True
        return True

    def _tell_head(self, record, idle: activity.Idleness) -> None:
        try:
            headguard.report(record, idle.since, idle.why, self.interval)
        except ClusterUnreachable:
            pass

    def _read(self, record):
        # the tunnel first: Ray's client waits ~35 s on a port nothing forwards any more, and a
        # kernel's Ray Client gives up reconnecting after 30
        record = self._follow(record) or self._reopen_tunnel(record) or record
        try:
            if capable(record).tunnelled and not tunnel.forwards(record.address):
                raise ClusterUnreachable(f"nothing answers through the tunnel at {record.address} — `%gpugeek doctor` "
                                         "checks the cluster; `down` stops it")
            nodes = read_nodes(record.address, timeout=max(1.0, self.interval))
            self.misses, self.unreached_since = 0, None
            return nodes
        except ClusterUnreachable as exc:
            self.misses += 1
            self.blind = f"its GCS does not answer: {exc}"
            self.unreached_since = self.unreached_since or time.time()
        if headguard.guarded(record) and headguard.pull(record) and registry.get(self.cluster_id).stopped:
            return registry.get(self.cluster_id).stop_reason    # the head stopped it while we could not see
        head_gone = capable(record).runs_here and not processes.session_processes(
            record.session_id, record.created, record.marker)
        if head_gone:       # a head that runs but does not answer is a failing look, not a lost one
            if shutdown(record, "lost: the head stopped answering", from_watchdog=True, stop=self.stop):
                return "lost"
        elif capable(record).tunnelled and not requeued(record) and \
                time.time() - (record.heard or self.unreached_since) > self.unreachable_after:   # as readers say
            return self._go_quiet(record)
        elif not self.unmetered_said and self.misses >= UNREACHABLE_LIMIT:
            # a cloud head we cannot reach may still be running: keep billing its open nodes, and
            # keep enforcing the budget on that (never stop it just for being unreachable)
            ledger.event(self.cluster_id, "unmetered",
                         f"cannot reach the head at {record.address}; metering on the last known nodes")
            self.unmetered_said = True
        return None

    def _go_quiet(self, record) -> str:
        """No word from a remote cluster for ``unreachable_after_min``: stop dialing it (the tunnel
        goes, and this watchdog ends); readers ask its head again (``lifecycle.catch_up``), and
        ``down --forget`` closes a cluster whose machines are gone."""
        heard = clock(record.heard or self.unreached_since)
        ledger.event(self.cluster_id, "unreachable",
                     f"no word from the cluster since {heard}: this machine's watchdog stops dialing it (its head's "
                     f"own watchdog, if it runs, enforces the limits); `status` asks it again, and `down "
                     f"{record.name} --forget` closes the record if its machines are gone")
        if record.session_id:
            processes.stop_session(record.session_id, record.created, record.marker, grace=1)
        return UNREACHABLE

    def _follow(self, record):
        """The record with its new head when its scheduler's job moved (requeued: it runs again on
        an allocation of its own, ``Backend.follow``), else None; looked for once the scheduler's
        record says so, at most every ``FOLLOW_EVERY_S``."""
        if not capable(record).scheduler or not requeued(record):
            return None
        now = time.monotonic()
        if now - self.followed < FOLLOW_EVERY_S:
            return None
        self.followed = now
        try:
            return BACKENDS[record.backend].follow(record)
        except GpugeekError as exc:
            if str(exc) != self.follow_failed:      # said once
                self.follow_failed = str(exc)
                ledger.event(self.cluster_id, "head-moved", str(exc))
            return None

    def _reopen_tunnel(self, record):
        """The record with a new tunnel if the one to a remote head had dropped, else None."""
        if not capable(record).tunnelled or not ClusterSpec.from_json(record.spec).remote.head_ip:
            return None
        try:
            fresh = tunnel.ensure(record)
        except GpugeekError as exc:          # the head (or the network to it) is down, not just the tunnel
            if self.misses == UNREACHABLE_LIMIT:
                ledger.event(self.cluster_id, "tunnel",
                             f"the SSH tunnel to the head is down and does not reopen: {exc}")
            return None
        if fresh.session_id == record.session_id:
            return None                      # the tunnel is fine: the head itself did not answer
        return fresh                         # (``tunnel.ensure`` put its reopening in the ledger)

    def _budget(self, record, now: float, enforce: bool = True) -> str | None:
        budget = record.budget_usd
        spent = ledger.spend(self.cluster_id, now)
        burn = ledger.burn_rate(self.cluster_id)
        self.known = health.Known(record, spent, burn, now)
        if not self.warned and spent >= BUDGET_WARN_AT * budget:
            ledger.event(self.cluster_id, "budget-warning",
                         f"{spent / budget:.0%} of the ${budget:,.2f} budget spent (${spent:,.2f}; "
                         f"burning ${burn:,.2f}/h)", options={"budget": budget, "burn_usd_per_hour": burn})
            self.warned = True
        ahead = burn * (self.period + self.stop_allowance) / 3600.0
        if enforce and spent + ahead >= budget:
            # the cap falls before the next look: the stop starts when what is left of the budget
            # is what the stop itself will burn, so that it ends at the cap, not a look early
            lead = (budget - spent) / burn * 3600.0 - self.stop_allowance if burn > 0 else 0.0
            time.sleep(min(max(0.0, lead), self.period))
            spent = ledger.spend(self.cluster_id, time.time())
            ledger.event(self.cluster_id, "budget-stop",
                         f"budget ${budget:,.2f} reached (${spent:,.2f} spent, ${burn:,.2f}/h) — stopping "
                         f"jobs and shutting the cluster down{_and_then(record)}",
                         options={"budget": budget, "burn_usd_per_hour": burn})
            if shutdown(record, "budget cap reached", from_watchdog=True, grace=BUDGET_STOP_GRACE_S, stop=self.stop):
                return "budget"
        return None

    def _held(self, record) -> bool:
        """Whether only placement groups (warm worker groups) hold the cluster's CPUs and GPUs."""
        try:
            return held_by_placement_groups(record.address, timeout=max(1.0, self.interval))
        except ClusterUnreachable:
            return False

    def _idleness(self, record, nodes, now: float) -> activity.Idleness:
        """Ray reports how long a node had been idle when its state last changed; a node whose
        idle time went *down* since the last look did work in between. The rest is
        ``activity.judge``: jobs and their devices, the notebooks' cells."""
        alive = {n.node_id: n.idle_s for n in nodes if n.alive}
        worked = any(node_id not in self.idle_seen or idle is None or idle < self.idle_seen[node_id]
                     for node_id, idle in alive.items())
        self.idle_seen = {k: v for k, v in alive.items() if v is not None}
        working, ended = self.cluster_jobs.look(self._gcs(record), now, timeout=max(1.0, self.interval))
        idle = activity.judge(self.cluster_id, nodes, record.idle_since,
                              (record.idle_minutes or DEFAULT_IDLE_WINDOW_MIN) * 60, ray_worked=worked,
                              last_cell=registry.last_cell(self.cluster_id),
                              notebook=bool(registry.attached_kernels(self.cluster_id)),
                              readings=self.readings, held=lambda: self._held(record), now=now,
                              working=working, job_ended=ended)
        if (idle.since, idle.why) != (record.idle_since, record.idle_why):
            registry.note_idleness(self.cluster_id, idle.since, idle.why)
        return idle

    def _gcs(self, record) -> str:
        """Where this watchdog reads the cluster's GCS (the head's reads its own)."""
        return record.address

    @property
    def by(self) -> str:
        """The watchdog, said in its own lines and events."""
        return "head's watchdog" if self.guard_kind == "head" else "watchdog"

    def looked(self) -> None:
        """A look that saw the cluster: a failing streak ends, and says so."""
        if self.failures >= health.FAILING_AFTER:
            ledger.event(self.cluster_id, "guard", f"the {self.by} sees the cluster again after {self.failures} "
                                                   f"failed looks")
        if self.failures:
            health.clear(self.cluster_id)
        self.failures, self.failing_since = 0, None

    def failed(self, why: str) -> str | None:
        """A look that failed (it raised, or could not reach the cluster): counted; said once
        after ``FAILING_AFTER`` in a row; and with a budget, the cluster is stopped once the last
        known burn would reach it. Returns why it stopped, if it did."""
        now = time.time()
        self.failures += 1
        self.failing_since = self.failing_since or now
        if self.failures >= health.FAILING_AFTER:
            known = self.known
            budget = known.record.budget_usd if known else None
            health.write(self.cluster_id, {"since": self.failing_since, "looks": self.failures, "error": why,
                                           "by": self.by, "pid": os.getpid(), "at": now, "budget": budget,
                                           "burn": known.burn if known else None})
            if self.failures == health.FAILING_AFTER:
                self._say("guard-failing", f"the {self.by} has failed {self.failures} looks in a row ({why})"
                          + (f"; it holds the ${budget:,.2f} budget on the last known ${known.burn:,.2f}/h"
                             if budget else ""))
        return self._money_safe(now, why)

    def _money_safe(self, now: float, why: str) -> str | None:
        """The budget held without a reading: stop once the last known burn, carried on to now
        and over the next look and the stop, would reach it."""
        known = self.known
        if known is None or not known.record.budget_usd or known.record.stopped:
            return None
        budget = known.record.budget_usd
        spent = known.projected(now)
        if spent + known.burn * (self.period + self.stop_allowance) / 3600.0 < budget:
            return None
        reason = "budget cap reached (by the last known burn: the spend could not be read)"
        self._say("budget-stop", f"budget ${budget:,.2f} reached by the last known burn (${known.burn:,.2f}/h from "
                                 f"${known.spent:,.2f}: ${spent:,.2f} now) — the {self.by} cannot read the spend "
                                 f"({why}); shutting the cluster down")
        try:
            if shutdown(known.record, reason, from_watchdog=True, grace=BUDGET_STOP_GRACE_S, stop=self.stop):
                return "budget"
            return None          # another stop was under way, and is done
        except Exception as exc:  # noqa: BLE001 - the registry or ledger failing: stop the machines anyway
            print(f"{self.by}: the recorded stop failed ({exc}); stopping the machines directly", flush=True)
        (self.stop or BACKENDS[known.record.backend].stop)(known.record, grace=BUDGET_STOP_GRACE_S)
        try:
            ledger.end_all_nodes(self.cluster_id, time.time(), reason)
            registry.mark_stopped(self.cluster_id, reason)
        except Exception as exc:  # noqa: BLE001 - the machines are stopped; the record says so when it can
            print(f"{self.by}: the machines are stopped but the ledger could not say so ({exc})", flush=True)
        return "budget"

    def _say(self, kind: str, message: str) -> None:
        """An event when the ledger takes it, and the watchdog's log either way."""
        print(f"{self.by}: {message}", flush=True)
        try:
            ledger.event(self.cluster_id, kind, message)
        except Exception as exc:  # noqa: BLE001 - the ledger may be what fails; the file and the log still say it
            print(f"{self.by}: the ledger did not take that ({exc})", flush=True)


def run(cluster_id: int, interval: float | None = None, watch: Watch | None = None) -> str:
    """Watch until the cluster stops; returns why it stopped. A look that raises is logged,
    counted and, repeated, said (``Watch.failed``); the watching goes on, and a budget still
    holds on the last known burn: a watchdog that fails quietly would leave it unenforced."""
    interval = interval or (watch.interval if watch else settings().meter_interval_s)
    watch = watch or Watch(cluster_id, interval)
    while True:
        started = time.monotonic()
        try:
            reason = watch.look()
            why = None if reason else watch.blind
        except Exception as exc:  # noqa: BLE001 - counted and said by `failed`; the log has the traceback
            reason, why = None, f"{type(exc).__name__}: {exc}"
            if watch.failures == 0:      # the first of a streak in full; the rest a line each
                traceback.print_exc()
            else:
                print(f"look failed again: {why}", file=sys.stderr, flush=True)
        if why is None and not reason:
            watch.looked()
        elif why is not None:
            reason = watch.failed(why)
        if reason:
            return reason
        time.sleep(interval)
        watch.period = max(interval, time.monotonic() - started)


def main(argv: list[str]) -> int:
    ledger.acting_as("watchdog")
    reason = run(int(argv[1]))
    print(f"watchdog: cluster {argv[1]} " + ("unreachable: this watchdog stops dialing it" if reason == UNREACHABLE
                                             else f"stopped ({reason})"), flush=True)
    return 0


def _and_then(record) -> str:
    """What the stop leaves billing that only the user can end (a rented box), as the event's end."""
    still = capable(record).still_billing(record)
    return f"; {still}" if still else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
