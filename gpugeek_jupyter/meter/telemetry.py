"""Per-node telemetry: what each machine's GPUs and host are doing, at most once a second.

One ``NodeSampler`` actor runs on each node (pinned there, ``num_cpus=0`` so it never takes a
slot from training). A daemon thread samples every ``interval`` seconds — never more often than
1 Hz — into a bounded buffer; the notebook drains the buffers and writes them into the ledger's
``node_samples`` table (one row per node, instant and device: ``host``, ``gpu0``, ``gpu1`` …).

GPU rows come from NVML and are sampled only on nodes where NVML initialises (decided once, when
the sampler starts); elsewhere ``info()`` says why. A metric a GPU does not support is left out
of its row — nothing is filled in — and reads back as NaN.

Beside the host's CPU, a sampler on a Ray node reads the CPU its node's Ray workers use (with
their children: data loaders), in cores (``work_cores``): the job's own work, which other work on
a shared host — or the simulated nodes that share this machine — does not inflate.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import psutil

from .. import store

if TYPE_CHECKING:  # the samplers on the nodes never build a table
    import pandas as pd

MIN_INTERVAL_S = 1.0          # the cap: at most one sample per second per node
BUFFER_SAMPLES = 3600         # an hour at 1 Hz; if undrained, the oldest are dropped (and counted)
GPU_METRICS = ("gpu_util", "gpu_mem_used", "gpu_mem_total", "power_w")
HOST_METRICS = ("cpu_percent", "mem_used", "mem_total", "cpus", "work_cores")
METRICS = GPU_METRICS + HOST_METRICS

_nvml_lock = threading.Lock()
_nvml: tuple[bool, str | None] | None = None     # (initialised, why not) once tried
_cpu_primed = False


# -- sampling functions -------------------------------------------------------------------------

def _nvml_state() -> tuple[bool, str | None]:
    """Try ``nvmlInit`` once per process; its answer does not change while the process lives."""
    global _nvml
    with _nvml_lock:
        if _nvml is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml = (True, None)
            except ImportError as exc:
                _nvml = (False, f"NVML not available: pynvml not installed ({exc})")
            except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, …
                _nvml = (False, f"NVML not available: {exc}")
        return _nvml


def nvml_available() -> bool:
    """True only if NVML initialised in this process (a driver and a GPU are here)."""
    return _nvml_state()[0]


def nvml_unavailable_reason() -> str | None:
    """Why GPUs are not sampled here, e.g. ``NVML not available: NVML Shared Library Not Found``."""
    return _nvml_state()[1]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_samples() -> list[dict]:
    """One dict per GPU on this node, by NVML's index; [] where NVML does not initialise.

    A metric the GPU reports as not supported is left out of its dict. Any other NVML error
    propagates: the sampler records it rather than hiding a GPU that has gone wrong.
    """
    if not nvml_available():
        return []
    import pynvml

    def supported(read: Callable):
        try:
            return read()
        except pynvml.NVMLError_NotSupported:
            return None

    rows = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        row: dict = {"gpu": index, "uuid": _text(pynvml.nvmlDeviceGetUUID(handle))}
        util = supported(lambda handle=handle: pynvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            row["gpu_util"] = util.gpu
        memory = supported(lambda handle=handle: pynvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            row["gpu_mem_used"], row["gpu_mem_total"] = int(memory.used), int(memory.total)
        milliwatts = supported(lambda handle=handle: pynvml.nvmlDeviceGetPowerUsage(handle))
        if milliwatts is not None:
            row["power_w"] = milliwatts / 1000.0
        rows.append(row)
    return rows


def host_sample() -> dict:
    """This node's CPU % (since the previous call) and memory in bytes.

    psutil's first ``cpu_percent(None)`` in a process has no previous reading and returns a
    meaningless 0.0, so that first call leaves ``cpu_percent`` out.
    """
    global _cpu_primed
    cpu = psutil.cpu_percent(None)
    memory = psutil.virtual_memory()
    row = {"cpu_percent": cpu} if _cpu_primed else {}
    _cpu_primed = True
    row.update(mem_used=int(memory.used), mem_total=int(memory.total), cpus=psutil.cpu_count() or 1)
    return row


class WorkCpu:
    """CPU cores this node's Ray workers and their children used since the last reading: the
    processes its raylet started (``ray::…``, not Ray's own agents, not this sampler), read from
    their CPU times. Only in a process whose parent is a raylet; None elsewhere and at first."""

    def __init__(self):
        try:
            parent = psutil.Process().parent()
            self._raylet = parent if parent is not None and parent.name() == "raylet" else None
        except psutil.Error:
            self._raylet = None
        self._last: dict[int, tuple[float, float]] = {}     # pid → (its start, CPU seconds)
        self._at: float | None = None

    def read(self) -> float | None:
        if self._raylet is None:
            return None
        now, seen = time.monotonic(), {}
        for proc in self._workers():
            try:
                times = proc.cpu_times()
                seen[proc.pid] = (proc.create_time(), times.user + times.system)
            except psutil.Error:
                continue
        cores = None
        if self._at is not None and now > self._at:
            used = sum(cpu - self._last[pid][1] for pid, (started, cpu) in seen.items()
                       if pid in self._last and self._last[pid][0] == started)
            cores = max(0.0, used) / (now - self._at)
        self._last, self._at = seen, now
        return cores

    def _workers(self) -> list[psutil.Process]:
        found = []
        try:
            children = self._raylet.children()
        except psutil.Error:
            return found
        for child in children:
            try:
                name = child.name()
                if child.pid != os.getpid() and name.startswith("ray::") and not name.endswith("Agent"):
                    found += [child, *child.children(recursive=True)]
            except psutil.Error:
                continue
        return found


# -- the per-node actor -------------------------------------------------------------------------

class NodeSampler:
    """Samples its node every ``interval`` s (≥ 1 s) on a daemon thread until ``stop()``.

    A plain class: ``start_samplers`` wraps it with ``ray.remote`` and pins one to each node.
    ``drain()`` only takes a lock around the buffer, never waits for a sample in progress, so a
    slow NVML call cannot stall the notebook.
    """

    def __init__(self, interval: float = MIN_INTERVAL_S, node_id: str | None = None,
                 buffer: int = BUFFER_SAMPLES, gpus: bool = True):
        if node_id is None:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        self.node_id, self.hostname = node_id, socket.gethostname()
        self.interval = max(float(interval), MIN_INTERVAL_S)
        self._gpus, self._why_not = _nvml_state() if gpus else (
            False, "simulated node: its GPUs are declared, not devices (the host's GPUs are not its own)")
        # decided once: a node without NVML never tries it again
        self._work = WorkCpu()
        self._sources: list[tuple[str, Callable]] = [("host", self._host)]
        if self._gpus:
            self._sources.append(("gpus", gpu_samples))
        host_sample()                 # primes cpu_percent so the first sample has a real one
        self._work.read()             # and the workers' CPU times
        self._buffer: deque[dict] = deque(maxlen=buffer)
        self._lock = threading.Lock()
        self._dropped = 0
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpugeek-node-sampler", daemon=True)
        self._thread.start()

    def _host(self) -> dict:
        row = host_sample()
        cores = self._work.read()
        if cores is not None:
            row["work_cores"] = cores
        return row

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            started = time.monotonic()
            self._take()
            # from this sample's start, not a fixed grid: a late sample never causes a burst
            next_at = started + self.interval

    def _take(self) -> None:
        sample: dict = {"t": time.time(), "node_id": self.node_id}
        for name, read in self._sources:
            try:
                sample[name] = read()
            except Exception as exc:  # noqa: BLE001 - keep sampling the rest; info() shows what failed
                self._errors[name] = f"{type(exc).__name__}: {exc}"
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self._dropped += 1
            self._buffer.append(sample)

    def drain(self) -> list[dict]:
        """Samples taken since the last drain, oldest first: ``{t, node_id, host, gpus?}``."""
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
        return out

    def info(self) -> dict:
        return {"node_id": self.node_id, "hostname": self.hostname, "interval": self.interval,
                "gpus_sampled": self._gpus, "why_not": self._why_not,
                "dropped": self._dropped, "errors": dict(self._errors)}

    def stop(self) -> list[dict]:
        """Stop the thread; returns what was not drained yet, so nothing sampled is lost."""
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        return self.drain()


def start_samplers(node_ids: Iterable[str], interval: float = MIN_INTERVAL_S, gpus: bool = True,
                   detached: bool = False) -> list:
    """One ``NodeSampler`` actor pinned to each node (hard affinity), in ``node_ids`` order.
    ``gpus=False`` (simulated nodes) samples the host only; ``detached``: they outlive this
    process's connection (a worker group's, which its rank 0 asks)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(NodeSampler)
    return [actor.options(num_cpus=0, name=None, lifetime="detached" if detached else None,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                          ).remote(interval, gpus=gpus)
            for node_id in node_ids]


