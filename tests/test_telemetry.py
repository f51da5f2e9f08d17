"""Per-node telemetry: the sampling functions, the NVML path (with a stand-in, as no GPU is here),
the ``node_samples`` table, and real sampler actors on a real Ray node."""

from __future__ import annotations

import math
import shutil
import sqlite3
import sys
import tempfile
import time
import types
from itertools import pairwise

import psutil
import pytest
from cluster_processes import wait_until

from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import telemetry


@pytest.fixture
def fresh_nvml(monkeypatch):
    """Each test tries nvmlInit itself (the module caches the first answer per process)."""
    monkeypatch.setattr(telemetry, "_nvml", None)


# -- host ---------------------------------------------------------------------------------------

def test_host_sample_is_sane():
    telemetry.host_sample()
    time.sleep(0.2)      # cpu_percent is measured between two calls
    row = telemetry.host_sample()
    assert set(row) == {"cpu_percent", "mem_used", "mem_total", "cpus"}
    assert 0 <= row["cpu_percent"] <= 100 and row["cpus"] == psutil.cpu_count()   # all CPUs' share, and how many
    assert 0 < row["mem_used"] <= row["mem_total"]


def test_first_cpu_reading_is_left_out_not_reported_as_zero(monkeypatch):
    monkeypatch.setattr(telemetry, "_cpu_primed", False)
    assert "cpu_percent" not in telemetry.host_sample()


# -- NVML: the real library, which finds no driver here ----------------------------------------

def test_no_nvml_here_means_no_gpu_rows_and_says_why(fresh_nvml):
    assert telemetry.nvml_available() is False
    assert telemetry.gpu_samples() == []
    why = telemetry.nvml_unavailable_reason()
    assert why.startswith("NVML not available: ") and len(why) > len("NVML not available: ")


# -- NVML: a stand-in module with pynvml's names --------------------------------------------------

GIB = 1024**3
FAKE_GPUS = [
    {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "util": 87, "used": 30 * GIB,
     "total": 80 * GIB, "mw": 312_456},
    {"uuid": "GPU-66666666-7777-8888-9999-000000000000", "util": 0, "used": 512 * 1024**2,
     "total": 24 * GIB, "mw": None},   # power: NVMLError_NotSupported
]


def fake_pynvml(gpus=FAKE_GPUS, init_error: str | None = None, broken_util: bool = False):
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    module.NVMLError, module.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    module.NVMLError_GpuIsLost = NVMLError_GpuIsLost

    def nvmlInit():
        if init_error:
            raise NVMLError(init_error)

    def utilisation(h):
        if broken_util:
            raise NVMLError_GpuIsLost("GPU is lost")
        return types.SimpleNamespace(gpu=gpus[h]["util"], memory=0)

    def power(h):
        if gpus[h]["mw"] is None:
            raise NVMLError_NotSupported("Not Supported")
        return gpus[h]["mw"]

    module.nvmlInit = nvmlInit
    module.nvmlDeviceGetCount = lambda: len(gpus)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetUUID = lambda h: gpus[h]["uuid"]
    module.nvmlDeviceGetUtilizationRates = utilisation
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=gpus[h]["used"], total=gpus[h]["total"], free=gpus[h]["total"] - gpus[h]["used"])
    module.nvmlDeviceGetPowerUsage = power
    return module


EXPECTED_GPUS = [
    {"gpu": 0, "uuid": FAKE_GPUS[0]["uuid"], "gpu_util": 87, "gpu_mem_used": 30 * GIB,
     "gpu_mem_total": 80 * GIB, "power_w": 312.456},
    {"gpu": 1, "uuid": FAKE_GPUS[1]["uuid"], "gpu_util": 0, "gpu_mem_used": 512 * 1024**2,
     "gpu_mem_total": 24 * GIB},
]


def test_gpu_samples_through_nvml(monkeypatch, fresh_nvml):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert telemetry.nvml_available() is True
    assert telemetry.nvml_unavailable_reason() is None
    assert telemetry.gpu_samples() == EXPECTED_GPUS


