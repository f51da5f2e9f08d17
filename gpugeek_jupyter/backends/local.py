"""Start a Ray head on this machine as a process tree of its own.

``ray start --head`` runs in a new session with its own temp dir and free ports, so it survives a
kernel restart, never collides with another Ray on the machine (a user's ``ray.init()`` included)
and can be stopped exactly. Ray's GCS listens on every interface, so our heads run with Ray's
token authentication on (``RAY_AUTH_MODE=token``): nobody without the token can reach them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .. import ports
from ..cluster import processes
from ..errors import GpugeekError
from ..onhost import marks
from ..onhost.script import HEAD_START
from ..raynodes import HEAD_ENV, use_token_auth
from . import readiness
from .base import REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started

HOST = "127.0.0.1"
START_TIMEOUT_S = 120


@dataclass
class Head:
    address: str
    session_id: int
    temp_dir: str
    pids: list[int]
    dashboard_url: str | None = None


def new_temp_dir(marker: str) -> str:
    """Short on purpose: Ray puts unix sockets under it and those paths must stay < 108 bytes. Marked
    the cluster's (``onhost/marks.py``): its stop removes it by that mark, not by its name."""
    folder = tempfile.mkdtemp(prefix="gg-", dir="/tmp" if os.path.isdir("/tmp") else None)
    marks.mark_folder(folder, marker)
    return folder


# Ray gives a new node's raylet 30 s to register with the GCS, and the raylet gives its dashboard
# agent (a Python process with a long import) 15 s to report its ports; neither is configurable. A
# machine busy enough misses them: the head then starts again, up to START_TRIES in all
SLOW_START = "timed out during startup"
# a free port found here can be taken before Ray binds it (by any connection's own local port,
# drawn from the same range): the head then starts again on other ports
PORT_TAKEN = ("Failed to start the grpc server", "Address already in use")
START_TRIES = 3


class _SlowStart(GpugeekError):
    pass


class _PortTaken(GpugeekError):
    pass


def start_head(temp_dir: str, marker: str, port_chosen: Callable[[int], None] | None = None, **kwargs) -> Head:
    """``ray start --head`` (see ``_start_head``), again if Ray's own startup wait ran out or a port
    was taken before Ray could bind it. ``port_chosen(port)`` hears the GCS port before
    each try (the sim backend's autoscaler config names it)."""
    for attempt in range(1, START_TRIES + 1):
        port, dashboard_port = ports.free_ports(2)   # both at once: never one twice
        if port_chosen is not None:
            port_chosen(port)
        try:
            return _start_head(temp_dir, marker, port=port, dashboard_port=dashboard_port, **kwargs)
        except _PortTaken as exc:
            if attempt == START_TRIES:
                raise GpugeekError(str(exc)) from None
        except _SlowStart as exc:
            if attempt == START_TRIES:
                raise GpugeekError(str(exc)) from None
            print("note: Ray's head did not start within Ray's own waits (a busy machine?) — starting it once "
                  "more", flush=True)
    raise AssertionError("unreachable")


def _start_head(temp_dir: str, marker: str, *, num_cpus: int | None = None, num_gpus: int | None = None,
                autoscaling_config: Path | None = None, env: dict[str, str] | None = None,
                port: int, dashboard_port: int, dashboard: bool = False) -> Head:
    """``dashboard``: Ray's dashboard on ``dashboard_port`` of 127.0.0.1 (token-protected like the
    rest). No Ray Client server (``HEAD_START``, as on a remote head): a kernel here joins as a
    driver, so it would be a Python process and an open port that nothing uses."""
    dashboard_port = dashboard_port if dashboard else None
    cmd = [
        sys.executable, "-c", HEAD_START,
        "start", "--head", f"--node-ip-address={HOST}", f"--port={port}", "--dashboard-agent-listen-port=0",
        "--disable-usage-stats", f"--temp-dir={temp_dir}",
    ]
    if dashboard_port:
        cmd += ["--include-dashboard=true", f"--dashboard-host={HOST}", f"--dashboard-port={dashboard_port}"]
    else:
        cmd.append("--include-dashboard=false")
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    if autoscaling_config is not None:
        cmd.append(f"--autoscaling-config={autoscaling_config}")
    else:
        cmd.append("--no-monitor")  # no autoscaler on a one-machine cluster: one process fewer
    use_token_auth()
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", **HEAD_ENV,
                processes.MARKER: marker, **(env or {})}
    log = Path(temp_dir) / "gpugeek-head.log"
    since = time.time()
    proc = processes.start_detached(cmd, full_env, log)
    try:
        import ray  # noqa: F401  - the kernel needs it to connect; load it while the head starts

        code = proc.wait(timeout=START_TIMEOUT_S)
    except BaseException:  # a timeout, or Ctrl-C in the notebook: leave nothing running
        processes.stop_session(proc.pid, since, marker)
        raise
    if code != 0:
        processes.stop_session(proc.pid, since, marker)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        said = f"the Ray head did not start ({'; '.join(tail) or f'exit {code}'}) — full log: {log}"
        said_there = " ".join(tail)
        raise (_SlowStart if SLOW_START in said_there else _PortTaken if any(
            sign in said_there for sign in PORT_TAKEN) else GpugeekError)(said)
    pids = [p.pid for p in processes.session_processes(proc.pid, since, marker)]
    return Head(address=f"{HOST}:{port}", session_id=proc.pid, temp_dir=temp_dir, pids=pids,
                dashboard_url=f"http://{HOST}:{dashboard_port}" if dashboard_port else None)


class LocalBackend(Backend):
    name = "local"
    launches = watched = runs_here = local_price = True
    cannot = MappingProxyType({
        Feature.SCALE: "the local backend is this one machine — `up --backend sim` rehearses a cluster that scales",
        Feature.PREEMPT: REHEARSAL_ONLY,
    })
    confirm = grows = tunnelled = simulated = from_offers = your_hosts = False
    kernel_joins = "driver"
    notices = provider = scheduler = None

    def show(self, name, spec):
        text = ("ray start --head --node-ip-address=127.0.0.1 --port=<free port> "
                "--include-dashboard=false --temp-dir=/tmp/gg-<random>")
        return LaunchConfig(self.name, text, None, "run without --dry-run to start it", {})

    def readiness(self, asked):
        return readiness.here(self.name)

    def start(self, record, spec):
        temp_dir = new_temp_dir(record.marker)
        started = start_head(temp_dir, record.marker, dashboard=spec.dashboard)
        return Started(started.address, started.session_id, started.pids, temp_dir, started.dashboard_url)

    def stop(self, record, grace=3.0):
        if record.session_id:
            processes.stop_session(record.session_id, record.created, record.marker, grace)
        if record.temp_dir:
            marks.remove_ours(record.temp_dir, record.marker)
