"""From what the user asked for — an offer id, a plan's best offer, or the cheapest ``--gpu`` —
to the node types a cluster is made of, priced from the catalog and nothing else.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

import pandas as pd

from ..backends.interface import capable
from ..catalog.heads import head_offer
from ..catalog.offers import find_offers, load_catalog, price_column
from ..catalog.residency import countries_in, country_of
from ..cluster.remote import Asked, learn
from ..cluster.spec import ClusterSpec, NodeType, SlurmJob
from ..config import settings
from ..errors import GpugeekError, NoMatchingOffers
from ..remote import ssh
from ..vocab import NodePrice, Pricing


def spec_for(backend: str, *, offer=None, plan=None, gpu: str | None = None, count: int | None = None,
             workers: int | None = None, min_workers: int | None = None, max_workers: int | None = None,
             pricing: str = Pricing.ON_DEMAND, spot_fallback: bool = False,
             catalog: str | None = None, residency: str | None = None) -> ClusterSpec:
    """The spec ``up`` starts: this machine for ``local``, nothing of ours for ``attach``, else
    the chosen offer's node types (``workers`` kept up, up to ``max_workers``)."""
    can = capable(backend)
    if not can.from_offers:
        given = [f for f, v in (("--offer", offer), ("--plan", plan), ("--gpu", gpu), ("--workers", workers),
                                ("--residency", residency),
                                ("--min-workers", min_workers), ("--max-workers", max_workers)) if v is not None]
        if given or spot_fallback:
            what = "this machine" if can.runs_here else "the cluster at --address"
            raise GpugeekError(f"{', '.join(given) or '--spot-fallback'}: the {backend} backend runs on {what} "
                               f"— use --backend sim or a cloud to choose offers and workers")
        usd = settings().local_usd_per_hour if can.local_price else 0.0
        return ClusterSpec(backend=backend, pricing="local",
                           head_price=NodePrice(None, "local" if can.local_price else "unpriced", usd))
    if workers is not None and min_workers is not None and workers != min_workers:
        raise GpugeekError("--workers and --min-workers say the same thing (nodes kept up) — give one")
    row, plan_nodes = resolve_offer(offer=offer, plan=plan, gpu=gpu, count=count, pricing=pricing,
                                    provider=can.provider, catalog=catalog,
                                    residency=residency)
    keep = workers if workers is not None else (min_workers if min_workers is not None else plan_nodes or 1)
    most = max_workers or max(keep, 1)
    if most < keep:
        raise GpugeekError(f"--max-workers {most} is below the {keep} worker nodes asked for — raise --max-workers or "
                           "ask for fewer")
    spec = build_spec(backend, row, pricing=pricing, workers=int(keep), max_workers=int(most),
                      spot_fallback=spot_fallback)
    if can.head_instance:       # a cloud's head: a CPU machine, on demand, where the workers are
        head = head_offer(can.provider, can.head_instance, spec.node_types[0].region, spec.node_types[0].zone)
        if head is not None:
            spec.head_price = NodePrice(head.id, Pricing.ON_DEMAND, head.usd_per_hour, head.usd_per_hour)
    spec.notes.extend(can.notes(spec))
    return spec


def slurm_spec(job: SlurmJob, *, ssh_key: str | None = None, usd_per_hour: float | None = None,
               offer: str | None = None, pricing: str = Pricing.ON_DEMAND, python: str | None = None,
               catalog: str | None = None, install: bool = True, pip_index_url: str | None = None,
               backend: str) -> ClusterSpec:
    """A Slurm allocation of ``job.nodes`` nodes, each priced at the rate given or as the offer
    given; the login node is the one host we reach (the runtime is made in the shared home from
    there, with ``pip_index_url``: compute nodes often have no internet)."""
    ssh.parse_hosts([job.login])           # one line for a login that is no [USER@]HOST[:PORT]
    spec = ssh_spec([job.login], ssh_key=ssh_key, gpus_per_host=job.gpus_per_node, cpus_per_host=job.cpus_per_node,
                    usd_per_hour=usd_per_hour, offer=offer, pricing=pricing, python=python, catalog=catalog,
                    install=install, pip_index_url=pip_index_url, backend=backend)
    for node_type in spec.node_types:
        node_type.min_workers = node_type.max_workers = job.nodes - 1
    spec.slurm = job
    return spec


