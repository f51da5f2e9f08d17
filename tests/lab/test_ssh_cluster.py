"""An ``ssh`` cluster on three lab hosts, driven from the laptop (this machine's own network
namespace), which is not part of it: the kernel reaches it only through its SSH tunnel.

One cluster serves the whole module (each start takes ~35 s), in order: up and everything a
kernel does on it; then ``doctor`` — all green when healthy; a slow link, a host cut off and a
host with another package version each named as the problem they are; a rank that cannot reach
rank 0 — and last ``down``, its dollars and what it leaves on the hosts. The second host's
Python finds another ``packaging`` first (its sshd, and so Ray there, has it on PYTHONPATH): a
package the doctor compares only when asked, so the cluster is otherwise healthy."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import netlab
import pytest
from cluster_processes import new_kernel, rays_own_lines, wait_until
from models import at_step, logged_steps
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg
from gpugeek_jupyter import api
from gpugeek_jupyter.backends import hosts
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.guard import board as server_clusters
from gpugeek_jupyter.kernel import environment
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.meter.telemetry import node_samples_frame

pytestmark = pytest.mark.slow

RATE = 7.2   # $/h per host: large enough to see the dollars move
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


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    """The module's cluster, "lab3", on the three lab hosts (timed); stopped at the end if a test
    before the last one failed. Yields its home, record, start time and packaging versions."""
    home = tmp_path_factory.mktemp("lab3-home")
    project = tmp_path_factory.mktemp("project")       # beside the notebook: its data, sent to every host
    (project / "data").mkdir()
    (project / "data" / "train.csv").write_text("x,y\n1,2\n3,4\n")
    (project / ".venv").mkdir()
    (project / ".venv" / "huge.bin").write_bytes(b"\0" * 1024)     # left out: never sent
    skewed = lab.hosts[1]
    versions = fetch_other_packaging(skewed.file("/root/skew"))      # on that host's own disk
    if versions:
        lab.restart_host(skewed, env={"PYTHONPATH": "/root/skew"})
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("GPUGEEK_HOME", str(home))
            try:
                names = ",".join(f"root@{h.address}" for h in lab.hosts)
                began = time.monotonic()
                gg.up("lab3", backend="ssh", hosts=names, ssh_key=str(lab.key), cpus_per_host=1,
                      usd_per_hour=RATE, pip_index_url=lab.index_url, working_dir=str(project),
                      storage="s3://lab/lab3")
                took = time.monotonic() - began
                yield SimpleNamespace(home=home, record=registry.live("lab3"), took=took, versions=versions)
            finally:
                if registry.live("lab3") is not None:
                    gg.down("lab3")
    finally:
        if versions:
            lab.restart_host(skewed)


@pytest.fixture
def on_lab3(cluster, monkeypatch):
    monkeypatch.setenv("GPUGEEK_HOME", str(cluster.home))
    return cluster


def test_three_hosts_up_attach_reconnect_train(lab, on_lab3):
    print(f"\nup --backend ssh on 3 hosts: ready in {on_lab3.took:.1f} s")
    gpugeek_home = on_lab3.home
    record = registry.live("lab3")
    assert record.backend == "ssh"
    on_hosts = hosts.processes_on_hosts(record)
    assert all(on_hosts.values()), f"Ray is not running on every host: {on_hosts}"
    assert processes.alive(record.session_id), "the tunnel is not running"

    spec = ClusterSpec.from_json(record.spec)
    for host in lab.hosts:     # the token, on each host's own disk
        mode = lab.ssh(host, f"stat -c %a {spec.remote.token_path}").stdout.strip()
        assert mode == "600", f"the token copied onto {host.name} is readable by others ({mode})"
    local = Path(os.path.expanduser("~/.ray/auth_token"))
    assert stat.S_IMODE(local.stat().st_mode) == 0o600, "the local token is readable by others"

    status = gg.status()
    assert len(status.nodes) == 3 and status.usd_per_hour == pytest.approx(3 * RATE)

    # a restarted kernel: a new process finds the cluster by name, through the same tunnel and the
    # same keeper
    again = new_kernel("import gpugeek_jupyter as gg\n"
                       "gg.up('lab3')\n"
                       "print('value', gg.run('6 * 7', workers=1).shown())\n", gpugeek_home)
    assert "re-attached to ssh cluster 'lab3'" in again.stdout, again.stderr[-2000:]
    assert "value 42" in again.stdout, again.stderr[-2000:]
    assert registry.get(record.id).session_id == record.session_id, "the re-attach opened another tunnel"

    # the tunnel drops (the laptop slept, the network blinked) and the user runs a cell at once:
    # the kernel's line dials again, through the tunnel opened again on the same local ports
    assert gg.run("6 * 7", workers=3).shown() == 42     # the group the DDP cell below uses
    os.kill(record.session_id, signal.SIGKILL)
    dropped = time.monotonic()
    assert gg.run("6 * 7", workers=3).shown() == 42, "the kernel did not reconnect through the new tunnel"
    print(f"a cell run as the tunnel dropped answered after {time.monotonic() - dropped:.1f} s")
    while registry.get(record.id).session_id == record.session_id and time.monotonic() - dropped < 30:
        time.sleep(0.2)
    reopened = registry.get(record.id)
    assert reopened.session_id != record.session_id, "the dropped tunnel was not reopened"
    assert reopened.address == record.address, "the tunnel moved to other local ports"
    assert ledger.events(record.id, "tunnel"), "the reopened tunnel is not in the cluster's events"
    record = reopened

    result = gg.run("""
