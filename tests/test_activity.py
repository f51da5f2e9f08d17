"""What the idle autostop counts as work: jobs whose devices work, notebooks running cells.

The readings are written to the ledger as the node samplers write them (``record_node_samples``);
NVML cannot run here, so GPU readings are made up in its shape, CPU readings too where a test
needs exact figures. The live counterpart (a real stalled loop stopped, a real training loop
not) is in ``test_cluster_live.py``.
"""

from __future__ import annotations

import pytest

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import activity, ledger, telemetry
from gpugeek_jupyter.raynodes import RayNode

NOW = 1_800_000_000.0
WINDOW = 600.0


@pytest.fixture()
def cluster(gpugeek_home):
    return registry.create("act", "local", {}, simulated=False, budget_usd=None, idle_minutes=10).id


def _node(idle_s=None):
    return RayNode(node_id="n1", node_type="gpu", alive=True, is_head=False, started=NOW - 7200,
                   ended=None, idle_s=idle_s, raylet_socket="", resources={"GPU": 1})


def gpu_readings(cluster_id, start, end, util, node="n1"):
    telemetry.record_node_samples(cluster_id, [
        {"t": t, "node_id": node, "host": {"cpu_percent": 90.0, "cpus": 8},
         "gpus": [{"gpu": 0, "gpu_util": util}, {"gpu": 1, "gpu_util": util}]}
        for t in range(int(start), int(end))])


def cpu_readings(cluster_id, start, end, percent, cpus=4, node="n1"):
    telemetry.record_node_samples(cluster_id, [
        {"t": t, "node_id": node, "host": {"cpu_percent": percent, "cpus": cpus}}
        for t in range(int(start), int(end))])


def judge(cluster_id, previous=None, **kw):
    return activity.judge(cluster_id, [_node()], previous, WINDOW, now=NOW, **kw)


