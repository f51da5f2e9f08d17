"""The backends behind one interface: show a config, start, stop, scale, preempt.

- ``local``: a Ray head on this machine with its real CPUs/GPUs (the default).
- ``sim``: Ray's fake multi-node autoscaler with node types made from offers (rehearsal).
- ``ssh``: the user's own machines, Ray started on each over SSH, reached through a tunnel.
- ``aws``/``gcp``/``azure``: Ray's cluster launcher (``ray up``/``ray down``) on a generated YAML
  whose start commands are the ``ssh`` backend's; its head reached through the same tunnel.
- ``kuberay``: a RayCluster manifest applied with ``kubectl``.
- ``attach``: an existing Ray cluster at ``--address``; we own none of it and never stop it.

Each is one class that says what it can do (``Backend``'s capabilities); code outside ``backends/``
asks that (``capable(record).tunnelled``), never a backend's name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..config import home
from ..errors import GpugeekError
from ..raynodes import read_nodes
from ..remote import ssh, tunnel
from . import hosts, kuberay, launcher, local, sim

READY_TIMEOUT_S = 180
CLIENT_SCHEME = "ray://"     # --address ray://HOST:PORT: a Ray Client server someone else runs


@dataclass
class Started:
    address: str | None
    session_id: int | None = None
    pids: list[int] | None = None
    temp_dir: str | None = None
    dashboard_url: str | None = None


@dataclass
class LaunchConfig:
    """What ``up`` would do, shown instead of doing it (``--dry-run``, or a cloud without ``--yes``)."""

    backend: str
    text: str
    path: Path | None
    next_step: str
    config: dict

    def __repr__(self) -> str:
        where = f"written to {self.path}\n" if self.path else ""
        return f"{self.text.rstrip()}\n\n{where}{self.next_step}"

    def _repr_markdown_(self) -> str:
        lang = "json" if self.text.lstrip().startswith("{") else "yaml"
        where = f"Written to `{self.path}`. " if self.path else ""
        return f"```{lang}\n{self.text.rstrip()}\n```\n\n{where}{self.next_step}"


class Backend:
    """One kind of cluster: how its machines appear and disappear, and what it can do. Each
    capability is declared here without a value, so every backend says each one."""

    name = ""
    launches: bool          # we start and stop it (False: an existing cluster we only attach to)
    confirm: bool           # needs --yes before it spends money
    grows: bool             # an autoscaler may add nodes for work that does not fit yet
    watched: bool           # a watchdog of ours meters it and holds its budget cap and idle stop
    runs_here: bool         # its head is processes of ours on this machine, gone when they are
    tunnelled: bool         # this machine reaches its head through an SSH tunnel of the cluster's own
    kernel_joins: str | None    # as a Ray "driver", a Ray "client" through the tunnel, or None: attached only
    simulated: bool         # its GPUs are declared and its dollars rehearsed; preemptions rehearsed on it
    notices: str | None     # where its spot nodes' preemption notices come from (None: none come)
    from_offers: bool       # you choose its machines from the catalog: --offer, --gpu, --plan, --workers
    your_hosts: bool        # its machines are the --hosts you name, Ray on each in a runtime we make there
    local_price: bool       # it costs what config.toml says this machine costs (local_usd_per_hour)
    provider: str | None    # the cloud that rents you its machines and bills for them (None: no cloud)
    dashboard: bool         # --dashboard starts Ray's dashboard on its head
    no_limits_because = ""  # why --budget and --idle are refused on one that is not watched

    def show(self, name: str, spec: ClusterSpec) -> LaunchConfig:
        raise NotImplementedError

    def preflight(self, spec: ClusterSpec) -> None:
        """Refuse early, in one line, what would fail half-way (credentials, CLIs)."""

    def start(self, record: ClusterRecord, spec: ClusterSpec) -> Started:
        raise NotImplementedError

    def wait_ready(self, record: ClusterRecord, spec: ClusterSpec, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once every node the cluster must have (head + min workers) has joined."""
        if not record.address:
            return
        want = sum(t.min_workers for t in spec.node_types)
        deadline = time.monotonic() + timeout
        while True:
            alive = [n for n in read_nodes(record.address) if n.alive]
            workers = [n for n in alive if not n.is_head]
            if alive and len(workers) >= want:
                return
            if time.monotonic() > deadline:
                raise GpugeekError(f"only {len(workers)} of {want} worker nodes joined in {timeout:.0f} s "
                                   f"— see the logs in {record.temp_dir}")
            time.sleep(0.2)

    def stop(self, record: ClusterRecord, grace: float = 3.0) -> None:
        raise NotImplementedError

    def scale(self, record: ClusterRecord, spec: ClusterSpec, workers: int) -> ClusterSpec:
        raise GpugeekError(f"the {self.name} backend cannot scale — it is one machine")


