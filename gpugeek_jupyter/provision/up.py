"""``up``: start a cluster (or re-attach to a live one by name) and make it this kernel's active one.

``up`` records the cluster before starting anything, so a crash half-way still leaves a row that
says which processes to stop. The kernel that runs ``up`` connects to the cluster and becomes
*attached*; a watchdog process of the cluster's own meters it and enforces the budget cap and
idle autostop, so both hold after the kernel dies.
"""

from __future__ import annotations

import time

from .. import ports
from ..backends.interface import BACKENDS, CLIENT_SCHEME, DEFAULT, LaunchConfig, capable
from ..backends.rented import instances_ended
from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.remote import StorageNeeds, learn
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError, LaunchRefused
from ..guard.lifecycle import start_watchdog, sync_ledger
from ..kernel import environment, headlogs
from ..kernel.environment import read_env_file, storage_packages, storage_url
from ..kernel.headlogs import HeadFailed
from ..kernel.session import current
from ..meter import ledger
from ..raynodes import ClusterUnreachable, read_nodes
from ..vocab import Pricing
from .actions import Cluster, stop
from .nodetypes import another_offer
from .request import UpRequest, spec_of


def up(name: str | None = None, *, backend: str | None = None, address: str | None = None,
       offer: str | None = None, plan=None, gpu: str | None = None, count: int | None = None,
       workers: int | None = None, min_workers: int | None = None, max_workers: int | None = None,
       pricing: str = Pricing.ON_DEMAND, spot_fallback: bool = False, budget: float | None = None,
       idle: float | None = None, dashboard: bool = False, dry_run: bool = False, yes: bool = False,
       catalog: str | None = None, hosts: str | list[str] | None = None, ssh_key: str | None = None,
       gpus_per_host: int | None = None, cpus_per_host: int | None = None,
       usd_per_hour: float | None = None, env: str | None = None,
       residency: str | None = None, python: str | None = None, install: bool = True,
       pip_index_url: str | None = None, working_dir: str | None = None,
       storage: str | None = None, internal_ips: bool = False, login: str | None = None,
       partition: str | None = None, nodes: int | None = None, gpu_type: str | None = None,
       time: str | int | None = None, account: str | None = None, qos: str | None = None,
       constraint: str | None = None, setup: str | None = None, sbatch: str | None = None,
       requeue: bool = False, job: str | None = None) -> Cluster | LaunchConfig:
    """Start (or re-attach to) a Ray cluster and make it the active one.

    ``up("name")`` on a live cluster of that name re-attaches to it — how a restarted kernel finds
    its cluster again. Clouds and KubeRay show their config unless ``yes=True``. ``backend="ssh"``
    runs on ``hosts`` (your own machines), each priced at ``usd_per_hour`` or as ``offer``.
    ``residency`` (``EU``, ``US``, ``DE`` …) refuses an offer outside that jurisdiction.
    ``env`` (a requirements.txt or pyproject.toml) is pip-installed for every job on every node.
    ``working_dir`` is sent to every node; each cell starts in its copy there. ``storage`` (an
    ``s3://``, ``gs://`` or ``az://`` URL, or a path every host shares) is where jobs checkpoint
    unless a cell names its own ``checkpoint_dir``. ``internal_ips`` reaches a cloud's nodes at their
    private addresses (from inside their network: a VPN, a bastion, a machine of the same VPC).
    On ``hosts``, Ray runs in a runtime made there at this kernel's versions unless ``python``
    names an environment to use as it is; ``install=False`` refuses to make one, and
    ``pip_index_url`` (or ``[hosts] pip_index_url`` in config.toml) is the mirror to make it from;
    ``workers`` starts a worker group of that many on them while ``up`` returns (``api.up``), which
    the first cell of that shape runs on.
    ``backend="slurm"`` submits one job from the cluster's ``login`` node (``[USER@]HOST`` or a
    host of your ssh config) for ``nodes`` nodes of ``partition`` with ``gpus_per_host`` GRES GPUs
    (of ``gpu_type``) and ``cpus_per_host`` CPUs each, for ``time`` (sbatch's walltime), under
    ``account``/``qos``/``constraint``; ``setup`` (shell lines: ``module load …``) runs before Ray
    on each node, ``sbatch`` adds any other option; each node is priced at ``usd_per_hour``. With
    ``requeue``, the job is requeued at its walltime's notice (once a running cell has checkpointed)
    and the cluster goes on in its next allocation, where the cell resumes. ``job`` (a Slurm job
    id, as ``squeue`` lists it) re-attaches to the live cluster that holds it, whatever its name.
    """
    return start(UpRequest.of(locals()))


