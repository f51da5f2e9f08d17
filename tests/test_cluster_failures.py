"""Failures that must not cost money unseen, on real local clusters with their real watchdogs.

- ``up`` fails half-way and stopping what it started fails too: the cluster may still be billing,
  so it stays live, listed as failed, watched and metered — and ``down`` retries the stop.
- A bug in reading Ray's node table (a ``TypeError`` after a Ray upgrade) is a bug, not an
  unreachable cluster: it surfaces, and the watchdog does not stop a healthy cluster as lost.
- A process that starts another while the host's processes are stopped (a raylet starting a
  worker) leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from cluster_processes import settings, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends.local import LocalBackend
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.guard import board as server
from gpugeek_jupyter.guard.lifecycle import phase_of
from gpugeek_jupyter.guard.watchdog import UNREACHABLE_LIMIT, Watch
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.raynodes import read_nodes
from gpugeek_jupyter.vocab import ClusterPhase

pytestmark = pytest.mark.slow


def _processes_of(record) -> list:
    return processes.session_processes(record.session_id, record.created, record.marker)


def _gone(record, timeout: float = 15.0) -> bool:
    """Every process of the cluster's session and its watchdog ended (by PID, not by Ray's word)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _processes_of(record) and not processes.alive(record.watchdog_pid):
            return True
        time.sleep(0.2)
    return False


def test_a_failed_stop_in_ups_clean_up_stays_listed_watched_and_metered(gpugeek_home, monkeypatch):
    settings(gpugeek_home, local_usd_per_hour=36.0, meter_interval_s=0.5)
    stop_breaks = {"on": True}
    real_stop = LocalBackend.stop

    def never_ready(self, record, spec, timeout=0):
        raise gg.GpugeekError("the head never reported ready")

    def stop(self, record, grace=3.0):      # a stop that fails, as `ray down` can on a cloud
        if stop_breaks["on"]:
            raise RuntimeError("the stop itself failed")
        return real_stop(self, record, grace)

    monkeypatch.setattr(LocalBackend, "wait_ready", never_ready)
    monkeypatch.setattr(LocalBackend, "stop", stop)
    with pytest.raises(gg.GpugeekError) as failed:
        gg.up("flaky")
    message = str(failed.value)
    assert "failed to start: the head never reported ready" in message
    assert "stopping what had started failed too (the stop itself failed)" in message
    assert "`%gpugeek down flaky` tries the stop again" in message and "\n" not in message

    # visible: still live, and said to be failed wherever clusters are listed
    record = registry.live("flaky")
    assert record is not None, "a cluster that may still be billing was closed"
    assert phase_of(record) is ClusterPhase.FAILED
    assert "may still be running and billing" in gg.status("flaky").status
    listed = gg.clusters().set_index("name").loc["flaky"]
    assert listed["state"] == "failed"
    assert server.detail("flaky")["state"] == "failed"
    assert [e["kind"] for e in ledger.events(record.id, "stop-failed")] == ["stop-failed"]
    assert _processes_of(record), "the head is still running (the stop failed)"

    # watched: the watchdog lives on and keeps metering what may still be billing
    assert processes.alive(record.watchdog_pid)
    wait_until(lambda: len(costs.nodes_frame(record.id)) == 1, 20, "the watchdog to meter the head")
    spent = ledger.spend(record.id)
    assert spent > 0
    wait_until(lambda: ledger.spend(record.id) > spent, 10, "the watchdog to go on metering")
    assert processes.alive(record.watchdog_pid), "the watchdog kept watching"

    # `down` tries the stop again; this time it works and nothing is left
    stop_breaks["on"] = False
    assert gg.down("flaky") == ["flaky"]
    stopped = registry.get(record.id)
    assert stopped.stopped is not None and stopped.stop_reason == "down"
    assert _gone(stopped), "every process of the cluster and its watchdog ended"


class _RayApiChanged:
    """Ray's GcsClient after an upgrade renamed an argument: what a private API change looks like."""

    def __init__(self, address):
        self.address = address

    def get_all_node_info(self, timeout=None):
        raise TypeError("get_all_node_info() got an unexpected keyword argument 'timeout'")


def a_type_error_reading_the_node_table_is_a_bug_not_an_unreachable_cluster(record, monkeypatch):
    """Where Ray's API changed under us (a TypeError reading the node table), the watchdog raises:
    a programming error is no missed look, and the healthy cluster is not stopped. Checked on the
    head that ``test_a_head_that_misses_rays_own_startup_wait_is_started_once_more`` starts."""
    import ray._raylet

    assert read_nodes(record.address), "the real reader sees the head"
    with monkeypatch.context() as patch:
        patch.setattr(ray._raylet, "GcsClient", _RayApiChanged)
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            read_nodes(record.address)
        watch = Watch(record.id, interval=0.5)
        for _ in range(UNREACHABLE_LIMIT + 2):      # more looks than it takes to call a head lost
            with pytest.raises(TypeError):
                watch.look()
        assert watch.misses == 0, "a programming error is not a missed look"
    now = registry.get(record.id)
    assert now.stopping is None and now.stopped is None, "the healthy cluster was stopped"
    assert _processes_of(now), "its head still runs"
    assert read_nodes(record.address)


