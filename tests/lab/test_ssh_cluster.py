"""An ``ssh`` cluster on three lab hosts, driven from the laptop (this machine's own network
namespace), which is not part of it: the kernel reaches it only through its SSH tunnel."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest
from cluster_processes import new_kernel

import gpugeek_jupyter as gg
from gpugeek_jupyter import api
from gpugeek_jupyter.cluster import hosts, processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.meter.telemetry import node_samples_frame
from gpugeek_jupyter.server import clusters as server_clusters

pytestmark = pytest.mark.slow

RATE = 7.2   # $/h per host: large enough to see the dollars move


def test_three_hosts_up_train_cost_down(lab, gpugeek_home):
    names = ",".join(f"root@{h.address}" for h in lab.hosts)
    began = time.monotonic()
    gg.up("lab3", backend="ssh", hosts=names, ssh_key=str(lab.key), cpus_per_host=1,
                    usd_per_hour=RATE)
    took = time.monotonic() - began
    print(f"\nup --backend ssh on 3 hosts: ready in {took:.1f} s")
    record = registry.live("lab3")
    assert record.backend == "ssh"
    on_hosts = hosts.processes_on_hosts(record)
    assert all(on_hosts.values()), f"Ray is not running on every host: {on_hosts}"
    assert processes.alive(record.session_id), "the tunnel is not running"

    spec = ClusterSpec.from_json(record.spec)
    token = Path(os.path.expanduser(spec.remote["token_path"]))
    assert stat.S_IMODE(token.stat().st_mode) == 0o600, "the token copied onto the hosts is readable by others"
    local = Path(os.path.expanduser("~/.ray/auth_token"))
    assert stat.S_IMODE(local.stat().st_mode) == 0o600, "the local token is readable by others"

    status = gg.status()
    assert len(status.nodes) == 3 and status.burn_usd_per_hour == pytest.approx(3 * RATE)

    # a restarted kernel: a new process finds the cluster by name, through the same tunnel; then,
    # as a user of someone else's cluster would, it attaches at its Ray Client server (here:
    # through this cluster's tunnel) and detaches again, stopping nothing
    client = ClusterSpec.from_json(registry.get(record.id).spec).remote["client_address"]
    again = new_kernel("import gpugeek_jupyter as gg\n"
                       "gg.up('lab3')\n"
                       "print('value', gg.run('6 * 7', workers=1).shown())\n"
                       f"gg.up('theirs', address={client!r})\n"
                       "print('theirs', gg.run('6 * 7', workers=1).shown())\n"
                       "print('detached', gg.down('theirs'))\n", gpugeek_home)
    assert "re-attached to ssh cluster 'lab3'" in again.stdout, again.stderr[-2000:]
    assert "value 42" in again.stdout, again.stderr[-2000:]
    assert registry.get(record.id).session_id == record.session_id, "the re-attach opened another tunnel"
    assert "theirs 42" in again.stdout and "detached ['theirs']" in again.stdout, again.stderr[-2000:]
    assert registry.live("theirs") is None and all(hosts.processes_on_hosts(record).values()), \
        "detaching from an attached cluster stopped something"

    # the tunnel drops (the laptop slept, the network blinked) and the user runs a cell at once:
    # the watchdog opens the tunnel again on the same local ports, this kernel's Ray Client
    # reconnects through it, and the cell waits for that instead of failing inside Ray
    assert gg.run("6 * 7", workers=3).shown() == 42     # the group the DDP cell below uses
    os.kill(record.session_id, signal.SIGKILL)
    dropped = time.monotonic()
    assert gg.run("6 * 7", workers=3).shown() == 42, "the kernel did not reconnect through the new tunnel"
    print(f"a cell run as the tunnel dropped answered after {time.monotonic() - dropped:.1f} s")
    while registry.get(record.id).session_id == record.session_id and time.monotonic() - dropped < 30:
        time.sleep(0.2)
    reopened = registry.get(record.id)
    assert reopened.session_id != record.session_id, "the watchdog did not reopen the dropped tunnel"
    assert reopened.address == record.address, "the tunnel moved to other local ports"
    assert ledger.events(record.id, "tunnel"), "the reopened tunnel is not in the cluster's events"
    record = reopened

    result = gg.run("""