import torch, torch.distributed as dist, socket
torch.manual_seed(rank)     # each rank's own initial weights: DDP's broadcast from rank 0 makes them one
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
x = torch.randn(16, 8) + rank
model(x).pow(2).mean().backward()
torch.optim.SGD(model.parameters(), lr=0.1).step()    # the same step everywhere only if grads were averaged
grad = model.module.weight.grad.clone()
grads = [torch.zeros_like(grad) for _ in range(world_size)]
dist.all_gather(grads, grad)
ips = [None] * world_size
dist.all_gather_object(ips, __import__("ray").util.get_node_ip_address())
nices = [None] * world_size
dist.all_gather_object(nices, os.getpriority(os.PRIO_PROCESS, 0))
names = [None] * world_size
dist.all_gather_object(names, socket.gethostname())
params = [None] * world_size
dist.all_gather_object(params, [p.detach().clone() for p in model.parameters()])
(all(torch.equal(g, grads[0]) for g in grads), sorted(set(ips)), os.environ.get("GLOO_SOCKET_IFNAME"), nices,
 sorted(names), all(all(torch.equal(a, b) for a, b in zip(p, params[0])) for p in params))
""".replace("os.", "__import__('os')."), workers=3)
    equal, ips, ifname, nices, names, same_params = result.shown()
    assert equal, "gradients differ between ranks"
    assert same_params, "the model's parameters differ between ranks"
    assert names == sorted(h.name for h in lab.hosts), f"the ranks' hostnames: {names}"
    assert ips == sorted(h.address for h in lab.hosts), f"ranks ran on {ips}"
    assert ifname == "eth0"
    assert nices == [0, 0, 0], f"the ranks' niceness: {nices} (Ray's default for workers is 15)"

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


def test_a_cell_reads_the_working_dirs_data_on_every_rank(lab, on_lab3):
    """``up --working-dir``: the folder beside the notebook is each cell's folder on every host."""
    result = gg.run("""
import os, socket, torch.distributed as dist
seen = [None] * world_size
dist.all_gather_object(seen, (socket.gethostname(), open("data/train.csv").read(), os.path.exists(".venv")))
sorted(seen)
""", workers=3)
    assert result.shown() == [(h.name, "x,y\n1,2\n3,4\n", False) for h in lab.hosts], result.shown()


def test_doctor_names_the_host_with_another_package_version(lab, on_lab3):
    versions = on_lab3.versions
    if versions is None:
        pytest.skip("could not fetch another release of packaging from PyPI")
    mine, other = versions
    skewed = lab.hosts[1]
    report = gg.doctor(packages="packaging")
    print(f"\n{report!r}")
    assert report.problems == _about(report, skewed), "a healthy host was blamed"
    assert [p.what for p in report.problems] == [f"packaging {other}, the head has {mine}"], repr(report)
    assert f"pip install 'packaging=={mine}'" in report.problems[0].fix


def _about(report, host) -> list:
    return [p for p in report.problems if host.address in p.host]


