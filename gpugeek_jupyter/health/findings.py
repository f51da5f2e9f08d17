"""The doctor's verdict: what each node reported, judged against the kernel and the other nodes,
as a table (one row per node) and one line per problem with its fix.

Pure: the facts come in, the report goes out — the thresholds can be tested without a cluster.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from .. import display

# what a cell pickled here must load there; not psutil: a Ray worker imports Ray's own copy; not
# this package: it travels with every job (Ray's py_modules), so every node runs the kernel's copy
DEFAULT_PACKAGES = ("ray", "torch", "numpy")
CLOCK_LIMIT_S = 1.0              # ledger times come from several clocks: more skew than this shows
LATENCY_LIMIT_MS = 5.0           # a small all_reduce inside one network is well under a millisecond
BANDWIDTH_FLOOR_GBS = 0.1        # under ~1 Gbit/s, gradient sync dominates data-parallel training
LINK_FLOOR_BPS = 500e6           # the same for plain TCP, with room for a 1 Gbit/s NIC's overheads
OUTLIER = 4.0                    # a pair this many times worse than the best pair is a slow link
OUTLIER_FLOOR_MS = 2.0           # … if its latency is also at least this


@dataclass
class NodeFacts:
    """One node as the doctor found it."""

    ip: str
    node_id: str
    is_head: bool
    declared_gpus: float = 0.0
    facts: dict | None = None            # the probe's answer; None: it did not answer
    answered_after: float | None = None
    unreachable_after: float | None = None   # its Ray port did not open from the nodes that answered
    silent_after: float | None = None        # its port opens, but it never answered
    error: str | None = None             # the probe failed there
    clock_offset_s: float | None = None
    clock_rtt_s: float | None = None
    torch: dict = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        return self.facts is not None

    @property
    def ports(self) -> dict:
        return (self.facts or {}).get("ports", {})

    def answer(self, facts: dict, seconds: float) -> None:
        self.facts, self.answered_after = facts, seconds


@dataclass(frozen=True)
class Link:
    """One link's plain TCP test: bits per second each way (None: not measured), and why not.
    Above a few Gbit/s one Python stream measures the CPU more than the link, so a fast link is
    compared with the best pair only when its test was cut short by the deadline."""

    there: float | None          # from the pair's first node to its second
    back: float | None
    why: str | None = None
    cut_short: bool = False      # the deadline came before the whole payload was through

    @property
    def rate(self) -> float | None:
        """The slower way's rate: a gradient sync waits for the slower half."""
        known = [r for r in (self.there, self.back) if r is not None]
        return min(known) if known and not self.why else None

    def said(self, first: str, second: str, blamed: str | None = None) -> str:
        """The figure in words; which way is slow where the two ways differ (said of ``blamed``
        when the problem is that host's)."""
        if self.why:
            return self.why
        if max(self.there, self.back) <= OUTLIER * min(self.there, self.back):
            return bits(self.rate)
        sender = first if self.there < self.back else second
        way = ("from it" if sender == blamed else "to it") if blamed else f"from {sender}"
        return f"{bits(self.rate)} {way} ({bits(max(self.there, self.back))} the other way)"


def bits(bps: float) -> str:
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} bit/s"


@dataclass(frozen=True)
class Problem:
    host: str          # the host it is about, as the user named it (or a link "a ↔ b"; "cluster": all)
    what: str
    fix: str

    def __str__(self) -> str:
        return f"✗ {self.host}: {self.what} — {self.fix}"

    def about(self, where: str) -> bool:
        return self.host == "cluster" or where in self.host.split(" ↔ ")


