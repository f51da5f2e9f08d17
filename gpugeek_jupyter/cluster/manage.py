"""up, down, scale, preempt, status: the cluster lifecycle that the magics and the API share.

``up`` records the cluster before starting anything, so a crash half-way still leaves a row that
says which processes to stop. The kernel that runs ``up`` connects to the cluster as a Ray driver
and becomes *attached*; a watchdog process of the cluster's own meters it and enforces the budget
cap and idle autostop, so both hold after the kernel dies. Whoever stops a cluster — ``down``, the
watchdog — first claims the stop in the registry, so it happens exactly once.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import store
from ..config import BUDGET_WARN_AT, home, settings
from ..errors import GpugeekError
from ..meter import ledger
from ..meter.ledger import NodePrice
from ..meter.raynodes import ClusterUnreachable, read_nodes
from ..units import duration
from . import processes, registry, sim
from .backends import BACKENDS, LaunchConfig
from .registry import ClusterRecord
from .spec import CLOUD_PROVIDERS, ClusterSpec, build_spec, resolve_offer

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
WATCH_INTERVAL_S = 2.0
_active: str | None = None


# -- up -------------------------------------------------------------------------------------------

def up(name: str | None = None, *, backend: str | None = None, address: str | None = None,
       offer: str | None = None, plan=None, gpu: str | None = None, count: int | None = None,
       workers: int | None = None, min_workers: int | None = None, max_workers: int | None = None,
       pricing: str = "on-demand", spot_fallback: bool = False, budget: float | None = None,
       idle: float | None = None, dashboard: bool = False, dry_run: bool = False, yes: bool = False,
       catalog: str | None = None) -> Cluster | LaunchConfig:
    """Start (or re-attach to) a Ray cluster and make it the active one.

    ``up("name")`` on a live cluster of that name re-attaches to it — how a restarted kernel finds
    its cluster again. Clouds and KubeRay show their config unless ``yes=True``.
    """
    global _active
    backend = _backend_name(backend, address)
    name = name or backend
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GpugeekError(f"cluster name {name!r}: use letters, digits, '-', '_' or '.' (at most 40)")
    _check_numbers(workers=workers, min_workers=min_workers, max_workers=max_workers, budget=budget, idle=idle)

    existing = registry.live(name)
    if existing is not None and not dry_run:
        if backend != existing.backend and (address or backend != "local"):
            raise GpugeekError(f"cluster {name!r} is a live {existing.backend} cluster — "
                               f"`%gpugeek down {name}` first, or pick another name")
        ignored = [flag for flag, value in (
            ("--address", address), ("--offer", offer), ("--plan", plan), ("--gpu", gpu),
            ("--workers", workers), ("--min-workers", min_workers), ("--max-workers", max_workers),
            ("--budget", budget), ("--idle", idle), ("--dashboard", dashboard or None)) if value is not None]
        if ignored:
            print(f"{', '.join(ignored)} ignored: {name!r} is already running with its own settings "
                  f"(`%gpugeek scale` resizes it; `down` then `up` changes the rest)")
        return _reattach(existing)

    spec = _spec(backend, offer=offer, plan=plan, gpu=gpu, count=count, workers=workers,
                 min_workers=min_workers, max_workers=max_workers, pricing=pricing,
                 spot_fallback=spot_fallback, catalog=catalog)
    if dashboard and backend not in ("local", "sim"):
        raise GpugeekError(f"--dashboard starts Ray's dashboard on a local or sim head; a {backend} head's "
                           f"dashboard is reached with `ray dashboard <its config>`")
    spec.dashboard = bool(dashboard)
    impl = BACKENDS[backend]
    if backend == "attach" and (budget or idle):
        raise GpugeekError("--budget and --idle stop a cluster, and an attached cluster is not ours to "
                           "stop — start one with --backend local/sim/aws/… instead")
    if backend == "kuberay" and (budget or idle):
        raise GpugeekError("--budget and --idle are not enforced on KubeRay yet (no route to meter its "
                           "head) — use the autoscaler's idle timeout in the manifest, or a cloud backend")
    if dry_run or (impl.confirm and not yes):
        return impl.show(name, spec)
    impl.preflight(spec)
    if backend == "attach":
        _check_listening(address)

    try:
        record = registry.create(name, backend, spec.to_json(), simulated=spec.simulated,
                                 budget_usd=budget, idle_minutes=idle)
    except ValueError as exc:
        raise GpugeekError(f"{exc} — pick another name") from None
    if address:
        registry.update(record.id, address=address)
        record.address = address
    what = f" ({spec.workers.min_workers} × {spec.workers.name})" if spec.workers else ""
    print(f"starting {backend} cluster {name!r}{what}…", flush=True)
    try:
        started = impl.start(record, spec)
        spec.dashboard_url = started.dashboard_url
        registry.update(record.id, address=started.address, session_id=started.session_id,
                        spec=spec.to_json(),
                        pids=started.pids or [], temp_dir=started.temp_dir)
        record = registry.get(record.id)
        if record.stopping or record.stopped:  # shut down (from JupyterLab, say) while starting
            impl.stop(record)
            registry.mark_stopped(record.id, record.stop_reason or "stopped while starting")
            raise GpugeekError(f"cluster {name!r} was shut down while it was starting")
        if impl.launches and record.address:
            _start_watchdog(record)
        impl.wait_ready(record, spec)
    except BaseException as exc:
        _abandon(record, exc)
        raise
    registry.update(record.id, ready=time.time())
    record = registry.get(record.id)
    _sync(record)
    cluster = Cluster(name)
    try:
        cluster.connect()
    except Exception as exc:  # the cluster is up, registered and watched; only this kernel failed
        raise GpugeekError(f"cluster {name!r} is up but this kernel could not connect to it ({exc}) — "
                           f"`%gpugeek up {name}` retries, `%gpugeek down {name}` stops it") from None
    _active = name
    return cluster


def _backend_name(backend: str | None, address: str | None) -> str:
    if address:
        if backend not in (None, "local", "attach"):
            raise GpugeekError(f"--address attaches to a running cluster; it does not go with --backend {backend}")
        return "attach"
    backend = backend or "local"
    if backend not in BACKENDS or backend == "attach":
        choices = ", ".join(b for b in BACKENDS if b != "attach")
        raise GpugeekError(f"unknown backend {backend!r} — use one of {choices} (or --address ADDR)")
    return backend


def _check_numbers(**values) -> None:
    for flag, value in values.items():
        if value is None:
            continue
        flag = "--" + flag.replace("_", "-")
        if flag == "--min-workers" and value == 0:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0
                or value == float("inf")):
            what = "at least 1" if "workers" in flag else "a positive number"
            extra = " (`%gpugeek down` stops a cluster)" if "workers" in flag else ""
            raise GpugeekError(f"{flag} {value!r}: must be {what}{extra}")
        if "workers" in flag and int(value) != value:
            raise GpugeekError(f"{flag} {value!r}: must be a whole number")


def _spec(backend: str, *, offer, plan, gpu, count, workers, min_workers, max_workers, pricing,
          spot_fallback, catalog) -> ClusterSpec:
    if backend in ("local", "attach"):
        given = [f for f, v in (("--offer", offer), ("--plan", plan), ("--gpu", gpu), ("--workers", workers),
                                ("--min-workers", min_workers), ("--max-workers", max_workers)) if v is not None]
        if given or spot_fallback:
            what = "this machine" if backend == "local" else "the cluster at --address"
            raise GpugeekError(f"{', '.join(given) or '--spot-fallback'}: the {backend} backend runs on {what} "
                               f"— use --backend sim or a cloud to choose offers and workers")
        usd = settings().local_usd_per_hour if backend == "local" else 0.0
        return ClusterSpec(backend=backend, pricing="local",
                           head_price=NodePrice(None, "local" if backend == "local" else "unpriced", usd))
    if workers is not None and min_workers is not None and workers != min_workers:
        raise GpugeekError("--workers and --min-workers say the same thing (nodes kept up); give one")
    row, plan_nodes = resolve_offer(offer=offer, plan=plan, gpu=gpu, count=count, pricing=pricing,
                                    provider=backend if backend in CLOUD_PROVIDERS else None, catalog=catalog)
    keep = workers if workers is not None else (min_workers if min_workers is not None else plan_nodes or 1)
    most = max_workers or max(keep, 1)
    if most < keep:
        raise GpugeekError(f"--max-workers {most} is below the {keep} worker nodes asked for")
    spec = build_spec(backend, row, pricing=pricing, workers=int(keep), max_workers=int(most),
                      spot_fallback=spot_fallback)
    if backend == "sim":
        spec.notes.append(sim.cpu_note(spec))
    return spec


def _abandon(record: ClusterRecord, exc: BaseException) -> None:
    """``up`` failed part-way: stop whatever did start and close the record."""
    reason = f"failed to start: {exc}" if isinstance(exc, GpugeekError) else f"failed to start ({type(exc).__name__})"
    try:
        shutdown(registry.get(record.id), reason, sync=False)
    except Exception:
        registry.mark_stopped(record.id, reason)


def _check_listening(address: str | None) -> None:
    """Fail in seconds, in one line, when nothing listens at ``host:port``."""
    import socket

    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit():
        raise GpugeekError(f"--address {address!r}: give host:port of the cluster's GCS (like 10.0.0.5:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise GpugeekError(f"nothing answers at {address} ({exc.strerror or exc}) — is the Ray head "
                           f"running, and is this its GCS port?") from None


def _reattach(record: ClusterRecord) -> Cluster:
    global _active
    if record.backend in ("local", "sim") and not _reachable(record):
        # only a head of ours on this machine is known gone when it does not answer; a cloud head
        # behind a dropped tunnel may still be running (and billing), so it is never closed here
        shutdown(record, "lost: its head no longer answers")
        raise GpugeekError(f"cluster {record.name!r} had stopped (its head no longer answers) — "
                           f"run `up` again to start a new one")
    cluster = Cluster(record.name)
    cluster.connect()
    _active = record.name
    print(f"re-attached to {record.backend} cluster {record.name!r} at {record.address}")
    return cluster


def _reachable(record: ClusterRecord) -> bool:
    if not record.address:
        return record.backend in ("aws", "gcp", "azure", "kuberay")
    try:
        read_nodes(record.address, timeout=3)
        return True
    except ClusterUnreachable:
        return False


def _start_watchdog(record: ClusterRecord) -> None:
    log_dir = Path(record.temp_dir) if record.temp_dir and Path(record.temp_dir).is_dir() else home()
    env = {**os.environ, "GPUGEEK_HOME": str(home()), processes.MARKER: record.marker}
    proc = processes.start_detached(
        [sys.executable, "-m", "gpugeek_jupyter.cluster.watchdog", str(record.id)], env,
        log_dir / "gpugeek-watchdog.log")
    registry.update(record.id, watchdog_pid=proc.pid)


# -- down -----------------------------------------------------------------------------------------

def shutdown(record: ClusterRecord, reason: str, *, from_watchdog: bool = False, sync: bool = True,
             grace: float = 3.0) -> bool:
    """Stop the cluster's jobs and nodes and close its ledger. Exactly once, whoever calls it.

    Nodes are billed until their processes are gone (the time is taken after the stop). If the
    stop itself fails (``ray down`` errors, say) the cluster is *not* marked stopped — it may still
    be billing — the claim is released and the error raised.
    """
    if not registry.claim_stop(record.id):
        _wait_stopped(record.id)
        return False
    ledger.stop_running_jobs(record.id, f"stopped: {reason}")
    if sync:
        _sync(record)
    if record.watchdog_pid and not from_watchdog:
        processes.stop_processes(
            [p for p in processes.session_processes(record.watchdog_pid, record.created, record.marker)
             if p.pid == record.watchdog_pid], grace=2)
    _disconnect_if(record)
    try:
        BACKENDS[record.backend].stop(record, grace=grace)
    except BaseException as exc:
        registry.release_stop(record.id)
        ledger.event(record.id, "stop-failed", f"stopping failed ({exc}) — the cluster may still be running")
        raise
    at = time.time()
    ledger.end_all_nodes(record.id, at, reason)
    registry.mark_stopped(record.id, reason, at)
    return True


def _wait_stopped(cluster_id: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = registry.get(cluster_id)
        if record.stopped is not None or record.stopping is None:  # done, or the other side gave up
            return
        time.sleep(0.2)


def down(name: str | None = None, *, all: bool = False) -> list[str]:
    """Stop a cluster (or every live one). Attached clusters are only detached, never stopped."""
    global _active
    records = registry.all_records(include_stopped=False) if all else [_live(name)]
    done = []
    for record in records:
        shutdown(record, "detached" if record.backend == "attach" else "down")
        if registry.get(record.id).stopped is None:
            raise GpugeekError(f"cluster {record.name!r} is still stopping elsewhere — check `%gpugeek status "
                               f"{record.name}` in a minute")
        done.append(record.name)
        if record.name == _active:
            _active = None
    return done


# -- the rest of the loop -------------------------------------------------------------------------

def scale(workers: int, name: str | None = None) -> Cluster:
    _check_numbers(workers=workers)
    record = _live(name)
    spec = ClusterSpec.from_json(record.spec)
    spec = BACKENDS[record.backend].scale(record, spec, int(workers))
    registry.update(record.id, spec=spec.to_json())
    ledger.event(record.id, "scale", f"scaled to {workers} worker node(s)")
    return Cluster(record.name)


def preempt(node: str, name: str | None = None) -> str:
    record = _live(name)
    if record.backend != "sim":
        raise GpugeekError("preempt rehearses losing a spot node, on the sim backend only")
    spec = ClusterSpec.from_json(record.spec)
    gone, spec = sim.preempt(record.id, record.name, spec, record.address, record.session_id,
                             record.created, record.marker, record.temp_dir, node)
    registry.update(record.id, spec=spec.to_json())
    what = "an on-demand replacement is on its way" if spec.spot_fallback else "no fallback: the autoscaler retries spot"
    return f"preempted node {gone.node_id[-6:]} ({gone.node_type}); {what}"


def active() -> str | None:
    return _active


def _live(name: str | None) -> ClusterRecord:
    name = name or _active
    if name is None:
        live = registry.all_records(include_stopped=False)
        if len(live) == 1:
            return live[0]
        names = ", ".join(r.name for r in live) or "none"
        raise GpugeekError(f"which cluster? none is active in this kernel — live clusters: {names}")
    record = registry.live(name)
    if record is None:
        past = registry.latest(name)
        if past is not None:
            raise GpugeekError(f"cluster {name!r} stopped ({past.stop_reason}) — `%gpugeek up {name}` starts it again")
        live = ", ".join(r.name for r in registry.all_records(include_stopped=False)) or "none"
        raise GpugeekError(f"no cluster named {name!r} — live clusters: {live}")
    return record


def _sync(record: ClusterRecord) -> None:
    """Pull Ray's node table into the ledger (cheap; both the kernel and the watchdog do it)."""
    if not record.address or record.stopped:
        return
    try:
        nodes = read_nodes(record.address, timeout=3)
    except ClusterUnreachable:
        return
    ledger.sync_nodes(record.id, nodes, ClusterSpec.from_json(record.spec).prices())