def test_nvml_that_fails_to_init_is_tried_once(monkeypatch, fresh_nvml):
    module = fake_pynvml(init_error="Driver Not Loaded")
    calls = []
    init = module.nvmlInit
    module.nvmlInit = lambda: (calls.append(1), init())
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert telemetry.gpu_samples() == []
    assert telemetry.nvml_available() is False
    assert telemetry.nvml_unavailable_reason() == "NVML not available: Driver Not Loaded"
    assert len(calls) == 1


def test_sampler_thread_with_gpus_caps_at_1hz_and_reports_errors(monkeypatch, fresh_nvml):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    sampler = telemetry.NodeSampler(interval=0.1, node_id="node-a")
    try:
        assert sampler.info()["interval"] == 1.0 and sampler.info()["gpus_sampled"] is True
        time.sleep(1.4)      # a window of 1.4 s: at most 1 Hz, so exactly one sample
        samples = sampler.drain()
    finally:
        left = sampler.stop()
    assert len(samples) == 1 and not sampler._thread.is_alive()
    assert samples[0]["node_id"] == "node-a" and samples[0]["gpus"] == EXPECTED_GPUS
    assert set(samples[0]["host"]) == {"cpu_percent", "mem_used", "mem_total", "cpus"}
    assert left == []

    # a GPU that goes wrong: its error is kept, the host is still sampled
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(broken_util=True))
    sampler = telemetry.NodeSampler(interval=1.0, node_id="node-a")
    try:
        time.sleep(1.3)      # a window of 1.3 s: one sample, the broken GPU left out of it
    finally:
        samples = sampler.stop()
    assert len(samples) == 1 and "gpus" not in samples[0] and "host" in samples[0]
    assert sampler.info()["errors"] == {"gpus": "NVMLError_GpuIsLost: GPU is lost"}


# -- storage ------------------------------------------------------------------------------------

def make_cluster(name: str = "telemetry") -> int:
    return registry.create(name, "local", {}, simulated=True, budget_usd=None, idle_minutes=None).id


def test_node_samples_round_trip():
    cluster_id = make_cluster()
    host_a = {"cpu_percent": 12.5, "mem_used": 3 * GIB, "mem_total": 16 * GIB}
    samples = [
        {"t": 1000.0, "node_id": "a", "host": host_a, "gpus": EXPECTED_GPUS},
        {"t": 1001.0, "node_id": "b", "host": {"mem_used": GIB, "mem_total": 8 * GIB}},
        {"t": 999.0, "node_id": "b",
         "host": {"cpu_percent": 50.0, "mem_used": GIB, "mem_total": 8 * GIB}},
    ]
    assert telemetry.record_node_samples(cluster_id, samples) == 5
    assert telemetry.record_node_samples(cluster_id, []) == 0

    frame = telemetry.node_samples_frame(cluster_id)
    assert list(frame.columns) == ["node_id", "at", "device", "uuid", *telemetry.METRICS]
    assert list(frame["at"]) == [999.0, 1000.0, 1000.0, 1000.0, 1001.0]
    assert list(frame["device"]) == ["host", "gpu0", "gpu1", "host", "host"]
    rows = frame.to_dict("records")
    for row, want in [(rows[1], EXPECTED_GPUS[0]), (rows[2], EXPECTED_GPUS[1])]:
        assert row["node_id"] == "a" and row["uuid"] == want["uuid"]
        for metric in telemetry.METRICS:
            assert (row[metric] == want[metric]) if metric in want else math.isnan(row[metric])
    assert rows[3]["cpu_percent"] == 12.5 and rows[3]["mem_used"] == 3 * GIB
    assert math.isnan(rows[3]["gpu_util"]) and math.isnan(rows[4]["cpu_percent"])

    window = telemetry.node_samples_frame(cluster_id, since=1000.0, until=1001.0)
    assert list(window["device"]) == ["gpu0", "gpu1", "host"]
    other = make_cluster("other")
    assert telemetry.node_samples_frame(other).empty
    assert list(telemetry.node_samples_frame(other).columns)[:3] == ["node_id", "at", "device"]


