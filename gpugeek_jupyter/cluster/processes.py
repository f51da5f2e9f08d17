"""The processes we own, and only those.

``ray start`` and our watchdog are started in a session of their own, so every process they
spawn (GCS, raylets, autoscaler, workers, simulated nodes) carries that session id. Stopping a
cluster means signalling exactly the processes with that session id that were created after the
cluster was, in a session whose processes carry the cluster's marker in their environment
(``GPUGEEK_CLUSTER``) — so a reused pid can never make us stop a stranger. Never the Ray
CLI's own stop command, which would kill every Ray on the machine, a user's own too.
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_detached(cmd: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` as the leader of a new session, output to ``log``; it outlives the kernel."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
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
    """SIGTERM, then SIGKILL whatever is left after ``grace`` seconds. Returns how many stopped."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)
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
    for member in family:
        with contextlib.suppress(psutil.Error):
            member.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(m) for m in family):
        time.sleep(0.05)
    for member in family:
        if _running(member):
            with contextlib.suppress(psutil.Error):
                member.send_signal(signal.SIGKILL)
    return len(family)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
