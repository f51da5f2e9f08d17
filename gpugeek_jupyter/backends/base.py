"""What every backend is: a ``Backend`` says what it can do (its capabilities, each declared here
without a value, so every backend says each one) and how its machines appear and disappear;
``start`` answers with what it ``Started``, ``show`` with the ``LaunchConfig`` it would run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from ..cluster.registry import ClusterRecord
from ..cluster.remote import Fact
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..meter.allocation import JobRecord
from ..raynodes import ClusterUnreachable, RayNode, read_nodes

READY_TIMEOUT_S = 180
CLIENT_SCHEME = "ray://"     # --address ray://HOST:PORT: a Ray Client server someone else runs


class Feature(str, Enum):
    """What a user may ask of a cluster that not every backend does. A backend lacking one says
    why, and what to do instead, in ``Backend.cannot`` — as SkyPilot's clouds declare their
    unsupported features with reasons — and ``Backend.check`` refuses it in one line."""

    LIMITS = "--budget and --idle"
    DASHBOARD = "--dashboard"
    SCALE = "scale"
    PREEMPT = "preempt"


REHEARSAL_ONLY = "rehearses losing a spot node, on a sim cluster only — rehearse it on one: `up --backend sim`"


@dataclass
class Started:
    """What a backend's ``start`` brought up; ``up`` records it, with what it ``learned``, in one write."""

    address: str | None
    session_id: int | None = None
    pids: list[int] | None = None
    temp_dir: str | None = None
    dashboard_url: str | None = None
    learned: tuple[Fact, ...] = ()   # of the machines, for the cluster's record (``cluster.remote``)


@dataclass
class LaunchConfig:
    """What ``up`` would do, shown instead of doing it (``--dry-run``, or a cloud without ``--yes``)."""

    backend: str
    text: str
    path: Path | None
    next_step: str
    config: dict

    def __repr__(self) -> str:
        where = f"written to {self.path}\n" if self.path else ""
        return f"{self.text.rstrip()}\n\n{where}{self.next_step}"

    def _repr_markdown_(self) -> str:
        lang = "json" if self.text.lstrip().startswith("{") else "yaml"
        where = f"Written to `{self.path}`. " if self.path else ""
        return f"```{lang}\n{self.text.rstrip()}\n```\n\n{where}{self.next_step}"


@dataclass(frozen=True)
class Asked:
    """What ``check`` was given to look at (None: not given): a cloud's region, a Slurm login node
    and its key, your hosts; ``ways``, the backends named (none named: every one that can tell)."""

    region: str | None = None
    login: str | None = None
    ssh_key: str | None = None
    hosts: str | None = None
    ways: tuple[str, ...] = ()


@dataclass(frozen=True)
class Readiness:
    """One backend's line in ``check``: ready, or what is missing and what to do."""

    way: str
    ready: bool
    line: str

    def __str__(self) -> str:
        return f"{self.way:<8} {'ready' if self.ready else 'NOT READY'}: {self.line}"


_DECLARED: dict[tuple[int, str], float] = {}     # (cluster, address) → its nodes' GPUs, as Ray declared them


