"""The notebook machine's side of a remote cluster's head watchdog (``guard/headwatch.py``):
starting it with the cluster, what this machine tells it, and copying its ledger back.

The head's watchdog enforces the budget cap and the idle stop, so they hold while this machine
sleeps or is cut off. This machine's own watchdog still runs while it can: it keeps the tunnel
open, writes its idleness verdict for the head (it sees what the head cannot: a notebook's cells,
a job's device readings) and, should the head's watchdog stop beating, enforces the limits itself.
Whenever the head answers over SSH, its ledger — node lifetimes, events, the stop — replaces this
machine's for the cluster (``pull``), so the dollars shown here are the head's.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time
from pathlib import Path, PurePosixPath

from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.remote import Guarded, Remote
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..meter import ledger
from ..raynodes import ClusterUnreachable, kv_get, kv_put
from . import ssh

PACKAGE = Path(__file__).resolve().parent.parent
# What the head's watchdog (guard/headwatch.py) imports, and nothing else: named, not guessed —
# and the host script it reads as text (remote/ssh.py's ONHOST: each node's stop runs it), not
# imported. tests/test_headguard.py holds this list against the imports it reaches and runs the
# watchdog from the archive alone.
HEAD_PACKAGE = ("__init__.py", "lean.py", "errors.py", "config.py", "units.py", "vocab.py", "store.py", "raynodes.py",
                "ports.py", "versions.py", "meter/allocation.py",
                "meter/__init__.py", "meter/activity.py", "meter/ledger.py", "meter/instances.py",
                "guard/__init__.py", "guard/health.py", "guard/lifecycle.py", "guard/watchdog.py",
                "guard/clusterjobs.py", "guard/headwatch.py", "guard/jobend.py", "guard/keeping.py",
                "guard/launches.py", "guard/cloudhead.py",
                "cluster/", "remote/", "backends/", "clouds/", "onhost/__init__.py", "onhost/script.py",
                "onhost/marks.py")
# What the keeper (keeper/serve.py, started by the head's watchdog) needs besides: the warm groups
# and their driver (``group/``, as a local kernel drives them), the doctor's look at the nodes, the
# line — nothing of a kernel's rooms (``cells/``, ``kernel/``). tests/test_headguard.py holds it to
# the keeper's imports as it holds HEAD_PACKAGE, and runs the keeper from the archive alone too.
# (blocks.py: what a worker checkpoints or shards, --grad-ckpt and --strategy fsdp, on a remote cluster too)
KEEPER_PACKAGE = ("keeper/", "line/", "group/", "health/__init__.py", "health/nodes.py", "health/probe.py",
                  "health/findings.py", "workers/", "launch/", "meter/telemetry.py", "display.py", "blocks.py")
ACTIVITY = "activity"        # this machine's idleness verdict (KV keys in the cluster's GCS)
LIMITS = "limits"            # budget and idle limits set here after `up`
HEARTBEAT = "guard"          # the head watchdog's heartbeat


def fresh(report: dict | None, now: float) -> bool:
    """Whether a report (either way) is recent enough to stand for what its writer sees now."""
    return bool(report) and now - report["at"] <= 3 * report.get("every", 2.0) + 10.0


def guarded(record: ClusterRecord) -> bool:
    """Whether the cluster's head runs the watchdog: ``up`` records where it keeps its state once
    it started it (an ssh head's by ``start``, a cloud head's by the launcher)."""
    return bool(ClusterSpec.from_json(record.spec).remote.guard_home)


def head_files(entries: tuple[str, ...] = HEAD_PACKAGE + KEEPER_PACKAGE) -> list[Path]:
    """The files of ``entries``, relative to the package: its Python sources, no caches."""
    files = []
    for entry in entries:
        found = sorted((PACKAGE / entry).glob("*.py")) if entry.endswith("/") else [PACKAGE / entry]
        files += [path.relative_to(PACKAGE) for path in found]
    return files


def package_archive() -> bytes:
    """The head's part of this package as a gzipped tar: its watchdog's and its keeper's (about 200 kB)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for file in head_files():
            tar.add(PACKAGE / file, arcname=f"{PACKAGE.name}/{file}")
    return buffer.getvalue()


