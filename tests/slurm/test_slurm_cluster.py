"""``up --backend slurm`` on a real Slurm (``tests/slurmlab.py``): the laptop reaches the login host
alone; the job's two compute nodes share the cluster's home with it and nothing with the laptop.

Counted from outside the product: the queue by Slurm's own ``squeue``, what ran on a node by the
node's network namespace, the job's end by Slurm's own record of ended jobs (``jobcomp``)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from cluster_processes import wait_until
from models import DDP_ACROSS_HOSTS

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.guard import board
from gpugeek_jupyter.line import wire
from gpugeek_jupyter.onhost import marks
from gpugeek_jupyter.units import clock

pytestmark = pytest.mark.slow

RATE = 3.6                # $/h per node
LEFT_WITHIN_S = 15.0      # after down: the job's processes gone from every node (Slurm's KillWait is 5 s)


def _nothing_left(slurm) -> bool:
    return not slurm.squeue() and not any(slurm.strays(n) for n in slurm.nodes)


def test_up_on_two_nodes_runs_a_ddp_cell_across_them_and_down_ends_the_job(slurm, cluster_user, gpugeek_home,
                                                                            capsys):
    began = time.monotonic()
    try:
        gg.up("hpc", nodes=2, gpus_per_host=1, time=30, **dict(cluster_user, usd_per_hour=RATE))
        took_up = time.monotonic() - began
        record = registry.live("hpc")
        spec = ClusterSpec.from_json(record.spec)
        job = spec.remote.job_id
        [listed] = slurm.squeue()
        assert (listed["id"], listed["state"], listed["nodes"]) == (job, "RUNNING", "node[1-2]"), listed
        assert spec.remote.head_ip == slurm.nodes[0].address and record.address.startswith("127.0.0.1:")
        # the countdown every reader shows (the sidebar, the panel, `status`), to the end Slurm gives the job
        ends = float(slurm.ssh(f"SLURM_TIME_FORMAT=%s squeue -h -j {job} -o %e").stdout)
        shown = board.model(record)["status"]
        assert f"walltime ends at {clock(ends)} (in 2" in shown, (shown, ends)      # 29-odd minutes of 30
        equal, ips = gg.run(DDP_ACROSS_HOSTS, workers=2, gpus_per_worker=1, monitor=False).shown()
        assert equal, "gradients differ between the two nodes"
        assert ips == [n.address for n in slurm.nodes], f"ranks ran on {ips}"
        pulled = gg.run("answer = 6 * 7", workers=2, gpus_per_worker=1, pull=["answer"], monitor=False).pulled
        assert pulled == {"answer": 42}, pulled
        # a new kernel reaches the cluster by its job's id, as squeue lists it, and runs a cell there
        gg.reset()           # (this kernel's workers hold both GPUs)
        other = subprocess.run(
            [sys.executable, "-c", f"import gpugeek_jupyter as gg\ngg.up(job={job!r})\nprint('pulled', gg.run("
             "'x = 2 + 3', workers=2, gpus_per_worker=1, pull=['x'], monitor=False).pulled)"],
            capture_output=True, text=True, timeout=240, env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
        assert "re-attached to slurm cluster 'hpc'" in other.stdout and "pulled {'x': 5}" in other.stdout, \
            other.stdout[-2000:] + other.stderr[-3000:]
        # a stranger on the cluster's network (another user on the login node) reaches the keeper's port
        # on the head node, answers its challenge without the token: closed, with nothing said
        probe = (f"import os, socket\ns = socket.create_connection(({spec.remote.head_ip!r}, "
                 f"{spec.remote.keeper_port}), 5)\ns.settimeout(15)\nfirst = s.recv({len(wire.MAGIC) + wire.NONCE})\n"
                 f"s.sendall(os.urandom({wire.DIGEST + wire.NONCE}))\nprint(len(first), repr(s.recv(1024)))\n")
        stranger = slurm.ssh(f"python3 -c {shlex.quote(probe)}")
        assert stranger.stdout.split() == [str(len(wire.MAGIC) + wire.NONCE), "b''"], stranger.stdout + stranger.stderr
        first_cell = time.monotonic() - began
    finally:
        downed = time.monotonic()
        if registry.live("hpc") is not None:
            gg.down("hpc")
        took_down = time.monotonic() - downed
    out = capsys.readouterr().out
    assert f"Slurm job {job} submitted from {cluster_user['login']}" in out, out
    assert not slurm.squeue(), slurm.squeue()
    wait_until(lambda: not any(slurm.strays(n) for n in slurm.nodes), LEFT_WITHIN_S,
               "no process of the job on any compute node (counted by namespace)")
    ended = wait_until(lambda: slurm.ended(job), 10, "Slurm's record of the job's end")
    assert (ended["JobState"], ended["NodeList"]) == ("CANCELLED", "node[1-2]"), ended
    # the money: Slurm's record of the job, start to end × its nodes × the rate, to one metering interval
    billed = (ended["end"] - ended["start"]) * 2 * RATE / 3600
    shown = gg.cost("hpc").total_usd
    interval_usd = 2 * RATE * (settings().meter_interval_s + 1.0) / 3600
    assert abs(shown - billed) <= interval_usd, (shown, billed)
    if slurm.accounting:          # and Slurm's accounting: its elapsed seconds × its node count
        elapsed, count = wait_until(lambda: (r := slurm.ssh(f"sacct -X -n -P -j {job} -o ElapsedRaw,NNodes,State")
                                             .stdout.split("|")) and r[-1].startswith("CANCELLED") and r[:2], 10,
                                    "the job's end in sacct")
        assert abs(shown - int(elapsed) * int(count) * RATE / 3600) <= interval_usd, (shown, elapsed, count)
    print(f"\nslurm: up {took_up:.1f} s, first cell {first_cell:.1f} s, down {took_down:.1f} s; the ledger "
          f"${shown:.5f}, Slurm's record × the rate ${billed:.5f} ({(shown - billed) / (2 * RATE) * 3600:+.1f} s)")


def _tag(job: str) -> str:
    """The job's temp folder's name, past ``gg-``: the cluster's tag, then the job."""
    import hashlib

    return f"{hashlib.sha1(registry.live('first').marker.encode()).hexdigest()[:8]}-{job}"