@dataclass
class DoctorReport:
    """What ``doctor`` found: ``rows`` (one per node), ``problems`` (empty: all green)."""

    name: str
    rows: list[dict]
    problems: list[Problem]
    pairs: dict
    took_s: float
    phases: dict = field(default_factory=dict)       # seconds from the start to the end of each step
    unreachable: dict = field(default_factory=dict)  # node → seconds after which it was found unreachable
    links: dict = field(default_factory=dict)        # (node, node) → the link's TCP rate, bit/s (None: none)
    sides: dict = field(default_factory=dict)        # a remote cluster's: the kernel's and the head's versions

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "all green" if self.ok else f"{len(self.problems)} problem(s)"
        return f"{self.name}: {len(self.rows)} node(s) checked in {self.took_s:.1f} s — {verdict}"

    def __repr__(self) -> str:
        columns = list(self.rows[0]) if self.rows else []
        widths = {c: max(len(c), *(len(str(r[c])) for r in self.rows)) for c in columns}
        lines = [self.summary(), *self._sides(), "  ".join(c.ljust(widths[c]) for c in columns)]
        lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in self.rows]
        return "\n".join(lines + [str(p) for p in self.problems])

    def _repr_html_(self) -> str:
        columns = list(self.rows[0]) if self.rows else []
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in columns) + "</tr>"
                       for r in self.rows)
        color = "#2e7d32" if self.ok else "#c62828"
        problems = "".join(f"<li>{html.escape(str(p))}</li>" for p in self.problems)
        sides = "".join(f"<div>{html.escape(line)}</div>" for line in self._sides())
        return (f"<div><b style='color:{color}'>{html.escape(self.summary())}</b>{sides}"
                f"<table><tr>{head}</tr>{body}</table>{f'<ul>{problems}</ul>' if problems else ''}</div>")

    def _sides(self) -> list[str]:
        """Both ends of a remote cluster's line, each with its own versions."""
        return [f"{side}: {versions}" for side, versions in self.sides.items()]

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return display.bundle(self, repr(self), self._repr_html_())


def judge(name: str, kernel: dict, nodes: list[NodeFacts], pairs: dict, *, simulated: bool = False,
          labels: dict[str, str] | None = None, links: dict | None = None,
          collective_failures: dict | None = None, took_s: float = 0.0, phases: dict | None = None,
          against: str = "the kernel", sides: dict | None = None, sent: set[str] = frozenset()) -> DoctorReport:
    """The report for ``nodes`` against ``kernel``'s versions (those of ``against``: the kernel, or
    a remote cluster's head, whose Python and Ray the nodes must share; ``sent``: the packages the
    kernel sent, held against its own version), the all_reduce ``pairs``
    ({(node_id_a, node_id_b): (latency_ms, GB/s)}), the TCP ``links`` ({(node_id_a, node_id_b):
    Link}) and the collectives that failed ({(node ids…): what happened, in words})."""
    labels, links = labels or {}, links or {}
    shared = {n.ip for n in nodes if sum(m.ip == n.ip for m in nodes) > 1}   # simulated nodes share one

    def host(ip: str) -> str:
        return f"{labels[ip]} ({ip})" if ip in labels and labels[ip].rpartition("@")[2] != ip else labels.get(ip, ip)

    names = {n.node_id: host(n.ip) + (f" · node {n.node_id[-6:]}" if n.ip in shared else "") for n in nodes}
    problems: list[Problem] = []
    gone = {n.ip for n in nodes if not n.answered}
    for n in nodes:
        problems += _reach(n, names[n.node_id], nodes, host)
        if n.answered:
            problems += _versions(n, kernel, names[n.node_id], against, sent)
            problems += _network(n, names[n.node_id], len(nodes), gone, host, against)
            problems += _gpus(n, names[n.node_id], simulated)
    problems += _nccl(nodes, names)
    ip = {n.node_id: n.ip for n in nodes}
    one_host = {(a, b) for (a, b) in [*pairs, *links] if a in ip and ip.get(b) == ip[a]}
    problems += _links(pairs, links, names, one_host)
    for ids, what in (collective_failures or {}).items():
        problems.append(Problem(" ↔ ".join(names[i] for i in ids if i in names) or "cluster", what,
                                "the plain TCP test passed, so look at the ports gloo and NCCL pick at random "
                                "(firewall, security group) and at GLOO_SOCKET_IFNAME"))
    rows = [_row(n, names[n.node_id], pairs, links, problems) for n in nodes]
    shown = {(names[a], names[b]): figures for (a, b), figures in pairs.items()}
    unreachable = {names[n.node_id]: n.unreachable_after for n in nodes if n.unreachable_after is not None}
    rates = {(names[a], names[b]): link.rate for (a, b), link in links.items()}
    return DoctorReport(name, rows, problems, shown, took_s, phases=phases or {}, unreachable=unreachable,
                        links=rates, sides=sides or {})


def _reach(n: NodeFacts, where: str, nodes: list[NodeFacts], host) -> list[Problem]:
    if n.error:
        return [Problem(where, f"the check could not run there ({n.error})",
                        "look at Ray's logs on that host")]
    if n.answered:
        return []
    if n.unreachable_after is None:
        return [Problem(where, f"no answer in {n.silent_after or 0:.0f} s, though its Ray port opens",
                        "the node may be overloaded or its Ray stuck: look at its load and Ray's logs there")]
    seen_closed = [o for o in nodes if o.answered and any(
        why and label.startswith(f"{n.ip}:") for label, why in o.ports.items())]
    return [Problem(where, f"unreachable: no answer after {n.unreachable_after:.1f} s; its Ray port does not "
                           f"open from {host(seen_closed[0].ip)}",
                    "check that the host is up and on the network; `%gpugeek down` and `up` again "
                    "without it if it is gone")]