def test_doctor_is_green_then_names_a_slow_link_and_a_host_cut_off(lab, on_lab3, capsys):
    healthy = gg.doctor()
    print(f"\n{healthy!r}")
    assert healthy.ok, f"a healthy lab cluster has problems:\n{healthy!r}"
    assert len(healthy.rows) == 3 and len(healthy.pairs) == 3
    assert {row["interface"] for row in healthy.rows} == {"eth0"}
    assert all(row[""] == "✓" for row in healthy.rows)

    slow = lab.hosts[2]
    if netlab.netem_available():      # a delay; rate limits: the test below
        lab.slow_link(slow, delay_ms=20)
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


def test_a_host_cut_off_between_two_cells_past_the_lines_keepalive_the_next_cell_runs(lab, on_lab3, capsys):
    """A host unplugged for 15 s while the group is idle: the cell line to its rank breaks (its
    keepalive gives up after ~11 s), Ray's health checks ride the cut out — the rank lives. The
    next cell reaches that rank by actor call and runs on all three, no worker said dead. After the
    doctor's cut above, a GCS-to-raylet connection stayed mute under TCP's resend backoff for up to
    ~26 s past the link's return, and five missed checks killed the rank, unless gRPC's keepalive
    (``raynodes.LINK_CONFIG``) closes it and Ray dials afresh."""
    assert gg.run("rank", workers=3, monitor=False).shown() == 0
    cut = lab.hosts[2]
    lab.cut_off(cut)
    try:
        time.sleep(15)      # the cut: past the line's keepalive (~11 s), within Ray's health checks
    finally:
        lab.reconnect(cut)
    capsys.readouterr()
    try:
        seen = gg.run("""
import socket, torch.distributed as dist
seen = [None] * world_size
dist.all_gather_object(seen, socket.gethostname())
sorted(seen)
""", workers=3, monitor=False).shown()
        said = capsys.readouterr().out
        assert seen == sorted(h.name for h in lab.hosts), seen
        assert "died" not in said and "new worker group" not in said, said
    except BaseException:      # what the hosts' Ray said of it, kept for reading after the lab goes
        print(f"the hosts' Ray logs: {lab.keep_logs(Path('artifacts') / 'cut-logs')}")
        raise

@pytest.mark.parametrize("rate_mbit", [8, 100])
def test_doctor_names_a_rate_limited_host_with_its_measured_rate_within_30_s(lab, on_lab3, capsys, rate_mbit):
    """What the third host sends is rate-limited (``tc tbf``): the doctor names that host with the
    rate it measured, in plain words (none of torch's or gloo's), and no sooner gives up on it."""
    slow = lab.hosts[2]
    lab.slow_link(slow, rate_mbit=rate_mbit)
    try:
        began = time.monotonic()
        report = gg.doctor()
        took = time.monotonic() - began
    finally:
        lab.heal_link(slow)
    said = capsys.readouterr().out + repr(report)
    print(f"\n{report!r}\ntbf {rate_mbit} Mbit/s: doctor took {took:.1f} s ({report.phases}); links {report.links}")
    about = _about(report, slow)
    assert about and report.problems == about, f"the rate-limited host was not the one named:\n{report!r}"
    rates = [float(r) for p in about for r in re.findall(r"(\d+(?:\.\d+)?) Mbit/s from it", p.what)]
    assert all("slow link" in p.what for p in about) and rates, repr(report)
    assert all(0.5 * rate_mbit <= r <= 1.1 * rate_mbit for r in rates), f"measured {rates} for {rate_mbit} Mbit/s"
    assert [row[""] for row in report.rows if row["node"] == f"root@{slow.address}"] == ["✗"]
    for raw in ("gloo", "unbound_buffer", "Timed out waiting"):
        assert raw not in said, f"{raw!r} reached the user:\n{said}"
    assert took < 30, f"doctor took {took:.1f} s with {rate_mbit} Mbit/s on {slow.address} ({report.phases})"


def test_a_rank_that_cannot_reach_rank_0_fails_in_one_line_naming_both(lab, on_lab3):
    """A rank on one host told that rank 0 listens on a port of another host where nothing does —
    what a firewall between the hosts looks like to it (``launch/rendezvous.reach``, where every
    rank's setup waits for rank 0's port): one line, within the timeout."""
    rank1, rank0 = lab.hosts[1], lab.hosts[2]
    cell = f"""
import socket, time, torch.distributed as dist
from gpugeek_jupyter.launch import rendezvous
said = None
if socket.gethostname() == {rank1.name!r}:
    began = time.monotonic()
    try:
        rendezvous.reach({rank0.address!r}, {CLOSED_PORT}, 1, 3)
    except ConnectionError as exc:
        said = (str(exc), time.monotonic() - began)
gathered = [None] * world_size
dist.all_gather_object(gathered, said)
[g for g in gathered if g]
"""
    [(said, took)] = gg.run(cell, workers=3, monitor=False).shown()
    print(f"\n{said}\n(after {took:.1f} s)")
    assert said.startswith(f"rank 1 on {rank1.address} cannot reach rank 0 at {rank0.address}:{CLOSED_PORT}")
    assert len(said.splitlines()) == 1 and took < 30


