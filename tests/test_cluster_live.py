"""Real Ray clusters: local and simulated multi-node, started, metered, capped and stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from cluster_processes import of_cluster, rays_own_lines, settings, wait_until
from models import at_step, logged_steps

import gpugeek_jupyter as gg
from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.raynodes import use_token_auth
from gpugeek_jupyter.vocab import ClusterPhase

pytestmark = pytest.mark.slow


def _leftovers(record, grace: float = 5.0) -> list:
    """Processes of the cluster still alive ``grace`` seconds after it was marked stopped."""
    def alive():
        return processes.session_processes(record.session_id, record.created, record.marker) + (
            [record.watchdog_pid] if processes.alive(record.watchdog_pid) else [])
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive()


def _ray_nodes(address):
    """Ray's own node table, read independently of the ledger."""
    from ray._raylet import GcsClient

    use_token_auth()   # our clusters require Ray's token; this only switches Ray's client to send it
    return list(GcsClient(address=address).get_all_node_info(timeout=5).values())


def test_sim_cluster_declares_16_gpus_and_costs_what_its_nodes_lived(ipython):
    import ray

    cluster = ipython.run_line_magic("gpugeek", "up s1 --backend sim --gpu A100 --count 8 --workers 2 --budget 5")
    assert isinstance(cluster, gg.Cluster)
    assert ray.cluster_resources()["GPU"] == 16
    workers = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    assert len(workers) == 2
    assert all(n["Resources"]["GPU"] == 8 and n["Resources"]["accelerator_type:A100"] == 1 for n in workers)
    assert "simulated" in repr(gg.status()) and "16 GPUs declared" in repr(gg.status())

    # the doctor examines every node (real raylets) and measures each pair; declared GPUs are no fault
    report = ipython.run_line_magic("gpugeek", "doctor")
    assert report.ok, repr(report)
    assert len(report.rows) == 3 and len(report.pairs) == 3
    assert [r["GPUs"] for r in report.rows].count("8") == 2

    # scale to one node: Ray's autoscaler removes the other and the ledger closes it
    gg.scale(1)
    wait_until(lambda: len([n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]) == 1, 60,
          "the autoscaler to remove a node")
    record = registry.live("s1")

    def closed_row():  # Ray's GCS closes the removed node's row a moment after the autoscaler lets it go
        table = {info.node_id.hex(): info for info in _ray_nodes(record.address)}
        return table if [i for i in table.values() if i.resources_total.get("GPU") and i.end_time_ms] else None
    table = wait_until(closed_row, 30, "Ray's GCS to close the removed node's row")
    t_down = time.time()
    ipython.run_line_magic("gpugeek", "down s1")
    t_done = time.time()

    price = gg.offers(gpu="A100", count=8).iloc[0]["on_demand_price"]   # the catalog, not the ledger
    nodes = costs.nodes_frame(record.id).set_index("node_id")
    expected = 0.0
    for node_id, info in table.items():
        if not info.resources_total.get("GPU"):
            continue                                           # the head is not billed
        start = info.start_time_ms / 1000
        end = info.end_time_ms / 1000 if info.end_time_ms else nodes.loc[node_id, "ended"]
        if not info.end_time_ms:
            assert t_down <= end <= t_done, "open nodes end when the cluster is stopped"
        expected += price * (end - start) / 3600
    report = gg.cost("s1")
    assert report.simulated and "simulated" in report.summary()
    assert report.total_usd == pytest.approx(expected, rel=0.01)
    print(f"\nsim cost: ledger ${report.total_usd:.5f} vs Σ lifetime × price ${expected:.5f}")
    assert len(report.table) == 3 and report.table["end_reason"].notna().all()
    assert not _leftovers(registry.get(record.id))


STEADY = logged_steps(60, 0.1)