class LocalBackend(Backend):
    name = "local"
    launches = watched = runs_here = local_price = dashboard = True
    confirm = grows = tunnelled = simulated = from_offers = your_hosts = False
    kernel_joins = "driver"
    notices = provider = None

    def show(self, name, spec):
        text = ("ray start --head --node-ip-address=127.0.0.1 --port=<free port> "
                "--include-dashboard=false --temp-dir=/tmp/gg-<random>")
        return LaunchConfig(self.name, text, None, "run without --dry-run to start it", {})

    def start(self, record, spec):
        temp_dir = local.new_temp_dir()
        started = local.start_head(temp_dir, record.marker, dashboard=spec.dashboard)
        return Started(started.address, started.session_id, started.pids, temp_dir, started.dashboard_url)

    def stop(self, record, grace=3.0):
        if record.session_id:
            processes.stop_session(record.session_id, record.created, record.marker, grace)
        if record.temp_dir and Path(record.temp_dir).name.startswith("gg-"):
            shutil.rmtree(record.temp_dir, ignore_errors=True)


class SimBackend(LocalBackend):
    name = "sim"
    grows = simulated = from_offers = True     # Ray's fake multi-node autoscaler, node types from offers
    local_price = False
    notices = "sim"             # `%gpugeek preempt NODE --notice S`

    def show(self, name, spec):
        config = sim.autoscaler_config(name, spec, "127.0.0.1:<port>")
        return LaunchConfig(self.name, json.dumps(config, indent=1), None,
                            f"{sim.cpu_note(spec)}. Run without --dry-run to start it.", config)

    def start(self, record, spec):
        temp_dir = local.new_temp_dir()
        config = sim.config_path(temp_dir)

        def port_chosen(port: int) -> None:   # the autoscaler's config names the GCS address
            sim.write_config(config, record.name, spec, f"{local.HOST}:{port}")
        started = local.start_head(temp_dir, record.marker, port_chosen, num_cpus=0, num_gpus=0,
                                   autoscaling_config=config, env=sim.ENV, dashboard=spec.dashboard)
        return Started(started.address, started.session_id, started.pids, temp_dir, started.dashboard_url)

    def scale(self, record, spec, workers):
        return sim.scale(record.name, spec, record.address, record.temp_dir, workers)


