"""The nodes' part of ``doctor``, run by a Ray driver of the cluster — a local kernel, or a remote
cluster's keeper on its head, asked over the line (``checkup``) — with nothing of a kernel's session.

The order matters for a cluster with a broken node: every node is asked for its facts at once,
and a node that has not answered once another node found its Ray port closed is called
unreachable then and there, rather than after a long timeout; the link checks then run among
the nodes that did answer. A slow link must not stall the check either: each link is first
measured with plain TCP under a short deadline (a link too slow to carry the payload in time
still gives its rate), and all_reduce runs only once every link carried data, with tensors
sized from those rates so that no round comes near gloo's timeout.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict

from .. import ports
from ..launch import rendezvous
from . import probe as probe_module
from .findings import Link, NodeFacts, tcp_slow

SILENT_TIMEOUT_S = 60.0      # a node whose port opens but that has not answered by then is silent
JOIN_TIMEOUT_S = 20.0        # gloo's rendezvous among the nodes that answered
MEASURE_TIMEOUT_S = 30.0     # every pair's all_reduce, one pair at a time: this, plus
MEASURE_PER_PAIR_S = 10.0    # … this per pair
PAIR_TIMEOUT_S = 5.0         # one all_reduce of a pair; its tensors are sized to take ~1/50 of it
LINK_DEADLINE_S = 1.0        # one direction of one link's TCP test, at most; with many nodes the
LINK_BUDGET_S = 12.0         # … deadline shrinks so that every direction fits this together,
LINK_DEADLINE_MIN_S = 0.25   # … down to this
BANDWIDTH_BUDGET_S = 0.5     # every bandwidth round of a pair together, at the link's TCP rate
CLOCK_ROUNDS = 3


def examine(packages: list[str], labels: dict[str, str], address: str, gcs_port: int | None,
            runtime_env: dict | None = None) -> dict:
    """The nodes' part of ``doctor``, run by a Ray driver of the cluster (a kernel, or a remote
    cluster's keeper, whose probes get its groups' ``runtime_env``): each node's facts, then clocks,
    links and all_reduce among those that answered — as plain data, and the versions this process
    has, which the nodes are held against."""
    import ray

    began = time.monotonic()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    nodes.sort(key=lambda n: (not _is_head(n), n["NodeManagerAddress"]))
    gcs = _gcs(address, gcs_port, nodes)
    probes = [_probe_on(n["NodeID"], runtime_env) for n in nodes]
    phases = {"nodes": time.monotonic() - began}
    pairs: dict = {}
    links: dict = {}
    failed: dict = {}
    try:
        facts = _facts(probes, nodes, packages, gcs, labels)
        phases["facts"] = time.monotonic() - began
        answered = [i for i, f in enumerate(facts) if f.answered]
        _clocks([probes[i] for i in answered], [facts[i] for i in answered])
        phases["clocks"] = time.monotonic() - began
        if len(answered) > 1:
            live, seen = [probes[i] for i in answered], [facts[i] for i in answered]
            links = _links(live, seen)
            phases["links"] = time.monotonic() - began
            if all(link.rate for link in links.values()):     # else gloo would only wait out its timeout
                pairs, failed = _all_reduce(live, seen, links, phases, began)
    finally:
        for actor in probes:       # also on Ctrl-C: no probe outlives the check
            ray.kill(actor)
    return {"facts": [asdict(f) for f in facts], "pairs": [[a, b, list(v)] for (a, b), v in pairs.items()],
            "links": [[a, b, asdict(link)] for (a, b), link in links.items()],
            "failed": [[list(ids), why] for ids, why in failed.items()], "phases": phases,
            "took_s": time.monotonic() - began, "reference": probe_module.versions(packages)}


def _is_head(node: dict) -> bool:
    return "node:__internal_head__" in node.get("Resources", {})


def _gcs(address: str, gcs_port: int | None, nodes: list[dict]) -> tuple[str, int] | None:
    """The head's GCS as the nodes reach it: the head's own address and the GCS port."""
    head = next((n for n in nodes if _is_head(n)), None)
    if head is None:
        return None
    port = gcs_port or address.rpartition(":")[2]
    return (head["NodeManagerAddress"], int(port)) if str(port).isdigit() else None


def _probe_on(node_id: str, runtime_env: dict | None = None):
    """A probe actor pinned to the node. The probe's module travels by value, so a node needs
    neither this package nor its version to be examined; ``runtime_env``: what the groups run with
    (a keeper's: the modules kernels sent), so the probe sees the versions a cell would."""
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cloudpickle.register_pickle_by_value(probe_module)
    cloudpickle.register_pickle_by_value(rendezvous)
    cloudpickle.register_pickle_by_value(ports)
    actor = ray.remote(probe_module.Probe)
    return actor.options(num_cpus=0, max_restarts=0, runtime_env=runtime_env or None,
                         scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def _facts(probes: list, nodes: list[dict], packages: list[str], gcs, labels: dict[str, str]) -> list[NodeFacts]:
    """Every node's facts, asked at once. A node that has not answered is unreachable as soon as
    a node that did could not open its Ray port (said at once: the rest takes a while longer);
    one whose port opens but that stays silent for SILENT_TIMEOUT_S is reported as silent."""
    import ray

    ports = [(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']} (Ray node manager)", n["NodeManagerAddress"],
              n["NodeManagerPort"]) for n in nodes]
    ports += [(f"{n['NodeManagerAddress']}:{n['ObjectManagerPort']} (Ray object manager)", n["NodeManagerAddress"],
               n["ObjectManagerPort"]) for n in nodes]
    if gcs is not None:
        ports.append((f"{gcs[0]}:{gcs[1]} (Ray GCS)", *gcs))
    out = [NodeFacts(ip=n["NodeManagerAddress"], node_id=n["NodeID"], is_head=_is_head(n),
                     declared_gpus=float(n.get("Resources", {}).get("GPU", 0))) for n in nodes]
    waiting = {probe.facts.remote(packages, ports): i for i, probe in enumerate(probes)}
    began = time.monotonic()
    while waiting and time.monotonic() - began < SILENT_TIMEOUT_S:
        done, _ = ray.wait(list(waiting), num_returns=1, timeout=0.5)
        for ref in done:
            i = waiting.pop(ref)
            try:
                out[i].answer(ray.get(ref), time.monotonic() - began)
            except ray.exceptions.RayError as exc:
                out[i].error = _first_line(exc)
        closed = _closed_hosts(out)
        for ref, i in list(waiting.items()):
            if out[i].ip in closed:
                del waiting[ref]
                out[i].unreachable_after = time.monotonic() - began
                print(f"doctor: {labels.get(out[i].ip, out[i].ip)} is unreachable (no answer after "
                      f"{out[i].unreachable_after:.1f} s, its Ray port closed to the other nodes); checking the rest…",
                      flush=True)
    for i in waiting.values():
        out[i].silent_after = time.monotonic() - began
    return out


def _closed_hosts(facts: list[NodeFacts]) -> set[str]:
    """Hosts whose Ray node manager some answering node could not connect to."""
    closed = set()
    for f in facts:
        if not f.answered:
            continue
        for label, why in f.ports.items():
            if why and "node manager" in label:
                closed.add(label.partition(":")[0])
    return closed


def _clocks(probes: list, facts: list[NodeFacts]) -> None:
    """Each node's clock against the kernel's: the node's time minus the midpoint of the round
    trip that carried it, from the quickest of a few round trips."""
    import ray

    for probe, f in zip(probes, facts, strict=True):
        best = None
        for _ in range(CLOCK_ROUNDS):
            sent = time.time()
            try:
                theirs = ray.get(probe.clock.remote(), timeout=10)
            except ray.exceptions.RayError:   # it answered before: its clock stays unknown ("-")
                break
            back = time.time()
            if best is None or back - sent < best[1]:
                best = (theirs - (sent + back) / 2, back - sent)
        if best is not None:
            f.clock_offset_s, f.clock_rtt_s = best


def _links(probes: list, facts: list[NodeFacts]) -> dict:
    """Plain TCP throughput of every link, each direction on its own and one at a time, so that
    each figure is that link's alone: {(node_id_a, node_id_b): Link}. A link whose figures say slow
    (under the floor, or many times under the best) is measured once more and keeps its better
    figures: a busy machine stalls one short test now and then, a slow link is slow both times."""
    pairs = list(itertools.combinations(range(len(probes)), 2))
    deadline = max(LINK_DEADLINE_MIN_S, min(LINK_DEADLINE_S, LINK_BUDGET_S / (2 * len(pairs))))

    def measure(i: int, j: int) -> Link:
        there, why, cut = _one_way(probes[i], probes[j], facts[j].ip, deadline)
        back, why_back, cut_back = _one_way(probes[j], probes[i], facts[i].ip, deadline)
        return Link(there, back, why or why_back, cut or cut_back)

    links = {(i, j): measure(i, j) for i, j in pairs}
    best = max((link.rate for link in links.values() if link.rate is not None), default=None)
    for (i, j), link in links.items():
        if link.rate is not None and tcp_slow(link, best):
            again = measure(i, j)
            if again.rate is not None:
                links[(i, j)] = Link(max(link.there, again.there), max(link.back, again.back),
                                     cut_short=link.cut_short and again.cut_short)
    return {(facts[i].node_id, facts[j].node_id): link for (i, j), link in links.items()}


def _one_way(sender, receiver, address: str, deadline: float) -> tuple[float | None, str | None, bool]:
    """Bits per second from ``sender`` to ``receiver`` (at ``address``), or why none; and whether
    the deadline cut the test short."""
    import ray

    try:
        port = ray.get(receiver.listen.remote(deadline), timeout=10)
        why = ray.get(sender.send.remote(address, port, deadline), timeout=deadline + 15)
        got = ray.get(receiver.received.remote(port, give_up=why is not None), timeout=deadline + 15)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        return None, f"the test did not finish ({_in_words(exc)})", True
    if why:
        return None, f"no TCP connection to {address}:{port} ({why})", True
    if not got.get("bytes"):
        return None, f"nothing got through in {deadline:g} s", True
    return got["bps"], None, got["bytes"] < probe_module.LINK_BYTES


def _all_reduce(probes: list, facts: list[NodeFacts], links: dict, phases: dict, began: float) -> tuple[dict, dict]:
    """A gloo group over the answering nodes, then all_reduce latency and bandwidth per pair:
    ({(node_id_a, node_id_b): (latency_ms, GB/s)}, {(node ids…): what failed, in words})."""
    import ray

    ids = tuple(f.node_id for f in facts)
    try:
        master, port = ray.get(probes[0].rendezvous.remote(), timeout=10)
        joined = ray.get([p.join.remote(rank, len(probes), master, port, JOIN_TIMEOUT_S)
                          for rank, p in enumerate(probes)], timeout=JOIN_TIMEOUT_S + 30)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        return {}, {ids: f"the gloo group could not form: {_in_words(exc)}"}
    for f, info in zip(facts, joined, strict=True):
        f.torch = info
    phases["joined"] = time.monotonic() - began
    pairs = list(itertools.combinations(range(len(probes)), 2))
    sizes = [_tensor_bytes(links[(facts[i].node_id, facts[j].node_id)].rate) for i, j in pairs]
    measured: dict = {}
    failed: dict = {}
    trouble = {}
    try:
        timeout = MEASURE_TIMEOUT_S + MEASURE_PER_PAIR_S * len(pairs)
        for part, broke in ray.get([p.measure.remote(pairs, sizes, PAIR_TIMEOUT_S) for p in probes], timeout=timeout):
            measured.update(part)
            failed.update(broke)
        phases["measured"] = time.monotonic() - began
        ray.get([p.leave.remote() for p in probes], timeout=10)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        trouble = {ids: f"all_reduce did not finish: {_in_words(exc)}"}
    named = {(facts[i].node_id, facts[j].node_id): figures for (i, j), figures in measured.items()}
    return named, {**{(facts[i].node_id, facts[j].node_id): why for (i, j), why in failed.items()}, **trouble}


def _tensor_bytes(bps: float) -> int:
    """The bandwidth tensor for a link of ``bps``: BANDWIDTH_BYTES, or less where the link is so
    slow that its rounds would not fit BANDWIDTH_BUDGET_S."""
    fits = bps / 8 * BANDWIDTH_BUDGET_S / (probe_module.BANDWIDTH_ROUNDS + 1)
    return int(max(4 << 10, min(probe_module.BANDWIDTH_BYTES, fits)))


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


def _in_words(exc: BaseException) -> str:
    """What went wrong, without the library's own message: ours (a rank that cannot reach rank
    0, naming both ends) is said as it is; torch's and gloo's are put in words."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, ConnectionError) and str(cause).startswith("rank "):
        return str(cause)
    if isinstance(cause, TimeoutError) or type(cause).__name__ == "GetTimeoutError":
        return "no answer in time"
    if "Actor" in type(cause).__name__:      # ActorDiedError, ActorUnavailableError
        return "a probe stopped (its node may be gone)"
    return probe_module.in_words(cause, JOIN_TIMEOUT_S)