def _kernel(code: str, home) -> subprocess.Popen:
    """A kernel of its own running ``code``: the stop button's SIGINT is a KeyboardInterrupt there, as
    ipykernel makes it (a process started in the background by a shell inherits SIGINT ignored)."""
    code = ("import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n" + code)
    return subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "GPUGEEK_HOME": str(home)}, start_new_session=True)


def _read_until(proc: subprocess.Popen, wanted: str, timeout: float) -> str:
    said, deadline = [], time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            said.append(line)
            if wanted in line:
                return "".join(said)
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.1)
    raise AssertionError(f"no {wanted!r} within {timeout} s: {''.join(said)[-2000:]}")


def test_a_second_cluster_waits_for_the_first_and_an_interrupted_wait_cancels_its_job(slurm, cluster_user,
                                                                                       gpugeek_home):
    """The first cluster holds both nodes: a second, asked for from another kernel, says "pending
    (Resources)" and starts once the first is downed. A third, interrupted (the stop button:
    SIGINT) while it waits, cancels its job: ``squeue`` lists none of it."""
    flags = ", ".join(f"{k}={v!r}" for k, v in cluster_user.items())
    # on each node's /tmp: the user's folders named like ours, and Ray's temp folder a job long gone
    # left there, marked as the product marks it (onhost/marks.py)
    (slurm.home / "gone-mark.json").write_text(json.dumps({"cluster": marks._cluster("long-gone"), "job": "999998"}))
    slurm.ssh("srun -N2 --ntasks-per-node=1 sh -c 'mkdir -p /tmp/gg-data-2024 /tmp/gg-0badcafe-999999/session_x "
              "/tmp/gg-0ldc1a55-999998/session_x && "
              f"cp /root/gone-mark.json /tmp/gg-0ldc1a55-999998/{marks.MADE_MARK}'")
    gg.up("first", nodes=2, cpus_per_host=2, **cluster_user)     # every CPU of both nodes
    # as the job starts, each node sweeps the marked folder of the job Slurm no longer lists, and says
    # so in the job's log; the user's folders stay, whatever their names
    job = ClusterSpec.from_json(registry.live("first").spec).remote.job_id
    temps = slurm.ssh(f"srun --jobid={job} --overlap -N2 --ntasks-per-node=1 "
                      "sh -c 'echo $(hostname) $(ls -d /tmp/gg-*)' | sort")
    assert [sorted(line.split()[1:]) for line in temps.stdout.splitlines()] == \
        [sorted(["/tmp/gg-0badcafe-999999", "/tmp/gg-data-2024", f"/tmp/gg-{_tag(job)}"])] * 2, temps.stdout
    logs = "".join(p.read_text() for p in slurm.home.rglob(f"job-{job}*.log"))
    assert logs.count("removed /tmp/gg-0ldc1a55-999998: Ray's temp folder of Slurm job 999998, which Slurm "
                      "no longer lists") == 2, logs[-3000:]
    second = _kernel(f"import gpugeek_jupyter as gg\ngg.up('second', nodes=1, {flags})\nprint('second is up')\n"
                     "import time\ntime.sleep(600)\n", gpugeek_home)
    third = None
    try:
        _read_until(second, "pending (Resources) — 1 node on gpu", 60)
        third = _kernel(f"import gpugeek_jupyter as gg\ngg.up('third', nodes=1, {flags})\n", gpugeek_home)
        said = _read_until(third, "pending (", 60)         # Priority: behind the second
        job = said.split("Slurm job ")[1].split()[0]
        assert {j["id"]: j["state"] for j in slurm.squeue()}.get(job) == "PENDING"
        os.kill(third.pid, signal.SIGINT)          # the stop button
        try:
            third.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.kill(third.pid, signal.SIGUSR1)     # its threads' stacks (faulthandler), then what it said
            time.sleep(1)                           # faulthandler writes at once; no condition to wait on
            third.kill()
            third.wait(timeout=10)
            os.set_blocking(third.stdout.fileno(), True)
            raise AssertionError(f"the interrupted up still runs 90 s on; it said: {third.stdout.read()}") from None
        assert job not in {j["id"] for j in slurm.squeue()}, slurm.squeue()
        assert registry.live("third") is None
        gg.down("first")
        _read_until(second, "second is up", 90)
    finally:
        for kernel in (second, third):
            if kernel is not None and kernel.poll() is None:
                os.killpg(kernel.pid, signal.SIGKILL)
                kernel.wait(timeout=10)
        for name in ("first", "second", "third"):
            if registry.live(name) is not None:
                gg.down(name)
    wait_until(lambda: _nothing_left(slurm), LEFT_WITHIN_S, "the queue empty and no process on any node")
    slurm.ssh("srun -N2 --ntasks-per-node=1 rm -rf /tmp/gg-data-2024 /tmp/gg-0badcafe-999999", timeout=60)


