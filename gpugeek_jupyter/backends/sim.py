"""The simulated multi-node GPU cluster: Ray's fake multi-node autoscaler, node types from offers.

Every worker node is a real raylet on this machine that declares the offer's GPUs (``GPU``) and
its model (``accelerator_type:A100``); Ray's own autoscaler launches and removes them. Nothing here
schedules: we write the autoscaler's config (node types, min/max workers) and Ray acts on it.
The autoscaler re-reads that file every update, which is how ``scale`` and spot fallback work.
Declared GPUs are not devices: work on these nodes runs on the CPU.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import MappingProxyType

import psutil

from ..cluster import processes
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..meter import ledger
from ..raynodes import RayNode, read_nodes
from . import local
from .base import LaunchConfig, Started
from .local import LocalBackend

NODE_IDLE_MINUTES = 1.0      # a node above min_workers is removed after this long idle
ENV = {
    "RAY_FAKE_CLUSTER": "1",
    "AUTOSCALER_UPDATE_INTERVAL_S": "1",
    # a preempted (killed) node is noticed in seconds, not the default half minute
    "AUTOSCALER_HEARTBEAT_TIMEOUT_S": "5",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def cpus_per_node(spec: ClusterSpec) -> int:
    """Declared CPUs per node, scaled so the largest the cluster may grow to fits this machine."""
    most = max(1, sum(t.max_workers for t in spec.node_types))
    return max(1, (os.cpu_count() or 1) // most)


def autoscaler_config(name: str, spec: ClusterSpec, gcs_address: str) -> dict:
    cpus = cpus_per_node(spec)
    types: dict[str, dict] = {"ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}}
    for t in spec.node_types:
        types[t.name] = {
            "resources": {"CPU": cpus, "GPU": t.gpu_count, f"accelerator_type:{t.gpu}": 1},
            "node_config": {}, "min_workers": t.min_workers, "max_workers": t.max_workers,
        }
    return {
        "cluster_name": name,
        "max_workers": sum(t.max_workers for t in spec.node_types),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": NODE_IDLE_MINUTES,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": gcs_address},
        "available_node_types": types,
        "head_node_type": "ray.head.default",
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def cpu_note(spec: ClusterSpec) -> str:
    t = spec.workers
    vcpus = f"{t.vcpus:g}" if t and t.vcpus else "?"
    return (f"simulated: CPUs scaled to fit this machine ({os.cpu_count()} cores) — each node "
            f"declares {cpus_per_node(spec)} CPU (the offer has {vcpus}); GPUs are declared, not real")


def write_config(path: Path, name: str, spec: ClusterSpec, gcs_address: str) -> None:
    """Atomic: the autoscaler never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(autoscaler_config(name, spec, gcs_address), indent=1))
    os.replace(tmp, path)


def config_path(temp_dir: str) -> Path:
    return Path(temp_dir) / "autoscaler.json"


def find_node(address: str, node: str) -> RayNode:
    """A live worker node by id, or by a unique start or end of its id (as ``status`` shows it)."""
    nodes = [n for n in read_nodes(address) if n.alive and not n.is_head]
    hits = [n for n in nodes if n.node_id == node or n.node_id.startswith(node) or n.node_id.endswith(node)]
    if len(hits) != 1:
        known = ", ".join(n.node_id[-6:] for n in nodes) or "none"
        what = "matches several nodes" if hits else "is not a live worker node"
        raise GpugeekError(f"node {node!r} {what} — live worker nodes: {known}")
    return hits[0]


