"""The cloud path (``--backend aws``; gcp and azure differ only in the provider section) on three
lab hosts: everything but the cloud API.

``LabCloud`` stands in for Ray's cluster launcher once a cloud has given it machines. ``ray up``
copies the YAML's ``file_mounts`` onto the hosts and runs its head start commands on the head and
its worker start commands on the workers over SSH, in the login shell and with the variables Ray's
updater exports; ``ray get-head-ip`` names the head, ``ray exec`` runs on the head over SSH. The
head's autoscaler finds no ``~/ray_bootstrap_config.yaml`` — launching machines is the cloud API's
part — and exits. It stands in for the cloud's API too: its list of instances (``Cloud.instances``,
by which a rented cluster is metered and found to stop), each host an instance from its ``ray up``
on, and ``Cloud.terminate``, which ends every process of the cluster on the host (what terminating
the instance does); the head's own watchdog, on a lab host with no EC2 to ask, meters nothing.
Everything else is the production code: the generated YAML, its setup command that makes each
node's runtime (``runtime.py``, from the lab's wheel index), ``onhost.py`` on the nodes, the tunnel,
the line to the head's keeper, a cell through ``gg.run``, the stop by tag and by process.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from cluster_processes import new_kernel, wait_until
from models import DDP_ACROSS_HOSTS
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends import launcher
from gpugeek_jupyter.clouds.aws import AWS
from gpugeek_jupyter.clouds.base import Instance
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.remote import headguard

pytestmark = pytest.mark.slow



class LabCloud:
    """Ray's launcher with the lab's hosts for instances: the head on the first, workers on the rest."""

    def __init__(self, lab):
        self.lab = lab
        for host in lab.hosts:      # a cloud image's login shell reads one
            host.file("/root/.bashrc").write_text("# the image's\n")
        self.ran: list[tuple[str, str]] = []
        self.launched: dict[str, tuple[str, float]] = {}   # host name → (node type, launched at)
        self.ended: dict[str, float] = {}
        self.config: Path | None = None      # what `ray up` was given

    # -- the cloud's API: what it bills ----------------------------------------------------------------

    def instances(self, cluster_name: str, region: str, since: float = 0.0) -> list[Instance]:
        hosts = {h.name: h for h in self.lab.hosts}
        return [Instance(id=f"lab-{name}", node_type=kind, launched=at, ended=self.ended.get(name),
                         state="terminated" if name in self.ended else "running", address=hosts[name].address,
                         spot=False, gone=name in self.ended, head=kind == "head")
                for name, (kind, at) in self.launched.items() if at >= since]

    def terminate(self, instance_ids: list[str], region: str) -> None:
        """The instances end, and every process on them."""
        config = yaml.safe_load(self.config.read_text())
        order = _order(config["head_start_ray_commands"][0])
        node_dir = next(iter(config["file_mounts"]))
        ended = [h for h in self.lab.hosts if f"lab-{h.name}" in instance_ids]

        def end(host) -> str:
            temp_dir = order["temp_dir"].replace("{ip}", host.address)
            return self._shell(host, f"python3 {node_dir}/onhost.py stop {shlex.quote(order['marker'])} 5 "
                                     f"{temp_dir}", {})

        with ThreadPoolExecutor(len(ended)) as pool:
            list(pool.map(end, ended))
        self.ended.update({h.name: time.time() for h in ended})

    # -- the ray CLI, as launcher.ray_cli calls it ---------------------------------------------------

    def ray_cli(self, *args: str, log: Path, timeout: float | None = None, env: dict | None = None) -> str:
        command, path = args[0], Path(args[-1] if args[0] != "exec" else args[1])
        config = launcher.validate(yaml.safe_load(path.read_text()))
        head, workers = self.lab.hosts[0], self.lab.hosts[1:]
        if command == "up":
            self.config = path
            self.launched[head.name] = ("head", time.time())
            for host in self.lab.hosts:
                self._mount(host, config["file_mounts"])
            with ThreadPoolExecutor(len(self.lab.hosts)) as pool:     # Ray's updaters set up the nodes at once
                list(pool.map(lambda host: [self._shell(host, c, {}) for c in config["setup_commands"]],
                              self.lab.hosts))
            [start] = config["head_start_ray_commands"]
            self._shell(head, start, self._env(config, "head", head, head_node=True))
            kinds = [name for name, t in config["available_node_types"].items()
                     if name != config["head_node_type"] for _ in range(t.get("min_workers", 0))]
            assert len(kinds) <= len(workers), "the lab has fewer hosts than the config's workers"
            [start] = config["worker_start_ray_commands"]

            for i, kind in enumerate(kinds):
                self.launched[workers[i].name] = (kind, time.time())

            def join(i: int) -> str:
                env = {"RAY_HEAD_IP": head.address, **self._env(config, kinds[i], workers[i])}
                return self._shell(workers[i], start, env)

            with ThreadPoolExecutor(max(1, len(kinds))) as pool:     # Ray's updaters run at once
                list(pool.map(join, range(len(kinds))))
            return ""
        if command == "get-head-ip":
            return f"Fetched IP: {head.address}\n{head.address}\n"
        if command == "exec":
            return self._shell(head, args[2], {})
        raise AssertionError(f"ray {command} is not part of the cloud path")

    def ssh_login(self, path: Path, log: Path) -> tuple[str, str]:
        return "root", str(self.lab.key)      # what Ray's bootstrap would say for a cloud

    # -- what Ray's updater does on a node -------------------------------------------------------------

    def _env(self, config: dict, kind: str, host, head_node: bool = False) -> dict:
        """The variables Ray exports to a start command (updater, ray_installer); a lab host is a
        one-CPU machine without GPUs, whatever the instance type says."""
        resources = {**config["available_node_types"][kind]["resources"], "CPU": 1, "GPU": 0}
        env = {"RAY_CLOUD_INSTANCE_ID": f"lab-{host.name}", "RAY_NODE_TYPE_NAME": kind,
               "RAY_OVERRIDE_RESOURCES": json.dumps(resources, separators=(",", ":"))}
        if head_node:
            env.update(RAY_enable_autoscaler_v2="1", RAY_USAGE_STATS_ENABLED="0")
        return env

    def _shell(self, host, command: str, env: dict) -> str:
        """``command`` in the login shell Ray's SSH command runner uses."""
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
        inner = f"source ~/.bashrc; export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore && ({exports}{command})"
        remote = f"bash --login -c -i {shlex.quote(inner)}"
        began = time.monotonic()
        done = subprocess.run(["ssh", *self.lab.ssh_options(), f"root@{host.address}", remote],
                              capture_output=True, text=True, timeout=200)
        self.ran.append((host.name, command))
        said = command.split(" start ")[0].split(" {")[0][-30:]
        print(f"  {host.name}: {said} … {time.monotonic() - began:.1f} s")
        if done.returncode != 0:
            raise AssertionError(f"{host.name}: {command[:60]}… exit {done.returncode}: "
                                 f"{done.stdout[-1000:]} {done.stderr[-1000:]}")
        return done.stdout

    def _mount(self, host, mounts: dict) -> None:
        """``mkdir -p`` then a copy that keeps the modes (Ray: ``rsync -avz``; here tar, no rsync)."""
        for remote, local in mounts.items():
            dest = remote.replace("~", "/root", 1)
            pack = subprocess.run(["tar", "-C", local, "-cf", "-", "."], capture_output=True, check=True)
            subprocess.run(["ssh", *self.lab.ssh_options(), f"root@{host.address}",
                            f"mkdir -p {shlex.quote(dest)} && tar -C {shlex.quote(dest)} -xpf -"],
                           input=pack.stdout, capture_output=True, check=True, timeout=30)


