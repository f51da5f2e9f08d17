"""What ``doctor`` runs on each node: one small actor per node that reports the node's facts,
tries the ports the cluster needs, and measures all_reduce with every other node.

This module is shipped to the nodes by value (cloudpickle), not imported there: the doctor has
to work exactly when a node is broken — without this package, or with another version of it —
so it needs only the standard library, Ray, psutil and (for all_reduce) torch, and the
process-group setup the workers use (``workers/rendezvous.py``), shipped by value with it.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..ports import free_port, why_closed
from ..workers import rendezvous

PORT_TIMEOUT_S = 1.0
LATENCY_ROUNDS = 20              # small all_reduces per pair: their median is the latency
BANDWIDTH_BYTES = 4 << 20        # one all_reduce of this size, timed BANDWIDTH_ROUNDS times: the
BANDWIDTH_ROUNDS = 5             # quickest is the link's (a busy CPU only ever slows a round down)


def versions(packages: list[str]) -> dict:
    """Python and each package's installed version (None: not installed), as pip sees them."""
    import platform
    from importlib import metadata

    found: dict = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _gpus() -> dict:
    """GPUs as NVML sees them (nvidia-ml-py), and the driver; empty without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {"names": [n.decode() if isinstance(n, bytes) else n for n in names],
                "driver": driver.decode() if isinstance(driver, bytes) else driver}
    finally:
        pynvml.nvmlShutdown()


def _load_torch() -> None:
    # c10d warns on every connection whose peer has no reverse DNS entry (common on private
    # networks): its C++ warnings would fill the cell, so the probe keeps only errors
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch.distributed  # noqa: F401


class Probe:
    """One per node, pinned there; lives for one doctor run."""

    def __init__(self):
        self.rank: int | None = None
        # torch takes seconds to import: load it while the facts are gathered and sent
        self._torch = threading.Thread(target=_load_torch, daemon=True)
        self._torch.start()

    def facts(self, packages: list[str], ports: list[tuple[str, str, int]]) -> dict:
        """Versions, the interface the node's Ray address is on, GPUs, the clock, and which of
        ``ports`` (label, host, port) this node could open a connection to."""
        import ray

        ip = ray.util.get_node_ip_address()
        interface, loopback = rendezvous.interface_of(ip)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(ports)))) as pool:
            tried = list(pool.map(lambda p: why_closed(p[1], p[2]), ports))
        return {"ip": ip, "hostname": socket.gethostname(), "versions": versions(packages),
                "interface": interface, "loopback": loopback, "gpus": _gpus(), "pid": os.getpid(),
                "ports": {label: why for (label, _, _), why in zip(ports, tried, strict=True)}, "time": time.time()}

    def clock(self) -> float:
        return time.time()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port on it (the rank 0 probe hosts the rendezvous)."""
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def join(self, rank: int, world_size: int, master: str, port: int, timeout_s: float) -> dict:
        """A gloo process group over the interface of this node's Ray address; what torch says
        of CUDA and NCCL here."""
        self._torch.join()
        import torch

        interface = rendezvous.join("gloo", rank, world_size, master, port, timeout_s)
        self.rank = rank
        cuda = torch.cuda.is_available()
        nccl = None
        if cuda:
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except (AttributeError, RuntimeError):   # a torch built without NCCL
                nccl = None
        return {"cuda": cuda, "cuda_version": torch.version.cuda, "nccl": nccl,
                "devices": torch.cuda.device_count() if cuda else 0,
                "gloo_interface": interface}

    def measure(self, pairs: list[tuple[int, int]]) -> dict:
        """all_reduce between every pair, one pair at a time (the others wait at a barrier), so
        each figure is that link's alone. Returns {(i, j): (latency_ms, GB/s)} for pairs led here."""
        import torch
        import torch.distributed as dist

        groups = [dist.new_group(list(pair)) for pair in pairs]     # every rank makes every group
        out: dict = {}
        small, big = torch.ones(1), torch.ones(BANDWIDTH_BYTES // 4)
        for pair, group in zip(pairs, groups, strict=True):
            if self.rank in pair:
                dist.all_reduce(small, group=group)                   # connect, warm up
                dist.all_reduce(big, group=group)
                latencies = []
                for _ in range(LATENCY_ROUNDS):
                    began = time.perf_counter()
                    dist.all_reduce(small, group=group)
                    latencies.append(time.perf_counter() - began)
                times = []
                for _ in range(BANDWIDTH_ROUNDS):
                    began = time.perf_counter()
                    dist.all_reduce(big, group=group)
                    times.append(time.perf_counter() - began)
                if self.rank == pair[0]:
                    out[pair] = (statistics.median(latencies) * 1e3, BANDWIDTH_BYTES / min(times) / 1e9)
            dist.barrier()
        return out

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