def preempt(cluster_id: int, name: str, spec: ClusterSpec, address: str, session_id: int,
            since: float, marker: str, temp_dir: str, node: str) -> tuple[RayNode, ClusterSpec]:
    """Take a node away as a spot preemption does: the machine is shut down under the node.

    The cloud's shutdown signals the node's processes (SIGTERM; SIGKILL for whatever is left
    a moment later); the work on it is lost.

    The ledger closes the node at this instant. With spot fallback, the autoscaler is told to
    keep one fewer spot node and one more on-demand node, and brings the replacement up.
    """
    target = find_node(address, node)
    raylets = [p for p in processes.session_processes(session_id, since, marker)
               if f"--raylet_socket_name={target.raylet_socket}" in " ".join(_cmdline(p))]
    if not raylets:
        raise GpugeekError(f"node {target.node_id[-6:]} is not a process of this cluster — `%gpugeek status` lists "
                           "its nodes")
    # the ledger and the autoscaler hear of it first, so neither Ray's later health-check verdict
    # nor a relaunch of the lost spot type gets ahead of us
    at = time.time()
    ledger.end_node(cluster_id, target.node_id, at, "preempted")
    ledger.event(cluster_id, "preempted", f"node {target.node_id[-6:]} ({target.node_type}) preempted", at,
                 options={"node": target.node_id})
    primary = next((t for t in spec.node_types if t.name == target.node_type and t.pricing == "spot"), None)
    fallback = next((t for t in spec.node_types if primary and t.replaces_preempted == primary.name), None)
    if primary and fallback:
        primary.min_workers = max(0, primary.min_workers - 1)
        fallback.min_workers += 1
        fallback.max_workers = max(fallback.max_workers, fallback.min_workers)
        write_config(config_path(temp_dir), name, spec, address)
        ledger.event(cluster_id, "spot-fallback",
                     f"replacing it with an on-demand {fallback.name} node at ${fallback.usd_per_hour:.2f}/h")
    for raylet in raylets:
        processes.preempt_tree(raylet)
    return target, spec


def scale(name: str, spec: ClusterSpec, address: str, temp_dir: str, workers: int) -> ClusterSpec:
    """A fixed size of ``workers`` nodes of the cluster's node type; extra stand-ins go idle."""
    primary = spec.workers
    if primary is None:
        raise GpugeekError("this cluster has no worker node type to scale — `up` one with --workers or --max-workers")
    primary.min_workers = primary.max_workers = workers
    for t in spec.node_types:
        if t.replaces_preempted:
            t.min_workers = 0
    write_config(config_path(temp_dir), name, spec, address)
    return spec


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:       # gone, or not ours to read
        return []


class SimBackend(LocalBackend):
    name = "sim"
    grows = simulated = from_offers = True     # Ray's fake multi-node autoscaler, node types from offers
    local_price = False
    notices = "kv"              # `%gpugeek preempt NODE --notice S` puts it in the KV store
    scheduler = None
    cannot = MappingProxyType({})

    def readiness(self, asked):
        """This machine, as ``local`` says: nothing of its own to look at."""
        return None

    def show(self, name, spec):
        config = autoscaler_config(name, spec, "127.0.0.1:<port>")
        return LaunchConfig(self.name, json.dumps(config, indent=1), None,
                            f"{cpu_note(spec)}. Run without --dry-run to start it.", config)

    def start(self, record, spec):
        temp_dir = local.new_temp_dir(record.marker)
        config = config_path(temp_dir)

        def port_chosen(port: int) -> None:   # the autoscaler's config names the GCS address
            write_config(config, record.name, spec, f"{local.HOST}:{port}")
        started = local.start_head(temp_dir, record.marker, port_chosen, num_cpus=0, num_gpus=0,
                                   autoscaling_config=config, env=ENV, dashboard=spec.dashboard)
        return Started(started.address, started.session_id, started.pids, temp_dir, started.dashboard_url)

    def scale(self, record, spec, workers):
        return scale(record.name, spec, record.address, record.temp_dir, workers)

    def notes(self, spec):
        return [cpu_note(spec)]

    def node(self, record, node):
        return find_node(record.address, node)

    def preempt(self, record, spec, node):
        return preempt(record.id, record.name, spec, record.address, record.session_id, record.created,
                       record.marker, record.temp_dir, node)
