"""Your own machines through Ray's cluster launcher and its on-premise node provider: the cloud
path's YAML (``launcher.py``) with the hosts in its provider section."""

from __future__ import annotations

import shutil
from types import MappingProxyType

import yaml

from ..cluster.remote import Found, Guarded, LaidOut, LineOpened, learn
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..remote import ssh, tunnel
from . import hosts, launcher, readiness
from .base import READY_TIMEOUT_S, REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started
from .clouds import LauncherBackend

UP_TIMEOUT_S = 900     # `ray up` makes the head's runtime (minutes on a bare host) and starts Ray
# Ray's on-premise provider under autoscaler v1: under v2 (the default since Ray 2.50) the head,
# whose node type is the workers' one, counts as one of them, and its state file on the head
# says the head is not running — one host was never started, seen on the lab's three hosts
ONPREM_UP_ENV = {"RAY_UP_enable_autoscaler_v2": "0"}


def check_onprem(spec: ClusterSpec) -> None:
    """One line for what Ray's on-premise provider cannot do with ``--hosts``: it logs in to every
    host as one user on port 22, copies files with ``rsync``, and its autoscaler on the head
    logs in to the others with the key ``ray up`` copies there."""
    targets = ssh.parse_hosts(spec.remote.hosts)
    if len(targets) < 2:
        raise GpugeekError("--backend onprem: name at least two --hosts (the head and a worker) — for one "
                           "machine use --backend ssh")
    if len({t.user for t in targets}) > 1 or any(t.port for t in targets):
        raise GpugeekError("--backend onprem: Ray's on-premise provider logs in to every host as one user on "
                           "port 22 — write --hosts as USER@HOST for one USER, or use --backend ssh")
    if not spec.remote.ssh_key:
        raise GpugeekError("--backend onprem needs --ssh-key: Ray copies it to the head, whose autoscaler logs in to "
                           "the other hosts with it — give --ssh-key PATH")
    if shutil.which("rsync") is None:
        raise GpugeekError("`ray up` copies files with rsync, which is not on PATH — install rsync "
                           "(apt install rsync, brew install rsync)")


def onprem_ips(spec: ClusterSpec) -> tuple[str, ...]:
    """Each host's address, as Ray's on-premise provider will look it up (one line if a name does
    not resolve here)."""
    import socket

    ips = []
    for target in ssh.parse_hosts(spec.remote.hosts):
        try:
            ips.append(socket.gethostbyname(target.host))
        except OSError:
            raise GpugeekError(f"--hosts {target.host!r}: the name does not resolve here — give its address") from None
    return tuple(ips)


class OnPremBackend(LauncherBackend):
    """Your own machines through Ray's cluster launcher and its on-premise node provider: ``ray up``
    logs in to the first of ``--hosts``, runs the setup command (the runtime) and the head's start
    command there, and the head's autoscaler does the same on every other host. What runs is an
    ssh cluster's: the same ``onhost.py start``, marker, token, tunnel and head watchdog; its stop
    is an ssh cluster's too, by process on each host (Ray's on-premise ``ray down`` forgets the
    nodes but leaves their Ray running)."""

    name = "onprem"
    launches = watched = tunnelled = your_hosts = True
    confirm = grows = runs_here = simulated = from_offers = local_price = False
    kernel_joins = "line"
    notices = provider = scheduler = None
    cannot = MappingProxyType({
        Feature.DASHBOARD: "the head's dashboard is not opened from here — open it with `ray dashboard <its config>` "
                           "(`up --dry-run` writes the config)",
        Feature.PREEMPT: "your own machines are not spot nodes; `preempt` " + REHEARSAL_ONLY,
    })

    def __init__(self):
        """No cloud to name: the launcher's YAML and log are all it takes from ``LauncherBackend``."""

    def show(self, name, spec):
        config = self.config(name, spec)
        return LaunchConfig(self.name, yaml.safe_dump(config, sort_keys=False), launcher.write(name, config),
                            "Ray validated this config. Run without --dry-run to `ray up` it on your hosts.", config)

    def readiness(self, asked):
        """Your hosts, as ``ssh`` looks at them (Ray's launcher reaches them over SSH too)."""
        return readiness.your_hosts(self.name, asked)

    def cannot_start_in(self, region):
        return None         # your own machines: no cloud's machine image to find

    def preflight(self, spec):
        check_onprem(spec)
        ips = onprem_ips(spec)      # as Ray's provider will look them up; ``onhost.py`` (ps, stop) needs
        learn(spec, Found(ips=ips, pythons=("python3",) * len(ips)))   # only the standard library

    def start(self, record, spec):
        ips = spec.remote.ips         # preflight found them
        laid = LaidOut(temp_dirs=tuple(launcher.temp_dir(record.name).replace("{ip}", ip) for ip in ips),
                       token_path=f"{launcher.node_dir(record.name)}/auth_token", head_ip=ips[0],
                       gcs_port=hosts.GCS_PORT, keeper_port=hosts.KEEPER_PORT)
        path = launcher.write(record.name, self.config(record.name, spec, record.marker))
        learn(spec, laid, record_id=record.id, temp_dir=str(path))   # a stop knows the hosts from here on
        guard = launcher.guard_order(record, spec)
        launcher.write_node_files(record.name, guard)
        launcher.ray_cli("up", "-y", "--no-config-cache", str(path), log=self._log(record),
                         timeout=UP_TIMEOUT_S, env=ONPREM_UP_ENV)
        opened = tunnel.open_tunnel(record, spec)
        return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid], temp_dir=str(path),
                       learned=(Guarded(guard_home=guard["home"]), LineOpened(line_address=opened.line)))

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        """Every host joins: the head's autoscaler starts them all, each after its setup command
        (minutes where it makes the runtime)."""
        Backend.wait_ready(self, record, spec, max(timeout, UP_TIMEOUT_S))

    def stop(self, record, grace=5.0):
        """By process on each host, the head first: its autoscaler would start a stopped worker again."""
        hosts.stop(record, grace, head_first=True)
        shutil.rmtree(launcher.node_files(record.name), ignore_errors=True)

    def scale(self, record, spec, workers):
        others = len(spec.remote.hosts) - 1
        if workers != others:
            raise GpugeekError(f"an onprem cluster is the hosts you named ({others} besides the head) — other "
                               f"hosts need `down`, then `up` with other --hosts")
        print("Ray's autoscaler on the head keeps every host in the cluster: it starts Ray again on one that "
              "lost it", flush=True)
        return spec