FORKS_WHEN_TERMINATED = """
import signal, subprocess, sys, time
def term(*_):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
time.sleep(60)
"""


def test_stopping_a_hosts_processes_also_stops_one_started_meanwhile():
    marker = f"test-{os.getpid()}-{time.time_ns()}"
    parent = subprocess.Popen([sys.executable, "-c", FORKS_WHEN_TERMINATED], stdout=subprocess.PIPE,
                              env={**os.environ, onhost.MARKER: marker})
    try:
        assert parent.stdout.readline().strip() == b"ready"
        answer = onhost.stop([marker, "3"])
        left = onhost.ours(marker)
        assert answer == {"ok": True, "left": []} and not left, f"left running: {left}"
    finally:
        for pid in onhost.ours(marker):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_a_head_that_misses_rays_own_startup_wait_is_started_once_more(gpugeek_home, monkeypatch, capsys):
    """Ray gives a raylet 30 s to register and its agent 15 s (fixed); a busy machine can miss that:
    the head is started again, and only a third miss is the error — in one line. (The head started
    again also shows that a TypeError reading its node table is a bug, not an unreachable cluster.)"""
    from gpugeek_jupyter.backends import local as head

    real, starts = processes.start_detached, []

    def slow_then_real(cmd, env, log, misses=1):
        if "--head" not in cmd:          # the watchdog
            return real(cmd, env, log)
        starts.append(cmd)
        if len(starts) <= misses:
            said = "Exception: The current node timed out during startup. This could happen because ..."
            return real([sys.executable, "-c", f"print({said!r}); raise SystemExit(1)"], env, log)
        return real(cmd, env, log)

    monkeypatch.setattr(processes, "start_detached", slow_then_real)
    try:
        gg.up("slow")
        assert len(starts) == 2 and "starting it once more" in capsys.readouterr().out
        a_type_error_reading_the_node_table_is_a_bug_not_an_unreachable_cluster(registry.live("slow"), monkeypatch)
    finally:
        if registry.live("slow") is not None:
            gg.down("slow")

    starts.clear()
    monkeypatch.setattr(processes, "start_detached", lambda cmd, env, log: slow_then_real(cmd, env, log, misses=3))
    with pytest.raises(gg.GpugeekError, match="timed out during startup") as failed:
        head.start_head(head.new_temp_dir("test-marker"), "test-marker")
    assert len(starts) == head.START_TRIES == 3 and len(str(failed.value).splitlines()) == 1


def test_a_head_whose_port_was_taken_before_ray_bound_it_starts_on_other_ports(gpugeek_home, monkeypatch, capsys):
    """A free port found here can be taken (by any connection's own local port) before Ray binds
    it: Ray's GCS then dies at once; the head starts again on new ports, quietly."""
    real, starts = processes.start_detached, []

    def taken_then_real(cmd, env, log):
        if "--head" not in cmd:          # the watchdog
            return real(cmd, env, log)
        starts.append(next(a for a in cmd if a.startswith("--port=")))
        if len(starts) == 1:
            said = ("(gcs_server) grpc_server.cc:134: Check failed: server_ Failed to start the grpc server. The "
                    "specified port is 1. If the server startup error message is `Address already in use` …")
            return real([sys.executable, "-c", f"print({said!r}); raise SystemExit(1)"], env, log)
        return real(cmd, env, log)

    monkeypatch.setattr(processes, "start_detached", taken_then_real)
    try:
        gg.up("taken", backend="sim", gpu="A100", count=1, workers=1)
        # a third start is a busy machine's (Ray's own 30 s startup wait missed), said as such
        assert len(starts) in (2, 3) and len(set(starts)) == len(starts), starts
        said = capsys.readouterr().out
        assert ("starting it once more" in said) == (len(starts) == 3), said
        record = registry.live("taken")
        assert record.address.endswith(starts[-1].removeprefix("--port="))
        assert read_nodes(record.address)
    finally:
        if registry.live("taken") is not None:
            gg.down("taken")


def test_a_node_found_dead_by_missed_health_checks_ends_when_it_died():
    """Ray writes a node's end when its GCS gives up on it, several missed health checks after it
    died; the ledger's end is moved back by what those checks took (their settings are ours,
    set on every head). A node that left in good order ends when Ray says."""
    from ray.core.generated import gcs_pb2

    from gpugeek_jupyter import raynodes

    def dead(message: str):
        info = gcs_pb2.GcsNodeInfo(node_id=b"\x01" * 28, start_time_ms=1_000_000, end_time_ms=1_060_000,
                                   state=gcs_pb2.GcsNodeInfo.GcsNodeState.DEAD)
        info.death_info.reason_message = message
        return raynodes._node(info)

    killed = dead("health check failed due to missing too many heartbeats")
    assert killed.ended == pytest.approx(1060.0 - raynodes.DIED_BEFORE_NOTICED_S)
    assert pytest.approx(13.5) == raynodes.DIED_BEFORE_NOTICED_S
    assert raynodes.HEAD_ENV["RAY_health_check_failure_threshold"] == "5"
    assert dead("received SIGTERM").ended == 1060.0
