"""The doctor's judgement on facts as the probes report them: what counts as a problem, and whom
it blames. (The lab tests in tests/lab/test_ssh_cluster.py gather the facts on real hosts.)"""

from __future__ import annotations

import collections

import pytest

from gpugeek_jupyter.health.findings import DoctorReport, Link, NodeFacts, judge

KERNEL = {"python": "3.11.7", "ray": "2.60.0", "torch": "2.13.0", "numpy": "2.4.6", "psutil": "7.2.2",
          "gpugeek-jupyter": "0.1.0"}
FAST = (0.3, 0.4)          # ms, GB/s
WIRE = Link(9.4e9, 9.2e9)  # a plain TCP test's bits per second, each way
TBF = Link(9.1e9, 7.6e6, cut_short=True)   # … where what the second node sends is rate-limited (``tc tbf``)


def node(ip: str, *, head: bool = False, versions: dict | None = None, ports: dict | None = None,
         interface: str | None = "eth0", gpus: float = 0, nvml: int = 0, cuda: bool = False,
         clock: float = 0.001) -> NodeFacts:
    f = NodeFacts(ip=ip, node_id=ip, is_head=head, declared_gpus=gpus, clock_offset_s=clock, clock_rtt_s=0.01)
    f.answer({"versions": {**KERNEL, **(versions or {})}, "interface": interface, "loopback": interface == "lo",
              "gpus": {"names": ["NVIDIA H100"] * nvml, "driver": "550.1"} if nvml else {},
              "ports": ports or {}}, 1.0)
    f.torch = {"cuda": cuda, "devices": nvml if cuda else 0, "nccl": "2.21.5" if cuda else None}
    return f


def three(**changes) -> list[NodeFacts]:
    return [node("10.0.0.1", head=True), node("10.0.0.2"), node("10.0.0.3", **changes)]


def pairs(slow_host: str | None = None, slow=(0.4, 0.012)) -> dict:
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    return {(a, b): (slow if slow_host in (a, b) else FAST) for i, a in enumerate(ips) for b in ips[i + 1:]}


def test_a_healthy_cluster_is_all_green():
    report = judge("c", KERNEL, three(), pairs())
    assert report.ok and report.problems == []
    assert [row[""] for row in report.rows] == ["✓"] * 3
    assert "all green" in repr(report) and "all green" in report._repr_html_()


def test_a_package_skew_names_the_host_and_the_fix():
    report = judge("c", KERNEL, three(versions={"psutil": "7.1.0"}), pairs(),
                   labels={"10.0.0.3": "ubuntu@gpu3"})
    assert [str(p) for p in report.problems] == [
        "✗ ubuntu@gpu3 (10.0.0.3): psutil 7.1.0, the kernel has 7.2.2 — pip install 'psutil==7.2.2' there "
        "(or the same version here)"]
    assert [row[""] for row in report.rows] == ["✓", "✓", "✗"]


def test_a_missing_package_and_another_python_minor_are_problems_a_patch_release_is_not():
    report = judge("c", KERNEL, three(versions={"torch": None, "python": "3.12.1"}), pairs())
    assert sorted(p.what for p in report.problems) == [
        "Python 3.12.1, the kernel has 3.11.7", "torch is not installed (the kernel has 2.13.0)"]
    assert judge("c", KERNEL, three(versions={"python": "3.11.9"}), pairs()).ok


def test_a_slow_host_is_blamed_alone_when_all_its_links_are_slow():
    report = judge("c", KERNEL, three(), pairs("10.0.0.3"))
    assert [p.host for p in report.problems] == ["10.0.0.3"]
    assert "slow link" in report.problems[0].what and "0.012 GB/s" in report.problems[0].what


@pytest.mark.parametrize("slow", [(25.0, 0.4), (0.4, 0.05)], ids=["latency", "bandwidth"])
def test_two_nodes_name_the_link_when_it_is_slow_in_absolute_terms(slow):
    report = judge("c", KERNEL, [node("10.0.0.1", head=True), node("10.0.0.2")], {("10.0.0.1", "10.0.0.2"): slow})
    assert [p.host for p in report.problems] == ["10.0.0.1 ↔ 10.0.0.2"]


def test_noise_within_a_fast_network_is_not_a_slow_link():
    wobble = {("10.0.0.1", "10.0.0.2"): (0.3, 0.40), ("10.0.0.1", "10.0.0.3"): (1.1, 0.21),
              ("10.0.0.2", "10.0.0.3"): (0.5, 0.30)}
    assert judge("c", KERNEL, three(), wobble).ok


