"""``doctor`` on lab hosts: all green when healthy; a slow link, a host cut off and a host with
another package version each named as the problem they are."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata

import netlab
import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry

pytestmark = pytest.mark.slow

UNREACHABLE_WITHIN_S = 10.0
CLOSED_PORT = 9         # nothing listens there on a lab host


def fetch_other_packaging(folder):
    """Another release of ``packaging`` than this environment's, from PyPI, into ``folder``:
    (mine, other), or None when PyPI cannot be reached."""
    mine = metadata.version("packaging")
    other = "24.2" if mine != "24.2" else "24.1"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder),
                           f"packaging=={other}"], capture_output=True, text=True, timeout=180)
    return (mine, other) if done.returncode == 0 else None


@contextmanager
def ssh_cluster(name: str, lab, hosts):
    """An ssh cluster on ``hosts`` for the block; stopped after it, also when ``up`` failed half-way."""
    try:
        gg.up(name, backend="ssh", hosts=",".join(f"root@{h.address}" for h in hosts), ssh_key=str(lab.key),
              cpus_per_host=1, usd_per_hour=0)
        yield
    finally:
        if registry.live(name) is not None:
            gg.down(name)


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    """One cluster on the three lab hosts for this module's tests (it takes ~30 s to start). The
    second host's Python finds another ``packaging`` first (its sshd, and so Ray there, has it on
    PYTHONPATH): a package the doctor compares only when asked, so the cluster is otherwise healthy.
    Yields (home, (mine, other) or None)."""
    home = tmp_path_factory.mktemp("doctor-home")
    folder = tmp_path_factory.mktemp("skew")
    versions = fetch_other_packaging(folder)
    skewed = lab.hosts[1]
    if versions:
        lab.restart_host(skewed, env={"PYTHONPATH": str(folder)})
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("GPUGEEK_HOME", str(home))
            with ssh_cluster("doc3", lab, lab.hosts):
                yield home, versions
    finally:
        if versions:
            lab.restart_host(skewed)


@pytest.fixture
def three_hosts(lab, cluster, monkeypatch):
    monkeypatch.setenv("GPUGEEK_HOME", str(cluster[0]))
    return lab


def test_doctor_names_the_host_with_another_package_version(three_hosts, cluster):
    lab, versions = three_hosts, cluster[1]
    if versions is None:
        pytest.skip("could not fetch another release of packaging from PyPI")
    mine, other = versions
    skewed = lab.hosts[1]
    report = gg.doctor(packages="packaging")
    print(f"\n{report!r}")
    assert report.problems == _about(report, skewed), "a healthy host was blamed"
    assert [p.what for p in report.problems] == [f"packaging {other}, the kernel has {mine}"], repr(report)
    assert f"pip install 'packaging=={mine}'" in report.problems[0].fix


def _about(report, host) -> list:
    return [p for p in report.problems if host.address in p.host]


def test_doctor_is_green_then_names_a_slow_link_and_a_host_cut_off(three_hosts, capsys):
    lab = three_hosts
    healthy = gg.doctor()
    print(f"\n{healthy!r}")
    assert healthy.ok, f"a healthy lab cluster has problems:\n{healthy!r}"
    assert len(healthy.rows) == 3 and len(healthy.pairs) == 3
    assert {row["interface"] for row in healthy.rows} == {"eth0"}
    assert all(row[""] == "✓" for row in healthy.rows)

    slow = lab.hosts[2]
    if netlab.netem_available():
        lab.slow_link(slow, delay_ms=20)
    else:     # this kernel has no netem: a rate limit is the slow link
        lab.slow_link(slow, rate_mbit=100)
    try:
        report = gg.doctor()
    finally:
        lab.heal_link(slow)
    print(f"\n{report!r}")
    assert _about(report, slow) and all("slow link" in p.what for p in _about(report, slow)), repr(report)
    assert report.problems == _about(report, slow), "a healthy host was blamed for the slow one"

    lab.cut_off(slow)
    try:
        began = time.monotonic()
        report = gg.doctor()
        took = time.monotonic() - began
    finally:
        lab.reconnect(slow)
    said = capsys.readouterr().out
    print(f"{said}\n{report!r}\ncut off: said after {report.unreachable} s, report after {took:.1f} s "
          f"({report.phases})")
    assert any("unreachable" in p.what for p in _about(report, slow)), repr(report)
    assert f"doctor: root@{slow.address} is unreachable" in said, "the unreachable host was not said at once"
    assert list(report.unreachable) == [f"root@{slow.address}"]
    assert report.unreachable[f"root@{slow.address}"] <= UNREACHABLE_WITHIN_S
    assert [sorted(pair) for pair in report.pairs] == [[f"root@{h.address}" for h in lab.hosts[:2]]], \
        "the reachable nodes were not measured"


def test_a_rank_that_cannot_reach_rank_0_fails_in_one_line_naming_both(three_hosts):
    """A worker on one host told that rank 0 listens on a port of another host where nothing
    does — what a firewall between the hosts looks like to it: one line, within the timeout."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gpugeek_jupyter.workers.options import RunOptions
    from gpugeek_jupyter.workers.worker import Worker

    lab = three_hosts
    rank1, rank0 = lab.hosts[1], lab.hosts[2]
    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == rank1.address)
    worker = ray.remote(Worker).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote()
    try:
        began = time.monotonic()
        with pytest.raises(ray.exceptions.RayTaskError) as failed:
            ray.get(worker.setup.remote(1, 2, rank0.address, CLOSED_PORT, RunOptions(), timeout_s=3), timeout=60)
        took = time.monotonic() - began
    finally:
        ray.kill(worker)
    said = str(failed.value.cause)
    print(f"\n{said}\n(after {took:.1f} s)")
    assert said.startswith(f"rank 1 on {rank1.address} cannot reach rank 0 at {rank0.address}:{CLOSED_PORT}")
    assert len(said.splitlines()) == 1 and took < 30