def only_in_this_kernel(folder: Path, name: str, version: str) -> Path:
    """An installed package (its folder and ``.dist-info``) that only this process's path has."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return folder


def test_a_package_only_the_kernel_has_runs_on_every_host_and_doctor_is_green(lab, on_lab3, tmp_path,
                                                                              monkeypatch, capsys):
    """The kernel's environment on the workers (Ray's runtime_env): a package no host has, and the
    second host's other ``packaging``, both at the kernel's versions once a cell imports them."""
    monkeypatch.syspath_prepend(str(only_in_this_kernel(tmp_path / "site", "onlyhere", "1.3")))
    capsys.readouterr()
    began = time.monotonic()
    result = gg.run("""
import onlyhere, packaging, torch.distributed as dist
seen = [None] * world_size
dist.all_gather_object(seen, (__import__("ray").util.get_node_ip_address(), onlyhere.VERSION, packaging.__version__))
sorted(seen)
""", workers=3)
    took = time.monotonic() - began
    said = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{said}the first cell importing them took {took:.1f} s")
    mine = metadata.version("packaging")
    assert [ip for ip, _, _ in result.shown()] == sorted(h.address for h in lab.hosts)
    assert {(v, p) for _, v, p in result.shown()} == {("1.3", mine)}, result.shown()
    assert "onlyhere 1.3" in said and (on_lab3.versions is None or f"packaging {mine}" in said), said

    began = time.monotonic()
    assert gg.run("import onlyhere\nonlyhere.VERSION", workers=3).shown() == "1.3"
    again = time.monotonic() - began
    assert "sending" not in capsys.readouterr().out, "a package already sent was sent again"
    # the doctor compares what was sent too (the skew the earlier test named is gone)
    report = gg.doctor(packages="packaging")
    with capsys.disabled():
        print(f"the next cell: {again * 1000:.0f} ms\n{report!r}")
    assert report.ok, f"a skew remains after the runtime env:\n{report!r}"
    assert {m.dist for m in environment.shipment().shipped.values()} >= {"onlyhere"}


LOSSY = logged_steps(40, 0.15)
# the same loop, its gradients taken from rank 0 (every rank computes the same ones) instead of
# DDP's average — which rounds differently over 3 ranks than over the 2 a resume has — so a run
# resumed after a host's loss must end on the very bits of one never interrupted; its value is
# the last step and the model's weights
EXACT = """
import torch.distributed as dist
def from_rank_0(state, bucket):
    return dist.broadcast(bucket.buffer(), src=0, async_op=True).get_future().then(lambda f: f.value()[0])