def test_an_unreachable_node_is_named_with_who_could_not_reach_it():
    nodes = three()
    nodes[2] = NodeFacts(ip="10.0.0.3", node_id="x", is_head=False, unreachable_after=3.2)
    nodes[0].answer({**nodes[0].facts, "ports": {"10.0.0.3:4321 (Ray node manager)": "no answer"}}, 1.0)
    report = judge("c", KERNEL, nodes, {("10.0.0.1", "10.0.0.2"): FAST})
    assert report.pairs == {("10.0.0.1", "10.0.0.2"): FAST}
    assert [(p.host, p.what) for p in report.problems] == [
        ("10.0.0.3", "unreachable: no answer after 3.2 s; its Ray port does not open from 10.0.0.1")]
    assert report.rows[2][""] == "✗" and report.rows[2]["python"] == "-"


def test_closed_ports_between_live_nodes_and_a_loopback_address_are_problems():
    report = judge("c", KERNEL, [node("10.0.0.1", head=True, ports={"10.0.0.2:6379 (Ray GCS)": "Connection refused"}),
                                 node("127.0.0.1", interface="lo")], {})
    what = [p.what for p in report.problems]
    assert "cannot open 10.0.0.2:6379 (Ray GCS): Connection refused" in what
    assert "Ray advertises a loopback address (127.0.0.1) on a 2-node cluster" in what


def test_clock_skew_and_missing_gpus_are_problems_on_real_nodes_not_simulated_ones():
    nodes = three(gpus=8, nvml=4, cuda=True, clock=2.5)
    what = [p.what for p in judge("c", KERNEL, nodes, pairs()).problems]
    assert what == ["its clock is +2.50 s off this machine's", "Ray offers 8 GPU(s) there, 4 can be seen"]
    simulated = judge("c", KERNEL, three(gpus=8, nvml=0), pairs(), simulated=True)
    assert simulated.ok


def test_nodes_that_share_an_address_are_told_apart_by_node_id():
    nodes = [node("10.0.0.1", head=True), node("10.0.0.1"), node("10.0.0.1", versions={"ray": "2.59.0"})]
    for i, n in enumerate(nodes):
        n.node_id = f"{i}" * 8
    report = judge("c", KERNEL, nodes, {("00000000", "11111111"): FAST, ("00000000", "22222222"): FAST,
                                        ("11111111", "22222222"): FAST}, simulated=True)
    assert [p.host for p in report.problems] == ["10.0.0.1 · node 222222"]
    assert len(report.pairs) == 3 and [r[""] for r in report.rows] == ["✓", "✓", "✗"]


def test_the_report_shows_as_text_and_html():
    report = judge("c", KERNEL, three(versions={"ray": "2.59.0"}), pairs(), took_s=4.2)
    assert isinstance(report, DoctorReport) and not report.ok
    text = repr(report)
    assert text.splitlines()[0] == "c: 3 node(s) checked in 4.2 s — 1 problem(s)"
    assert "✗ 10.0.0.3: ray 2.59.0, the kernel has 2.60.0" in text
    assert "<li>✗ 10.0.0.3: ray 2.59.0" in report._repr_html_()


def links(slow_host: str | None = None, slow: Link = TBF) -> dict:
    """Every pair's TCP test; the links of ``slow_host`` are ``slow``."""
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    return {(a, b): (slow if slow_host in (a, b) else WIRE) for i, a in enumerate(ips) for b in ips[i + 1:]}


def test_a_host_whose_links_are_slow_is_named_with_their_measured_rate():
    report = judge("c", KERNEL, three(), {}, links=links("10.0.0.3"), labels={"10.0.0.3": "root@10.0.0.3"})
    assert [str(p) for p in report.problems] == [
        "✗ root@10.0.0.3: slow link — with 10.0.0.1 7.6 Mbit/s from it (9.1 Gbit/s the other way); with "
        "10.0.0.2 7.6 Mbit/s from it (9.1 Gbit/s the other way) (best pair 9.2 Gbit/s) — check that link: its "
        "speed, traffic shaping (`tc qdisc show`), the nodes' zone or placement group"]
    # a row's figure is its slowest link's, as for all_reduce; the ✗ is where the problem is
    assert [(row["link"], row[""]) for row in report.rows] == [
        ("7.6 Mbit/s", "✓"), ("7.6 Mbit/s", "✓"), ("7.6 Mbit/s", "✗")]
    assert report.links[("10.0.0.1", "root@10.0.0.3")] == 7.6e6


