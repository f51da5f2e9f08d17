"""``up``: start a cluster (or re-attach to a live one by name) and make it this kernel's active one.

``up`` records the cluster before starting anything, so a crash half-way still leaves a row that
says which processes to stop. The kernel that runs ``up`` connects to the cluster and becomes
*attached*; a watchdog process of the cluster's own meters it and enforces the budget cap and
idle autostop, so both hold after the kernel dies.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .. import ports
from ..backends.interface import BACKENDS, CLIENT_SCHEME, LaunchConfig
from ..cluster import processes, registry
from ..cluster.registry import NAME, ClusterRecord
from ..cluster.spec import ClusterSpec
from ..config import home, settings
from ..errors import GpugeekError
from ..guard.lifecycle import sync_ledger
from ..kernel.environment import read_env_file
from ..kernel.session import current
from ..meter import ledger
from ..raynodes import ClusterUnreachable, read_nodes
from ..remote import headguard
from ..vocab import Pricing
from .actions import Cluster, check_numbers, stop
from .nodetypes import spec_for, ssh_spec


def up(name: str | None = None, *, backend: str | None = None, address: str | None = None,
       offer: str | None = None, plan=None, gpu: str | None = None, count: int | None = None,
       workers: int | None = None, min_workers: int | None = None, max_workers: int | None = None,
       pricing: str = Pricing.ON_DEMAND, spot_fallback: bool = False, budget: float | None = None,
       idle: float | None = None, dashboard: bool = False, dry_run: bool = False, yes: bool = False,
       catalog: str | None = None, hosts: str | list[str] | None = None, ssh_key: str | None = None,
       gpus_per_host: int | None = None, cpus_per_host: int | None = None,
       usd_per_hour: float | None = None, env: str | None = None,
       residency: str | None = None) -> Cluster | LaunchConfig:
    """Start (or re-attach to) a Ray cluster and make it the active one.

    ``up("name")`` on a live cluster of that name re-attaches to it — how a restarted kernel finds
    its cluster again. Clouds and KubeRay show their config unless ``yes=True``. ``backend="ssh"``
    runs on ``hosts`` (your own machines), each priced at ``usd_per_hour`` or as ``offer``.
    ``residency`` (``EU``, ``US``, ``DE`` …) refuses an offer outside that jurisdiction.
    ``env`` (a requirements.txt or pyproject.toml) is pip-installed for every job on every node.
    """
    given = {k: v for k, v in locals().items() if v is not None and v is not False and k != "plan"}
    backend = _backend_name(backend, address)
    name = name or backend
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GpugeekError(f"cluster name {name!r}: use letters, digits, '-', '_' or '.' (at most 40)")
    check_numbers(workers=workers, min_workers=min_workers, max_workers=max_workers, budget=budget, idle=idle)

    pip = read_env_file(env) if env else []

    existing = registry.live(name)
    if existing is not None and not dry_run:
        if backend != existing.backend and (address or backend != "local"):
            raise GpugeekError(f"cluster {name!r} is a live {existing.backend} cluster — "
                               f"`%gpugeek down {name}` first, or pick another name")
        ignored = [flag for flag, value in (
            ("--address", address), ("--offer", offer), ("--plan", plan), ("--gpu", gpu),
            ("--workers", workers), ("--min-workers", min_workers), ("--max-workers", max_workers),
            ("--budget", budget), ("--idle", idle), ("--dashboard", dashboard or None), ("--env", env))
            if value is not None]
        if ignored:
            print(f"{', '.join(ignored)} ignored: {name!r} is already running with its own settings "
                  f"(`%gpugeek scale` resizes it; `down` then `up` changes the rest)")
        return _reattach(existing)

    ssh_flags = [flag for flag, value in (
        ("--hosts", hosts), ("--ssh-key", ssh_key), ("--gpus-per-host", gpus_per_host),
        ("--cpus-per-host", cpus_per_host), ("--usd-per-hour", usd_per_hour)) if value is not None]
    if backend == "ssh":
        ignored = [f for f, v in (("--plan", plan), ("--gpu", gpu), ("--workers", workers),
                                  ("--min-workers", min_workers), ("--max-workers", max_workers)) if v is not None]
        if ignored or spot_fallback:
            raise GpugeekError(f"{', '.join(ignored) or '--spot-fallback'}: an ssh cluster is the --hosts you name")
        if residency and offer is None:
            raise GpugeekError("--residency checks a catalog offer's region; your own --hosts are "
                               "where you put them (give --offer ID to check one)")
        spec = ssh_spec(hosts, ssh_key=ssh_key, gpus_per_host=gpus_per_host, cpus_per_host=cpus_per_host,
                        usd_per_hour=usd_per_hour, offer=offer, pricing=pricing, catalog=catalog,
                        residency=residency)
    elif ssh_flags:
        raise GpugeekError(f"{', '.join(ssh_flags)}: only for --backend ssh (your own machines)")
    else:
        spec = spec_for(backend, offer=offer, plan=plan, gpu=gpu, count=count, workers=workers,
                        min_workers=min_workers, max_workers=max_workers, pricing=pricing,
                        spot_fallback=spot_fallback, catalog=catalog, residency=residency)
    if dashboard and backend not in ("local", "sim"):
        raise GpugeekError(f"--dashboard starts Ray's dashboard on a local or sim head; a {backend} head's "
                           f"dashboard is reached with `ray dashboard <its config>`")
    spec.dashboard = bool(dashboard)
    spec.env = pip
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
    if backend == "ssh":
        what = f" on {len(spec.remote['hosts'])} host{'s' if len(spec.remote['hosts']) > 1 else ''}"
    print(f"starting {backend} cluster {name!r}{what}…", flush=True)
    try:
        started = impl.start(record, spec)
        spec.dashboard_url = started.dashboard_url
        registry.update(record.id, address=started.address, session_id=started.session_id,
                        spec=spec.to_json(), pids=started.pids or [], temp_dir=started.temp_dir)
        record = registry.get(record.id)
        if record.stopping or record.stopped:  # shut down (from JupyterLab, say) while starting
            impl.stop(record)
            registry.mark_stopped(record.id, record.stop_reason or "stopped while starting")
            raise GpugeekError(f"cluster {name!r} was shut down while it was starting")
        if impl.launches and record.address:
            start_watchdog(record)
        impl.wait_ready(record, spec)
        if backend == "ssh":       # a cloud head starts its own (launcher.start_commands)
            _guard_on_head(registry.get(record.id))
    except BaseException as exc:
        _abandon(record, exc)
        raise
    registry.update(record.id, ready=time.time())
    record = registry.get(record.id)
    sync_ledger(record)
    offers = sorted({t.offer_id for t in spec.node_types if t.offer_id})
    ledger.event(record.id, "up", f"{backend} cluster {name!r} up{what} in {record.ready - record.created:.1f} s",
                 options={**given, "backend": backend, **({"offers": offers} if offers else {}),
                          **({"plan": "given"} if plan is not None else {})})
    cluster = Cluster(name)
    try:
        cluster.connect()
    except Exception as exc:  # noqa: BLE001 - the cluster is up, registered and watched; only this kernel failed
        raise GpugeekError(f"cluster {name!r} is up but this kernel could not connect to it ({exc}) — "
                           f"`%gpugeek up {name}` retries, `%gpugeek down {name}` stops it") from None
    current().active = name
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


def _abandon(record: ClusterRecord, exc: BaseException) -> None:
    """``up`` failed part-way: stop whatever did start and close the record.

    If that stop fails too, what started may still be running and billing: the record stays live
    and says so (phase ``failed``), a watchdog keeps metering it and enforcing its budget, and
    ``down`` tries the stop again. Closing it here would hide a cluster that costs money.
    """
    reason = f"failed to start: {exc}" if isinstance(exc, GpugeekError) else f"failed to start ({type(exc).__name__})"
    try:
        stop(registry.get(record.id), reason, sync=False)
    except Exception as stop_error:  # noqa: BLE001 - any failure to stop leaves the cluster to watch
        record = registry.get(record.id)
        registry.update(record.id, start_failed=f"{reason}; stopping it failed ({stop_error})")
        if BACKENDS[record.backend].launches and record.address and not (
                record.watchdog_pid and processes.alive(record.watchdog_pid)):
            start_watchdog(record)
        raise GpugeekError(f"cluster {record.name!r} {reason}, and stopping what had started failed too "
                           f"({stop_error}) — it may still be running and billing; it stays listed and "
                           f"watched, and `%gpugeek down {record.name}` tries the stop again") from exc


def _check_listening(address: str | None) -> None:
    """Fail in seconds, in one line, when nothing listens at ``host:port``."""
    host, _, port = (address or "").removeprefix(CLIENT_SCHEME).rpartition(":")
    if not host or not port.isdigit():
        raise GpugeekError(f"--address {address!r}: give host:port of the cluster's GCS (like 10.0.0.5:6379), "
                           f"or ray://host:port of its Ray Client server")
    why = ports.why_closed(host, int(port), timeout=3)
    if why is not None:
        port_kind = "client server" if address.startswith(CLIENT_SCHEME) else "GCS"
        raise GpugeekError(f"nothing answers at {address} ({why}) — is the Ray head "
                           f"running, and is this its {port_kind} port?")


def _reattach(record: ClusterRecord) -> Cluster:
    if record.backend in ("local", "sim") and not _reachable(record):
        # only a head of ours on this machine is known gone when it does not answer; a cloud head
        # behind a dropped tunnel may still be running (and billing), so it is never closed here
        stop(record, "lost: its head no longer answers")
        raise GpugeekError(f"cluster {record.name!r} had stopped (its head no longer answers) — "
                           f"run `up` again to start a new one")
    cluster = Cluster(record.name)
    cluster.connect()
    current().active = record.name
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


def _guard_on_head(record: ClusterRecord) -> None:
    """The watchdog on the head too, so that the budget cap and idle stop hold without this
    machine; a cluster whose head could not start it is still watched from here, and says so."""
    try:
        headguard.start(record, ClusterSpec.from_json(record.spec), settings().meter_interval_s)
    except GpugeekError as exc:
        said = (f"the head's watchdog did not start ({exc}): the budget cap and idle stop hold only while "
                f"this machine's watchdog runs")
        ledger.event(record.id, "guard", said)
        print(f"warning: {said}", flush=True)


def start_watchdog(record: ClusterRecord) -> None:
    """The cluster's own watchdog process, in a session of its own (it outlives the kernel)."""
    log_dir = Path(record.temp_dir) if record.temp_dir and Path(record.temp_dir).is_dir() else home()
    env = {**os.environ, "GPUGEEK_HOME": str(home()), processes.MARKER: record.marker}
    proc = processes.start_detached(
        [sys.executable, "-m", "gpugeek_jupyter.guard.watchdog", str(record.id)], env,
        log_dir / "gpugeek-watchdog.log")
    registry.update(record.id, watchdog_pid=proc.pid)
