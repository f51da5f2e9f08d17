"""What a user asked of ``up``, and each backend's check of the flags that are its own: an ssh
cluster is the ``--hosts`` named, an attached one is someone else's to size and stop, KubeRay's
limits are its autoscaler's, and the rest pick an offer from the catalog. One line for a flag
that does not belong; the spec to start otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from ..backends.interface import ATTACH, BACKENDS, DEFAULT, Feature, capable
from ..catalog.offers import load_catalog
from ..cluster.registry import NAME
from ..cluster.spec import ClusterSpec, SlurmJob
from ..errors import GpugeekError
from ..units import number
from ..vocab import Pricing
from . import renting
from .actions import check_numbers
from .nodetypes import offer_row, slurm_spec, spec_for, ssh_spec


@dataclass(frozen=True)
class UpRequest:
    """``up``'s flags as given (``None``: not given): the one shape they have past the magic's
    parser and ``up``'s keywords, which ``tests/test_up_flags.py`` holds to these fields."""

    name: str
    backend: str
    address: str | None = None
    offer: str | None = None
    plan: object = None
    gpu: str | None = None
    count: int | None = None
    workers: int | None = None
    min_workers: int | None = None
    max_workers: int | None = None
    pricing: str = Pricing.ON_DEMAND
    spot_fallback: bool = False
    budget: float | None = None
    idle: float | None = None
    dashboard: bool = False
    dry_run: bool = False
    yes: bool = False
    catalog: str | None = None
    hosts: str | list[str] | None = None
    ssh_key: str | None = None
    gpus_per_host: int | None = None
    cpus_per_host: int | None = None
    usd_per_hour: float | None = None
    env: str | None = None
    residency: str | None = None
    python: str | None = None
    install: bool = True
    pip_index_url: str | None = None
    working_dir: str | None = None
    storage: str | None = None
    internal_ips: bool = False
    login: str | None = None
    partition: str | None = None
    nodes: int | None = None
    gpu_type: str | None = None
    time: str | int | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: str | None = None
    sbatch: str | None = None
    requeue: bool = False
    job: str | None = None          # re-attach to the live Slurm cluster that holds this job

    @classmethod
    def of(cls, flags: dict) -> UpRequest:
        """The request from ``up``'s arguments: the backend named (``attach`` for an address)."""
        known = {f.name for f in fields(cls)}
        backend = backend_name(flags.get("backend"), flags.get("address"), flags.get("offer"))
        request = cls(**{**{k: v for k, v in flags.items() if k in known}, "backend": backend,
                         "name": flags.get("name") or backend})
        if not isinstance(request.name, str) or not NAME.fullmatch(request.name):
            raise GpugeekError(f"cluster name {request.name!r} is not allowed — use letters, digits, '-', '_' or '.' "
                               "(at most 40)")
        check_numbers(workers=request.workers, min_workers=request.min_workers, max_workers=request.max_workers,
                      budget=request.budget, idle=request.idle)
        return request

    def options(self) -> dict:
        """The flags given, for the ledger's ``up`` event: a plan is said given (the object is not
        kept), ``install`` only when off, the name only when it is not the backend's."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (None, False) and f.name not in ("plan", "name")
                and not (f.name == "install" and self.install)} | (
            {"name": self.name} if self.name != self.backend else {}) | (
            {"plan": "given"} if self.plan is not None else {})

    def given(self, *names: str) -> list[str]:
        """The flags among ``names`` that were given, as the user typed them (``--min-workers``)."""
        return ["--" + n.replace("_", "-") for n in names if getattr(self, n) not in (None, False)]


def backend_name(backend: str | None, address: str | None, offer: str | None = None) -> str:
    """The backend named; for an ``--address``, the one that attaches; for a cloud's ``--offer``
    (``aws/…``), that cloud's; else the default."""
    launching = [name for name, impl in BACKENDS.items() if impl.launches]
    if address:
        if backend is not None and backend != DEFAULT and (backend not in BACKENDS or backend in launching):
            raise GpugeekError(f"--address attaches to a running cluster; it does not go with --backend {backend} — "
                               "drop one of the two")
        return ATTACH
    if backend is None and isinstance(offer, str):
        backend = renting.renting(offer.split("/", 1)[0])    # the offers' up_with: the backend that rents it
    backend = backend or DEFAULT
    if backend not in launching:
        if backend in providers():           # RunPod, Lambda, …: a catalog's provider no backend rents
            raise GpugeekError(renting.way_in(None, backend))
        raise GpugeekError(f"unknown backend {backend!r} — use one of {', '.join(launching)} (or --address ADDR)")
    return backend


def providers() -> set[str]:
    """The providers the catalog holds offers of."""
    return set(load_catalog()["provider"])


SSH_FLAGS = ("hosts", "ssh_key", "gpus_per_host", "cpus_per_host", "usd_per_hour", "python", "pip_index_url")
# a scheduler's allocation is reached over SSH too (its login node), its runtime made from there
SLURM_FLAGS = ("login", "partition", "nodes", "gpu_type", "time", "account", "qos", "constraint", "setup", "sbatch",
               "requeue")
SIZING_FLAGS = ("plan", "gpu", "workers", "min_workers", "max_workers")


