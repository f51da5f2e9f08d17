"""Each host made ready to run this kernel's cluster, before anything is recorded or started: the
Python that runs Ray there found, or a runtime made (``onhost/runtime.py`` does it on the host).
All hosts at once, a line per host as it goes; a host already ready costs one SSH round trip.

A rented box seldom has Ray, and never at the kernel's version: the runtime is made for it, in a
venv of its own (so neither the user's Ray nor ours can break the other), with ``uv`` — sent from
here when the host has none and is the same kind of machine — or else with ``venv`` and pip. Nodes
that Ray's launcher starts are not asked first: this machine's uv travels with their files, and
each node takes it where it is the same kind of machine.
"""

from __future__ import annotations

import gzip
import json
import platform
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path

from ..cluster.remote import Remote
from ..cluster.spec import ClusterSpec
from ..config import home
from ..errors import GpugeekError
from ..versions import version_of
from . import ssh

SCRIPT = Path(__file__).resolve().parent.parent / "onhost" / "runtime.py"
UV_ON_HOST = "~/.gpugeek/bin/uv"
CHECK_TIMEOUT_S = 60
INSTALL_TIMEOUT_S = 1300
_packing = threading.Lock()


def order_for(remote: Remote) -> dict:
    """What the hosts must run: this kernel's Ray and torch (its Python minor version is said, not
    asked for: the hosts' runtime is made with their own Python), and the user's
    ``--python``, ``--no-install`` and ``--pip-index-url`` (from an ssh spec's ``remote``)."""
    ray, torch, minor = _kernel()
    return {"ray": ray, "torch": torch, "minor": minor,
            "python": remote.python, "install": remote.install, "index_url": remote.pip_index_url,
            # pip, for what a job installs there (Ray's pip environments are clones of the runtime)
            "extra": sorted({"pip", *remote.extra})}


@lru_cache(maxsize=1)
def _kernel() -> tuple[str | None, str | None, str]:
    """This kernel's Ray, torch and Python minor version (looked up once: a lookup reads files)."""
    return version_of("ray"), version_of("torch"), f"{sys.version_info.major}.{sys.version_info.minor}"


def python_on_host(order: dict | None = None) -> str:
    """The runtime's Python on a host, for this kernel (as ``onhost/runtime.py`` names its folder)."""
    order = order or order_for(Remote())
    return f"~/.gpugeek/runtime/ray-{order['ray']}/bin/python"


def ready(spec: ClusterSpec, say=print) -> list[dict]:
    """Each host's answer, in ``--hosts`` order, its runtime made first where needed: ``python``
    (what runs Ray there) and ``interfaces`` (its IPv4 addresses → interface names)."""
    order = order_for(spec.remote)
    key = spec.remote.ssh_key

    def one(target: ssh.Target) -> dict:
        answer = _call(target, key, "check", order, CHECK_TIMEOUT_S)
        if answer["ready"]:
            return answer
        began = time.monotonic()
        wanted = dict(order)
        if answer["uv"] is None and (packed := _uv_for(answer)) is not None:
            ssh.run(target, key, f"umask 077 && mkdir -p ~/.gpugeek/bin && gzip -dc > {UV_ON_HOST}.part && "
                                 f"chmod 755 {UV_ON_HOST}.part && mv {UV_ON_HOST}.part {UV_ON_HOST}",
                    packed, timeout=300)
            wanted["uv"] = UV_ON_HOST
        how = "uv" if answer["uv"] or "uv" in wanted else "venv and pip"
        if answer.get("adds"):
            say(f"{target}: adding {', '.join(answer['adds'])} to its runtime ({answer['folder']}) with {how}…",
                flush=True)
        else:
            say(f"{target}: making Ray {order['ray']} ready in {answer['folder']} with {how} (torch: "
                f"{answer['torch']})…", flush=True)
        done = _call(target, key, "install", wanted, INSTALL_TIMEOUT_S)
        say(f"{target}: ready in {time.monotonic() - began:.1f} s", flush=True)
        return done

    return ssh.on_hosts(ssh.parse_hosts(spec.remote.hosts), one)


def _call(target: ssh.Target, key: str | None, command: str, order: dict, timeout: float) -> dict:
    """``runtime.py COMMAND ORDER`` on the host, run by its ``python3``; its answer, or one line."""
    line = ssh.quote(json.dumps(order))
    remote = (f"p=$(command -v python3 || command -v python) || {{ echo '{{\"ok\": false, \"error\": "
              f"\"no python3 on the host — install Python 3.10 or newer there\"}}'; exit 1; }}; "
              f"exec \"$p\" - {command} {line}")
    answer = ssh.answer(target, command, ssh.run(target, key, remote, SCRIPT.read_text(), timeout))
    if not answer.get("ok"):
        raise GpugeekError(f"{target}: {answer.get('error')}")
    return answer


def _uv_for(host: dict) -> bytes | None:
    """This machine's uv, gzipped, when the host can run it (same OS and architecture)."""
    if host.get("system") != platform.system() or host.get("arch") != platform.machine():
        return None
    binary = _local_uv()
    return _packed(str(binary)) if binary is not None else None


def uv_for_nodes() -> dict | None:
    """The kind of machine this one's uv runs on, where it has one to ship to nodes not asked
    first (Ray's launcher starts them): ``onhost/runtime.py`` unpacks it on a node of that kind."""
    if platform.system() != "Linux" or _local_uv() is None:
        return None
    return {"system": platform.system(), "arch": platform.machine()}


def packed_uv() -> bytes:
    """This machine's uv, gzipped (``uv_for_nodes`` says there is one)."""
    return _packed(str(_local_uv()))


def _local_uv() -> Path | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return Path(find_uv_bin())
    except FileNotFoundError:
        return None


@lru_cache(maxsize=2)
def _packed(binary: str) -> bytes:
    """The binary gzipped once per kernel (every host takes the same bytes), cached on disk."""
    with _packing:
        source = Path(binary)
        cached = home() / "cache" / f"uv-{source.stat().st_size}-{int(source.stat().st_mtime)}.gz"
        if not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            part = cached.with_suffix(".part")
            part.write_bytes(gzip.compress(source.read_bytes(), compresslevel=6))
            part.replace(cached)
        return cached.read_bytes()