""" + LOSSY.replace("model, optimizer = gg.prepare(model, optimizer)\n",
                    "model, optimizer = gg.prepare(model, optimizer)\n"
                    "model.register_comm_hook(None, from_rank_0)\n") + \
    "\n(final_step, [p.detach().clone() for p in model.parameters()])"


HOST_LOSS_TRIALS = int(os.environ.get("GPUGEEK_HOST_LOSS_TRIALS", "1"))   # 5: the figures in the notes
CHECKPOINT_EVERY = 5


@pytest.mark.timeout(150 + 100 * HOST_LOSS_TRIALS)
def test_a_host_killed_mid_job_the_job_resumes_on_the_hosts_left(lab, on_lab3, tmp_path, capsys):
    """Every process of a worker host SIGKILLed (it lost power) at step 12 of 40: the job resumes
    from its last checkpoint — in the cluster's S3 storage (``up --storage``) — on the two hosts
    left, finishes every step and ends on the weights of a run never interrupted, bit for bit; the
    ledger ends the host's node when it died; then the host comes back and `scale` starts its Ray
    again."""
    import torch

    from gpugeek_jupyter.kernel.session import current
    from gpugeek_jupyter.raynodes import read_nodes

    record = registry.live("lab3")
    clean = gg.run(EXACT, workers=3, push={"log": str(lab.shared / "clean.log")}, monitor=False).shown()
    figures = []
    for trial in range(HOST_LOSS_TRIALS):
        # rank 0's log on the lab's shared filesystem, where the laptop reads it
        log = lab.shared / f"steps-{trial}.log"
        gg.run("pass", workers=3)
        victim = lab.hosts[1 + trial % 2]
        node_id = next(rank["node_id"] for rank in current().group.info if rank["ip"] == victim.address)
        killed = []

        def kill_at_step_12(victim=victim, log=log, killed=killed):
            at_step(log, 12)
            killed.append(time.time())
            lab.kill_host(victim)

        killer = threading.Thread(target=kill_at_step_12)
        killer.start()
        began = time.monotonic()
        result = gg.run(EXACT, workers=3, push={"log": str(log)}, checkpoint_every=CHECKPOINT_EVERY,
                        max_failures=1, monitor=False, name=f"killed-{trial}")
        took = time.monotonic() - began
        killer.join()
        out, err = capsys.readouterr()
        assert not rays_own_lines(out, err), f"Ray's own lines reached the cell: {rays_own_lines(out, err)}"
        final_step, weights = result.shown()
        assert final_step == 40, out
        assert all(torch.equal(a, b) for a, b in zip(weights, clean[1], strict=True)), \
            f"the resumed run ended on other weights than the uninterrupted one: {weights} vs {clean[1]}"
        assert any(key.startswith(f"lab3/checkpoints/killed-{trial}/step-") for key in _s3_keys(lab)), \
            "no checkpoint in the cluster's S3 storage"
        steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
        assert sorted(set(steps)) == list(range(1, 41)), f"a step never taken: {steps}"
        restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        lost = steps[restart - 1] - steps[restart] + 1
        assert 0 <= lost <= CHECKPOINT_EVERY, f"{lost} steps taken twice: {steps}"
        assert "died" in out and "resumes on 2" in out and "resumed from step-" in out, out

        def node_end(node_id=node_id):
            ended = costs.nodes_frame(record.id).set_index("node_id")["ended"].get(node_id)
            return ended if ended == ended and ended is not None else None    # NaN until the node is closed
        ended = wait_until(node_end, 60, "the killed host's node closed in the ledger")
        off = ended - killed[0]
        assert abs(off) <= settings().meter_interval_s, f"the node ended {off:+.1f} s from its kill"
        figures.append(f"trial {trial + 1}: {victim.name} killed at step 12; the cell finished 40 steps in "
                       f"{took:.1f} s, {lost} taken twice; node end {off:+.2f} s from the kill")
        with capsys.disabled():
            print(f"\n{figures[-1]}")

        lab.start_sshd(victim)
        gg.scale(2, "lab3")
        wait_until(lambda: len([n for n in read_nodes(record.address) if n.alive]) == 3, 60, "the host rejoined")


C10D_NOISE = "hostname of the client socket cannot be retrieved"


def test_a_cell_on_hosts_without_reverse_dns_shows_no_c10d_noise_and_keeps_its_own_warning(on_lab3, capfd):
    """The lab's hosts have no DNS: torch's C++ side warns on each rendezvous connection that it
    cannot name the peer. The workers start with torch's C++ log level at errors, and what a
    worker writes outside a cell stays in Ray's logs on its host (the keeper forwards none of it),
    so a new group's cell shows none of that; a warning the cell itself raises still shows. The
    control: the same rendezvous at torch's WARNING level, in a process the cell starts on a host
    (its stderr is the cell's), prints the noise — the test sees it when it is there."""
    cell = "import warnings\nwarnings.warn('my own warning')\nimport time; time.sleep(3)\n"
    control = """
import os, subprocess, sys
join = ("import torch.distributed as dist\\n"
        f"dist.init_process_group('gloo', init_method='tcp://{MASTER}:29877', rank={rank}, world_size=2)")
if rank < 2:     # two processes on two hosts, what they print shown by the cell
    done = subprocess.run([sys.executable, "-c", join], env={**os.environ, "TORCH_CPP_LOG_LEVEL": "WARNING"},
                          capture_output=True, text=True, timeout=60)
    print(done.stderr, file=sys.stderr)
"""
    gg.reset()
    capfd.readouterr()
    master = gg.run("import ray\nray.util.get_node_ip_address()", workers=3, monitor=False).shown()
    gg.run(control.replace("{MASTER}", master), workers=3, monitor=False, all_ranks=True)
    out, err = capfd.readouterr()
    noisy = out + err
    gg.reset()
    gg.run(cell, workers=3, monitor=False)
    time.sleep(3)                     # anything a worker wrote outside the cell would come in this while
    out, err = capfd.readouterr()
    quiet = out + err
    with capfd.disabled():
        print(f"\nc10d hostname warnings: {noisy.count(C10D_NOISE)} from a rendezvous at torch's WARNING level; "
              f"{quiet.count(C10D_NOISE)} in a new 3-host group's cell")
    assert C10D_NOISE in noisy, noisy[-2000:]
    assert "my own warning" in quiet and "c10d" not in quiet, quiet[-2000:]


def _s3_keys(lab) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=lab.env["AWS_ENDPOINT_URL"], aws_access_key_id="lab",
                          aws_secret_access_key="lab", region_name="us-east-1")
    return [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket="lab")
            for o in page.get("Contents", [])]