def _order(command: str) -> dict:
    words = shlex.split(command)
    return json.loads(words[words.index("start") + 1])


def test_cloud_path_up_run_down_on_lab_hosts(lab, gpugeek_home, monkeypatch):
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f'[hosts]\npip_index_url = "{lab.index_url}"\n')
    cloud = LabCloud(lab)
    monkeypatch.setattr(launcher, "ray_cli", cloud.ray_cli)
    monkeypatch.setattr(launcher, "ssh_login", cloud.ssh_login)
    monkeypatch.setattr(AWS, "check_credentials", lambda: None)
    monkeypatch.setattr(AWS, "instances", cloud.instances)
    monkeypatch.setattr(AWS, "terminate", cloud.terminate)
    began = time.monotonic()
    try:
        gg.up("labcloud", backend="aws", gpu="A100", count=8, workers=2, yes=True)
        print(f"\nup --backend aws on 3 lab hosts (no cloud API): ready in {time.monotonic() - began:.1f} s")
        record = registry.live("labcloud")
        config = yaml.safe_load(Path(record.temp_dir).read_text())
        head_order = _order(config["head_start_ray_commands"][0])
        assert head_order["marker"] == record.marker
        assert [c for _, c in cloud.ran[3:6]] == [config["head_start_ray_commands"][0],
                                                  *config["worker_start_ray_commands"] * 2]

        spec = ClusterSpec.from_json(record.spec)
        head = lab.hosts[0]
        assert spec.remote.hosts == (f"root@{head.address}",) and spec.remote.head_ip == head.address
        assert spec.remote.line_address.startswith("127.0.0.1:")
        assert record.address.startswith("127.0.0.1:") and processes.alive(record.session_id), "no tunnel"
        on_hosts = {h.name: _ours(h, record.marker) for h in lab.hosts}
        assert all(on_hosts.values()), f"Ray is not running, marked, on every host: {on_hosts}"
        for host in lab.hosts:
            mode = lab.ssh(host, f"stat -c %a {head_order['token_path']}").stdout.strip()
            assert mode == "600", f"the token on {host.name} is readable by others ({mode})"
        # the head's watchdog, started by the head's start command from what file_mounts copied
        wait_until(lambda: headguard.beating(registry.get(record.id)), 20, "the head watchdog's heartbeat")

        print(f"  checked: {time.monotonic() - began:.1f} s")
        status = gg.status()
        workers = spec.node_types[0]
        assert len(status.nodes) == 3
        # the workers at the offer's rate, and the head (a CPU machine) at the catalog's own
        assert spec.head_price.offer_id and spec.head_price.usd_per_hour > 0, spec.head_price
        assert status.usd_per_hour == pytest.approx(2 * workers.usd_per_hour + spec.head_price.usd_per_hour), \
            "node types not priced"

        # a restarted kernel finds the cluster by name, through the same tunnel (tunnel.ensure)
        again = new_kernel("import gpugeek_jupyter as gg\n"
                            "gg.up('labcloud')\n"
                            "print('nodes', len(gg.status().nodes))\n", gpugeek_home, timeout=120)
        assert "re-attached to aws cluster 'labcloud'" in again.stdout, again.stderr[-2000:]
        assert "nodes 3" in again.stdout, again.stderr[-2000:]
        assert registry.get(record.id).session_id == record.session_id, "the re-attach opened another tunnel"

        print(f"  re-attached in a new process: {time.monotonic() - began:.1f} s")
        # on CPUs: the stand-in machines have none of the GPUs the offer's type declares (the GPU
        # instances a cell takes by default: tests/lab/test_aws_in_a_box.py)
        result = gg.run(DDP_ACROSS_HOSTS, workers=3, gpus_per_worker=0)
        equal, ips = result.shown()
        assert equal, "gradients differ between ranks"
        assert ips == sorted(h.address for h in lab.hosts), f"ranks ran on {ips}"
        print(f"  a 3-rank cell: {time.monotonic() - began:.1f} s")
    finally:      # also when `up` got the cluster up but this process could not connect
        if registry.live("labcloud") is not None:
            gg.down("labcloud")

    record = registry.get(record.id)
    assert record.stopped
    assert not (left := left_on_hosts(lab)), f"processes left on the hosts: {described(left)}"
    assert not processes.alive(record.session_id), "the tunnel outlived down"
    assert not launcher.node_files("labcloud").exists(), "the token's local copy outlived down"
    tag = head_order["temp_dir"].split("-")[1]
    assert not [d for h in lab.hosts for d in h.file("/tmp").glob(f"gg-{tag}-*")], "Ray's temp dirs remain"
    print(f"up, re-attach, a 3-rank cell, down: {time.monotonic() - began:.1f} s")


def _ours(host, marker: str) -> list[int]:
    return host.pids_with(onhost.MARKER, marker)