def test_a_job_whose_gpus_work_is_busy_and_one_stalled_for_the_window_is_idle(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    gpu_readings(cluster, NOW - 3000, NOW - 900, 95)     # trained, then the loop stalled
    gpu_readings(cluster, NOW - 900, NOW, 0)             # the host's CPU stays busy: GPUs decide
    idle = judge(cluster)
    assert idle.since is not None and NOW - idle.since >= WINDOW
    assert idle.why == "job 'train' stalled: GPUs at most 0 %"
    gpu_readings(cluster, NOW - 5, NOW, 60)
    assert judge(cluster) == activity.Idleness(None, "job 'train' working: GPUs at most 60 %")


def test_a_stall_shorter_than_the_window_starts_the_clock_at_the_last_busy_reading(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    gpu_readings(cluster, NOW - 3000, NOW - 120, 95)
    gpu_readings(cluster, NOW - 120, NOW, 3)
    idle = judge(cluster)
    assert idle.since == NOW - 121 and "stalled" in idle.why


def test_on_cpu_nodes_the_cpus_decide_in_cores_not_percent(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    cpu_readings(cluster, NOW - 3000, NOW, 100.0 / 64, cpus=64)    # one core of 64 is busy
    assert judge(cluster).since is None
    cpu_readings(cluster, NOW - 3000, NOW, 0.3, cpus=64, node="n2")     # a second node, idle: n1 still works
    assert judge(cluster).since is None
    registry.create("other", "local", {}, simulated=False, budget_usd=None, idle_minutes=10)
    quiet = registry.live("other").id
    ledger.job_started(quiet, "j2", "stuck", at=NOW - 3000)
    cpu_readings(quiet, NOW - 3000, NOW, 5.0, cpus=4)    # 0.2 cores: Ray's own hum
    idle = judge(quiet)
    assert idle.since is not None and idle.why == "job 'stuck' stalled: CPUs at most 0.2 cores busy"


def test_a_job_without_readings_is_busy_while_a_notebook_is_attached_and_idle_once_none_is(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    assert judge(cluster, notebook=True).since is None
    gone = judge(cluster, notebook=False)
    assert gone.since == NOW - 3000 and "no notebook attached" in gone.why


def test_the_stall_clock_starts_no_sooner_than_the_job_and_its_first_reading(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    gpu_readings(cluster, NOW - 28, NOW, 0)       # the samplers of a group just rebuilt
    assert judge(cluster).since == NOW - 28
    ledger.job_started(cluster, "j2", "again", at=NOW - 20)
    assert judge(cluster) == activity.Idleness(NOW - 20, "job 'again' stalled: GPUs at most 0 %")


def test_without_a_job_rays_clock_counts_carried_forward_and_a_notebooks_cell_restarts_it(cluster):
    nodes = [_node(idle_s=100.0)]
    assert activity.judge(cluster, nodes, None, WINDOW, now=NOW).since == NOW - 100
    assert activity.judge(cluster, nodes, NOW - 500, WINDOW, now=NOW).since == NOW - 500
    assert activity.judge(cluster, nodes, NOW - 500, WINDOW, ray_worked=True, now=NOW).since == NOW - 100
    assert activity.judge(cluster, [_node(idle_s=None)], NOW - 500, WINDOW, now=NOW).since is None
    ledger.job_started(cluster, "j1", "x", at=NOW - 90)
    ledger.job_ended(cluster, "j1", at=NOW - 50)
    assert activity.judge(cluster, nodes, None, WINDOW, now=NOW).since == NOW - 50
    celled = activity.judge(cluster, nodes, None, WINDOW, last_cell=NOW - 20, now=NOW)
    assert celled == activity.Idleness(NOW - 20, "since a notebook's last cell")


def test_a_notebook_running_cells_notes_them_for_every_cluster_it_is_attached_to(cluster, ipython):
    from gpugeek_jupyter.kernel import session

    registry.attach(cluster)
    attached_at = registry.last_cell(cluster)
    assert attached_at is not None                # attaching is done from a cell
    session.attach(registry.get(cluster))         # hooks this shell's cells
    session._cells_heard[1] = 0.0
    ipython.run_cell("1 + 1")
    assert registry.last_cell(cluster) > attached_at


def test_the_watchdogs_readings_are_kept_between_looks_and_take_a_late_batch(cluster):
    ledger.job_started(cluster, "j1", "train", at=NOW - 3000)
    kept = activity.Readings(cluster)
    gpu_readings(cluster, NOW - 3000, NOW - 900, 95)
    assert judge(cluster, readings=kept).since is not None      # stalled for 900 s
    gpu_readings(cluster, NOW - 900, NOW - 5, 0)
    assert judge(cluster, readings=kept) == activity.Idleness(NOW - 901, "job 'train' stalled: GPUs at most 0 %")
    gpu_readings(cluster, NOW - 3, NOW, 70, node="n2")           # a late node's batch: busy again
    assert judge(cluster, readings=kept) == judge(cluster) == activity.Idleness(
        None, "job 'train' working: GPUs at most 70 %")
    ledger.job_ended(cluster, "j1", at=NOW - 2)
    ledger.job_started(cluster, "j2", "next", at=NOW - 0.5)   # another job: its own readings only
    assert judge(cluster, readings=kept, notebook=True) == activity.Idleness(
        None, "job 'next' running (no device readings yet)")


def test_warm_workers_between_cells_do_not_keep_the_cluster_busy(cluster):
    held = [_node(idle_s=None)]                     # Ray calls a node its placement group holds busy
    assert activity.judge(cluster, held, None, WINDOW, ray_worked=True, now=NOW).since is None
    first = activity.judge(cluster, held, None, WINDOW, ray_worked=True, held=lambda: True, now=NOW)
    assert first == activity.Idleness(NOW, "no job running; warm workers wait for the next cell")
    later = activity.judge(cluster, held, first.since, WINDOW, ray_worked=True, held=lambda: True, now=NOW + 60)
    assert later.since == NOW                       # carried forward, whatever Ray's clock says