class SshBackend(Backend):
    """The user's own machines: Ray started and stopped by us on each host over SSH (``hosts``)."""

    name = "ssh"
    launches = watched = tunnelled = your_hosts = True
    confirm = grows = runs_here = simulated = from_offers = local_price = dashboard = False
    kernel_joins = "client"
    notices = provider = None

    def show(self, name, spec):
        remote = spec.remote
        lines = [f"head: {remote['hosts'][0]}  ray start --head --port={hosts.GCS_PORT} "
                 f"--ray-client-server-port={hosts.CLIENT_PORT} --num-gpus={remote['gpus_per_host']}"]
        lines += [f"worker: {h}  ray start --address=<head>:{hosts.GCS_PORT} --num-gpus={remote['gpus_per_host']}"
                  for h in remote["hosts"][1:]]
        lines.append(f"tunnel: ssh -tt -L <gcs>:<head>:{hosts.GCS_PORT} -L <client>:<head>:{hosts.CLIENT_PORT} "
                     f"{remote['hosts'][0]}")
        return LaunchConfig(self.name, "\n".join(lines), None, "run without --dry-run to start it", {})

    def preflight(self, spec):
        """Every host answers over SSH and is ready to run Ray, before anything is recorded or started."""
        hosts.prepare(spec)

    def start(self, record, spec):
        opened = hosts.start(record, spec)
        return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid])

    def stop(self, record, grace=5.0):
        hosts.stop(record, grace)

    def scale(self, record, spec, workers):
        """An ssh cluster is the hosts named: scaling to all of them brings back any whose Ray is gone."""
        if workers != len(spec.remote["hosts"]) - 1:
            raise GpugeekError(f"an ssh cluster is the hosts you named ({len(spec.remote['hosts']) - 1} besides the "
                               f"head) — `scale {len(spec.remote['hosts']) - 1}` restarts Ray on any of them that lost "
                               f"it; other hosts need `down`, then `up` with other --hosts")
        back = hosts.rejoin(record)
        print(f"Ray started again on {', '.join(back)}" if back else "every host runs its Ray: nothing to do",
              flush=True)
        return spec


class LauncherBackend(Backend):
    """aws, gcp, azure: the generated YAML through ``ray up``/``ray down``. Past the provider
    section it is an ssh cluster: the same ``onhost.py start`` on every node, the same tunnel."""

    launches = confirm = watched = tunnelled = from_offers = True
    grows = True                # up to --max-workers, by Ray's autoscaler
    runs_here = simulated = your_hosts = local_price = dashboard = False
    kernel_joins = "client"

    def __init__(self, provider: str):
        self.name = self.provider = provider
        self.notices = provider     # its metadata service warns a spot node before taking it

    def config(self, name: str, spec: ClusterSpec, marker: str | None = None) -> dict:
        config = launcher.cluster_config(name, spec, marker)
        launcher.validate(config)
        return config

    def show(self, name, spec):
        config = self.config(name, spec)
        path = launcher.write(name, config)
        head_note = (f"The head node ({launcher.HEAD_INSTANCE[self.name]}) is not priced: the catalog "
                     f"holds GPU offers only. ")
        notes = " ".join(spec.notes)
        return LaunchConfig(self.name, yaml.safe_dump(config, sort_keys=False), path,
                            f"Ray validated this config. {head_note}{notes}Add --yes to run `ray up -y` on it "
                            f"(the folder in its file_mounts is written then).", config)

    def preflight(self, spec):
        launcher.check_credentials(self.name)

    def start(self, record, spec):
        config = self.config(record.name, spec, record.marker)
        path = launcher.write(record.name, config)
        # recorded before `ray up`, so a failure half-way can still be taken down
        registry.update(record.id, temp_dir=str(path))
        log = self._log(record)
        guard = launcher.guard_order(record, spec)
        launcher.write_node_files(record.name, guard)
        launcher.ray_cli("up", "-y", str(path), log=log)
        found = launcher.find_head(record.name, path, log)
        spec.remote.update(hosts=[f"{found.ssh_user}@{found.public_ip}"], head_ip=found.private_ip,
                           ssh_key=found.ssh_key, gcs_port=hosts.GCS_PORT, client_port=hosts.CLIENT_PORT,
                           known_hosts=str(ssh.local_dir(record.name, record.id) / "known_hosts"),
                           guard_home=guard["home"])
        registry.update(record.id, spec=spec.to_json())
        opened = tunnel.open_tunnel(record, spec)
        spec.remote["client_address"] = opened.client
        return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid], temp_dir=str(path))

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        return  # `ray up` returns once the head is up; workers join as the autoscaler brings them

    def stop(self, record, grace=3.0):
        if record.temp_dir:
            launcher.ray_cli("down", "-y", str(record.temp_dir), log=self._log(record))
        if record.session_id:     # the tunnel
            processes.stop_session(record.session_id, record.created, record.marker, grace)
        shutil.rmtree(launcher.node_files(record.name), ignore_errors=True)

    def scale(self, record, spec, workers):
        spec.workers.min_workers = spec.workers.max_workers = workers
        config = self.config(record.name, spec, record.marker)
        path = launcher.write(record.name, config)
        launcher.write_node_files(record.name)
        launcher.ray_cli("up", "-y", "--no-restart", str(path), log=self._log(record))
        return spec

    def _log(self, record: ClusterRecord) -> Path:
        return home() / "launch" / f"{record.name}-{self.name}.log"