def start(request: UpRequest) -> Cluster | LaunchConfig:
    """``up`` from its request: re-attach to a live cluster of that name, show a cloud's config,
    or record the cluster, start it and connect this kernel to it."""
    pip = read_env_file(request.env) if request.env else []
    folder = environment.working_dir(request.working_dir) if request.working_dir else None
    existing = _holding(request.job) if request.job is not None else registry.live(request.name)
    if existing is not None and not request.dry_run:
        return _reattach(existing, request)
    spec = spec_of(request)
    spec.env = pip
    spec.working_dir = folder
    spec.storage = storage_url(request.storage) if request.storage else None
    if capable(spec).tunnelled:     # a runtime we make on each node gets the file system the jobs' storage needs
        learn(spec, StorageNeeds(extra=tuple(storage_packages(spec.storage)) if spec.storage else ()))
    impl = BACKENDS[request.backend]
    if request.dry_run or (impl.confirm and not request.yes):
        return impl.show(request.name, spec)
    _can_start_there(impl, spec)
    impl.preflight(spec)
    if not impl.launches:     # attach to what runs at --address: it must answer there
        _check_listening(request.address)
    record = _record(request, spec)
    _start(record, spec)
    record = registry.get(record.id)
    sync_ledger(record)
    offers = sorted({t.offer_id for t in spec.node_types if t.offer_id})
    ledger.event(record.id, "up", f"{request.backend} cluster {record.name!r} up{_what(spec)} in "
                 f"{record.ready - record.created:.1f} s",
                 options={**request.options(), **({"offers": offers} if offers else {})})
    return _connected(record.name)


def _can_start_there(impl, spec: ClusterSpec) -> None:
    """Refused before anything is made or called: an offer in a region where the backend cannot
    start a machine (a cloud's launcher with no machine image there), with the next that can."""
    for node_type in spec.node_types:
        why = impl.cannot_start_in(node_type.region)
        if why:
            elsewhere = another_offer(spec, lambda region: impl.cannot_start_in(region) is None)
            hint = f"; the next offer that can start: --offer {elsewhere}" if elsewhere else ""
            raise GpugeekError(f"offer {node_type.offer_id}: {why}{hint} — nothing was started")


def _what(spec: ClusterSpec) -> str:
    """`` (2 × A100x8)`` or `` on 3 hosts``: what is being started, for people."""
    if capable(spec).scheduler:
        job = spec.slurm
        return f" on {job.nodes} node{'s' if job.nodes > 1 else ''}{f' of {job.partition}' if job.partition else ''}"
    if capable(spec).your_hosts:
        hosts = len(spec.remote.hosts)
        return f" on {hosts} host{'s' if hosts > 1 else ''}"
    return f" ({spec.workers.min_workers} × {spec.workers.name})" if spec.workers else ""


def _record(request: UpRequest, spec: ClusterSpec) -> ClusterRecord:
    """The cluster in the registry before anything starts: a crash half-way leaves a row that
    says what to stop."""
    try:
        record = registry.create(request.name, request.backend, spec.to_json(), simulated=capable(spec).simulated,
                                 budget_usd=request.budget, idle_minutes=request.idle,
                                 started_by=processes.this_kernel())
    except ValueError as exc:
        raise GpugeekError(f"{exc} — pick another name") from None
    if request.address:
        registry.update(record.id, address=request.address)
        record.address = request.address
    return record


def _start(record: ClusterRecord, spec: ClusterSpec) -> None:
    """Start the machines, the watchdog here and on the head, and wait until ready; on any failure
    stop what did start (``_abandon``)."""
    impl = BACKENDS[record.backend]
    print(f"starting {record.backend} cluster {record.name!r}{_what(spec)}…", flush=True)
    try:
        started = impl.start(record, spec)
        spec.dashboard_url = started.dashboard_url
        learn(spec, *started.learned, record_id=record.id, address=started.address, session_id=started.session_id,
              spec=spec.to_json(), pids=started.pids or [], temp_dir=started.temp_dir)
        record = registry.get(record.id)
        if record.stopping or record.stopped:  # shut down (from JupyterLab, say) while starting
            impl.stop(record)
            registry.mark_stopped(record.id, record.stop_reason or "stopped while starting")
            raise GpugeekError(f"cluster {record.name!r} was shut down while it was starting — `%gpugeek up` it again")
        if impl.launches and record.address:
            start_watchdog(record)
        impl.wait_ready(record, spec)     # an ssh head's watchdog started with it; a cloud head's by itself
    except BaseException as exc:
        exc = _heads_word(record, exc)
        _abandon(record, exc)
        if isinstance(exc, GpugeekError):      # the stop worked: say so, or the user checks by hand
            elsewhere = another_offer(spec) if isinstance(exc, LaunchRefused) and exc.no_capacity else None
            hint = f"; the next offer to try: --offer {elsewhere}" if elsewhere else ""
            ended = instances_ended(record.id)
            raise GpugeekError(f"{exc}{hint} — what had started was stopped{f' ({ended})' if ended else ''}, "
                               f"nothing of {record.name!r} runs") from exc
        raise
    registry.update(record.id, ready=time.time())


