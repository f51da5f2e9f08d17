"""Every cluster at a glance, as plain data: for JupyterLab's status bar and sidebar, and for the
``gpugeek`` terminal command.

Read straight from SQLite — no pandas, no Ray — because the status bar asks every few seconds from
every open Lab tab and the terminal command must start at once; and a stop here must work even
when the kernel that started the cluster is gone (a crashed server, a closed laptop).
Dollars are the ledger's: Σ $/h × hours per node, open nodes up to now (or to a stopped cluster's
stop).
"""

from __future__ import annotations

import threading
import time
from typing import Literal, TypedDict

from .. import store
from ..backends.interface import BACKENDS, capable
from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..config import BUDGET_WARN_AT
from ..errors import GpugeekError
from ..meter import ledger
from ..units import clock
from ..vocab import ClusterPhase
from . import lifecycle

STOPPED_SHOWN = 10          # recently stopped clusters listed after the live ones
UTILISATION_WINDOW_S = 60   # the detail view's "recent" utilisation

# open nodes count up to now — or, on a stopped cluster, to its stop: its dollars never grow after;
# nor do a remote cluster's past the moment this machine last heard from it (lifecycle.counted_until)
_UNTIL = ("COALESCE(c.stopped, CASE WHEN c.heard IS NOT NULL AND c.backend IN ({remote}) AND c.heard < ?"
          " THEN c.heard ELSE ? END)")
_SPEND = f"""
SELECT n.cluster_id,
       SUM({ledger.node_usd(_UNTIL, "n.")}) AS spent_usd,
       SUM(CASE WHEN n.ended IS NULL AND c.stopped IS NULL THEN n.usd_per_hour ELSE 0 END) AS usd_per_hour,
       SUM(CASE WHEN n.ended IS NULL AND c.stopped IS NULL THEN 1 ELSE 0 END) AS nodes,
       SUM(CASE WHEN n.ended IS NULL AND c.stopped IS NULL THEN n.gpus ELSE 0 END) AS gpus
FROM nodes n JOIN clusters c ON c.id = n.cluster_id
WHERE n.cluster_id IN ({{ids}}) GROUP BY n.cluster_id
"""


class NotFound(GpugeekError):
    """No cluster of that name in the registry."""


class StillStarting(GpugeekError):
    """Its ``up`` is still at work; a stop now would race it."""


class AlreadyStopped(GpugeekError):
    """The cluster exists but has stopped; the message carries its final cost."""


def catch_up(name: str | None = None, *, wait: bool = True) -> None:
    """Before reading: the live remote clusters (or the one named) whose watchdog here is gone
    get their head's word first (``lifecycle.catch_up``: over SSH, bounded by its connect
    timeout). ``wait=False`` does it in a thread of its own — the Jupyter server never blocks on
    SSH, and its next poll reads what that brought."""
    due = [r for r in registry.all_records(include_stopped=False)
           if (name is None or r.name == name) and lifecycle.needs_catch_up(r)]
    if not due:
        return

    def each() -> None:
        for record in due:
            lifecycle.catch_up(record)
    if wait:
        each()
    else:
        threading.Thread(target=each, name="gpugeek-catch-up", daemon=True).start()


def overview(now: float | None = None) -> dict:
    """Every live cluster, then the most recent stopped ones, with totals over the live ones."""
    now = time.time() if now is None else now
    rows = store.query(
        "SELECT * FROM (SELECT * FROM clusters WHERE stopped IS NULL ORDER BY id)"
        " UNION ALL SELECT * FROM (SELECT * FROM clusters WHERE stopped IS NOT NULL"
        " ORDER BY stopped DESC LIMIT ?)", (STOPPED_SHOWN,))
    clusters = models([registry.from_row(r) for r in rows], now)
    live = [c for c in clusters if c["live"]]
    return {
        "clusters": clusters,
        "live": len(live),
        "spent_usd": sum(c["spent_usd"] for c in live),
        "usd_per_hour": sum(c["usd_per_hour"] for c in live),
        "simulated": any(c["simulated"] for c in live),
        "at": now,
    }