def _versions(n: NodeFacts, kernel: dict, where: str, against: str = "the kernel",
              sent: set[str] = frozenset()) -> list[Problem]:
    theirs = n.facts["versions"]
    out = []
    mine, other = kernel.get("python", ""), theirs.get("python", "")
    if mine.split(".")[:2] != other.split(".")[:2]:
        why = "a Ray Client needs the same minor version" if against == "the kernel" else \
            "Ray needs one Python minor version on every node"
        out.append(Problem(where, f"Python {other}, {against} has {mine}",
                           f"use Python {'.'.join(mine.split('.')[:2])} there: {why}"))
    for package, want in kernel.items():
        if package == "python" or want is None:
            continue
        have, has = theirs.get(package), "the kernel" if package in sent else against
        if have is None:
            out.append(Problem(where, f"{package} is not installed ({has} has {want})",
                               f"pip install '{package}=={want}' there"))
        elif have != want:
            out.append(Problem(where, f"{package} {have}, {has} has {want}",
                               f"pip install '{package}=={want}' there (or the same version here)"))
    return out


def _network(n: NodeFacts, where: str, size: int, gone: set[str], host, against: str = "the kernel") -> list[Problem]:
    out = []
    if n.facts["interface"] is None:
        out.append(Problem(where, f"no network interface carries its Ray address {n.ip}",
                           "set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface the nodes "
                           "reach each other on"))
    elif n.facts["loopback"] and size > 1:
        out.append(Problem(where, f"Ray advertises a loopback address ({n.ip}) on a {size}-node cluster",
                           "start Ray there with --node-ip-address=<the address the others reach it at>"))
    for label, why in n.ports.items():
        target = label.partition(":")[0]
        if why and target not in gone:
            out.append(Problem(where, f"cannot open {label.replace(target, host(target), 1)}: {why}",
                               "open that port between the nodes (firewall, security group)"))
    if n.clock_offset_s is not None and abs(n.clock_offset_s) > CLOCK_LIMIT_S + (n.clock_rtt_s or 0) / 2:
        clock = "this machine's" if against == "the kernel" else "the head's"
        out.append(Problem(where, f"its clock is {n.clock_offset_s:+.2f} s off {clock}",
                           "run NTP on both (chrony, systemd-timesyncd): node lifetimes are priced from "
                           "these clocks"))
    return out


def _gpus(n: NodeFacts, where: str, simulated: bool) -> list[Problem]:
    if not n.declared_gpus or simulated:
        return []
    nvml = len(n.facts.get("gpus", {}).get("names", []))
    seen = max(nvml, n.torch.get("devices", 0))
    out = []
    if seen < n.declared_gpus:
        out.append(Problem(where, f"Ray offers {n.declared_gpus:g} GPU(s) there, {seen} can be seen",
                           f"start Ray there with --num-gpus={seen}, or fix the NVIDIA driver"))
    if n.torch and not n.torch.get("cuda"):
        out.append(Problem(where, "torch there has no CUDA", "install a CUDA build of torch there"))
    return out


def _nccl(nodes: list[NodeFacts], names: dict[str, str]) -> list[Problem]:
    versions = {n.node_id: n.torch.get("nccl") for n in nodes if n.torch.get("nccl")}
    if len(set(versions.values())) <= 1:
        return []
    common = max(set(versions.values()), key=list(versions.values()).count)
    return [Problem(names[node], f"NCCL {v}, other nodes have {common}", "use the same torch build on every node")
            for node, v in versions.items() if v != common]