def test_a_slow_link_measured_both_ways_names_its_rate_beside_all_reduce():
    report = judge("c", KERNEL, three(), pairs("10.0.0.3", slow=(0.9, 0.001)),
                   links=links("10.0.0.3", Link(95e6, 96e6)))
    [problem] = report.problems
    assert problem.host == "10.0.0.3"
    assert problem.what.startswith("slow link — with 10.0.0.1 95.0 Mbit/s, all_reduce 0.9 ms, 0.001 GB/s; ")
    assert problem.what.endswith("(best pair 9.2 Gbit/s, 0.3 ms, 0.400 GB/s)")


def test_one_slow_link_between_two_nodes_is_named_by_both_and_neither_row_is_green():
    nodes = [node("10.0.0.1", head=True), node("10.0.0.2")]
    report = judge("c", KERNEL, nodes, {}, links={("10.0.0.1", "10.0.0.2"): Link(7.6e6, 7.7e6)})
    assert [(p.host, p.what) for p in report.problems] == [
        ("10.0.0.1 ↔ 10.0.0.2", "slow link — 7.6 Mbit/s (limits 500.0 Mbit/s, 5 ms, 0.1 GB/s)")]
    assert [row[""] for row in report.rows] == ["✗", "✗"]


def test_tcp_figures_within_a_fast_network_are_not_a_slow_link():
    """One Python stream on a busy CPU: a fast link's figure wobbles far more than 4× (seen on a
    lab: 1.6 against 12.7 Gbit/s), so it counts against the best pair only when the deadline cut
    its test short — the link, not the CPU, held it back."""
    wobble = {**links(), ("10.0.0.2", "10.0.0.3"): Link(1.6e9, 4.0e9)}
    report = judge("c", KERNEL, three(), pairs(), links=wobble)
    assert report.ok and [row["link"] for row in report.rows] == ["9.2 Gbit/s", "1.6 Gbit/s", "1.6 Gbit/s"]
    held = {**links(), ("10.0.0.2", "10.0.0.3"): Link(1.6e9, 4.0e9, cut_short=True)}
    report = judge("c", KERNEL, three(), pairs(), links=held)
    assert [(p.host, p.what) for p in report.problems] == [
        ("10.0.0.2 ↔ 10.0.0.3", "slow link — 1.6 Gbit/s, all_reduce 0.3 ms, 0.400 GB/s "
                                "(best pair 9.2 Gbit/s, 0.3 ms, 0.400 GB/s)")]


def test_a_link_nothing_got_through_is_a_broken_link_on_the_host_they_share():
    cut = Link(None, None, "nothing got through in 1 s")
    report = judge("c", KERNEL, three(), {}, links=links("10.0.0.3", cut))
    assert [(p.host, p.what.partition(" (")[0]) for p in report.problems] == [
        ("10.0.0.3", "broken link — with 10.0.0.1 nothing got through in 1 s; with 10.0.0.2 nothing got through "
                     "in 1 s")]
    assert [row["link"] for row in report.rows] == ["none", "none", "none"] and report.rows[1][""] == "✓"


def test_a_failed_collective_names_its_hosts_in_words_and_no_row_it_names_is_green():
    report = judge("c", KERNEL, three(), {("10.0.0.1", "10.0.0.2"): FAST}, links=links(),
                   collective_failures={("10.0.0.1", "10.0.0.3"): "timed out after 5 s"})
    assert [(p.host, p.what) for p in report.problems] == [("10.0.0.1 ↔ 10.0.0.3", "timed out after 5 s")]
    assert [row[""] for row in report.rows] == ["✗", "✓", "✗"]
    unknown = judge("c", KERNEL, three(), {}, links=links(), collective_failures={("gone",): "no answer in time"})
    assert [p.host for p in unknown.problems] == ["cluster"] and {row[""] for row in unknown.rows} == {"✗"}


def test_no_row_is_green_while_a_problem_below_names_it():
    reports = [judge("c", KERNEL, three(), pairs("10.0.0.3"), links=links("10.0.0.3")),
               judge("c", KERNEL, three(versions={"ray": "2.59.0"}), pairs()),
               judge("c", KERNEL, [node("10.0.0.1", head=True), node("10.0.0.2")], {},
                     links={("10.0.0.1", "10.0.0.2"): Link(1e6, 1e6)})]
    for report in reports:
        assert report.problems
        for row in report.rows:
            named = any(row["node"] in p.host.split(" ↔ ") for p in report.problems)
            assert row[""] == ("✗" if named else "✓"), repr(report)