import torch, torch.distributed as dist, socket
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
x = torch.randn(16, 8) + rank
model(x).pow(2).mean().backward()
grad = model.module.weight.grad.clone()
grads = [torch.zeros_like(grad) for _ in range(world_size)]
dist.all_gather(grads, grad)
ips = [None] * world_size
dist.all_gather_object(ips, __import__("ray").util.get_node_ip_address())
(all(torch.equal(g, grads[0]) for g in grads), sorted(set(ips)), os.environ.get("GLOO_SOCKET_IFNAME"))
""".replace("os.environ", "__import__('os').environ"), workers=3)
    equal, ips, ifname = result.shown()
    assert equal, "gradients differ between ranks"
    assert ips == sorted(h.address for h in lab.hosts), f"ranks ran on {ips}"
    assert ifname == "eth0"

    # the workers run the package the kernel sent (Ray's py_modules), not whatever the host has
    where = gg.run("__import__('gpugeek_jupyter').__file__", workers=3).shown()
    assert "runtime_resources" in where and not where.startswith(str(Path(gg.__file__).parent)), where
    # a telemetry sampler on every host, drained into the ledger
    deadline = time.monotonic() + 30      # samplers report about once a second; drains never wait long
    while node_samples_frame(record.id)["node_id"].nunique() < 3 and time.monotonic() < deadline:
        api.drain_telemetry()
        time.sleep(1)
    sampled = node_samples_frame(record.id)
    assert sampled["node_id"].nunique() == 3, f"telemetry from {sampled['node_id'].nunique()} of 3 hosts"

    # what JupyterLab's status bar and sidebar are sent: the server reads the registry and ledger
    # (kept current by the watchdog through the tunnel) and is never part of the cluster
    shown = next(c for c in server_clusters.overview()["clusters"] if c["name"] == "lab3")
    assert shown["live"] and shown["state"] == "running" and shown["backend"] == "ssh"
    assert shown["nodes"] == 3 and shown["usd_per_hour"] == pytest.approx(3 * RATE) and shown["spent_usd"] > 0
    detail = server_clusters.detail("lab3")
    assert len({u["node"] for u in detail["utilisation"]}) == 3, detail["utilisation"]
    assert any(e["kind"] == "tunnel" for e in detail["events"]), detail["events"]

    gg.down("lab3")
    record = registry.get(record.id)
    assert record.stopped
    # the dollars: every host's lifetime (as Ray recorded it, closed at the stop) × the rate
    nodes = ledger.nodes_frame(record.id)
    assert len(nodes) == 3 and nodes["ended"].notna().all()
    expected = sum((r.ended - r.started) / 3600 * RATE for r in nodes.itertuples())
    assert gg.cost("lab3").total_usd == pytest.approx(expected, rel=1e-9)
    print(f"cost: ${expected:.4f} for {', '.join(f'{(r.ended - r.started):.1f} s' for r in nodes.itertuples())}"
          f" at ${RATE}/h per host")
    for host in lab.hosts:
        assert lab.ssh(host, "true").returncode == 0
    assert not any(hosts_left := _ours_on_hosts(lab, record)), f"processes left on the hosts: {hosts_left}"
    assert not processes.alive(record.session_id), "the tunnel outlived down"


def _ours_on_hosts(lab, record) -> list[int]:
    from gpugeek_jupyter.cluster import onhost

    return [pid for host in lab.hosts for pid in host.pids() if _carries(pid, record.marker, onhost.MARKER)]


def _carries(pid: int, marker: str, key: str) -> bool:
    try:
        return f"{key}={marker}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
