"""What to provision: node types made from catalog offers, each with its price.

Every backend turns the same ``ClusterSpec`` into its own form — autoscaler node types for the
simulated cluster, a cluster-launcher YAML for a cloud, a RayCluster manifest for KubeRay — and the
ledger prices nodes from it. Offers come from ``--offer ID``, a plan's ``.best`` or ``--gpu/--count``
(the cheapest match); prices come from the catalog only.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field, fields

import pandas as pd

from ..catalog.offers import find_offers, load_catalog, price_column
from ..errors import GpugeekError, NoMatchingOffers
from ..meter.ledger import NodePrice

CLOUD_PROVIDERS = ("aws", "gcp", "azure")


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

    @property
    def simulated(self) -> bool:
        return self.backend == "sim"

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
        return cls(**data)


def resolve_offer(*, offer: str | None = None, plan=None, gpu: str | None = None,
                  count: int | None = None, pricing: str = "on-demand",
                  provider: str | None = None, catalog: str | None = None) -> tuple[pd.Series, int | None]:
    """The offer to build from, and the node count a plan asks for (else None)."""
    given = [name for name, value in (("--offer", offer), ("--plan", plan), ("--gpu", gpu)) if value is not None]
    if len(given) > 1:
        raise GpugeekError(f"give one of {', '.join(given)}, not several")
    price_column(pricing)
    if plan is not None:
        best = getattr(plan, "best", None)
        if best is None:
            why = getattr(plan, "why_empty", "") or "it has no offer that fits"
            raise GpugeekError(f"--plan: the plan has no best offer ({why})")
        row, nodes = _offer_by_id(best["id"], catalog), int(best.get("nodes", 1))
    elif offer is not None:
        row, nodes = _offer_by_id(offer, catalog), None
    elif gpu is not None:
        frame = find_offers(gpu=gpu, count=count, pricing=pricing, provider=provider, catalog=catalog)
        row, nodes = _offer_by_id(frame.iloc[0]["id"], catalog), None
    else:
        raise GpugeekError("say what to run on: --offer ID, --plan VAR or --gpu NAME [--count N]")
    if provider and row["provider"] != provider:
        raise GpugeekError(
            f"offer {row['id']} is a {row['provider']} offer — the {provider} backend needs a "
            f"{provider} offer (try --gpu {row['gpu']} --count {int(row['gpu_count'])})")
    column = price_column(pricing)
    if pd.isna(row[column]):
        raise GpugeekError(f"offer {row['id']} has no {pricing} price in the catalog — "
                           f"use --pricing on-demand or another offer")
    return row, nodes


def _offer_by_id(offer_id: str, extra: str | None = None) -> pd.Series:
    catalog = load_catalog(extra)
    hits = catalog[catalog["id"] == offer_id]
    if hits.empty:
        close = difflib.get_close_matches(offer_id, catalog["id"].tolist(), n=3, cutoff=0.6)
        hint = f" — did you mean {', '.join(close)}?" if close else " — `%gpugeek offers` lists ids"
        raise NoMatchingOffers(f"no offer with id {offer_id!r}{hint}", close)
    return hits.iloc[0]


def node_type_name(row: pd.Series, pricing: str) -> str:
    """``a100x8-spot``: readable in ``ray status`` and valid as a Kubernetes group name."""
    base = re.sub(r"[^a-z0-9]+", "-", f"{row['gpu']}x{int(row['gpu_count'])}".lower()).strip("-")
    return f"{base}-{pricing}"


def build_spec(backend: str, row: pd.Series, *, pricing: str, workers: int, max_workers: int,
               spot_fallback: bool) -> ClusterSpec:
    """Node types for ``row``: the chosen pricing, plus an on-demand stand-in with --spot-fallback."""
    if spot_fallback and pricing != "spot":
        raise GpugeekError("--spot-fallback only makes sense with --pricing spot")
    on_demand = _price(row, "on-demand")
    common = dict(
        offer_id=row["id"], provider=row["provider"], instance_type=row["instance_type"],
        region=row["region"] or "", zone=row["zone"] or "", gpu=row["gpu"],
        gpu_count=int(row["gpu_count"]), gpu_mem_gib=_num(row["gpu_mem_gib"]),
        vcpus=_num(row["vcpus"]), mem_gib=_num(row["mem_gib"]), on_demand_usd_per_hour=on_demand,
    )
    primary = NodeType(name=node_type_name(row, pricing), pricing=pricing,
                       usd_per_hour=_price(row, pricing), min_workers=workers,
                       max_workers=max_workers, **common)
    spec = ClusterSpec(backend=backend, node_types=[primary], pricing=pricing,
                       spot_fallback=spot_fallback)
    if pricing == "reserved":
        spec.notes.append("reserved $/h is an estimate: on-demand less the configured discount")
    if spot_fallback:
        if on_demand is None:
            raise GpugeekError(f"offer {row['id']} has no on-demand price to fall back to")
        spec.node_types.append(NodeType(
            name=node_type_name(row, "on-demand"), pricing="on-demand", usd_per_hour=on_demand,
            min_workers=0, max_workers=max_workers, replaces_preempted=primary.name, **common))
    return spec


def _price(row: pd.Series, pricing: str) -> float | None:
    value = row[price_column(pricing)]
    return None if pd.isna(value) else float(value)


def _num(value) -> float | None:
    return None if pd.isna(value) else float(value)