def _heads_word(record: ClusterRecord, exc: BaseException) -> BaseException:
    """A start that failed once the head's watchdog was started: what the head's logs say ended
    there, where they show it (read before the stop takes the head away), else ``exc``."""
    if not isinstance(exc, GpugeekError) or isinstance(exc, LaunchRefused | HeadFailed):
        return exc
    record = registry.get(record.id)
    if not capable(record).tunnelled or not ClusterSpec.from_json(record.spec).remote.guard_home:
        return exc
    line = headlogs.ended(record)
    return HeadFailed(f"cluster {record.name!r}: {line}") if line else exc


def _connected(name: str) -> Cluster:
    """This kernel connected to the cluster that is up, and its commands meaning it from now on."""
    cluster = Cluster(name)
    try:
        cluster.connect()
    except HeadFailed as exc:      # nothing on the head lets a kernel in: what `up` started goes
        record = registry.live(name)
        if record is not None:
            _abandon(record, exc)
        ended = instances_ended(record.id) if record is not None else None
        raise GpugeekError(f"{exc} — what had started was stopped{f' ({ended})' if ended else ''}, nothing of "
                           f"{name!r} runs") from None
    except Exception as exc:  # noqa: BLE001 - the cluster is up, registered and watched; only this kernel failed
        raise GpugeekError(f"cluster {name!r} is up but this kernel could not connect to it ({exc}) — "
                           f"`%gpugeek up {name}` retries, `%gpugeek down {name}` stops it") from None
    current().active = name
    return cluster


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
        if capable(record).launches and record.address and not (
                record.watchdog_pid and processes.alive(record.watchdog_pid)):
            start_watchdog(record)
        raise GpugeekError(f"cluster {record.name!r} {reason}, and stopping what had started failed too "
                           f"({stop_error}) — it may still be running and billing; it stays listed and "
                           f"watched, and `%gpugeek down {record.name}` tries the stop again") from exc


def _check_listening(address: str | None) -> None:
    """Fail in seconds, in one line, when nothing listens at ``host:port``."""
    host, _, port = (address or "").removeprefix(CLIENT_SCHEME).rpartition(":")
    if not host or not port.isdigit():
        raise GpugeekError(f"--address {address!r} is not an address — give host:port of the cluster's GCS (like "
                           "10.0.0.5:6379), "
                           f"or ray://host:port of its Ray Client server")
    why = ports.why_closed(host, int(port), timeout=3)
    if why is not None:
        port_kind = "client server" if address.startswith(CLIENT_SCHEME) else "GCS"
        raise GpugeekError(f"nothing answers at {address} ({why}) — is the Ray head "
                           f"running, and is this its {port_kind} port?")


def _holding(job: str) -> ClusterRecord:
    """``up --job ID``: the live Slurm cluster of this machine that holds the job (what ``squeue``
    lists), whatever its name — a new kernel reaches it so."""
    job = str(job).strip()
    for record in registry.all_records(include_stopped=False):
        if capable(record).scheduler and (record.spec.get("remote") or {}).get("job_id") == job:
            return record
    raise GpugeekError(f"--job {job}: no live Slurm cluster of this machine holds that job — `%gpugeek clusters` "
                       f"lists them; reach a job submitted from another machine from there")


def _reattach(record: ClusterRecord, request: UpRequest) -> Cluster:
    """``up NAME`` on a live cluster: connect to it again; its own settings stay (said when the
    request gave others)."""
    if request.backend != record.backend and (request.address or request.backend != DEFAULT):
        raise GpugeekError(f"cluster {record.name!r} is a live {record.backend} cluster — "
                           f"`%gpugeek down {record.name}` first, or pick another name")
    ignored = request.given("address", "offer", "plan", "gpu", "workers", "min_workers", "max_workers",
                            "budget", "idle", "dashboard", "env", "working_dir", "storage")
    if ignored:
        print(f"{', '.join(ignored)} ignored: {record.name!r} is already running with its own settings "
              f"(`%gpugeek scale` resizes it; `down` then `up` changes the rest)")
    if capable(record).runs_here and not _reachable(record):
        # only a head of ours on this machine is known gone when it does not answer; a cloud head
        # behind a dropped tunnel may still be running (and billing), so it is never closed here
        stop(record, "lost: its head no longer answers")
        raise GpugeekError(f"cluster {record.name!r} had stopped (its head no longer answers) — "
                           f"run `up` again to start a new one")
    if capable(record).scheduler:       # a requeued job running again: its new head reached
        BACKENDS[record.backend].follow(record)
    cluster = Cluster(record.name)
    cluster.connect()
    current().active = record.name
    print(f"re-attached to {record.backend} cluster {record.name!r} at {record.address}")
    return cluster


def _reachable(record: ClusterRecord) -> bool:
    """Whether the head of ours on this machine answers."""
    if not record.address:
        return False
    try:
        read_nodes(record.address, timeout=3)
        return True
    except ClusterUnreachable:
        return False
