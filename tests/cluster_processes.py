"""For tests that start real clusters: their settings, waiting on them, and the processes of one
cluster we started, found by process session, for tests that stop it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil


def new_kernel(code: str, home, timeout: float = 180) -> subprocess.CompletedProcess:
    """``code`` run by a fresh Python process on the same ``$GPUGEEK_HOME``: a restarted kernel,
    or someone else's."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "GPUGEEK_HOME": str(home)})


def settings(home, **cluster) -> None:
    """Write ``[cluster]`` settings into the test's ``config.toml``."""
    home.mkdir(parents=True, exist_ok=True)
    body = "".join(f"{key} = {value}\n" for key, value in cluster.items())
    (home / "config.toml").write_text(f"[cluster]\n{body}")


def wait_until(predicate, timeout: float, what: str, every: float = 0.2):
    """``predicate()``'s first truthy value, polled every ``every`` s for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# What only Ray itself prints: its daemons' records are prefixed "(raylet)", "(raylet, ip=…)",
# "(pid=gcs_server)", "(autoscaler +3s)", a worker's "(pid=1234)" or "(RankWorker pid=1234, ip=…)";
# none belongs in a cell.
RAYS_OWN = re.compile(r"\((raylet|autoscaler)\b|\(pid=|\bpid=\d+[,)]|gcs_server")


def rays_own_lines(*outputs: str) -> list[str]:
    """The lines of a cell's captured output that Ray printed, not the cell or us."""
    return [line for text in outputs for line in text.splitlines() if RAYS_OWN.search(line)]


def of_cluster(record) -> list[psutil.Process]:
    """Every process in the cluster's Ray session or its watchdog's session."""
    procs = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) in (record.session_id, record.watchdog_pid):
                procs.append(proc)
        except OSError:
            continue
    return procs


def still_running(procs: list[psutil.Process], wait: float = 0.0) -> list[int]:
    """PIDs of ``procs`` still running (psutil checks the start time, so a reused PID is not
    taken for ours) after waiting up to ``wait`` seconds for them to end."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def kernel_line(kernel: subprocess.Popen, what: str, timeout: float, said: list[str] | None = None) -> str:
    """The first line a kernel process prints with ``what`` in it (every line read goes into
    ``said``); its last words and stderr in the failure when none comes within ``timeout``."""
    said = [] if said is None else said
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = kernel.stdout.readline()
        if not line:
            raise AssertionError(f"{said[-30:]}\n{kernel.stderr.read()[-3000:]}")
        said.append(line.strip())
        if what in line:
            return line.strip()
    raise AssertionError(f"no {what!r} from the kernel within {timeout} s: {said[-30:]}")