def spec_of(request: UpRequest) -> ClusterSpec:
    """The spec to start, from the flags the request's backend checks: your own ``--hosts``, or an
    offer's node types (``--budget`` and ``--idle`` refused where no watchdog of ours holds them)."""
    can = capable(request)
    if request.offer and (can.provider or not (can.from_offers or can.your_hosts)):   # a cloud, this machine
        row = offer_row(request.offer, request.catalog)
        if renting.renting(row["provider"]) is None:
            raise GpugeekError(renting.way_in(request.offer, row["provider"], pricing=request.pricing,
                                              name=request.name if request.name != request.backend else None,
                                              budget=request.budget, idle=request.idle))
    slurm_only = request.given(*SLURM_FLAGS)
    if not can.scheduler and slurm_only:
        raise GpugeekError(f"{', '.join(slurm_only)}: only for --backend {_those('scheduler')} (an allocation of "
                           f"its scheduler) — drop it, or use that backend")
    ssh_only = request.given(*(f for f in SSH_FLAGS if not (can.scheduler and f != "hosts"))) + (
        ["--no-install"] if not request.install and not can.scheduler else [])
    if not can.your_hosts and ssh_only:
        raise GpugeekError(f"{', '.join(ssh_only)}: only for --backend {_those('your_hosts')} (your own machines) — "
                           "drop it, "
                           f"or use that backend")
    can.check(*([Feature.DASHBOARD] if request.dashboard else []),
              *([Feature.LIMITS] if request.budget or request.idle else []))
    if request.internal_ips and not can.provider:
        raise GpugeekError(f"--internal-ips: only for a cloud's nodes (--backend {_those('provider')}); "
                           f"--backend {request.backend} reaches its own — drop --internal-ips")
    spec = _ssh(request) if can.your_hosts else _scheduled(request) if can.scheduler else _from_offers(request)
    spec.dashboard = bool(request.dashboard)
    spec.internal_ips = request.internal_ips
    return spec


def _those(capability: str) -> str:
    """The backends that can: ``local or sim``."""
    return " or ".join(name for name, impl in BACKENDS.items() if getattr(impl, capability))


def _ssh(request: UpRequest) -> ClusterSpec:
    """Your own hosts; ``--workers`` is the warm group started on them (``cells/jobs.warm_start``)."""
    if wrong := request.given(*(f for f in SIZING_FLAGS if f != "workers"), "spot_fallback"):
        raise GpugeekError(f"{', '.join(wrong)}: an ssh cluster is the --hosts you name — drop it, and name the hosts")
    if request.residency and request.offer is None:
        raise GpugeekError("--residency checks a catalog offer's region; your own --hosts are "
                           "where you put them — give --offer ID to check one, or drop --residency")
    return ssh_spec(request.hosts, ssh_key=request.ssh_key, gpus_per_host=request.gpus_per_host,
                    cpus_per_host=request.cpus_per_host, usd_per_hour=request.usd_per_hour, offer=request.offer,
                    pricing=request.pricing, catalog=request.catalog, residency=request.residency,
                    python=request.python, install=request.install, pip_index_url=request.pip_index_url,
                    backend=request.backend)


def _scheduled(request: UpRequest) -> ClusterSpec:
    """An allocation of the cluster's scheduler: ``--nodes`` of ``--partition`` for ``--time``,
    submitted from ``--login``."""
    if wrong := request.given(*SIZING_FLAGS, "spot_fallback", "residency", "internal_ips"):
        raise GpugeekError(f"{', '.join(wrong)}: a Slurm cluster is --nodes of its --partition — give those (sbatch's "
                           "own options)")
    if not request.login:
        raise GpugeekError("--login is missing — name the cluster's login node, [USER@]HOST[:PORT] or a host of your "
                           "ssh config")
    nodes = number(request.nodes, "--nodes", whole=True, least=1)
    gpus = number(request.gpus_per_host, "--gpus-per-host", whole=True, least=0)
    cpus = number(request.cpus_per_host, "--cpus-per-host", whole=True, least=1)
    job = SlurmJob(login=request.login, nodes=nodes or 1, partition=request.partition,
                   gpus_per_node=gpus or 0, gpu_type=request.gpu_type,
                   cpus_per_node=cpus, time_min=walltime(request.time),
                   account=request.account, qos=request.qos, constraint=request.constraint,
                   setup=request.setup, sbatch=request.sbatch, requeue=request.requeue)
    return slurm_spec(job, ssh_key=request.ssh_key, usd_per_hour=request.usd_per_hour, offer=request.offer,
                      pricing=request.pricing, python=request.python, catalog=request.catalog,
                      install=request.install, pip_index_url=request.pip_index_url, backend=request.backend)


# sbatch's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS
_WALLTIME = re.compile(r"(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?")


def walltime(value: str | int | None) -> int | None:
    """``--time`` in whole minutes (rounded up), as sbatch reads it; one line when it is not one."""
    if value is None:
        return None
    match = _WALLTIME.fullmatch(str(value).strip())
    if isinstance(value, bool) or match is None:
        raise GpugeekError(f"--time {value!r} is not a walltime — give it as sbatch takes it: minutes, HH:MM:SS or "
                           "D-HH:MM")
    d, a, b, c = (int(match[k]) if match[k] else None for k in "dabc")
    if d is not None:                                   # D-HH[:MM[:SS]]
        seconds = d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:                                 # HH:MM:SS
        seconds = a * 3600 + b * 60 + c
    elif b is not None:                                 # MM:SS
        seconds = a * 60 + b
    else:                                               # minutes
        seconds = a * 60
    if seconds <= 0:
        raise GpugeekError(f"--time {value!r} is under a minute — give a walltime of at least a minute")
    return -(-seconds // 60)


def _from_offers(request: UpRequest) -> ClusterSpec:
    """Every backend but your own hosts: an offer's node types, or none for this machine or an
    attached cluster (``nodetypes.spec_for``)."""
    return spec_for(request.backend, offer=request.offer, plan=request.plan, gpu=request.gpu, count=request.count,
                    workers=request.workers, min_workers=request.min_workers, max_workers=request.max_workers,
                    pricing=request.pricing, spot_fallback=request.spot_fallback, catalog=request.catalog,
                    residency=request.residency)