def ssh_spec(hosts, *, ssh_key: str | None = None, gpus_per_host: int | None = None,
             cpus_per_host: int | None = None, usd_per_hour: float | None = None, offer: str | None = None,
             pricing: str = Pricing.ON_DEMAND, python: str | None = None, catalog: str | None = None,
             residency: str | None = None, install: bool = True, pip_index_url: str | None = None,
             backend: str) -> ClusterSpec:
    """The user's own machines, each priced at the rate given or as the offer given (per host).
    ``python``, ``install`` and ``pip_index_url``: how each host gets its runtime (``remote.runtime``)."""
    targets = ssh.parse_hosts(hosts)
    if (usd_per_hour is None) == (offer is None):
        raise GpugeekError("what each host costs is not said — give --usd-per-hour X (0 if they cost you nothing) "
                           "or --offer ID (priced from the catalog), one of the two")
    for flag, value in (("--gpus-per-host", gpus_per_host), ("--cpus-per-host", cpus_per_host)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise GpugeekError(f"{flag} {value!r} is not a whole number ≥ 0 — give one")
    if usd_per_hour is not None and (not isinstance(usd_per_hour, (int, float)) or usd_per_hour < 0):
        raise GpugeekError(f"--usd-per-hour {usd_per_hour!r} is not a price — give a number of dollars ≥ 0")
    if offer is not None:
        row, _ = resolve_offer(offer=offer, pricing=pricing, catalog=catalog, residency=residency)
        spec = build_spec(backend, row, pricing=pricing, workers=len(targets) - 1, max_workers=len(targets) - 1,
                          spot_fallback=False)
        host = spec.node_types[0]
        host.name = "host"
        gpus = int(row["gpu_count"]) if gpus_per_host is None else gpus_per_host
    else:
        gpus = gpus_per_host or 0
        host = NodeType(name="host", offer_id="", provider=backend, instance_type="your machine", region="",
                        zone="", gpu="", gpu_count=gpus, gpu_mem_gib=None, vcpus=cpus_per_host, mem_gib=None,
                        pricing="rate", usd_per_hour=float(usd_per_hour), on_demand_usd_per_hour=None,
                        min_workers=len(targets) - 1, max_workers=len(targets) - 1)
        spec = ClusterSpec(backend=backend, node_types=[host], pricing="rate")
        if not usd_per_hour:
            spec.notes.append("priced at $0/h: these machines cost nothing here")
    spec.head_price = host.price()
    if pip_index_url is not None and not re.match(r"(https?|file)://\S+$", pip_index_url):
        raise GpugeekError(f"--pip-index-url {pip_index_url!r} is not a URL — give a package index's, like "
                           f"https://pypi.example.com/simple")
    learn(spec, Asked(hosts=tuple(str(t) for t in targets), ssh_key=ssh_key, gpus_per_host=gpus,
                      cpus_per_host=cpus_per_host, python=python, install=bool(install),
                      pip_index_url=pip_index_url or settings().pip_index_url))
    return spec


def resolve_offer(*, offer: str | None = None, plan=None, gpu: str | None = None,
                  count: int | None = None, pricing: str = "on-demand",
                  provider: str | None = None, catalog: str | None = None,
                  residency: str | None = None) -> tuple[pd.Series, int | None]:
    """The offer to build from, and the node count a plan asks for (else None)."""
    given = [name for name, value in (("--offer", offer), ("--plan", plan), ("--gpu", gpu)) if value is not None]
    if len(given) > 1:
        raise GpugeekError(f"{', '.join(given)} given together — give one of them")
    pricing = Pricing.parse(pricing, "--pricing")
    if plan is not None:
        best = getattr(plan, "best", None)
        if best is None:
            why = getattr(plan, "why_empty", "") or "it has no offer that fits"
            raise GpugeekError(f"--plan: the plan has no best offer ({why}) — widen the plan's search, or give "
                               "--offer ID")
        row, nodes = offer_row(best["id"], catalog), int(best.get("nodes", 1))
    elif offer is not None:
        row, nodes = offer_row(offer, catalog), None
    elif gpu is not None:
        frame = find_offers(gpu=gpu, count=count, pricing=pricing, provider=provider, catalog=catalog,
                            residency=residency)
        row, nodes = offer_row(frame.iloc[0]["id"], catalog), None
    else:
        raise GpugeekError("nothing says what to run on — give --offer ID, --plan VAR or --gpu NAME [--count N]")
    if provider and row["provider"] != provider:
        raise GpugeekError(
            f"offer {row['id']} is a {row['provider']} offer — the {provider} backend needs a "
            f"{provider} offer (try --gpu {row['gpu']} --count {int(row['gpu_count'])})")
    if residency:
        where = country_of(row["provider"], row["region"])
        if where is None or where not in countries_in(residency):
            raise GpugeekError(
                f"offer {row['id']} is in {where or 'a place the region table does not know'}, "
                f"outside --residency {residency} — pick one with `%gpugeek offers --residency {residency}`")
    column = price_column(pricing)
    if pd.isna(row[column]):
        raise GpugeekError(f"offer {row['id']} has no {pricing} price in the catalog — "
                           f"use --pricing on-demand or another offer")
    return row, nodes


def offer_row(offer_id: str, extra: str | None = None) -> pd.Series:
    """The catalog row of an offer id (one line naming the nearest ids when there is none)."""
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
    pricing = Pricing.parse(pricing, "--pricing")
    if spot_fallback and pricing != Pricing.SPOT:
        raise GpugeekError("--spot-fallback only makes sense with --pricing spot — add --pricing spot, or drop "
                           "--spot-fallback")
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
            raise GpugeekError(f"offer {row['id']} has no on-demand price to fall back to — drop --spot-fallback, or "
                               "pick another offer")
        spec.node_types.append(NodeType(
            name=node_type_name(row, "on-demand"), pricing="on-demand", usd_per_hour=on_demand,
            min_workers=0, max_workers=max_workers, replaces_preempted=primary.name, **common))
    return spec


def _price(row: pd.Series, pricing: str) -> float | None:
    value = row[price_column(pricing)]
    return None if pd.isna(value) else float(value)


def _num(value) -> float | None:
    return None if pd.isna(value) else float(value)


def another_offer(spec: ClusterSpec, can_start: Callable[[str], bool] = lambda region: True) -> str | None:
    """The cheapest offer like ``spec``'s (the same provider, GPU, count and pricing) in another
    region: where to try when the cloud has none free where it was asked (a catalog's AWS zones
    are zone ids, which name no zone of the user's account, so another zone is no other place)."""
    node = spec.workers
    if node is None:
        return None
    try:
        offers = find_offers(gpu=node.gpu, count=node.gpu_count, provider=node.provider, pricing=node.pricing)
    except GpugeekError:
        return None
    others = offers[(offers["region"] != node.region) & offers["region"].map(can_start)]
    return None if others.empty else str(others.iloc[0]["id"])
