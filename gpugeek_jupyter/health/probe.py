"""What ``doctor`` runs on each node: one small actor per node that reports the node's facts,
tries the ports the cluster needs, measures plain TCP throughput to every other node (one side
listens, the other sends), and all_reduce with every other node.

This module is shipped to the nodes by value (cloudpickle), not imported there: the doctor has
to work exactly when a node is broken — without this package, or with another version of it —
so it needs only the standard library, Ray, psutil and (for all_reduce) torch, and the
process-group setup the workers use (``launch/rendezvous.py``), shipped by value with it.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from ..launch import rendezvous
from ..ports import free_port, why_closed

PORT_TIMEOUT_S = 1.0
LATENCY_ROUNDS = 20              # small all_reduces per pair: their median is the latency
BANDWIDTH_BYTES = 4 << 20        # one all_reduce of at most this size, timed BANDWIDTH_ROUNDS times:
BANDWIDTH_ROUNDS = 5             # the quickest is the link's (a busy CPU only ever slows a round down)
LINK_BYTES = 64 << 20            # the most one side of a link test sends: a fast link is done early,
LINK_CHUNK = 256 << 10           # a slow one is cut at its deadline and its rate is what got through
CONNECT_S = 2.0                  # to open the link test's connection


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


def _sink(server: socket.socket, deadline_s: float, stop: threading.Event, out: dict) -> None:
    """Count what one sender sends for at most ``deadline_s``. The first read is left out of the
    rate: it may hold a burst that a rate limiter lets through before it bites."""
    began = time.monotonic()
    conn = None
    with server:
        server.settimeout(0.1)        # polled, so that ``stop`` ends the wait for a sender that failed
        while conn is None and not stop.is_set() and time.monotonic() - began < deadline_s + CONNECT_S:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
    if conn is None:
        out["why"] = "no connection came"
        return
    end = time.monotonic() + deadline_s
    first = last = None
    total = counted = 0
    buffer = bytearray(LINK_CHUNK)
    with conn:
        while (left := end - time.monotonic()) > 0:
            conn.settimeout(left)
            try:
                n = conn.recv_into(buffer)
            except OSError:           # the deadline, or the sender gave up
                break
            if not n:
                break
            last = time.perf_counter()
            if first is None:
                first = last
            else:
                counted += n
            total += n
    seconds = (last - first) if first is not None else 0.0
    out.update(bytes=total, seconds=seconds,
               bps=counted * 8 / seconds if counted and seconds > 0 else total * 8 / deadline_s)


class Probe:
    """One per node, pinned there; lives for one doctor run."""

    def __init__(self):
        self.rank: int | None = None
        self._sinks: dict[int, tuple[threading.Thread, threading.Event, dict]] = {}
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

    def listen(self, deadline_s: float) -> int:
        """A port on this node's Ray address where one sender's bytes are counted for at most
        ``deadline_s`` (in a thread: this actor stays free for ``received``)."""
        import ray

        server = socket.create_server((ray.util.get_node_ip_address(), 0))
        port = server.getsockname()[1]
        stop, out = threading.Event(), {}
        thread = threading.Thread(target=_sink, args=(server, deadline_s, stop, out), daemon=True)
        thread.start()
        self._sinks[port] = (thread, stop, out)
        return port

    def received(self, port: int, give_up: bool = False) -> dict:
        """What came in at ``port``: bytes, seconds and bits per second, or why nothing did."""
        thread, stop, out = self._sinks.pop(port)
        if give_up:
            stop.set()
        thread.join()
        return out

    def send(self, host: str, port: int, deadline_s: float) -> str | None:
        """Send LINK_BYTES to a peer's ``listen`` port, for at most ``deadline_s``; why not, in
        words, when no connection opens."""
        end = time.monotonic() + deadline_s
        try:
            conn = socket.create_connection((host, port), timeout=CONNECT_S)
        except OSError as exc:
            return "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        chunk, sent = memoryview(bytes(LINK_CHUNK)), 0
        with conn:
            try:
                while sent < LINK_BYTES and (left := end - time.monotonic()) > 0:
                    conn.settimeout(left)
                    sent += conn.send(chunk)
                if sent >= LINK_BYTES:            # all sent: wait for the peer to have read it all
                    conn.shutdown(socket.SHUT_WR)
                    conn.settimeout(max(0.01, end - time.monotonic()))
                    conn.recv(1)
            except OSError:                       # the deadline, or the peer stopped counting
                pass
            # drop what is still queued here rather than let it hold the link after the test
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return None

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

    def measure(self, pairs: list[tuple[int, int]], sizes: list[int], timeout_s: float) -> tuple[dict, dict]:
        """all_reduce between every pair, one pair at a time (the others wait at a barrier), so
        each figure is that link's alone; the bandwidth tensor of each pair is ``sizes`` bytes, so
        that a slow link's rounds end well within ``timeout_s``. Returns, for the pairs led here,
        {(i, j): (latency_ms, GB/s)}, and {(i, j): what went wrong, in words} as this side saw it."""
        import torch
        import torch.distributed as dist

        every = [dist.new_group(list(pair), timeout=timedelta(seconds=timeout_s)) for pair in pairs]
        out: dict = {}
        failed: dict = {}
        small = torch.ones(1)
        for pair, group, size in zip(pairs, every, sizes, strict=True):
            if self.rank in pair:
                try:
                    figures = _pair(dist, group, small, torch.ones(max(1, size // 4)))
                    if self.rank == pair[0]:
                        out[pair] = figures
                except RuntimeError as exc:     # torch's own words stay here: the kernel says it plainly
                    failed[pair] = in_words(exc, timeout_s)
            dist.barrier()
        return out, failed

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()



def _pair(dist, group, small, big) -> tuple[float, float]:
    """(median latency in ms, GB/s of the quickest round) of one pair's group."""
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
    return statistics.median(latencies) * 1e3, big.numel() * 4 / min(times) / 1e9


def in_words(exc: BaseException, timeout_s: float) -> str:
    """What a failed collective means, without the library's message (file paths, buffer names)."""
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        return f"timed out after {timeout_s:g} s"
    if "refused" in text:
        return "a connection was refused"
    if "reset" in text or "closed" in text or "broken pipe" in text:
        return "the connection dropped"
    return f"failed ({type(exc).__name__})"