def test_a_preemption_notice_checkpoints_the_job_which_resumes_losing_no_step(
        ipython, capsys, tmp_path):
    """A spot node gets a 5 s notice mid-job: its workers checkpoint at once and stop, the job
    waits for the node to go and resumes from that checkpoint — every step taken once, none
    lost, with ``--max-failures 0`` — and an on-demand node replaces the spot one."""

    from gpugeek_jupyter.kernel.session import current

    gg.up("p1", backend="sim", gpu="A100", count=8, workers=2, pricing="spot", spot_fallback=True)
    record = registry.live("p1")
    log, ckpt = tmp_path / "steps.log", tmp_path / "ckpt"
    gg.run("pass", workers=2, gpus_per_worker=1)
    victim = current().group.info[0]["node_id"]           # rank 0's node (both ranks: PACK)
    noticed = []

    def notice():
        at_step(log, 5, timeout=60)
        noticed.append((time.time(), gg.preempt(victim[-6:], notice=5)))

    threading.Thread(target=notice, daemon=True).start()
    result = gg.run(STEADY + "\nfinal_step", workers=2, gpus_per_worker=1, push={"log": str(log)},
                    checkpoint_dir=str(ckpt), max_failures=0, monitor=False)
    out, err = capsys.readouterr()
    assert result.shown() == 60, out
    # the node went mid-job, its placement group's bundles with it: told in our words alone
    assert not rays_own_lines(out, err), f"Ray's own lines reached the cell: {rays_own_lines(out, err)}"
    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert steps == list(range(1, 61)), f"each step once, none lost: {steps}"
    at, said = noticed[0]
    assert "it goes in 5 s" in said
    saved = [p for p in ckpt.glob("step-*") if (p / "COMPLETE").exists()]
    assert len(saved) == 1, saved
    assert "preemption notice: checkpointed at step" in out and f"resumed from {saved[0].name}" in out, out
    by_node = costs.nodes_frame(record.id).set_index("node_id")
    assert by_node.loc[victim, "end_reason"] == "preempted"
    assert at < (saved[0] / "COMPLETE").stat().st_mtime < by_node.loc[victim, "ended"], \
        "the checkpoint was written after the notice and before the node was gone"
    job = store.query("SELECT status, preemptions FROM jobs WHERE cluster_id=? ORDER BY started DESC LIMIT 1",
                      (record.id,))[0]
    assert (job["status"], job["preemptions"]) == ("finished", 1)     # not a failure: recorded apart
    kinds = [e["kind"] for e in ledger.events(record.id)]
    assert kinds.index("preemption-notice") < kinds.index("job-preempted") < kinds.index("preempted")

    def replaced():
        return "on-demand" in set(gg.status("p1").nodes["pricing"])
    wait_until(replaced, 120, "an on-demand replacement")
    gg.down("p1")
    by_node = costs.nodes_frame(record.id).set_index("node_id")
    assert by_node.loc[victim, "end_reason"] == "preempted"
    assert by_node.loc[victim, "pricing"] == "spot"
    on_demand = by_node[by_node["pricing"] == "on-demand"]
    assert len(on_demand) == 1 and on_demand["started"].iloc[0] > by_node.loc[victim, "ended"]
    by_pricing = gg.cost("p1", by="pricing").table.set_index("pricing")
    assert by_pricing.loc["spot", "nodes"] >= 2 and by_pricing.loc["on-demand", "nodes"] == 1
    assert by_pricing.loc["spot", "spot_saved_usd"] > 0
    kinds = [e["kind"] for e in ledger.events(record.id)]
    assert kinds.index("preempted") < kinds.index("spot-fallback")
    assert not _leftovers(registry.get(record.id))


def test_a_node_lost_mid_job_is_told_once_in_our_words_and_the_job_goes_on_on_the_node_left(capsys, tmp_path):
    """A node taken away with no notice (its host lost power) while a rank runs on it: the cell
    says the worker died and resumes from its checkpoint on the node left. Ray often says it too —
    its raylet's "A worker died or was killed…", its GCS's "Failed to remove … bundle(s)" — and none
    of that reaches the cell: its whole output is read, until the cluster is down."""
    from gpugeek_jupyter.kernel.session import current

    gg.up("lost", backend="sim", gpu="A100", count=1, workers=2)
    record = registry.live("lost")
    log = tmp_path / "steps.log"
    gg.run("pass", workers=2, gpus_per_worker=1)          # one GPU a node: a rank on each
    victim = current().group.info[1]["node_id"]

    def lose_the_node():
        at_step(log, 5, timeout=60)
        gg.preempt(victim[-6:])

    loser = threading.Thread(target=lose_the_node, daemon=True)
    loser.start()
    result = gg.run(logged_steps(40, 0.1) + "\nfinal_step", workers=2, gpus_per_worker=1, push={"log": str(log)},
                    checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=5, max_failures=1, monitor=False)
    loser.join()
    assert result.shown() == 40
    gg.down("lost")
    out, err = capsys.readouterr()
    assert out.count("worker 1 died") == 1 and "resumed from step-" in out, out
    assert not rays_own_lines(out, err), f"Ray's own lines reached the cell: {rays_own_lines(out, err)}"
    assert not _leftovers(registry.get(record.id))