def test_a_host_cut_off_for_5_s_the_cell_goes_on_or_resumes_and_says_which(lab, on_lab3, tmp_path, capsys):
    """A worker host's cable pulled for 5 s at step 12 (no RST: packets dropped), then plugged
    back: the collectives wait (TCP resends) and the cell goes on, or it resumes and says so —
    never stuck past the collective timeout set for the cell."""
    log, ckpt, timeout = lab.shared / "steps.log", lab.shared / "ckpt", 30
    victim = lab.hosts[2]
    gg.run("pass", workers=3, collective_timeout=timeout)
    cut = []

    def cut_for_5_s():
        at_step(log, 12)
        lab.cut_off(victim)
        cut.append(time.monotonic())
        try:
            time.sleep(5)             # the cut itself: the host stays off this long
        finally:
            lab.reconnect(victim)

    cutter = threading.Thread(target=cut_for_5_s)
    cutter.start()
    began = time.monotonic()
    result = gg.run(LOSSY + "\nfinal_step", workers=3, collective_timeout=timeout, push={"log": str(log)},
                    checkpoint_dir=str(ckpt), checkpoint_every=CHECKPOINT_EVERY, max_failures=1, monitor=False)
    took = time.monotonic() - began
    cutter.join()
    out = capsys.readouterr().out
    assert cut and result.shown() == 40, out
    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    resumed = "died" in out
    if resumed:
        assert "resumed from step-" in out and sorted(set(steps)) == list(range(1, 41)), out
    else:
        assert steps == list(range(1, 41)), f"the cell went on, yet steps were taken twice or lost: {steps}"
    assert took < timeout + 60, f"the cell took {took:.0f} s"
    with capsys.disabled():
        print(f"\na 5 s cut of {victim.name} at step 12: the cell {'resumed' if resumed else 'went on'} and "
              f"finished 40 steps in {took:.1f} s")


def test_a_checkpoint_dir_the_hosts_do_not_share_is_one_line_before_any_step(lab, on_lab3):
    """A path on each host's own disk: each host would checkpoint for itself and no resume could
    read the others' parts — said before the first step. (The default place on a cluster without
    ``--storage``: ``test_bring_up``.)"""
    for trial, flags in enumerate(({"checkpoint_dir": "/tmp/ckpt-of-each-host"},)):
        log = lab.shared / f"unshared-{trial}.log"
        with pytest.raises(gg.GpugeekError) as failed:
            gg.run(LOSSY + "\nfinal_step", workers=3, push={"log": str(log)}, checkpoint_every=CHECKPOINT_EVERY,
                   monitor=False, **flags)
        said = str(failed.value)
        print(f"\n{said}")
        assert "\n" not in said and said.startswith("checkpoint dir "), said
        blind = re.search(r"is not shared by the hosts \((h\d), (h\d) cannot see it\) — give an s3:// URL", said)
        assert blind and blind[1] != blind[2], said
        assert not log.exists() or not log.read_text().strip(), "a step ran before the check"


