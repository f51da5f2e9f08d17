"""How ranks on different hosts form a torch process group — one way, for the workers and for
the doctor's probes: on the interface of this node's Ray address, rank 0's port reached within a
deadline (a rank that cannot reach it says so, naming both ends), then ``init_process_group``.

Standard library, psutil, Ray, torch and ``ports`` only: the doctor ships this module and
``ports`` to the nodes by value (cloudpickle), so a node without this package can use them.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from .. import ports

REACH_TIMEOUT_S = 30.0      # how long a rank tries rank 0's port before it says it cannot


def interface_of(ip: str) -> tuple[str | None, bool]:
    """The network interface that carries ``ip`` here, and whether it is a loopback one."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            return name, name == "lo" or ip.startswith("127.")
    return None, False


def use_interface_of(ip: str) -> str | None:
    """gloo and NCCL pick their interface from the host name, which on many machines resolves to
    127.0.0.1 (then ranks on other hosts are told to connect to loopback): use the interface
    that carries this node's Ray address instead, unless the user chose one."""
    name, _ = interface_of(ip)
    if name:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
    return os.environ.get("GLOO_SOCKET_IFNAME")


def reach(master: str, port: int, rank: int, timeout_s: float) -> None:
    """Wait until rank 0's rendezvous port opens; fail in one line, naming both ends, when it does
    not within ``timeout_s`` — rather than wait out the collective timeout."""
    import ray

    deadline = time.monotonic() + timeout_s
    while (why := ports.why_closed(master, port)) is not None:
        if time.monotonic() > deadline:
            raise ConnectionError(
                f"rank {rank} on {ray.util.get_node_ip_address()} cannot reach rank 0 at {master}:{port} "
                f"({why}) after {timeout_s:.0f} s — can the hosts reach each other on every port?")
        time.sleep(0.2)


def join(backend: str, rank: int, world_size: int, master: str, port: int, timeout_s: float, *,
         reached=None) -> str | None:
    """Join the process group; the gloo interface used. ``reached`` runs on a rank other than 0
    once rank 0's port answers, before the group forms (the workers open their cell line there)."""
    import ray
    import torch.distributed as dist

    interface = use_interface_of(ray.util.get_node_ip_address())
    if rank != 0:
        reach(master, port, rank, min(timeout_s, REACH_TIMEOUT_S))
        if reached is not None:
            reached()
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return interface