KERNEL = """
import json, sys, time
import gpugeek_jupyter as gg
cluster = gg.up("b1", budget=float(sys.argv[1]))
print(json.dumps({"id": cluster.record.id}), flush=True)
time.sleep(600)
"""


def test_budget_cap_stops_the_cluster_after_its_kernel_is_killed(gpugeek_home):
    # $36,000/h is $10/s: a few seconds cost dollars
    settings(gpugeek_home, local_usd_per_hour=36000, meter_interval_s=0.5)
    usd_per_s, budget, interval_s = 10.0, 150.0, 0.5
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(budget)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    try:
        line = kernel.stdout.readline()
        while line and not line.startswith("{"):      # `up` says what it starts first
            line = kernel.stdout.readline()
        cluster_id = json.loads(line)["id"]
        assert not gg.clusters().set_index("name").loc["b1", "orphan"]
    finally:
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait()
    assert gg.clusters().set_index("name").loc["b1", "orphan"], "a live cluster with no kernel is an orphan"
    record = registry.get(cluster_id)
    head = next(info for info in _ray_nodes(record.address))
    started = head.start_time_ms / 1000                      # Ray's record, not the ledger's

    def head_dead():  # watched from outside: when did the cluster's last process go?
        return not processes.session_processes(record.session_id, record.created, record.marker)
    wait_until(head_dead, 90, "the watchdog to stop the cluster")
    died = time.time()
    wait_until(lambda: registry.get(cluster_id).stopped, 10, "the stop to be recorded")
    record = registry.get(cluster_id)
    assert record.stop_reason == "budget cap reached"
    spent = ledger.spend(cluster_id)
    measured = usd_per_s * (died - started)
    one_interval = usd_per_s * interval_s
    print(f"\nbudget ${budget:.0f}: ledger ${spent:.2f}, measured from outside ≤ ${measured:.2f} "
          f"(one interval = ${one_interval:.2f})")
    assert spent <= budget + one_interval
    assert measured <= budget + one_interval + usd_per_s * 0.25, "processes outlived the cap"
    assert spent >= 0.9 * budget, "it ran up to the cap, not far short of it"
    kinds = [e["kind"] for e in ledger.events(cluster_id)]
    assert kinds.index("budget-warning") < kinds.index("budget-stop")
    assert not _leftovers(record)


def test_idle_cluster_stops_itself_but_not_while_work_runs(gpugeek_home):
    import ray

    settings(gpugeek_home, meter_interval_s=0.5)
    gg.up("i1", idle=0.1)                                  # six seconds
    record = registry.live("i1")
    # (a job without device readings while a notebook is attached: tests/test_activity.py)
    gg.run("pass", workers=1, monitor=False)     # a warm worker group: Ray calls its node busy for good

    @ray.remote(num_cpus=1)
    def step():
        time.sleep(1.0)     # the task's work: a second of it

    until = time.monotonic() + 9                           # tasks beside it, with idle gaps < 6 s
    while time.monotonic() < until:
        ray.get(step.remote())
        time.sleep(1.0)
    assert registry.get(record.id).stopped is None, "Ray tasks between looks keep the cluster up"
    wait_until(lambda: registry.get(record.id).stopped, 40, "the idle autostop, the warm group still up")
    assert registry.get(record.id).stop_reason == "idle 0.1 min"
    assert "warm workers wait for the next cell" in ledger.events(record.id, "idle-stop")[0]["message"]
    assert not _leftovers(registry.get(record.id))
    shown = gg.status()                 # the active cluster, stopped: its final state, said as a value
    assert shown.state is ClusterPhase.STOPPED and shown.status.startswith("stopped (idle 0.1 min)")
    with pytest.raises(gg.GpugeekError, match=r"stopped \(idle 0\.1 min\) — `%gpugeek up i1` starts it again"):
        gg.scale(1)


SEEN_WITHIN_S = 60     # the samplers' first readings of a busy loop (seen past 30 s under CI's load)


