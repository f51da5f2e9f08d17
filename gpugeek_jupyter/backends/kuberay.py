"""KubeRay: a ``RayCluster`` (``ray.io/v1``) manifest with one worker group per node type.

Each group asks Kubernetes for the offer's GPUs (``nvidia.com/gpu`` limits), lands on the offer's
instance type (the well-known ``node.kubernetes.io/instance-type`` label) and, for spot, on the
spot capacity of managed Kubernetes offerings. Ray's in-tree autoscaler sizes the groups between
min and max replicas. Applied with ``kubectl`` only when the user says ``--yes``.
"""

from __future__ import annotations

import subprocess
from types import MappingProxyType

import yaml

from ..clouds import CLOUDS
from ..cluster import registry
from ..cluster.spec import ClusterSpec, NodeType
from ..config import home
from ..errors import GpugeekError
from ..raynodes import NODE_ENV
from . import readiness
from .base import READY_TIMEOUT_S, REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started
from .launcher import kubectl_available

IDLE_TIMEOUT_S = 300


def ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


def image(gpu: bool) -> str:
    version = ray_version()
    return f"rayproject/ray:{version}-gpu" if gpu else f"rayproject/ray:{version}"


def manifest(name: str, spec: ClusterSpec, namespace: str = "default") -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "gpugeek-jupyter"}},
        "spec": {
            "rayVersion": ray_version(),
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": IDLE_TIMEOUT_S},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0"},
                "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": image(gpu=False),
                    "resources": {"limits": {"cpu": "2", "memory": "8Gi"},
                                  "requests": {"cpu": "2", "memory": "8Gi"}},
                    "ports": [{"containerPort": 6379, "name": "gcs"},
                              {"containerPort": 10001, "name": "client"}],
                }]}},
            },
            "workerGroupSpecs": [_group(t) for t in spec.node_types],
        },
    }


def _group(t: NodeType) -> dict:
    cpus = str(int(t.vcpus * 0.9)) if t.vcpus else "4"          # leave room for the kubelet
    memory = f"{int(t.mem_gib * 0.9)}Gi" if t.mem_gib else "16Gi"
    resources = {"nvidia.com/gpu": str(t.gpu_count), "cpu": cpus, "memory": memory}
    selector = {"node.kubernetes.io/instance-type": t.instance_type}
    if t.pricing == "spot" and t.provider in CLOUDS:     # its managed Kubernetes' spot label
        key, value = CLOUDS[t.provider].kubernetes_spot
        selector[key] = value
    return {
        "groupName": t.name,
        "replicas": t.min_workers,
        "minReplicas": t.min_workers,
        "maxReplicas": t.max_workers,
        "rayStartParams": {"resources": f'"{{\\"accelerator_type:{t.gpu}\\": 1}}"'},
        "template": {"spec": {
            "nodeSelector": selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "ray-worker", "image": image(gpu=True),
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "env": [{"name": k, "value": v} for k, v in NODE_ENV.items()],   # the ranks' priority
            }],
        }},
    }


class KubeRayBackend(Backend):
    name = "kuberay"
    launches = confirm = from_offers = True
    grows = True                # KubeRay's autoscaler
    watched = False             # no route to meter its head yet
    cannot = MappingProxyType({
        Feature.LIMITS: "not enforced on KubeRay yet (no route to meter its head) — use the autoscaler's idle "
                        "timeout in the manifest, or a cloud backend",
        Feature.DASHBOARD: "KubeRay runs the head's dashboard — `kubectl port-forward svc/NAME-head-svc 8265`",
        Feature.SCALE: "KubeRay's autoscaler sizes the cluster — change the RayCluster's workerGroupSpecs "
                       "(`kubectl edit raycluster NAME`)",
        Feature.PREEMPT: REHEARSAL_ONLY,
    })
    runs_here = tunnelled = simulated = your_hosts = local_price = False
    kernel_joins = None         # a kernel records itself attached, no more
    notices = provider = scheduler = None

    def show(self, name, spec):
        made = manifest(name, spec)
        folder = home() / "launch"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{name}-raycluster.yaml"
        text = yaml.safe_dump(made, sort_keys=False)
        path.write_text(text)
        return LaunchConfig(self.name, text, path,
                            "Add --yes to `kubectl apply` it (needs the KubeRay operator in the cluster).",
                            made)

    def preflight(self, spec):
        if not kubectl_available():
            raise GpugeekError("kubectl is not on PATH — install it and point KUBECONFIG at your cluster")

    def readiness(self, asked):
        return readiness.kubernetes(self.name)

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
            raise GpugeekError(f"kubectl {args[0]} failed: {last} — check kubectl's context and access (`kubectl get "
                               "rayclusters`)")