def _links(pairs: dict, links: dict, names: dict[str, str], one_host: set = frozenset()) -> list[Problem]:
    """Slow pairs — absolutely, or against the cluster's best pair, by their TCP rate or their
    all_reduce — blamed on the one host they share when there is one, else on the link.
    Two nodes on one machine (a simulated cluster) have no network between them: their figures
    measure that machine's busy CPU, so such a pair is judged only on whether it connects at all,
    and is never the best pair the others are held against."""
    keys = list(dict.fromkeys([*links, *pairs]))
    if not keys:
        return []
    rates = [link.rate for p, link in links.items() if link.rate is not None and p not in one_host]
    best_bps = max(rates, default=None)
    best_ms = min((ms for p, (ms, _) in pairs.items() if p not in one_host), default=None)
    best_gbs = max((gbs for p, (_, gbs) in pairs.items() if p not in one_host), default=None)

    def is_slow(pair: tuple) -> bool:
        if pair in one_host:
            return pair in links and links[pair].rate is None
        return _slow(links.get(pair), pairs.get(pair), best_bps, best_ms, best_gbs)

    slow = [pair for pair in keys if is_slow(pair)]
    if not slow:
        return []
    nodes = {node for pair in keys for node in pair}
    blamed = [node for node in sorted(nodes) if all(p in slow for p in keys if node in p)
              and sum(node in p for p in slow) >= min(2, len(slow))]
    best = ", ".join(filter(None, [bits(best_bps) if best_bps else "",
                                   f"{best_ms:.1f} ms, {best_gbs:.3f} GB/s" if best_ms is not None else ""]))
    versus = f"best pair {best}" if len(keys) > 1 else \
        f"limits {bits(LINK_FLOOR_BPS)}, {LATENCY_LIMIT_MS:g} ms, {BANDWIDTH_FLOOR_GBS:g} GB/s"
    fix = "check that link: its speed, traffic shaping (`tc qdisc show`), the nodes' zone or placement group"

    def said(a: str, b: str, blamed: str | None = None) -> str:
        link, figures = links.get((a, b)), pairs.get((a, b))
        words = [link.said(names[a], names[b], blamed)] if link is not None else []
        return ", ".join(words + ([f"all_reduce {figures[0]:.1f} ms, {figures[1]:.3f} GB/s"] if figures else []))

    def kind(among: list) -> str:
        return "slow link" if all(links[p].rate for p in among if p in links) else "broken link"

    if len(blamed) == 1 and len(nodes) > 2:
        node = blamed[0]
        detail = "; ".join(f"with {names[b if a == node else a]} {said(a, b, names[node])}" for (a, b) in slow)
        return [Problem(names[node], f"{kind(slow)} — {detail} ({versus})", fix)]
    return [Problem(f"{names[a]} ↔ {names[b]}", f"{kind([(a, b)])} — {said(a, b)} ({versus})", fix) for (a, b) in slow]


def tcp_slow(link: Link, best_bps: float | None) -> bool:
    """What a link's plain TCP test says alone: nothing measured, under the floor, or cut short by
    the deadline at a rate many times under the best pair's."""
    return link.rate is None or link.rate < LINK_FLOOR_BPS or (
        link.cut_short and best_bps is not None and link.rate * OUTLIER < best_bps)


def _slow(link: Link | None, figures: tuple | None, best_bps, best_ms, best_gbs) -> bool:
    if link is not None and tcp_slow(link, best_bps):
        return True
    if figures is None:
        return False
    ms, gbs = figures
    return (ms > LATENCY_LIMIT_MS or gbs < BANDWIDTH_FLOOR_GBS
            or (ms > OUTLIER * best_ms and ms > OUTLIER_FLOOR_MS) or gbs * OUTLIER < best_gbs)


def _row(n: NodeFacts, where: str, pairs: dict, links: dict, problems: list[Problem]) -> dict:
    """One node's row: ✓ only when no problem printed below is about it."""
    facts = n.facts or {}
    versions = facts.get("versions", {})
    mine = [(ms, gbs) for pair, (ms, gbs) in pairs.items() if n.node_id in pair]
    rates = [link.rate for pair, link in links.items() if n.node_id in pair]
    gpus = facts.get("gpus", {})
    gpu_text = f"{n.declared_gpus:g}" if n.declared_gpus else "0"
    if gpus.get("names"):
        gpu_text += f" ({len(gpus['names'])}× {gpus['names'][0]}, driver {gpus.get('driver')})"
    if n.torch.get("cuda"):
        gpu_text += f" CUDA {n.torch.get('cuda_version')} NCCL {n.torch.get('nccl')}"
    bad = any(p.about(where) for p in problems)
    return {
        "node": where, "role": "head" if n.is_head else "worker",
        "interface": facts.get("interface") or "-", "python": versions.get("python", "-"),
        "ray": versions.get("ray") or "-", "torch": versions.get("torch") or "-", "GPUs": gpu_text,
        "clock": f"{n.clock_offset_s * 1e3:+.0f} ms" if n.clock_offset_s is not None else "-",
        "link": ("-" if not rates else "none" if None in rates else bits(min(rates))),
        "all_reduce": (f"{max(ms for ms, _ in mine):.2f} ms, {min(g for _, g in mine):.2g} GB/s" if mine else "-"),
        "": "✗" if bad or not n.answered else "✓",
    }