class KubeRayBackend(Backend):
    name = "kuberay"
    launches = confirm = from_offers = True
    grows = True                # KubeRay's autoscaler
    watched = False             # no route to meter its head yet
    no_limits_because = ("are not enforced on KubeRay yet (no route to meter its head) — use the autoscaler's "
                         "idle timeout in the manifest, or a cloud backend")
    runs_here = tunnelled = simulated = your_hosts = local_price = dashboard = False
    kernel_joins = None         # a kernel records itself attached, no more
    notices = provider = None

    def show(self, name, spec):
        manifest = kuberay.manifest(name, spec)
        folder = home() / "launch"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{name}-raycluster.yaml"
        text = yaml.safe_dump(manifest, sort_keys=False)
        path.write_text(text)
        return LaunchConfig(self.name, text, path,
                            "Add --yes to `kubectl apply` it (needs the KubeRay operator in the cluster).",
                            manifest)

    def preflight(self, spec):
        if not launcher.kubectl_available():
            raise GpugeekError("kubectl is not on PATH — install it and point KUBECONFIG at your cluster")

    def start(self, record, spec):
        shown = self.show(record.name, spec)
        registry.update(record.id, temp_dir=str(shown.path))
        self._kubectl("apply", "-f", str(shown.path))
        return Started(address=None, temp_dir=str(shown.path))

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        return

    def stop(self, record, grace=3.0):
        if record.temp_dir:
            self._kubectl("delete", "-f", str(record.temp_dir))

    @staticmethod
    def _kubectl(*args: str) -> None:
        done = subprocess.run(["kubectl", *args], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise GpugeekError(f"kubectl {args[0]} failed: {last}")


class AttachBackend(Backend):
    name = "attach"
    launches = watched = False  # someone else's cluster: theirs to size and stop
    grows = True                # … and it may have an autoscaler
    confirm = runs_here = tunnelled = simulated = from_offers = your_hosts = local_price = dashboard = False
    kernel_joins = "driver"     # or a Ray Client at a ray:// address
    notices = provider = None
    no_limits_because = ("stop a cluster, and an attached cluster is not ours to stop — start one with "
                         "--backend local/sim/aws/… instead")

    def show(self, name, spec):
        return LaunchConfig(self.name, "attach only: nothing is started", None, "", {})

    def start(self, record, spec):
        return Started(address=record.address)

    def preflight(self, spec):
        return

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        if not record.address.startswith(CLIENT_SCHEME):   # a Ray Client address is proven by connecting
            read_nodes(record.address)     # raises one clear line if nothing answers

    def stop(self, record, grace=3.0):
        return  # not ours


BACKENDS: dict[str, Backend] = {
    "local": LocalBackend(),
    "sim": SimBackend(),
    "ssh": SshBackend(),
    "aws": LauncherBackend("aws"),
    "gcp": LauncherBackend("gcp"),
    "azure": LauncherBackend("azure"),
    "kuberay": KubeRayBackend(),
    "attach": AttachBackend(),
}
DEFAULT = LocalBackend.name      # what `up` starts when no backend is named: this machine
ATTACH = AttachBackend.name      # what `up --address` means: a cluster someone else runs


def capabilities() -> list[str]:
    """What a backend says it can do: the names ``Backend`` declares."""
    return list(vars(Backend)["__annotations__"])


def capable(cluster) -> Backend:
    """What a cluster's backend can do: ``cluster`` is a record, a spec or a request (anything
    with a ``backend``), or a backend's name."""
    return BACKENDS[cluster if isinstance(cluster, str) else cluster.backend]
