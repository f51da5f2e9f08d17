"""The clouds (``clouds/``: aws, gcp, azure) through Ray's cluster launcher (``launcher.py`` writes the YAML).

A cloud whose API we speak (``Cloud.lists_instances``: AWS) is stopped through it, by the
cluster's tag (``rented.terminate_all``); the others through ``ray down``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import MappingProxyType

import yaml

from ..clouds import Cloud
from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.remote import CloudHead, Guarded, LineOpened, learn
from ..cluster.spec import ClusterSpec
from ..config import home
from ..errors import LaunchRefused
from ..remote import ssh, tunnel
from . import hosts, launcher, readiness
from .base import READY_TIMEOUT_S, REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started
from .rented import terminate_all


class LauncherBackend(Backend):
    """A cloud of ``clouds/``: the generated YAML through ``ray up``/``ray down``. Past the provider
    section it is an ssh cluster: the same ``onhost.py start`` on every node, the same tunnel."""

    launches = confirm = watched = tunnelled = from_offers = True
    grows = True                # up to --max-workers, by Ray's autoscaler
    runs_here = simulated = your_hosts = local_price = False
    scheduler = None
    kernel_joins = "line"
    cannot = MappingProxyType({
        Feature.DASHBOARD: "the head's dashboard is not opened from here — open it with `ray dashboard <its config>` "
                           "(`up --dry-run` writes the config)",
        Feature.PREEMPT: "a cloud preempts its spot nodes for real; `preempt` " + REHEARSAL_ONLY,
    })

    def __init__(self, provider: Cloud):
        self.cloud = provider
        self.name = self.provider = provider.name
        self.head_instance = provider.head_instance
        self.notices = provider.name     # its metadata service warns a spot node before taking it

    def config(self, name: str, spec: ClusterSpec, marker: str | None = None) -> dict:
        config = launcher.cluster_config(name, spec, marker)
        launcher.validate(config)
        return config

    def show(self, name, spec):
        config = self.config(name, spec)
        path = launcher.write(name, config)
        head_note = (f"The head node ({self.cloud.head_instance}) is priced at ${spec.head_price.usd_per_hour:g}/h "
                     f"({spec.head_price.offer_id}). " if spec.head_price.offer_id else
                     f"The head node ({self.cloud.head_instance}) is not priced: the catalog holds no "
                     f"{self.cloud.head_instance} row for its region. ")
        notes = " ".join(spec.notes)
        return LaunchConfig(self.name, yaml.safe_dump(config, sort_keys=False), path,
                            f"Ray validated this config. {head_note}{notes}Add --yes to run `ray up -y` on it "
                            f"(the folder in its file_mounts is written then).", config)

    def preflight(self, spec):
        self.cloud.check_credentials()

    def readiness(self, asked):
        return readiness.cloud(self.name, self.cloud, asked.region)

    def cannot_start_in(self, region):
        return self.cloud.cannot_start_in(region)

    def start(self, record, spec):
        config = self.config(record.name, spec, record.marker)
        path = launcher.write(record.name, config)
        # recorded before `ray up`, so a failure half-way can still be taken down
        registry.update(record.id, temp_dir=str(path))
        log = self._log(record)
        guard = launcher.guard_order(record, spec)
        launcher.write_node_files(record.name, guard)
        try:
            launcher.ray_cli("up", "-y", str(path), log=log, env=launcher.ssh_wait())
        except LaunchRefused as refused:     # the cloud's own code and words, and what to do
            what = self.cloud.refusals.get(refused.code, "see the log")
            raise LaunchRefused(f"{self.name} refused to launch the cluster's machines: {refused.code} "
                                f"({refused.said}) — {what}", refused.code, refused.said,
                                no_capacity=refused.code in self.cloud.no_capacity) from None
        found = launcher.find_head(record.name, path, log)
        learn(spec, CloudHead(hosts=(f"{found.ssh_user}@{found.public_ip}",), head_ip=found.private_ip,
                              ssh_key=found.ssh_key, gcs_port=hosts.GCS_PORT, keeper_port=hosts.KEEPER_PORT,
                              known_hosts=str(ssh.local_dir(record.name, record.id) / "known_hosts"),
                              pip_index_url=guard["keeper"]["index_url"]),
              Guarded(guard_home=guard["home"]), record_id=record.id)   # a running head: what reaches it
        opened = tunnel.open_tunnel(record, spec)
        return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid], temp_dir=str(path),
                       learned=(LineOpened(line_address=opened.line),))

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        return  # `ray up` returns once the head is up; workers join as the autoscaler brings them

    def stop(self, record, grace=3.0):
        if self.cloud.lists_instances:
            terminate_all(record)
        elif record.temp_dir:
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

