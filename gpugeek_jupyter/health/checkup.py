"""``doctor``: examine a live cluster from the kernel — one probe per node (``nodes.examine``, run
here or by a remote cluster's keeper on its head), then the verdict (``findings``)."""

from __future__ import annotations

from dataclasses import fields

from ..cells.driving import LineDriver
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..kernel import connection, environment, session
from ..line.messages import Examine
from . import probe as probe_module
from .findings import DEFAULT_PACKAGES, DoctorReport, Link, NodeFacts, judge
from .nodes import JOIN_TIMEOUT_S, MEASURE_TIMEOUT_S, SILENT_TIMEOUT_S, examine

EXAMINE_TIMEOUT_S = SILENT_TIMEOUT_S + JOIN_TIMEOUT_S + MEASURE_TIMEOUT_S + 180.0   # on the head, over the line


def doctor(name: str | None = None, *, packages: list[str] | str | None = None) -> DoctorReport:
    """Check every node of a live cluster against this kernel (a remote cluster's: against its
    head, whose keeper examines the nodes) and against each other: versions, the network interface,
    GPUs, ports, clocks and all_reduce between every pair of nodes."""
    record = session.live_cluster(name)
    if not record.address:
        raise GpugeekError(f"cluster {record.name!r} has no address this kernel can reach — doctor needs a "
                           f"running Ray cluster")
    connection.connect(record)
    # what the kernel sent with the job is compared too: the nodes must import the kernel's version
    sent = [m.dist for m in environment.shipment().for_cluster(record.id).shipped.values() if m.dist]
    names = _package_names([*sent, *_listed(packages)])
    spec = ClusterSpec.from_json(record.spec)
    labels = _labels(spec)
    mine = probe_module.versions(names)
    line = connection.line()
    if line is None:
        seen, sides = examine(names, labels, record.address, spec.remote.gcs_port), {}
        reference, against = mine, "the kernel"
    else:
        examined = LineDriver(line, f"cluster {record.name!r}").ask(
            Examine(packages=names, labels=labels, gcs_port=spec.remote.gcs_port), timeout=EXAMINE_TIMEOUT_S)
        seen = {f.name: getattr(examined, f.name) for f in fields(examined)}
        welcome = line.welcome
        # the nodes run the head's Python and Ray; what the kernel sent, at the kernel's version
        reference, against = {**seen["reference"], **{dist: mine.get(dist) for dist in sent}}, "the head"
        sides = {"kernel": f"Python {mine['python']}, Ray {mine.get('ray') or '-'}",
                 "head": f"Python {welcome.python}, Ray {welcome.ray} (its keeper, gpugeek-jupyter "
                         f"{welcome.package}; the line: protocol {welcome.protocol})"}
    facts = [NodeFacts(**f) for f in seen["facts"]]
    pairs = {(a, b): tuple(figures) for a, b, figures in seen["pairs"]}
    links = {(a, b): Link(**link) for a, b, link in seen["links"]}
    failed = {tuple(ids): why for ids, why in seen["failed"]}
    return judge(record.name, reference, facts, pairs, simulated=record.simulated, labels=labels, links=links,
                 collective_failures=failed, took_s=seen["took_s"], phases=seen["phases"], against=against,
                 sides=sides, sent=set(sent))


def _listed(packages: list[str] | str | None) -> list[str]:
    return packages.split(",") if isinstance(packages, str) else list(packages or [])


def _package_names(extra: list[str]) -> list[str]:
    names = list(DEFAULT_PACKAGES)
    for name in (p.strip() for p in extra):
        if name and name not in names:
            names.append(name)
    return names


def _labels(spec: ClusterSpec) -> dict[str, str]:
    """How the user named each node's host, where they did (``--hosts``), by its Ray address."""
    return dict(zip(spec.remote.ips, spec.remote.hosts, strict=False))
