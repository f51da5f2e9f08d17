"""The SSH tunnel to a remote head: the one way this machine reaches a cluster it is not part of.

A head's ports stay closed to the laptop; one ``ssh`` forwards two of them to 127.0.0.1 here: the
keeper's line (on the head's own loopback: the kernel talks to the keeper through it, ``line/``;
on a Slurm cluster the SSH host is the login node, and the keeper listens on the head node's
address, behind the cluster's token) and the GCS (the watchdog, status and the Lab sidebar read
Ray's node table through it). The tunnel is a process of the cluster's own — in a session of its
own, carrying the cluster's marker — so it outlives a kernel restart (the next kernel finds it by
name) and ``down`` stops it with the rest.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .. import ports
from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.remote import LineOpened, learn
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..meter import ledger
from . import ssh

OPEN_TIMEOUT_S = 20
HOLD_S = 2**31 - 1     # the session's remote command only holds it open; it ends with the session


@dataclass(frozen=True)
class Tunnel:
    pid: int
    gcs: str          # 127.0.0.1:PORT here → the head's GCS
    line: str         # 127.0.0.1:PORT here → the keeper's line on the head's loopback


def open_tunnel(record: ClusterRecord, spec: ClusterSpec, wanted: tuple[int, int] | None = None) -> Tunnel:
    """Start the tunnel (on the ``wanted`` ports here when given and free) and wait until both ends
    answer."""
    remote = spec.remote
    head = ssh.parse_hosts([remote.head])[0]
    gcs_port, line_port = wanted if wanted and all(ports.is_free(p, reuse=True) for p in wanted) else (
        ports.free_ports(2))
    forward = [f"-L127.0.0.1:{gcs_port}:{remote.head_ip}:{remote.gcs_port}",
               f"-L127.0.0.1:{line_port}:{remote.keeper_host or '127.0.0.1'}:{remote.keeper_port}"]
    # a terminal session, not `-N`: only then do both ends of SSH turn Nagle's algorithm off
    # (TCP_NODELAY), and every small Ray Client request stops waiting out a 40 ms delayed ACK
    # the hold carries the cluster's marker, so the head's own stop ends it (and this tunnel with it)
    hold = f"exec env {processes.MARKER}={ssh.quote(record.marker)} sleep {HOLD_S}"
    cmd = ssh.argv(head, remote.ssh_key, "-tt", hold, known_hosts=remote.known_hosts)
    cmd[1:1] = ["-o", "ExitOnForwardFailure=yes", *forward]
    log = ssh.local_dir(record.name, record.id) / "tunnel.log"
    proc = processes.start_detached(cmd, {**os.environ, processes.MARKER: record.marker}, log)
    deadline = time.monotonic() + OPEN_TIMEOUT_S
    while not (ports.answers("127.0.0.1", gcs_port, 0.5) and ports.answers("127.0.0.1", line_port, 0.5)):
        if proc.poll() is not None or time.monotonic() > deadline:
            processes.stop_session(proc.pid, record.created, record.marker, grace=1)
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise GpugeekError(f"the SSH tunnel to {head} did not open ({'; '.join(tail) or 'no answer'}) "
                               f"— check that `ssh` reaches the head; its log: {log}")
        time.sleep(0.05)
    return Tunnel(proc.pid, f"127.0.0.1:{gcs_port}", f"127.0.0.1:{line_port}")


@contextmanager
def held(record: ClusterRecord):
    """The cluster's tunnel, one process at a time (the kernel and the watchdog may both find it
    dropped, or its head moved)."""
    with open(ssh.local_dir(record.name, record.id) / "tunnel.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(record: ClusterRecord) -> ClusterRecord:
    """The record with a live tunnel: the one it has if that still forwards, else a new one on the
    same local ports where they are free (so addresses others hold stay good, and a kernel whose
    line dropped dials the new one)."""
    with held(record):
        return _ensure(registry.get(record.id))


def moved(record: ClusterRecord, *facts) -> ClusterRecord:
    """The head moved (a requeued Slurm job's next run; the caller holds ``held``): what was
    learned of it recorded, the tunnel to the old head stopped and one to the new opened on the
    same local ports where they are free — a kernel's line dials the new keeper where it did."""
    learn(ClusterSpec.from_json(record.spec), *facts, record_id=record.id)
    if record.session_id and processes.alive(record.session_id):
        processes.stop_session(record.session_id, record.created, record.marker, grace=1)
    registry.update(record.id, session_id=None)      # (not a tunnel that dropped: the caller says why)
    return _ensure(registry.get(record.id))


def _ensure(record: ClusterRecord) -> ClusterRecord:
    spec = ClusterSpec.from_json(record.spec)
    if record.session_id and processes.alive(record.session_id) and record.address and ports.answers(
            "127.0.0.1", int(record.address.rpartition(":")[2]), 0.5):
        return record
    if record.session_id and processes.alive(record.session_id):
        processes.stop_session(record.session_id, record.created, record.marker, grace=1)
    wanted = None
    if record.address and spec.remote.line_address:
        wanted = (int(record.address.rpartition(":")[2]), int(spec.remote.line_address.rpartition(":")[2]))
    tunnel = open_tunnel(record, spec, wanted)
    learn(spec, LineOpened(line_address=tunnel.line), record_id=record.id, session_id=tunnel.pid, address=tunnel.gcs)
    if record.session_id:            # whoever found it dropped (a kernel's line, the watchdog) says so
        ledger.event(record.id, "tunnel", f"the SSH tunnel to the head had dropped; reopened it on the same ports "
                                          f"({tunnel.gcs})" if wanted and tunnel.gcs == record.address else
                     f"the SSH tunnel to the head had dropped; reopened it at {tunnel.gcs}")
    return registry.get(record.id)


def forwards(address: str | None) -> bool:
    """Whether what listens at ``address`` here (a tunnel's end) reaches a server: SSH accepts the
    connection locally and closes it at once when nothing answers at the head's port. Ray's
    client would wait ~35 s to find that out."""
    host, _, port = (address or "").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=0.5) as sock:
            sock.settimeout(0.5)
            return sock.recv(1) != b""      # a gRPC server waits for the client to speak first
    except TimeoutError:
        return True
    except (OSError, ValueError):
        return False