def stop_samplers(handles: Iterable, timeout: float = 10.0) -> list[dict]:
    """Stop and kill the samplers; returns the samples they still held (lost nodes give none)."""
    import ray

    handles = list(handles)
    refs = [h.stop.remote() for h in handles]
    left: list[dict] = []
    try:
        for ref in refs:
            try:
                left.extend(ray.get(ref, timeout=timeout))
            except (ray.exceptions.RayError, TimeoutError):
                pass                  # the node is gone: its samples went with it
    finally:
        for h in handles:
            ray.kill(h)
    return left


# -- the ledger's node_samples table ------------------------------------------------------------

def record_node_samples(cluster_id: int, samples: Iterable[dict]) -> int:
    """Write drained samples as one row per (node, instant, device), in one transaction."""
    rows = []
    for s in samples:
        at, node_id = float(s["t"]), s["node_id"]
        if "host" in s:
            rows.append((cluster_id, node_id, at, "host", json.dumps(s["host"])))
        for gpu in s.get("gpus") or ():
            metrics = {k: v for k, v in gpu.items() if k != "gpu"}
            rows.append((cluster_id, node_id, at, f"gpu{gpu['gpu']}", json.dumps(metrics)))
    if rows:
        with store.transaction(durable=False) as db:
            db.executemany("INSERT INTO node_samples (cluster_id, node_id, at, device, metrics)"
                           " VALUES (?,?,?,?,?)", rows)
    return len(rows)