def detail(name: str, now: float | None = None, cluster_id: int | None = None) -> dict:
    """One cluster (the live one of that name, else its latest run; or the run ``cluster_id``)
    with its nodes, the latest utilisation per node and device, and its recent events."""
    now = time.time() if now is None else now
    record = _find(name, cluster_id)
    out = model(record, now)
    until = lifecycle.counted_until(record, record.stopped or now)
    out["node_rows"] = [
        {"node": r["node_id"], "type": r["node_type"], "gpus": r["gpus"], "pricing": r["pricing"],
         "usd_per_hour": r["usd_per_hour"], "alive": r["ended"] is None,
         "up_s": max(0.0, (r["ended"] or until) - r["started"]),
         "usd": r["usd"]}
        for r in store.query(f"SELECT *, {ledger.node_usd()} AS usd FROM nodes WHERE cluster_id=?"
                             " ORDER BY started, node_id", (until, record.id))]
    # SQLite takes the bare columns from the row holding MAX(at): the latest sample per device
    out["utilisation"] = [
        {"node": r["node_id"], "gpu": None if r["device"] == "host" else int(r["device"][3:]),
         "util_pct": r["util"], "mem_pct": 100.0 * r["used"] / r["total"] if r["used"] is not None
         and r["total"] else None, "at": r["at"]}
        for r in store.query(
            "SELECT node_id, device, MAX(at) AS at,"
            " COALESCE(json_extract(metrics, '$.gpu_util'), json_extract(metrics, '$.cpu_percent')) AS util,"
            " COALESCE(json_extract(metrics, '$.gpu_mem_used'), json_extract(metrics, '$.mem_used')) AS used,"
            " COALESCE(json_extract(metrics, '$.gpu_mem_total'), json_extract(metrics, '$.mem_total')) AS total"
            " FROM node_samples WHERE cluster_id=? AND at>=? AND json_valid(metrics)"
            " GROUP BY node_id, device"
            " ORDER BY node_id, device", (record.id, now - UTILISATION_WINDOW_S))]
    out["events"] = [{"at": r["at"], "kind": r["kind"], "message": r["message"]} for r in store.query(
        "SELECT at, kind, message FROM events WHERE cluster_id=? ORDER BY at DESC, id DESC LIMIT 10",
        (record.id,))]
    return out


def every_run(name: str | None = None, now: float | None = None) -> list[dict]:
    """Every cluster run in the registry (or every run named ``name``: ``NotFound`` if none), oldest
    first, with its dollars — what ``gpugeek cost`` adds up."""
    now = time.time() if now is None else now
    rows = store.query("SELECT * FROM clusters" + (" WHERE name=?" if name else "") + " ORDER BY id",
                       (name,) if name else ())
    if name and not rows:
        raise NotFound(_unknown(name))
    return models([registry.from_row(r) for r in rows], now)


