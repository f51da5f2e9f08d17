"""What a notebook does to a running cluster — ``down``, ``scale``, ``limits``, ``preempt`` — and
the ``Cluster`` handle whose methods are these."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..backends.interface import BACKENDS, Feature, capable
from ..backends.rented import instances_ended
from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..guard import lifecycle
from ..guard.lifecycle import shutdown
from ..kernel import connection
from ..kernel.session import current, live_cluster
from ..meter import ledger
from ..raynodes import ClusterUnreachable, send_notice
from ..remote import headguard
from ..units import number
from .status import ClusterStatus, status


def check_numbers(**values) -> None:
    """Worker counts, budgets and idle minutes as flags (``units.number``): workers whole and at
    least 1 (``min_workers`` may be 0), budget and idle minutes above 0."""
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if "workers" in name:
            hint = " (`%gpugeek down` stops a cluster)" if name == "workers" else ""
            number(value, flag, whole=True, least=0 if name == "min_workers" else 1, hint=hint)
        else:
            number(value, flag, above=0)


def stop(record: ClusterRecord, reason: str, **kwargs) -> bool:
    """``lifecycle.shutdown`` from a kernel: this kernel lets go of the cluster first."""
    return shutdown(record, reason, before_stop=connection.disconnect, **kwargs)


def down(name: str | None = None, *, all: bool = False, forget: bool = False) -> list[str]:
    """Stop a cluster (or every live one). Attached clusters are only detached, never stopped.
    ``forget``: close the record of a remote cluster whose machines are gone, its nodes ended
    when it was last heard from (``lifecycle.forget``)."""
    session = current()
    records = registry.all_records(include_stopped=False) if all else [live_cluster(name)]
    if forget:
        if all or not capable(records[0]).tunnelled:
            raise GpugeekError("down --forget takes one cluster — name the remote cluster whose machines are gone")
        connection.disconnect(records[0])
        lifecycle.forget(records[0], "the notebook")
        if records[0].name == session.active:
            session.active = None
        return [records[0].name]
    done = []
    for record in records:
        try:
            stop(record, "down" if capable(record).launches else "detached")
        except GpugeekError as exc:
            raise GpugeekError(f"{exc}{lifecycle.forget_hint(record)}") from None
        if registry.get(record.id).stopped is None:
            raise GpugeekError(f"cluster {record.name!r} is still stopping elsewhere — check `%gpugeek status "
                               f"{record.name}` in a minute")
        done.append(record.name)
        if ended := instances_ended(record.id):
            print(f"{record.name}: {ended}", flush=True)
        if still := capable(record).still_billing(record):
            print(f"{record.name}: {still}", flush=True)
        if record.name == session.active:
            session.active = None
    return done


def scale(workers: int, name: str | None = None) -> Cluster:
    check_numbers(workers=workers)
    record = live_cluster(name)
    spec = ClusterSpec.from_json(record.spec)
    spec = BACKENDS[record.backend].scale(record, spec, int(workers))
    registry.update(record.id, spec=spec.to_json())
    ledger.event(record.id, "scale", f"scaled to {workers} worker node(s)", options={"workers": int(workers)})
    return Cluster(record.name)


def limits(name: str | None = None, *, budget: float | None = None, idle: float | None = None) -> Cluster:
    """Change a live cluster's budget cap or idle stop (those ``up`` took). A cap at or below
    what is spent stops the cluster at the watchdog's next look. A head that runs the watchdog
    is told too, through the cluster: it must answer, or nothing changes."""
    check_numbers(budget=budget, idle=idle)
    if budget is None and idle is None:
        raise GpugeekError("limits: nothing to set — give --budget USD, --idle MINUTES or both")
    record = live_cluster(name)
    if not capable(record).watched:
        raise GpugeekError(f"cluster {record.name!r} ({record.backend}) has no watchdog of ours: budget and idle "
                           f"stop are not enforced there — set limits on a cluster that `up` started")
    budget = record.budget_usd if budget is None else float(budget)
    idle = record.idle_minutes if idle is None else float(idle)
    if headguard.guarded(record):
        try:
            headguard.set_limits(record, budget, idle)
        except ClusterUnreachable:
            raise GpugeekError(f"cluster {record.name!r}'s head does not answer, so its watchdog keeps the limits it "
                               f"has — try again once it does") from None
    registry.update(record.id, budget_usd=budget, idle_minutes=idle)
    said = ", ".join(f for f in (f"budget ${budget:,.2f}" if budget else "", f"idle stop {idle:g} min" if idle else "")
                     if f)
    ledger.event(record.id, "limits", f"limits set: {said}", options={"budget": budget, "idle": idle})
    return Cluster(record.name)


def preempt(node: str, name: str | None = None, notice: float = 0.0) -> str:
    """Take a node of a sim cluster away as a spot preemption does; with ``notice`` seconds of
    warning first, as the clouds give (the workers checkpoint and stop: ``workers/notice.py``).
    The call returns at once; the node goes when the notice runs out."""
    record = live_cluster(name)
    capable(record).check(Feature.PREEMPT)
    if not 0 <= notice <= 600:
        raise GpugeekError(f"--notice {notice:g} is out of range — give 0 to 600 seconds (AWS gives 120, GCP and "
                           "Azure 30)")
    if notice:
        target = capable(record).node(record, node)
        send_notice(record.address, target.node_id, time.time() + notice)
        ledger.event(record.id, "preemption-notice",
                     f"node {target.node_id[-6:]} ({target.node_type}) goes in {notice:g} s",
                     options={"node": node, "notice": notice})
        timer = threading.Timer(notice, _preempt_later, (record, target.node_id))
        timer.daemon = True      # a kernel that ends first takes its rehearsal with it
        timer.start()
        return f"preemption notice sent to node {target.node_id[-6:]} ({target.node_type}): it goes in {notice:g} s"
    return _preempt_now(record.name, node)


def _preempt_later(record: ClusterRecord, node_id: str) -> None:
    try:
        _preempt_now(record.name, node_id)
    except Exception as exc:  # noqa: BLE001 - on a timer thread: said in the ledger, not lost
        ledger.event(record.id, "preempt-failed", f"node {node_id[-6:]} was not preempted: {exc}")


def _preempt_now(name: str, node: str) -> str:
    record = live_cluster(name)
    spec = ClusterSpec.from_json(record.spec)
    gone, spec = capable(record).preempt(record, spec, node)
    registry.update(record.id, spec=spec.to_json())
    what = ("an on-demand replacement is on its way" if spec.spot_fallback
            else "no fallback: the autoscaler retries spot")
    return f"preempted node {gone.node_id[-6:]} ({gone.node_type}); {what}"


@dataclass
class Cluster:
    """A handle on a cluster by name: what ``up`` returns and what ``status``/``cost`` describe."""

    name: str

    @property
    def record(self) -> ClusterRecord:
        record = registry.live(self.name) or registry.latest(self.name)
        if record is None:
            raise GpugeekError(f"no cluster named {self.name!r} — `%gpugeek clusters` lists them")
        return record

    @property
    def address(self) -> str | None:
        return self.record.address

    def connect(self) -> None:
        """Make this kernel a Ray driver of the cluster (local, sim, attach)."""
        connection.connect(self.record)

    def status(self) -> ClusterStatus:
        return status(self.name)

    def scale(self, workers: int) -> Cluster:
        return scale(workers, self.name)

    def preempt(self, node: str, notice: float = 0.0) -> str:
        return preempt(node, self.name, notice)

    def down(self) -> None:
        down(self.name)

    def __repr__(self) -> str:
        return repr(self.status())

    def _repr_html_(self) -> str:
        return self.status()._repr_html_()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return self.status()._repr_mimebundle_(include, exclude)