def copy_package(folder: Path) -> None:
    """The same part of this package, as files under ``folder`` (the cluster launcher's
    ``file_mounts`` copies them onto a cloud head)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    for file in head_files():
        target = folder / PACKAGE.name / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE / file, target)


def order(record: ClusterRecord, spec: ClusterSpec, interval: float, *, ip: str, gcs_port: int,
          temp_dirs: dict[str, str], token_path: str, cloud: str | None = None, keeper_port: int | None = None,
          index_url: str | None = None) -> dict:
    """What the head's watchdog is told at its start (``headwatch.main``). ``ip`` may be
    ``{head_ip}``, filled in on the head; ``temp_dirs`` maps a node's address to Ray's temp dir
    there (``*``: any, ``{ip}`` in it being the node's); ``cloud``: the provider whose instance the
    head is (it ends itself), None on the user's own machine. The watchdog starts the keeper on
    the head's loopback port the spec names (``keeper``), with the mirror the hosts install from
    (``keeper_port``, ``index_url``: others than the spec's, for a head not yet started)."""
    keeper = {"port": keeper_port or spec.remote.keeper_port, "index_url": index_url or spec.remote.pip_index_url}
    return {"name": record.name, "backend": record.backend, "cloud": cloud, "spec": spec.to_json(),
            "marker": record.marker, "budget": record.budget_usd, "idle": record.idle_minutes,
            "created": record.created, "gcs": f"{ip}:{gcs_port}", "ip": ip, "temp_dirs": temp_dirs,
            "token_path": token_path, "home": str(Path(token_path).parent / "head"), "interval": interval,
            "keeper": keeper}


def _on_head(remote: Remote, command: str, *args: str, **kwargs) -> dict:
    """``onhost.py COMMAND`` on the cluster's head, over SSH, with the head's Python."""
    head = ssh.parse_hosts([remote.head])[0]
    python = (remote.pythons or [remote.python or "python3"])[0]
    return ssh.on_host(head, remote.ssh_key, python, command, *args, **kwargs)


def start(record: ClusterRecord, spec: ClusterSpec, interval: float) -> Guarded:
    """Start an ssh cluster's head watchdog over SSH (this package travels in the script); where
    it keeps its state and its pid there, for the spec's ``remote`` (the caller records them).
    (A cloud head starts its own: ``launcher.start_commands``.)"""
    remote = spec.remote
    told = order(record, spec, interval, ip=remote.head_ip, gcs_port=remote.gcs_port,
                 temp_dirs=dict(zip(remote.ips, remote.temp_dirs, strict=True)), token_path=remote.token_path)
    answer = _on_head(remote, "guard", json.dumps(told), package=base64.b64encode(package_archive()).decode(),
                      timeout=60)
    if not answer.get("ok"):      # its log's last lines: a traceback's last is what it ended on
        said = str(answer.get("error")).split("; ")[-1]
        raise GpugeekError(f"{remote.head}: {said} — its log: {remote.head}:{told['home']}/watchdog.log")
    return Guarded(guard_home=told["home"], guard_pid=answer["pid"])


def heartbeat(record: ClusterRecord, timeout: float = 2.0) -> dict | None:
    """The head watchdog's last heartbeat (spend, budget, a stop under way), or None."""
    try:
        return kv_get(record.address, HEARTBEAT, timeout=timeout)
    except ClusterUnreachable:
        return None


def beating(record: ClusterRecord, now: float | None = None) -> bool:
    return fresh(heartbeat(record), time.time() if now is None else now)


def report(record: ClusterRecord, since: float | None, why: str, every: float) -> None:
    """This machine's idleness verdict, for the head (``headwatch.HeadWatch._idleness``)."""
    kv_put(record.address, ACTIVITY, {"at": time.time(), "since": since, "why": why, "every": every})


def set_limits(record: ClusterRecord, budget: float | None, idle: float | None) -> None:
    kv_put(record.address, LIMITS, {"budget": budget, "idle": idle})


def pull(record: ClusterRecord) -> dict | None:
    """The head's ledger for the cluster, over SSH, made this machine's; None when the head does
    not answer. A stop the head made is recorded here with its reason and time."""
    remote = ClusterSpec.from_json(record.spec).remote
    try:
        dump = _on_head(remote, "ledger", remote.guard_home, record.name, timeout=30)
    except GpugeekError:
        return None
    if not dump.get("ok") or not dump.get("cluster"):
        return None
    ledger.adopt(record.id, dump["nodes"], dump["events"])
    registry.heard_from(record.id, time.time())      # the head's word: its ledger, as of now
    head_record = dump["cluster"]
    if head_record.get("stopped") and record.stopped is None:
        registry.mark_stopped(record.id, head_record["stop_reason"] or "stopped by the head", head_record["stopped"])
        if record.session_id:        # the tunnel: nothing is left to reach
            processes.stop_session(record.session_id, record.created, record.marker, grace=1)
        _forget_on_head(record, remote)
    return dump


def _forget_on_head(record: ClusterRecord, remote: Remote) -> None:
    """The head's folder of the stopped cluster, once its ledger is copied here: removed there
    (the copy here is kept); a failure is said in the ledger."""
    folder = str(PurePosixPath(remote.token_path or remote.guard_home).parent)   # a Slurm cluster's: its guard's
    try:
        answer = _on_head(remote, "forget", folder, timeout=30)
        why = None if answer.get("ok") else answer.get("error", "it is still there")
    except GpugeekError as exc:
        why = str(exc)
    if why:
        ledger.event(record.id, "head-folder", f"the head's {folder} was not removed ({why}); its ledger is "
                                               f"copied here")