def events(name: str | None = None, since: float | None = None) -> list[dict]:
    """The ledger's events (the audit log) in the order they happened, with their cluster's name:
    who (``user``, ``client``), from where (``host``), what (``options``, JSON) and the cluster's $
    then (``usd``). A watchdog writes a job's end when it learns it, at the moment the cluster
    says it ended: that row sits where it happened, so time and dollars only grow down the log."""
    where, args = [], []
    if name:
        where.append("c.name=?")
        args.append(name)
    if since is not None:
        where.append("e.at>=?")
        args.append(since)
    sql = ("SELECT e.id, e.at, c.name AS cluster, e.cluster_id, e.kind, e.message, e.user, e.client, e.host,"
           " e.options, e.usd FROM events e"
           " JOIN clusters c ON c.id = e.cluster_id" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY e.at, e.id")
    return [dict(r) for r in store.query(sql, tuple(args))]


def stop(name: str, by: str = "JupyterLab") -> dict:
    """Shut a live cluster down — only the processes we started for it — and say what it cost.
    ``by`` is who asked, for the stop reason: JupyterLab's sidebar, or the terminal.

    The ledger is not synced with Ray first: the cluster's watchdog keeps it current every few
    seconds, and this process (the Jupyter server, the terminal) never becomes a Ray driver.
    """
    record = registry.live(name)
    if record is None:
        past = _find(name)
        spent = _money([past.id], time.time()).get(past.id, {}).get("spent_usd", 0.0)
        raise AlreadyStopped(f"cluster {name!r} already stopped ({past.stop_reason}); it cost "
                             f"${spent:,.2f}{' (simulated)' if past.simulated else ''} — nothing to stop; `%gpugeek "
                             "up` starts a new one")
    if lifecycle.starting(record):
        # `up` is still at work (`ray up` on a cloud, a head starting here): a stop now would race
        # it and could leave half a cluster running that the ledger calls stopped
        raise StillStarting(f"cluster {name!r} is still starting — shut it down once it is up "
                            f"(its `up` has finished)")
    detaching = not capable(record).launches     # someone else's cluster: let go of, never stopped
    reason = f"detached (from {by})" if detaching else f"down (from {by})"
    try:
        lifecycle.shutdown(record, reason, sync=False)
    except GpugeekError as exc:
        raise GpugeekError(f"{exc}{lifecycle.forget_hint(record)}") from None
    record = registry.get(record.id)
    if record.stopped is None:
        raise GpugeekError(f"cluster {name!r} is still stopping elsewhere — look again in a minute")
    spent = _money([record.id], record.stopped).get(record.id, {}).get("spent_usd", 0.0)
    sim = " (simulated $)" if record.simulated else ""
    verb = "detached from" if detaching else "stopped"
    return {"name": name, "stopped": True, "reason": record.stop_reason, "spent_usd": spent,
            "simulated": record.simulated,
            "message": f"{verb} {name!r}: it cost ${spent:,.2f}{sim}"}


def forget(name: str, by: str = "JupyterLab") -> dict:
    """Close the record of a live remote cluster whose machines are gone (``lifecycle.forget``)
    and say what it cost, counted to the last moment it was heard from."""
    record = registry.live(name)
    if record is None:
        raise AlreadyStopped(f"cluster {name!r} is not live — nothing to forget")
    if not capable(record).tunnelled:
        raise GpugeekError(f"cluster {name!r} runs here ({record.backend}), there is nothing to forget — `down "
                           f"{name}` stops it")
    at = lifecycle.forget(record, by)
    spent = _money([record.id], at).get(record.id, {}).get("spent_usd", 0.0)
    return {"name": name, "stopped": True, "reason": registry.get(record.id).stop_reason, "spent_usd": spent,
            "message": f"forgot {name!r}: its nodes end at {clock(at)}, when it "
                       f"was last heard from; it cost ${spent:,.2f} to then"}


def attach_code(name: str) -> str:
    """A notebook cell that makes its kernel a driver of the cluster again (``up`` re-attaches)."""
    return f"%load_ext gpugeek_jupyter\n%gpugeek up {name}\n%gpugeek status {name}"


def _find(name: str, cluster_id: int | None = None) -> ClusterRecord:
    if cluster_id is not None:
        try:
            record = registry.get(cluster_id)
        except KeyError:
            record = None
        if record is None or record.name != name:
            raise NotFound(f"no cluster named {name!r} with id {cluster_id} — `gpugeek clusters` lists them")
        return record
    record = registry.live(name) or registry.latest(name)
    if record is None:
        raise NotFound(_unknown(name))
    return record


def _unknown(name: str) -> str:
    return f"no cluster named {name!r} — `gpugeek clusters` (or `%gpugeek clusters`) lists them"


def _money(ids: list[int], now: float) -> dict[int, dict]:
    if not ids:
        return {}
    remote = ",".join(f"'{name}'" for name, backend in BACKENDS.items() if backend.tunnelled)
    sql = _SPEND.format(ids=",".join("?" * len(ids)), remote=remote)
    return {r["cluster_id"]: dict(r) for r in store.query(sql, (now - lifecycle.HEARD_WINDOW_S, now, *ids))}


class _Failing(TypedDict):
    since: float
    looks: int
    error: str


class GuardFailing(_Failing, total=False):
    """A watchdog's looks failing in a row (``health.failing``), as it wrote them. (Keys that may
    be missing are declared this way, not with ``NotRequired``: a head may run Python 3.10.)"""

    by: str
    at: float
    budget: float | None
    burn: float | None


class _Guard(TypedDict):
    by: str
    pid: int | None
    host: str


class Guard(_Guard, total=False):
    """Who enforced a cluster's limits when it was last heard (its watchdog's ``guard``)."""

    beat: float | None


class ClusterModel(TypedDict):
    """One cluster (one run) as every reader shows it: the status bar and sidebar (``ICluster`` in
    ``labextension/src/api.ts``, held to this by ``tests/test_cluster_model.py``), the server's
    JSON, the ``gpugeek`` command, ``status`` and ``clusters()``."""

    id: int                  # names come back after `down`; the id tells the runs apart
    name: str
    backend: str
    live: bool
    state: Literal["starting", "running", "failed", "stopping", "stopped"]   # ``ClusterPhase``
    status: str              # the state said for people ("running — orphan: no notebook attached")
    unheard_since: float | None   # its $ is counted to then: an estimate
    guard: Guard | None
    heard: float | None      # this machine last heard from it then
    guarded_by: str | None   # who enforces the limits now, said
    guard_by: Literal["head", "here"] | None   # the same in a word (None: nothing does)
    simulated: bool
    detaches: bool           # `down` lets go of it (someone else's cluster) and stops nothing
    nodes: int
    gpus: float
    spent_usd: float
    usd_per_hour: float
    budget_usd: float | None
    budget_used: float | None     # the fraction of the budget spent (may pass 1)
    budget_warn_at: float
    idle_minutes: float | None
    idle_since: float | None      # the watchdog's idle clock (None: busy)
    idle_why: str | None          # what that clock rests on
    orphan: bool
    watchdog_gone: bool
    watchdog_pid: int | None
    guard_failing: GuardFailing | None
    address: str | None
    dashboard_url: str | None
    attach_code: str         # notebook-cell source that re-attaches a kernel to it
    created: float
    stopped: float | None
    stop_reason: str | None


def models(records: list[ClusterRecord], now: float | None = None) -> list[ClusterModel]:
    """Each cluster's model (``model``), their dollars read in one query."""
    now = time.time() if now is None else now
    money = _money([r.id for r in records], now)
    return [model(r, now, money.get(r.id, {})) for r in records]


def model(record: ClusterRecord, now: float | None = None, money: dict | None = None) -> ClusterModel:
    """The one model of a cluster, as plain data: what the status bar, the sidebar, the server's
    JSON, the ``gpugeek`` command, ``status`` and ``clusters()`` all show. ``money``: its row of
    the spend query when the caller read many at once."""
    now = time.time() if now is None else now
    money = _money([record.id], now).get(record.id, {}) if money is None else money
    spent = float(money.get("spent_usd") or 0.0)
    budget = record.budget_usd
    phase = lifecycle.phase_of(record)
    state = lifecycle.state_of(record, registry.attached_kernels(record.id)
                               if phase is ClusterPhase.RUNNING else [], now=now)
    return ClusterModel(
        id=record.id, name=record.name, backend=record.backend, live=record.live,
        state=state.phase.value,
        status=state.describe(record.name, now, spent_then=spent if state.unheard_since is not None else None),
        unheard_since=state.unheard_since, guard=state.guard, heard=record.heard,
        guarded_by=state.guarded_by(now, record.heard), guard_by=state.guard_by,
        simulated=record.simulated, detaches=not capable(record).launches,
        nodes=int(money.get("nodes") or 0), gpus=float(money.get("gpus") or 0.0), spent_usd=spent,
        usd_per_hour=float(money.get("usd_per_hour") or 0.0), budget_usd=budget,
        budget_used=spent / budget if budget else None, budget_warn_at=BUDGET_WARN_AT,
        idle_minutes=record.idle_minutes,
        idle_since=record.idle_since if record.live else None,
        idle_why=record.idle_why if record.live else None,
        orphan=state.orphan, watchdog_gone=state.watchdog_gone, watchdog_pid=record.watchdog_pid,
        guard_failing=state.guard_failing, address=record.address,
        dashboard_url=record.spec.get("dashboard_url") if record.live else None,
        attach_code=attach_code(record.name), created=record.created, stopped=record.stopped,
        stop_reason=record.stop_reason,
    )