@pytest.mark.parametrize("flags, said", [
    ({"partition": "nope"}, "Slurm refused the job: invalid partition specified: nope"),
    ({"time": 120}, "Requested time limit is invalid (missing or exceeds some limit)"),
    ({"gpus_per_host": 5}, "Requested node configuration is not available"),
    ({"account": "nosuch"}, "Invalid account or account/partition combination specified (--account: yours here "
                            "are gglab, root)"),   # root: the cluster's own account, which root is in
])
def test_what_slurm_refuses_is_sbatchs_own_words_in_one_line_and_nothing_is_queued(slurm, cluster_user, flags,
                                                                                    said):
    """A partition the cluster has not, a walltime over the partition's limit (the lab enforces it:
    ``EnforcePartLimits=ALL``), a GRES no node has, an account Slurm's accounting does not know (the
    lab enforces associations): sbatch's own words, one line, and no job left queued."""
    if "account" in flags and not slurm.accounting:
        pytest.skip("an unknown account is refused where Slurm's accounting runs: make test's lab")
    with pytest.raises(gg.GpugeekError) as refused:
        gg.up("refused", nodes=1, **{**cluster_user, **flags})
    line = str(refused.value)
    assert "\n" not in line and "Traceback" not in line and said in line, line
    assert line.endswith("nothing of 'refused' runs"), line
    assert slurm.squeue() == [] and registry.live("refused") is None


def test_a_login_that_fails_is_one_line_and_submits_nothing(slurm, cluster_user, tmp_path):
    key = tmp_path / "not-the-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(gg.GpugeekError) as failed:
        gg.up("nologin", nodes=1, **{**cluster_user, "ssh_key": str(key)})
    line = str(failed.value)
    assert "\n" not in line and line.startswith(f"{cluster_user['login']}: SSH failed — "), line
    assert "Permission denied" in line, line
    assert slurm.squeue() == [] and registry.all_records() == []


@pytest.mark.skipif(not os.environ.get("GPUGEEK_SLURM_LAB"), reason="two clusters side by side take a minute "
                    "beside make test's timed tests: `make slurm-lab` runs it")
def test_two_clusters_on_the_same_nodes_do_not_collide_and_downing_one_leaves_the_other_running(slurm, cluster_user):
    """Two jobs of one CPU per node on the same two nodes (two CPUs each): their heads on the same
    first node on ports of their own, temp folders and Ray sessions of their own; a cell on each;
    the one downed, the other's cells go on."""
    gg.up("left", nodes=2, cpus_per_host=1, **cluster_user)
    gg.up("right", nodes=2, cpus_per_host=1, **cluster_user)
    try:
        queue = {j["name"]: j for j in slurm.squeue()}
        assert {queue[f"gg-{n}"]["state"] for n in ("left", "right")} == {"RUNNING"}, queue
        assert {queue[f"gg-{n}"]["nodes"] for n in ("left", "right")} == {"node[1-2]"}, queue
        left, right = (ClusterSpec.from_json(registry.live(n).spec).remote for n in ("left", "right"))
        assert left.head_ip == right.head_ip == slurm.nodes[0].address
        assert len({left.gcs_port, left.keeper_port, right.gcs_port, right.keeper_port}) == 4, (left, right)
        assert left.temp_dirs != right.temp_dirs, (left.temp_dirs, right.temp_dirs)
        for name in ("right", "left"):
            gg.up(name)                       # re-attached: the active cluster
            equal, ips = gg.run(DDP_ACROSS_HOSTS, workers=2, monitor=False).shown()
            assert equal and ips == [n.address for n in slurm.nodes], (name, ips)
        gg.down("left")
        assert [j["name"] for j in slurm.squeue()] == ["gg-right"], slurm.squeue()
        gg.up("right")
        equal, ips = gg.run(DDP_ACROSS_HOSTS, workers=2, monitor=False).shown()
        assert equal and ips == [n.address for n in slurm.nodes], ips
        assert all(slurm.strays(n) for n in slurm.nodes), "the right cluster's Ray is gone from a node"
    finally:
        for name in ("left", "right"):
            if registry.live(name) is not None:
                gg.down(name)
    wait_until(lambda: _nothing_left(slurm), LEFT_WITHIN_S, "the queue empty and no process on any node")