def _disconnect_if(record: ClusterRecord) -> None:
    """The kernel drops its driver connection before the cluster goes away under it.

    A Ray driver whose GCS has gone ends its own process a minute later, so a kernel must never
    stay connected to a stopped cluster.
    """
    global _connected
    if _connected is not None and _connected[0] == record.address:
        import ray

        ray.shutdown()
        _connected = None
    registry.detach(record.id)


# the cluster this process is a Ray driver of: (address, its registry database, its id)
_connected: tuple[str, Path, int] | None = None


def connected_address() -> str | None:
    """The address of the cluster this process is a Ray driver of, as ``ray.init`` was given it."""
    return _connected[0] if _connected is not None else None


def _watch_connection() -> None:
    """Disconnect this kernel when its cluster is stopped elsewhere (watchdog, another kernel)."""
    global _connected
    while True:
        time.sleep(WATCH_INTERVAL_S)
        connected = _connected
        if connected is None:
            continue
        address, db, cluster_id = connected
        if registry.stop_started(db, cluster_id) and _connected == connected:
            try:
                import ray

                ray.shutdown()
            except Exception:
                pass
            _connected = None


_watcher: threading.Thread | None = None


# -- the handle -----------------------------------------------------------------------------------

@dataclass
class Cluster:
    """A handle on a cluster by name: what ``up`` returns and what ``status``/``cost`` describe."""

    name: str

    @property
    def record(self) -> ClusterRecord:
        record = registry.live(self.name) or registry.latest(self.name)
        if record is None:
            raise GpugeekError(f"no cluster named {self.name!r}")
        return record

    @property
    def address(self) -> str | None:
        return self.record.address

    def connect(self) -> None:
        """Make this kernel a Ray driver of the cluster (local, sim, attach)."""
        record = self.record
        if not record.address or record.backend in ("aws", "gcp", "azure", "kuberay"):
            registry.attach(record.id)     # this notebook looks after it, even without a driver
            return
        import ray

        global _connected, _watcher
        if ray.is_initialized():
            if _connected and _connected[0] == record.address:
                registry.attach(record.id)
                return
            if _connected is None:
                print("note: this kernel's own Ray connection is closed; it now drives "
                      f"{record.name!r}")
            ray.shutdown()
            _connected = None
        # simulated nodes share one log folder, so every node's log monitor would repeat every
        # line: there we keep Ray's logs in the files and show status instead
        ray.init(address=record.address, namespace="gpugeek", logging_level="ERROR",
                 configure_logging=True, log_to_driver=not record.simulated)
        _connected = (record.address, store.path(), record.id)
        registry.attach(record.id)
        if _watcher is None:
            _watcher = threading.Thread(target=_watch_connection, name="gpugeek-connection", daemon=True)
            _watcher.start()

    def status(self) -> ClusterStatus:
        return status(self.name)

    def scale(self, workers: int) -> Cluster:
        return scale(workers, self.name)

    def preempt(self, node: str) -> str:
        return preempt(node, self.name)

    def down(self) -> None:
        down(self.name)

    def __repr__(self) -> str:
        return repr(self.status())

    def _repr_html_(self) -> str:
        return self.status()._repr_html_()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return self.status()._repr_mimebundle_(include, exclude)


