"""An ``ssh`` cluster: Ray started and stopped by us, over SSH, on the user's own machines.

The head goes on the first host; every other host joins it. We run ``ray start`` on each host
ourselves rather than through Ray's cluster launcher with its on-prem provider: that provider
brought the head up but left workers unjoined, and its ``ray down`` reported "No nodes remaining"
while the head's processes ran on. Here each host's processes carry the cluster's marker, and a
stop is checked by listing that host's processes, never by Ray's word.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from concurrent.futures import ThreadPoolExecutor, wait
from types import MappingProxyType

from ..cluster import processes
from ..cluster.registry import ClusterRecord
from ..cluster.remote import Fact, Found, Guarded, HeadStarted, LaidOut, LineOpened, learn
from ..cluster.spec import ClusterSpec
from ..config import settings
from ..errors import GpugeekError
from ..meter import ledger
from ..raynodes import HEAD_ENV, LINK_CONFIG, NODE_ENV, token_text
from ..remote import headguard, runtime, ssh, tunnel
from . import readiness
from .base import REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started

GCS_PORT = 6379
KEEPER_PORT = 10002     # the keeper's line, on the head's loopback (another where that one is held)
START_TIMEOUT_S = 150


def targets(spec: ClusterSpec) -> list[ssh.Target]:
    return ssh.parse_hosts(spec.remote.hosts)


def prepare(spec: ClusterSpec) -> None:
    """Each host made ready and asked what it is, before anything is recorded or started: the
    Python that runs Ray there (its runtime made first where needed, ``remote.runtime``) and the
    address the other hosts reach it at. An unreachable host, a wrong key or a host that cannot be
    made ready is one line, and nothing is left to list or stop."""
    hosts = targets(spec)
    answers = runtime.ready(spec)
    learn(spec, Found(pythons=tuple(a["python"] for a in answers),
                      ips=tuple(_node_ip(t, a) for t, a in zip(hosts, answers, strict=True))))


def start(record: ClusterRecord, spec: ClusterSpec) -> Started:
    """Ray on the head, then at once: Ray on every other host, the tunnel and the head's watchdog
    (neither needs the workers). Where each host keeps its files is recorded before anything
    starts, so a failure half-way can be cleaned up.

    This thread alone changes the spec: the tunnel's and the watchdog's threads only read it and
    hand back what they learned. It is written when what a stop needs is known, and again only
    when a start fails half-way (``up`` writes the started cluster once, with what it learned)."""
    hosts = targets(spec)
    if not spec.remote.ips:
        prepare(spec)
    tag = hashlib.sha1(record.marker.encode()).hexdigest()[:8]
    learn(spec, LaidOut(temp_dirs=tuple(f"/tmp/gg-{tag}-{i}" for i in range(len(hosts))),
                        token_path=f"~/.gpugeek/clusters/{tag}/auth_token", head_ip=spec.remote.ips[0],
                        gcs_port=GCS_PORT, keeper_port=KEEPER_PORT), record_id=record.id)
    token = token_text()
    head = _ray_start(record, spec, 0, "head", token)     # on other ports when the usual ones are taken there
    learned: list[Fact] = [HeadStarted(gcs_port=head["port"], keeper_port=head["keeper_port"])]
    learn(spec, *learned)       # what the workers, the tunnel and the watchdog dial
    failed: BaseException | None = None
    with ThreadPoolExecutor(2) as pool:
        opening, guarding = pool.submit(tunnel.open_tunnel, record, spec), pool.submit(guard_head, record, spec)
        try:
            if len(hosts) > 1:
                ssh.on_hosts(list(range(1, len(hosts))), lambda i: _ray_start(record, spec, i, "worker", token))
        except BaseException as exc:  # noqa: BLE001 - raised below, once both threads have ended
            failed = exc
        wait([opening, guarding])
    opened, guarded = (done.exception() or done.result() for done in (opening, guarding))
    if isinstance(opened, tunnel.Tunnel):
        learned.append(LineOpened(line_address=opened.line))
    if isinstance(guarded, Guarded):
        learned.append(guarded)
    failed = failed or next((r for r in (opened, guarded) if isinstance(r, BaseException)), None)
    if failed is not None:      # what a stop of the rest needs: the tunnel's process, the watchdog's pid
        tunnelled = {"address": opened.gcs, "session_id": opened.pid, "pids": [opened.pid]} if (
            isinstance(opened, tunnel.Tunnel)) else {}
        learn(spec, *learned, record_id=record.id, **tunnelled)
        raise failed
    return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid], learned=tuple(learned))


def guard_head(record: ClusterRecord, spec: ClusterSpec) -> Guarded | None:
    """The watchdog on the head too, so that the budget cap and idle stop hold without this
    machine; where it keeps its state and its pid, for the spec. A cluster whose head could not
    start it is still watched from here, and says so (None)."""
    try:
        return headguard.start(record, spec, settings().meter_interval_s)
    except GpugeekError as exc:
        said = (f"the head's watchdog did not start ({exc}): the budget cap and idle stop hold only while "
                f"this machine's watchdog runs")
        ledger.event(record.id, "guard", said)
        print(f"warning: {said}", flush=True)
        return None


def _ray_start(record: ClusterRecord, spec: ClusterSpec, i: int, role: str, token: str) -> dict:
    remote, hosts = spec.remote, targets(spec)
    order = {"role": role, "marker": record.marker, "temp_dir": remote.temp_dirs[i], "ip": remote.ips[i],
             "gpus": remote.gpus_per_host, "cpus": remote.cpus_per_host,
             "token_path": remote.token_path, "node_type": "host", "port": remote.gcs_port,
             "keeper_port": remote.keeper_port, "head": f"{remote.head_ip}:{remote.gcs_port}",
             "free_ports": True, "timeout": START_TIMEOUT_S, "env": HEAD_ENV if role == "head" else NODE_ENV,
             **({"system_config": LINK_CONFIG} if role == "head" else {})}
    answer = ssh.on_host(hosts[i], remote.ssh_key, remote.pythons[i], "start", json.dumps(order),
                         token=token, timeout=START_TIMEOUT_S + 30)
    if not answer.get("ok"):
        raise GpugeekError(f"{hosts[i]}: Ray did not start ({answer.get('error')}) — check Ray and Python on that "
                           "host; `up` again once it does")
    return answer


def rejoin(record: ClusterRecord) -> list[str]:
    """Ray started again on every worker host where none of our processes runs (the host was
    rebooted, or lost power and came back): each joins the head as a new node. Returns those
    hosts. Checked by process on each host, as a stop is."""
    spec = ClusterSpec.from_json(record.spec)
    hosts, running = targets(spec), processes_on_hosts(record)
    gone = [i for i in range(1, len(hosts)) if not running.get(str(hosts[i]))]
    if gone:
        token = token_text()
        ssh.on_hosts(gone, lambda i: _ray_start(record, spec, i, "worker", token))
    return [str(hosts[i]) for i in gone]


def stop(record: ClusterRecord, grace: float = 5.0, head_first: bool = False) -> None:
    """Stop our processes on every host we started Ray on, and the tunnel; raise, naming the
    hosts, when any host cannot be reached or still runs a process of ours. ``head_first``: the
    head before the others (an autoscaler there would start them again)."""
    spec = ClusterSpec.from_json(record.spec)
    remote = spec.remote
    hosts, pythons = targets(spec), remote.pythons
    if pythons and remote.temp_dirs:      # else nothing was started on them
        def stop_one(i: int) -> str | None:
            try:
                answer = ssh.on_host(hosts[i], remote.ssh_key, pythons[i], "stop", record.marker,
                                     str(grace), remote.temp_dirs[i], timeout=grace + 40)
            except GpugeekError as exc:
                return str(exc)
            return None if answer.get("ok") else f"{hosts[i]}: processes {answer.get('left')} would not stop"

        first = [stop_one(0)] if head_first else []
        failures = [f for f in first + ssh.on_hosts(list(range(len(first), len(hosts))), stop_one) if f]
        if failures:
            raise GpugeekError("; ".join(failures))
    if record.session_id:
        processes.stop_session(record.session_id, record.created, record.marker, grace=1)


def processes_on_hosts(record: ClusterRecord) -> dict[str, list[int]]:
    """Our processes on each host, listed on the host itself."""
    spec = ClusterSpec.from_json(record.spec)
    remote, hosts = spec.remote, targets(spec)
    answers = ssh.on_hosts(list(range(len(hosts))), lambda i: ssh.on_host(
        hosts[i], remote.ssh_key, remote.pythons[i], "ps", record.marker))
    return {str(t): a["pids"] for t, a in zip(hosts, answers, strict=True)}


def _node_ip(target: ssh.Target, answer: dict) -> str:
    """The address Ray advertises for the host: the one we reach it at when the host has it,
    else its only non-loopback IPv4 address."""
    addresses = [a for a in answer.get("interfaces", {}) if not ipaddress.ip_address(a).is_loopback]
    if target.host in addresses:
        return target.host
    if len(addresses) == 1:
        return addresses[0]
    raise GpugeekError(f"{target}: cannot tell which of its addresses ({', '.join(addresses) or 'none'}) the "
                       f"other hosts reach it at — name the host by that address in --hosts")


class SshBackend(Backend):
    """The user's own machines: Ray started and stopped by us on each host over SSH (``hosts``)."""

    name = "ssh"
    launches = watched = tunnelled = your_hosts = True
    confirm = grows = runs_here = simulated = from_offers = local_price = False
    kernel_joins = "line"
    notices = provider = scheduler = None
    cannot = MappingProxyType({
        Feature.DASHBOARD: "an ssh cluster's head starts no dashboard: your hosts open no port the cluster does "
                           "not need — `%gpugeek status` and `%gpugeek doctor` show its nodes",
        Feature.PREEMPT: "your own machines are not spot nodes; `preempt` " + REHEARSAL_ONLY,
    })

    def show(self, name, spec):
        remote = spec.remote
        lines = [f"head: {remote.head}  ray start --head --port={GCS_PORT} "
                 f"--num-gpus={remote.gpus_per_host}, then the watchdog and the keeper (127.0.0.1:{KEEPER_PORT})"]
        lines += [f"worker: {h}  ray start --address=<head>:{GCS_PORT} --num-gpus={remote.gpus_per_host}"
                  for h in remote.hosts[1:]]
        lines.append(f"tunnel: ssh -tt -L <gcs>:<head>:{GCS_PORT} -L <line>:127.0.0.1:{KEEPER_PORT} {remote.head}")
        return LaunchConfig(self.name, "\n".join(lines), None, "run without --dry-run to start it", {})

    def preflight(self, spec):
        """Every host answers over SSH and is ready to run Ray, before anything is recorded or started."""
        prepare(spec)

    def readiness(self, asked):
        return readiness.your_hosts(self.name, asked)

    def start(self, record, spec):
        return start(record, spec)

    def stop(self, record, grace=5.0):
        stop(record, grace)

    def scale(self, record, spec, workers):
        """An ssh cluster is the hosts named: scaling to all of them brings back any whose Ray is gone."""
        others = len(spec.remote.hosts) - 1
        if workers != others:
            raise GpugeekError(f"an ssh cluster is the hosts you named ({others} besides the "
                               f"head) — `scale {others}` restarts Ray on any of them that lost "
                               f"it; other hosts need `down`, then `up` with other --hosts")
        back = rejoin(record)
        print(f"Ray started again on {', '.join(back)}" if back else "every host runs its Ray: nothing to do",
              flush=True)
        return spec