STALLED_ONCE = {   # (sender, receiver) pair → each try's (bits per second, why not, cut short)
    "a fast pair stalls under 4× the best": {
        (0, 1): [(7.6e6, None, True)] * 2,                      # shaped: slow both times
        (1, 2): [(2.95e8, None, True), (9.0e9, None, False)],   # stalled once
        (0, 2): [(9.4e9, None, False)]},
    "the best pair stalls under the floor": {
        (0, 1): [(3.94e8, None, True), (1.1e10, None, False)],  # seen in CI: 394 Mbit/s, 11 Gbit/s the other way
        (0, 2): [(9.57e7, None, True)] * 2,                     # 10.0.0.3 shaped to 100 Mbit/s
        (1, 2): [(9.56e7, None, True)] * 2},
}


@pytest.mark.parametrize("case", STALLED_ONCE)
def test_a_link_that_looks_slow_once_is_measured_again_and_only_a_slow_one_is_named(case, monkeypatch):
    """A busy machine stalls one short TCP test now and then (seen under load: 295 and 394 Mbit/s
    on an 11 Gbit/s bridge): a link whose figures say slow is measured once more and keeps its
    better figures, so only a link slow both times is named."""
    from gpugeek_jupyter.health import nodes as checkup

    facts, tries = three(), STALLED_ONCE[case]
    calls = collections.Counter()

    def one_way(sender, receiver, address, deadline):
        pair = (min(sender, receiver), max(sender, receiver))
        calls[pair] += 1
        return tries[pair][(calls[pair] - 1) // 2]                    # a try is both ways

    monkeypatch.setattr(checkup, "_one_way", one_way)
    links = checkup._links([0, 1, 2], facts)
    assert calls == {pair: 2 * len(got) for pair, got in tries.items()}   # measured again: the slow-looking
    names = {(0, 1): ("10.0.0.1", "10.0.0.2"), (0, 2): ("10.0.0.1", "10.0.0.3"), (1, 2): ("10.0.0.2", "10.0.0.3")}
    for pair, got in tries.items():
        rate = max(bps for bps, _, _ in got)
        assert links[names[pair]] == Link(rate, rate, cut_short=all(cut for _, _, cut in got))
    slow = [names[pair] for pair, got in tries.items() if max(got)[0] < 1e9]
    report = judge("c", KERNEL, facts, pairs(), links=links)
    named = [p.host for p in report.problems]
    assert named == (["10.0.0.3"] if len(slow) == 2 else [" ↔ ".join(slow[0])]), report.problems


def test_nodes_on_one_machine_are_not_held_to_a_network_but_must_connect():
    """A simulated cluster's nodes share one machine: their TCP test and all_reduce measure that
    machine's busy CPU (seen in CI: 893 Mbit/s against 8.0 Gbit/s between two other processes
    of it), so no pair among them is called slow, and none is the best pair others are held
    against; a pair among them that cannot connect at all is still a broken link."""
    one = [node("192.0.2.2", head=True), node("192.0.2.2"), node("192.0.2.2")]
    for i, n in enumerate(one):
        n.node_id = f"node{i}"
    ids = [n.node_id for n in one]
    busy = {(ids[0], ids[1]): Link(8.0e9, 8.1e9), (ids[0], ids[2]): Link(8.93e8, 9.0e8, cut_short=True),
            (ids[1], ids[2]): Link(9.767e8, 9.8e8, cut_short=True)}
    figures = {(ids[0], ids[1]): (0.2, 0.927), (ids[0], ids[2]): (0.29, 0.77), (ids[1], ids[2]): (0.25, 0.05)}
    assert judge("s1", KERNEL, one, figures, links=busy, simulated=True).ok
    broken = {**busy, (ids[0], ids[2]): Link(None, None, why="connection refused")}
    problems = judge("s1", KERNEL, one, figures, links=broken, simulated=True).problems
    assert [(p.host, p.what.split(" — ")[0]) for p in problems] == [
        ("192.0.2.2 · node node0 ↔ 192.0.2.2 · node node2", "broken link")], problems

    # a real host beside them is held against the real links only, not the machine's loopback
    mixed = [*one[:2], node("10.0.0.9")]
    ids = [n.node_id for n in mixed]
    wire = {(ids[0], ids[1]): Link(9.0e9, 9.0e9), (ids[0], ids[2]): Link(9.4e8, 9.4e8, cut_short=True),
            (ids[1], ids[2]): Link(9.3e8, 9.3e8, cut_short=True)}
    assert judge("m", KERNEL, mixed, {}, links=wire).ok
