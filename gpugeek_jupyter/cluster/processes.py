"""The processes we own, and only those.

``ray start`` and our watchdog are started in a session of their own, so every process they
spawn (GCS, raylets, autoscaler, workers, simulated nodes) carries that session id. Stopping a
cluster means signalling exactly the processes with that session id that were created after the
cluster was, in a session whose processes carry the cluster's marker in their environment
(``GPUGEEK_CLUSTER``) — so a reused pid can never make us stop a stranger. Never the Ray
CLI's own stop command, which would kill every Ray on the machine, a user's own too.

A kernel is known to a cluster as host:pid (``this_kernel``): whose job, whose worker group;
whether it still runs is asked here alone (``kernel_gone``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

LEAN_IMPORTS = Path(__file__).parent / "lean_imports"


def lean_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``lean_imports`` first on the path: modules that cost seconds of CPU in every
    Python process that imports Ray, and that none of them uses, are not loaded there."""
    path = [str(LEAN_IMPORTS), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def start_detached(cmd: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` as the leader of a new session, output to ``log``; it outlives the kernel.
    Its processes (a Ray head and all it starts, a watchdog) import lean (``lean_env``)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(cmd), env=lean_env(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )


MARKER = "GPUGEEK_CLUSTER"


def session_processes(session_id: int, since: float, marker: str | None = None) -> list[psutil.Process]:
    """Live processes in ``session_id`` created at or after ``since``.

    With ``marker``, the session counts as ours only if some process in it carries the marker
    (not every Ray process keeps its parent's environment, but the ones we start do), so a pid
    reused by a stranger's session never matches.
    """
    found, marked = [], marker is None
    for proc in psutil.process_iter(["create_time"]):
        try:
            if proc.pid == os.getpid() or os.getsid(proc.pid) != session_id:
                continue
            if proc.info["create_time"] + 1.0 < since or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if not marked and proc.environ().get(MARKER) == marker:
                marked = True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
        found.append(proc)
    return found if marked else []


def stop_processes(procs: Sequence[psutil.Process], grace: float = 3.0) -> int:
    """The one stop-with-grace: SIGTERM, then SIGKILL whatever still runs after ``grace`` seconds,
    and wait as long again for those to go. Returns how many there were."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [proc for proc in procs if alive(proc)]
        for proc in left:
            with contextlib.suppress(psutil.Error):     # gone meanwhile (psutil checks it is the same)
                proc.send_signal(sig)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            psutil.wait_procs(left, timeout=0.05)       # reaps our own children as they end
            left = [proc for proc in left if alive(proc)]
    return len(procs)


def stop_session(session_id: int, since: float, marker: str | None, grace: float = 3.0) -> int:
    """Stop every process of ours in ``session_id``; repeat for children spawned meanwhile."""
    stopped = 0
    for _ in range(3):
        procs = session_processes(session_id, since, marker)
        if not procs:
            break
        stopped += stop_processes(procs, grace)
    return stopped


def preempt_tree(proc: psutil.Process, grace: float = 2.0) -> int:
    """Shut a process tree down the way a reclaimed VM goes: SIGTERM, then SIGKILL."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    return stop_processes(family, grace)


def alive(proc: psutil.Process | int | None) -> bool:
    """The one liveness test: the process runs (a zombie has ended; it only waits for its parent)."""
    if not proc:
        return False
    try:
        proc = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def this_kernel() -> str:
    """This process as the cluster knows a kernel: host:pid (whose job, whose worker group)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def kernel_gone(kernel: str | None) -> bool | None:
    """Whether kernel ``kernel`` (host:pid) no longer runs: None when it ran on another machine,
    which this one cannot see."""
    host, _, pid = (kernel or "").partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return not alive(int(pid))


def process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