def test_a_torchrun_script_on_two_hosts_writes_in_the_working_dirs_copy_and_fetch_brings_it_back(
        lab, on_lab3, tmp_path, monkeypatch, ipython, capsys):
    """``%gpugeek torchrun`` of a script whose modules sit beside it (the hosts have neither: they
    go with the job) on two hosts of a cluster with ``--working-dir``: its checkpoint folder lands
    in each rank's copy of the working folder, the cell's end says where, the second run resumes
    from it, and ``%gpugeek fetch`` brings rank 0's back (the bytes the host holds, read over SSH),
    then every rank's into ``rank-N/``. What is there already is never overwritten unasked."""
    import torch
    from framework_programs import EXAMPLE, magic_torchrun_runs

    shutil.copytree(EXAMPLE, tmp_path / "examples")
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    monkeypatch.chdir(notebook)
    said = magic_torchrun_runs(ipython, capsys, "../examples/train.py", 3, 5)
    assert "no checkpoint: starting at step 0" in said[0] and "resumed from step 3" in said[1], said
    assert "sending checkpoint (local" in said[0] and "model (local" in said[0], said[0]
    note = re.search(r"note: the job wrote checkpoints/ in its folder on the nodes \(its copy of --working-dir, "
                     r"gone with the cluster at `down`\) — rank 0's is ([\d.]+):(\S+); "
                     r"`%gpugeek fetch checkpoints` brings it here", said[1])
    assert note, said[1]
    address, folder = note.groups()
    [host] = [h for h in lab.hosts if h.address == address]
    assert not list(notebook.iterdir()), "a remote job wrote into the notebook's folder"

    ipython.run_line_magic("gpugeek", "fetch checkpoints")
    out = capsys.readouterr().out
    assert re.search(r"fetching checkpoints from rank 0 on h\d: 2 files, [\d.]+ [KM]iB", out), out
    assert f"→ {notebook / 'checkpoints'}" in out, out
    assert sorted(p.name for p in (notebook / "checkpoints").iterdir()) == ["model.pt", "shard-0.pt"]
    theirs = lab.ssh(host, f"sha256sum {folder}/checkpoints/model.pt").stdout.split()[0]
    assert hashlib.sha256((notebook / "checkpoints" / "model.pt").read_bytes()).hexdigest() == theirs
    assert torch.load(notebook / "checkpoints" / "model.pt", weights_only=True)["step"] == 5

    gg.run("import os\nwith open('big.bin', 'wb') as f:\n    f.write(os.urandom(20 << 20))", workers=2, monitor=False)
    assert "`%gpugeek fetch big.bin` brings it here" in capsys.readouterr().out
    assert gg.fetch("big.bin") == [notebook / "big.bin"]      # in three pieces
    theirs = lab.ssh(host, f"sha256sum {folder}/big.bin").stdout.split()[0]
    assert hashlib.sha256((notebook / "big.bin").read_bytes()).hexdigest() == theirs
    gg.fetch("checkpoints", all_ranks=True, to="shards/checkpoints")
    shards = {r: sorted(p.name for p in (notebook / "shards" / f"rank-{r}" / "checkpoints").iterdir()) for r in (0, 1)}
    assert shards == {0: ["model.pt", "shard-0.pt"], 1: ["shard-1.pt"]}, shards
    assert torch.load(notebook / "shards" / "rank-1" / "checkpoints" / "shard-1.pt", weights_only=True) == \
        {"rank": 1, "step": 5}
    with pytest.raises(gg.GpugeekError, match=r"checkpoints is here already — give --to another path, or --overwrite"):
        gg.fetch("checkpoints")
    with pytest.raises(gg.GpugeekError, match=r"nothing there on rank 0's node"):
        gg.fetch("no-such-folder")
    assert not [p for p in notebook.rglob("*") if ".fetching-" in p.name], "a scratch folder was left"


def test_down_costs_the_hosts_lifetimes_and_leaves_nothing(lab, on_lab3):
    record = on_lab3.record
    gg.down("lab3")
    record = registry.get(record.id)
    assert record.stopped
    # the dollars: every host's lifetime (as Ray recorded it, closed at the stop) × the rate
    nodes = costs.nodes_frame(record.id)
    assert len(nodes) >= 3 and nodes["ended"].notna().all()     # and a node per host rejoined after a kill
    expected = sum((r.ended - r.started) / 3600 * RATE for r in nodes.itertuples())
    assert gg.cost("lab3").total_usd == pytest.approx(expected, rel=1e-9)
    print(f"cost: ${expected:.4f} for {', '.join(f'{(r.ended - r.started):.1f} s' for r in nodes.itertuples())}"
          f" at ${RATE}/h per host")
    for host in lab.hosts:
        assert lab.ssh(host, "true").returncode == 0
    assert not (left := left_on_hosts(lab)), f"processes left on the hosts: {described(left)}"
    assert not processes.alive(record.session_id), "the tunnel outlived down"