class Backend:
    """One kind of cluster: how its machines appear and disappear, and what it can do. Each
    capability is declared here without a value, so every backend says each one."""

    name = ""
    launches: bool          # we start and stop it (False: an existing cluster we only attach to)
    confirm: bool           # needs --yes before it spends money
    grows: bool             # an autoscaler may add nodes for work that does not fit yet
    watched: bool           # a watchdog of ours meters it and holds its budget cap and idle stop
    runs_here: bool         # its head is processes of ours on this machine, gone when they are
    tunnelled: bool         # this machine reaches its head through an SSH tunnel of the cluster's own
    kernel_joins: str | None    # a Ray "driver", or on the "line" to its keeper (through the tunnel); None: attached
    simulated: bool         # its GPUs are declared and its dollars rehearsed; preemptions rehearsed on it
    notices: str | None     # where its spot nodes' preemption notices come from (None: none come)
    from_offers: bool       # you choose its machines from the catalog: --offer, --gpu, --plan, --workers
    your_hosts: bool        # its machines are the --hosts you name, Ray on each in a runtime we make there
    local_price: bool       # it costs what config.toml says this machine costs (local_usd_per_hour)
    provider: str | None    # the cloud that rents you its machines and bills for them (None: no cloud)
    scheduler: str | None   # the batch scheduler whose allocation the cluster is (--login, --nodes, --time…)
    head_instance: str | None = None    # the machine a cloud cluster's head runs on (priced from the catalog)
    cannot = MappingProxyType({})   # each Feature it lacks: why, and what to do instead

    @property
    def dashboard(self) -> bool:
        """--dashboard starts Ray's dashboard on its head: what ``cannot`` does not refuse."""
        return Feature.DASHBOARD not in self.cannot

    def check(self, *wanted: Feature) -> None:
        """One line for the first of ``wanted`` this backend cannot do, saying why."""
        for feature in wanted:
            if feature in self.cannot:
                raise GpugeekError(f"{feature.value}: {self.cannot[feature]}")

    def show(self, name: str, spec: ClusterSpec) -> LaunchConfig:
        raise NotImplementedError

    def preflight(self, spec: ClusterSpec) -> None:
        """Refuse early, in one line, what would fail half-way (credentials, CLIs)."""

    def readiness(self, asked: Asked) -> Readiness | None:
        """Whether ``up`` could get its machines, found without launching anything (``check``);
        None where there is nothing of its own to look at, or nothing was given to look at."""
        return None

    def still_billing(self, record: ClusterRecord) -> str | None:
        """What a stop leaves billing that only you can end, in words: your own hosts priced at a
        provider's offer are boxes you rented there — a stop ends Ray on them, not the rental."""
        spec = ClusterSpec.from_json(record.spec)
        rented = [t for t in spec.node_types if t.provider and t.offer_id] if self.your_hosts else []
        if not rented:
            return None
        hosts, offer = len(spec.remote.hosts), rented[0]
        boxes = f"the {hosts} boxes are" if hosts > 1 else "the box is"
        return (f"{boxes} still rented from {offer.provider} at ${offer.usd_per_hour * hosts:,.2f}/h (offer "
                f"{offer.offer_id}): this stopped Ray on {'them' if hosts > 1 else 'it'}, not the rental — end "
                f"it on {offer.provider}'s site; the ledger counts none of it from here")

    def worker_gpus(self, record: ClusterRecord) -> float:
        """The GPUs of each machine a cell's workers run on: what the cluster is made of (your
        hosts as ``up`` found them, the offer's node type), else what Ray's nodes declare now (this
        machine, a cluster attached to). A cell's workers take one each where there are any."""
        spec = ClusterSpec.from_json(record.spec)
        made = spec.remote.gpus_per_host or (spec.workers.gpu_count if spec.workers else 0)
        if made or not record.address or self.tunnelled or "://" in record.address:
            return float(made)
        key = (record.id, record.address)      # a machine's GPUs do not change: asked once, not every cell
        if key not in _DECLARED:
            try:
                _DECLARED[key] = max((n.gpus for n in read_nodes(record.address, timeout=2.0) if n.alive), default=0.0)
            except ClusterUnreachable:
                return 0.0
        return _DECLARED[key]

    def cannot_start_in(self, region: str) -> str | None:
        """Why it cannot start a machine in ``region`` as things stand (a cloud's launcher with no
        machine image there), and what to do; None where it can."""
        return None

    def start(self, record: ClusterRecord, spec: ClusterSpec) -> Started:
        raise NotImplementedError

    def wait_ready(self, record: ClusterRecord, spec: ClusterSpec, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once every node the cluster must have (head + min workers) has joined."""
        if not record.address:
            return
        want = sum(t.min_workers for t in spec.node_types)
        deadline = time.monotonic() + timeout
        while True:
            alive = [n for n in read_nodes(record.address) if n.alive]
            workers = [n for n in alive if not n.is_head]
            if alive and len(workers) >= want:
                return
            if time.monotonic() > deadline:
                raise GpugeekError(f"only {len(workers)} of {want} worker nodes joined in {timeout:.0f} s "
                                   f"— see the logs in {record.temp_dir}")
            time.sleep(0.2)

    def stop(self, record: ClusterRecord, grace: float = 3.0) -> None:
        raise NotImplementedError

    def job_record(self, spec: ClusterSpec) -> JobRecord | None:
        """A scheduler's record of the cluster's job (``scheduler`` backends: what its nodes are
        billed from, ``meter/allocation.py``); None when it does not answer."""
        return None

    def follow(self, record: ClusterRecord) -> ClusterRecord | None:
        """Where the cluster's head moved without a stop of ours (a requeued scheduler job runs
        again on a new allocation): the record with the new head, reached again; None where it
        has not moved (or cannot)."""
        return None

    def wait_moved(self, record: ClusterRecord, say=print) -> ClusterRecord:
        """Until the cluster's head has moved (``follow``) and its nodes are back: the record then."""
        raise GpugeekError(f"a {self.name} cluster's head does not move — a node to preempt is one of its workers "
                           "(`%gpugeek status` lists them)")

    def scale(self, record: ClusterRecord, spec: ClusterSpec, workers: int) -> ClusterSpec:
        self.check(Feature.SCALE)
        raise NotImplementedError

    def notes(self, spec: ClusterSpec) -> list[str]:
        """What a user should know of ``spec`` on this backend, said with its config."""
        return []

    def node(self, record: ClusterRecord, node: str) -> RayNode:
        """A live worker node by (part of) its id, to rehearse a preemption on."""
        self.check(Feature.PREEMPT)
        raise NotImplementedError

    def preempt(self, record: ClusterRecord, spec: ClusterSpec, node: str) -> tuple[RayNode, ClusterSpec]:
        """Take a node away as a spot preemption does; returns it and the spec as it is after."""
        self.check(Feature.PREEMPT)
        raise NotImplementedError