def test_a_stalled_loop_is_stopped_after_the_idle_window_and_a_training_one_is_not(gpugeek_home):
    """Idleness that sees the work: the job's devices (CPUs here: no GPU) are read by the node
    samplers; a loop that trains keeps the cluster up past the window, one that only sleeps does
    not, and the cell that stalled says why it ended."""
    settings(gpugeek_home, meter_interval_s=0.5)
    gg.up("stall", idle=0.1)                               # six seconds
    record = registry.live("stall")
    # the loop trains past the window, and on until the watchdog has said why it is busy (the
    # first device readings come later on a loaded machine): this test's thread watches for that
    said, seen = [], gpugeek_home / "seen-working"

    def watch():
        deadline = time.monotonic() + SEEN_WITHIN_S
        while not seen.exists() and time.monotonic() < deadline:
            why = registry.get(record.id).idle_why or ""
            if "working: CPUs" in why:
                said.append(why)
                seen.touch()
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    gg.run(f"import os, time\nt = time.time()\nwhile time.time() - t < 8 or not os.path.exists({str(seen)!r}):\n"
           f"    sum(range(20000))\n    if time.time() - t > {SEEN_WITHIN_S}: break", monitor=False)
    watcher.join()
    assert time.monotonic() - start > 8
    assert registry.get(record.id).stopped is None, "a training loop keeps the cluster up"
    assert said, f"the watchdog never saw the loop work: {registry.get(record.id).idle_why}"
    start = time.monotonic()
    with pytest.raises(gg.GpugeekError) as stopped:
        gg.run("import time\nwhile True:\n    time.sleep(0.2)", monitor=False)
    # the node's Ray workers' own CPU is read, not the host's: other work on this shared machine
    # (`make test`'s other stream) cannot make the stalled job look busy, so the stop comes after
    # the window, a look or two and the readings' lag
    assert time.monotonic() - start < 40, str(stopped.value)
    wait_until(lambda: registry.get(record.id).stopped, 30, "the idle stop")
    assert registry.get(record.id).stop_reason == "idle 0.1 min", str(stopped.value)
    event = ledger.events(record.id, "idle-stop")[0]["message"]
    assert "job 'cell 2' stalled: CPUs at most" in event, event
    assert "was stopped while the cell ran (idle for 0.1 min (job 'cell 2' stalled" in str(stopped.value), \
        str(stopped.value)
    assert not _leftovers(registry.get(record.id))


def test_local_cluster_outlives_a_kernel_restart_and_is_reattached_by_name(gpugeek_home):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})

    def run(code):
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("ERROR " + msg["content"]["evalue"])
        reply = kc.execute_interactive(code, output_hook=hook, timeout=180)
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text
        return text

    try:
        out = run("%load_ext gpugeek_jupyter\nimport time, ray\nt = time.time()\n"
                  "c = %gpugeek up r1\nprint('READY', round(time.time() - t, 2), c.address)")
        ready, address = out.split("READY ")[1].split()
        record = registry.live("r1")
        assert record.address == address
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        assert gg.clusters().set_index("name").loc["r1", "orphan"]
        out = run("%load_ext gpugeek_jupyter\nimport ray\nc = %gpugeek up r1\n"
                  "print('CPUS', ray.cluster_resources()['CPU'], c.address)")
        assert "re-attached to local cluster 'r1'" in out and address in out
        assert not gg.clusters().set_index("name").loc["r1", "orphan"]
        # two drivers joined, no task ran: Ray's default would have one idle worker per CPU waiting
        # here for tasks nobody sends (seen by name in the head's session; one booting for an actor
        # of ours is named so for a moment only)
        wait_until(lambda: not [p for p in of_cluster(record) if p.name() == "ray::IDLE"], 10,
                   "no idle Ray worker on the head")
        run("%gpugeek down r1")
        print(f"\nlocal up → ready {ready} s")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    record = registry.get(record.id)
    assert record.stop_reason == "down"
    assert not _leftovers(record)
    # the audit log names the kernel that acted, by its Jupyter kernel id
    who = {e["kind"]: e["client"] for e in ledger.events(record.id)}
    assert who["up"].startswith("kernel ") and who["down"].startswith("kernel "), who
    assert who["up"] != who["down"], "the restarted kernel is another process"
