"""What a watchdog makes of the jobs a cluster tells of itself (``guard/clusterjobs.py``): a job's
end closes its ledger row only when the kernel that ran it is gone, and a preempted cell, whose
job resumes on other nodes, is no end at all."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil
import pytest
from cluster_processes import wait_until

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.guard import clusterjobs
from gpugeek_jupyter.meter import ledger


@pytest.fixture
def cluster_id(gpugeek_home):
    return registry.create("jobs", "local", {}, simulated=False, budget_usd=None, idle_minutes=None).id


def _told(job: str, state: str, kernel: str) -> dict:
    now = time.time()
    return {"at": now, "every": 2.0, "job": job, "name": job, "kernel": kernel, "running": False,
            "step": 7, "began": now - 60, "ended": now - 1, "state": state}


def _look(monkeypatch, cluster_id: int, told: dict) -> tuple:
    monkeypatch.setattr(clusterjobs, "kv_all", lambda address, prefix, timeout: {"job/g/0": told})
    return clusterjobs.ClusterJobs(cluster_id).look("127.0.0.1:1", time.time(), timeout=1)


def test_a_live_kernels_job_is_left_for_it_to_close(monkeypatch, cluster_id):
    ledger.job_started(cluster_id, "j1", "train", workers=2)
    working, ended = _look(monkeypatch, cluster_id, _told("j1", "failed", f"{socket.gethostname()}:{os.getpid()}"))
    assert working is None and ended is not None
    assert ledger.job_status(cluster_id, "j1") == "running", "this kernel runs it again (a retry): it closes it"
    assert [e["kind"] for e in ledger.events(cluster_id, "job-ended")] == ["job-ended"]


def test_a_dead_kernels_job_is_closed_at_the_clusters_moment(monkeypatch, cluster_id):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ledger.job_started(cluster_id, "j2", "train", workers=2)
    told = _told("j2", "finished", f"{socket.gethostname()}:{gone.stdout.strip()}")
    _look(monkeypatch, cluster_id, told)
    assert ledger.job_status(cluster_id, "j2") == "finished"
    row = ledger.jobs_of(cluster_id)[0]
    assert row["ended"] == pytest.approx(told["ended"])


def test_a_preempted_cell_is_no_end(monkeypatch, cluster_id):
    ledger.job_started(cluster_id, "j3", "train", workers=2)
    working, ended = _look(monkeypatch, cluster_id, _told("j3", "preempted", "elsewhere:1"))
    assert (working, ended) == (None, None) and ledger.job_status(cluster_id, "j3") == "running"
    assert ledger.events(cluster_id, "job-ended") == []


def test_a_kernel_is_gone_when_its_process_ended_even_unreaped_and_unknown_on_another_machine():
    from gpugeek_jupyter.cluster.processes import kernel_gone, this_kernel

    here = socket.gethostname()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    unreaped = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: psutil.Process(unreaped.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
    try:
        assert this_kernel() == f"{here}:{os.getpid()}"
        assert kernel_gone(this_kernel()) is False
        assert kernel_gone(f"{here}:{ended.pid}") is True
        assert kernel_gone(f"{here}:{unreaped.pid}") is True      # ended; only its parent has not read it
        assert kernel_gone(f"elsewhere-{here}:{os.getpid()}") is None
        assert kernel_gone(None) is None and kernel_gone(f"{here}:notapid") is None
    finally:
        unreaped.wait()
