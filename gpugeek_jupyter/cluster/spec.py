"""What a cluster is made of: node types, each an offer bought one way at its $/h.

Every backend turns the same ``ClusterSpec`` into its own form — autoscaler node types for the
simulated cluster, a cluster-launcher YAML for a cloud, a RayCluster manifest for KubeRay — and the
ledger prices nodes from it. Plain data, stored as JSON in the registry and read by every process
(the watchdog too), so it loads nothing heavy; ``nodetypes`` builds it from the catalog.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ..vocab import NodePrice
from .remote import Remote


@dataclass
class NodeType:
    """One kind of worker node: an offer bought one way (on-demand, spot or reserved)."""

    name: str
    offer_id: str
    provider: str
    instance_type: str
    region: str
    zone: str
    gpu: str
    gpu_count: int
    gpu_mem_gib: float | None
    vcpus: float | None
    mem_gib: float | None
    pricing: str
    usd_per_hour: float
    on_demand_usd_per_hour: float | None
    min_workers: int
    max_workers: int
    replaces_preempted: str | None = None   # the spot node type this one stands in for

    def price(self) -> NodePrice:
        return NodePrice(self.offer_id, self.pricing, self.usd_per_hour, self.on_demand_usd_per_hour)


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm allocation a cluster is (``up --backend slurm``): sbatch's own options, and how to
    reach the login node it is submitted from."""

    login: str                         # [USER@]HOST[:PORT], or a host of your ssh config
    nodes: int = 1
    partition: str | None = None
    gpus_per_node: int = 0             # GRES gpu per node (--gres=gpu[:TYPE]:N)
    gpu_type: str | None = None
    cpus_per_node: int | None = None   # --cpus-per-task (one task a node)
    time_min: int | None = None        # the walltime, in minutes
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: str | None = None           # shell lines run before Ray on each node ("module load …")
    sbatch: str | None = None          # more sbatch options, as on its command line
    requeue: bool = False              # requeued at its walltime's notice: the cluster goes on in its next allocation


@dataclass
class ClusterSpec:
    backend: str
    node_types: list[NodeType] = field(default_factory=list)
    pricing: str = "on-demand"
    spot_fallback: bool = False
    head_price: NodePrice = field(default_factory=lambda: NodePrice(None, "not billed", 0.0))
    notes: list[str] = field(default_factory=list)
    dashboard: bool = False           # Ray's dashboard on the head (local and sim)
    dashboard_url: str | None = None  # where it answers, once started
    remote: Remote = field(default_factory=Remote)   # your machines, clouds: hosts, key, head, ports, tunnel
    env: list[str] = field(default_factory=list)  # pip requirements every job gets (``up --env``)
    working_dir: str | None = None    # the folder every cell starts in, sent to the nodes (``up --working-dir``)
    storage: str | None = None        # where jobs checkpoint unless told (``up --storage``): a URL or shared path
    internal_ips: bool = False        # a cloud's nodes reached at their private addresses (``up --internal-ips``)
    slurm: SlurmJob | None = None     # the allocation a Slurm cluster is (``up --backend slurm``)

    @property
    def workers(self) -> NodeType | None:
        """The node type the cluster is made of (the spot one when there is a fallback)."""
        primary = [t for t in self.node_types if t.replaces_preempted is None]
        return primary[0] if primary else None

    def prices(self) -> dict[str, NodePrice]:
        prices = {t.name: t.price() for t in self.node_types}
        prices["head"] = self.head_price
        return prices

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ClusterSpec:
        """Keys a later version added are dropped (a spec is read by every version's processes)."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["node_types"] = [NodeType(**t) for t in data.get("node_types", [])]
        data["head_price"] = NodePrice(**data["head_price"])
        data["remote"] = Remote.from_json(data.get("remote"))
        if data.get("slurm"):
            known_job = {f.name for f in fields(SlurmJob)}
            data["slurm"] = SlurmJob(**{k: v for k, v in data["slurm"].items() if k in known_job})
        return cls(**data)