def test_an_older_database_gains_the_table_on_connect():
    """A state.db made before node_samples existed: connecting adds it and keeps what was there."""
    old_schema = store.SCHEMA.split("CREATE TABLE IF NOT EXISTS node_samples")[0]
    old_schema += store.SCHEMA.split("node_samples_by_time ON node_samples(cluster_id, at);")[1]
    assert "node_samples" not in old_schema
    with sqlite3.connect(store.path()) as db:
        db.executescript(old_schema)
        db.execute("INSERT INTO clusters (name, backend, spec, created)"
                   " VALUES ('old', 'local', '{}', 1.0)")
    names = {r["name"] for r in store.query("SELECT name FROM sqlite_master")}
    assert {"node_samples", "node_samples_by_time"} <= names
    assert [r["name"] for r in store.query("SELECT name FROM clusters")] == ["old"]
    sample = {"t": 5.0, "node_id": "n", "host": {"mem_used": 1}}
    assert telemetry.record_node_samples(1, [sample]) == 1


# -- real Ray -----------------------------------------------------------------------------------

def _ours(before: set[int], temp_dir: str) -> list[str]:
    """Live processes this test started: new descendants of this process, and any process run
    for our Ray temp dir (one Ray might have re-parented)."""
    me = psutil.Process()
    procs = {p.pid: p for p in me.children(recursive=True) if p.pid not in before}
    for proc in psutil.process_iter():
        try:
            if proc.pid != me.pid and temp_dir in " ".join(proc.cmdline()):
                procs[proc.pid] = proc
        except psutil.Error:
            continue
    found = []
    for proc in procs.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_samplers_on_a_real_ray_node(monkeypatch):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    temp_dir = tempfile.mkdtemp(prefix="gg-", dir="/tmp")   # short: Ray's socket paths live here
    try:
        ray.init(address="local", num_cpus=1, include_dashboard=False, _temp_dir=temp_dir,
                 logging_level="ERROR", log_to_driver=False)
        node_ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        handles = telemetry.start_samplers(node_ids, interval=0.1)
        infos = ray.get([h.info.remote() for h in handles], timeout=120)
        assert [i["node_id"] for i in infos] == node_ids
        for info in infos:
            assert info["interval"] == 1.0 and info["gpus_sampled"] is False
            assert info["why_not"].startswith("NVML not available: ")
        samples = []
        wait_until(lambda: samples.extend(ray.get(handles[0].drain.remote(), timeout=30)) or len(samples) >= 2,
                   30, "two samples from the first node")
        # the node's Ray workers' own CPU, against the spinning task's own count of it: the task
        # burns CPU seconds (not wall seconds), so a machine busy with other work only slows it
        @ray.remote(num_cpus=1)
        def spin(cpu_seconds):
            until = time.process_time() + cpu_seconds
            while time.process_time() < until:
                pass

        spinning = spin.remote(3.0)
        busy = []

        def core_seconds():
            # Σ work_cores × the time each reading covers, over the readings that have it
            readings = [s for s in samples[-1:] + busy if "work_cores" in s["host"]]
            return sum(b["host"]["work_cores"] * (b["t"] - a["t"]) for a, b in pairwise(readings))

        wait_until(lambda: busy.extend(ray.get(handles[0].drain.remote(), timeout=30)) or core_seconds() >= 1.8,
                   90, "the spinning task's CPU seconds in work_cores")
        ray.get(spinning, timeout=60)
        # no reading counts the one task twice (a core, plus its worker's threads and the clock's skew)
        assert max(s["host"]["work_cores"] for s in busy if "work_cores" in s["host"]) <= 1.5
        samples += busy
        left = telemetry.stop_samplers(handles)

        assert len(samples) >= 2
        assert all(s["node_id"] == node_ids[0] and "gpus" not in s for s in samples)
        assert all(set(s["host"]) == {"cpu_percent", "mem_used", "mem_total", "cpus", "work_cores"}
                   for s in samples[1:])
        times = [s["t"] for s in samples + left]
        assert all(b - a >= 0.99 for a, b in pairwise(times)), times

        cluster_id = make_cluster()
        assert telemetry.record_node_samples(cluster_id, samples + left) == len(samples + left)
        frame = telemetry.node_samples_frame(cluster_id)
        assert set(frame["device"]) == {"host"} and frame["gpu_util"].isna().all()
    finally:
        ray.shutdown()
        deadline = time.time() + 20
        while (left_behind := _ours(before, temp_dir)) and time.time() < deadline:
            time.sleep(0.5)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left_behind, f"processes left behind: {left_behind}"