@dataclass
class ClusterStatus:
    name: str
    backend: str
    state: str
    address: str | None
    simulated: bool
    nodes: pd.DataFrame
    spend_usd: float
    burn_usd_per_hour: float
    budget_usd: float | None
    idle_minutes: float | None
    idle_for_s: float | None
    events: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> float:
        return float(self.nodes["gpus"].sum()) if not self.nodes.empty else 0.0

    @property
    def budget_left_hours(self) -> float | None:
        if not self.budget_usd or self.burn_usd_per_hour <= 0:
            return None
        return max(0.0, self.budget_usd - self.spend_usd) / self.burn_usd_per_hour

    def lines(self) -> list[str]:
        tag = " (simulated $)" if self.simulated else ""
        out = [f"{self.name}: {self.backend} cluster, {self.state}" + (f" at {self.address}" if self.address else ""),
               f"nodes: {len(self.nodes)} alive, {self.gpus:g} GPUs"
               + (" declared" if self.simulated else "")]
        money = f"spent ${self.spend_usd:,.2f}{tag}; burning ${self.burn_usd_per_hour:,.2f}/h"
        if self.budget_usd:
            money += f"; budget ${self.budget_usd:,.2f} ({self.spend_usd / self.budget_usd:.0%} used)"
            left = self.budget_left_hours
            if left is not None and self.state.startswith("running"):
                money += f", reached in {duration(left * 3600)} at this rate"
        elif self.burn_usd_per_hour > 0:
            money += f" → ${self.burn_usd_per_hour * 24:,.2f} per day at this rate"
        out.append(money)
        if self.idle_minutes:
            idle = f"idle for {duration(self.idle_for_s)}" if self.idle_for_s is not None else "busy"
            out.append(f"autostop after {self.idle_minutes:g} min idle ({idle})")
        out += [f"{pd.Timestamp(e['at'], unit='s'):%H:%M:%S} {e['kind']}: {e['message']}" for e in self.events[-5:]]
        out += self.notes
        return out

    def __repr__(self) -> str:
        table = self.nodes.to_string(index=False) if not self.nodes.empty else ""
        return "\n".join(self.lines()) + ("\n" + table if table else "")

    def _repr_html_(self) -> str:
        import html

        body = "<br>".join(html.escape(line) for line in self.lines())
        table = self.nodes.to_html(index=False) if not self.nodes.empty else ""
        return f"<div>{body}</div>{table}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """The live ``ClusterPanel`` in a notebook; HTML and text wherever widgets cannot show."""
        from ..widgets._base import bundle, in_kernel

        widget = None
        if in_kernel():
            from ..widgets.cluster import ClusterPanel

            widget = ClusterPanel(self.name)
        return bundle(repr(self), self._repr_html_(), widget)


def status(name: str | None = None, *, sync: bool = True) -> ClusterStatus:
    """A cluster's state from the ledger. ``sync`` first copies Ray's node table in; without it
    (the panels' background refresh) nothing talks to Ray — the watchdog keeps the ledger's
    nodes current every few seconds and open nodes accrue up to now either way."""
    record = _live(name) if (name is None or registry.live(name)) else registry.latest(name)
    if record is None:
        raise GpugeekError(f"no cluster named {name!r}")
    if sync:
        _sync(record)
    now = time.time()
    frame = ledger.nodes_frame(record.id, now)
    alive = frame[frame["alive"]]
    nodes = pd.DataFrame({
        "node": alive["node_id"].str[-6:], "type": alive["node_type"], "gpus": alive["gpus"],
        "pricing": alive["pricing"], "usd_per_hour": alive["usd_per_hour"],
        "up_for": [duration(now - s) for s in alive["started"]],
    })
    spec = ClusterSpec.from_json(record.spec)
    return ClusterStatus(
        name=record.name, backend=record.backend, state=state_of(record), address=record.address,
        simulated=record.simulated, nodes=nodes.reset_index(drop=True),
        spend_usd=float(frame["usd"].sum()), burn_usd_per_hour=float(alive["usd_per_hour"].sum()),
        budget_usd=record.budget_usd, idle_minutes=record.idle_minutes,
        idle_for_s=_idle_for(record) if record.live else None,
        events=ledger.events(record.id), notes=list(spec.notes),
    )


def state_of(record: ClusterRecord, attached: list[int] | None = None) -> str:
    """``running``, with ``orphan`` and ``not watched`` when they apply; ``attached`` saves a
    second look at the attached kernels when the caller already has them."""
    if record.stopped:
        return f"stopped ({record.stop_reason}) {duration(time.time() - record.stopped)} ago"
    if record.stopping:
        return "stopping"
    if starting(record):
        return "starting"
    state = "running"
    if not (registry.attached_kernels(record.id) if attached is None else attached):
        state += " — orphan: no notebook attached"
    if record.watchdog_pid and not processes.alive(record.watchdog_pid):
        state += " — not watched: its watchdog is gone, budget and idle stop are not enforced"
    return state


STARTING_AT_MOST_S = 600   # an `up` still unfinished after this died half-way (its kernel was killed)


def starting(record: ClusterRecord) -> bool:
    """``up`` is still bringing the cluster up (it marks it ready at the end)."""
    return record.live and record.ready is None and time.time() - record.created < STARTING_AT_MOST_S


def _idle_for(record: ClusterRecord) -> float | None:
    """Seconds idle as the watchdog last saw it (None while busy or unwatched)."""
    return time.time() - record.idle_since if record.idle_since else None


def clusters() -> pd.DataFrame:
    """Every cluster this machine has run, newest last; live ones say if they are orphans."""
    rows = []
    for record in registry.all_records():
        frame = ledger.nodes_frame(record.id)
        attached = registry.attached_kernels(record.id) if record.live else []
        rows.append({
            "name": record.name, "backend": record.backend, "state": state_of(record, attached),
            "nodes": int(frame["alive"].sum()), "gpus": float(frame.loc[frame["alive"], "gpus"].sum()),
            "spent_usd": float(frame["usd"].sum()), "simulated": record.simulated,
            "budget_usd": record.budget_usd, "created": pd.Timestamp(record.created, unit="s"),
            "orphan": record.live and not attached,
        })
    return pd.DataFrame(rows, columns=["name", "backend", "state", "nodes", "gpus", "spent_usd",
                                       "simulated", "budget_usd", "created", "orphan"])