def node_samples_frame(cluster_id: int, since: float | None = None,
                       until: float | None = None, metrics: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows with ``since <= at < until``, sorted by ``at``: node_id, at, device, uuid, then one
    float column per metric (NaN where that device did not report it). ``metrics`` picks a few
    (read by SQLite's ``json_extract``: hours of samples load in a fraction of the time)."""
    import pandas as pd

    if metrics is not None:
        return _metrics_frame(cluster_id, since, until, list(metrics))
    sql = "SELECT node_id, at, device, metrics FROM node_samples WHERE cluster_id=?"
    params: list = [cluster_id]
    if since is not None:
        sql, params = sql + " AND at>=?", [*params, since]
    if until is not None:
        sql, params = sql + " AND at<?", [*params, until]
    records = [{"node_id": r["node_id"], "at": r["at"], "device": r["device"],
                **json.loads(r["metrics"])}
               for r in store.query(sql + " ORDER BY at, node_id, device", tuple(params))]
    columns = ["node_id", "at", "device", "uuid", *METRICS]
    columns += sorted({k for r in records for k in r} - set(columns))
    frame = pd.DataFrame(records, columns=columns)
    frame["at"] = frame["at"].astype(float)
    frame[list(METRICS)] = frame[list(METRICS)].astype(float)
    return frame


def _metrics_frame(cluster_id: int, since, until, metrics: list[str]) -> pd.DataFrame:
    import pandas as pd

    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metrics: {sorted(unknown)}")
    picks = "".join(f", json_extract(metrics, '$.{m}') AS {m}" for m in metrics)
    sql = f"SELECT node_id, at, device{picks} FROM node_samples WHERE cluster_id=?"
    params: list = [cluster_id]
    if since is not None:
        sql, params = sql + " AND at>=?", [*params, since]
    if until is not None:
        sql, params = sql + " AND at<?", [*params, until]
    rows = store.query(sql + " ORDER BY at, node_id, device", tuple(params))
    frame = pd.DataFrame([tuple(r) for r in rows], columns=["node_id", "at", "device", *metrics])
    return frame.astype({"at": float, **{m: float for m in metrics}})
