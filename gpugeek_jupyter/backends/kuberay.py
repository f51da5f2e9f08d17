"""KubeRay: a ``RayCluster`` (``ray.io/v1``) manifest with one worker group per node type.

Each group asks Kubernetes for the offer's GPUs (``nvidia.com/gpu`` limits), lands on the offer's
instance type (the well-known ``node.kubernetes.io/instance-type`` label) and, for spot, on the
spot capacity of managed Kubernetes offerings. Ray's in-tree autoscaler sizes the groups between
min and max replicas. Applied with ``kubectl`` only when the user says ``--yes``.
"""

from __future__ import annotations

from ..cluster.spec import ClusterSpec, NodeType
from ..raynodes import NODE_ENV

IDLE_TIMEOUT_S = 300
# what each managed Kubernetes calls its spot capacity (node label → value)
SPOT_SELECTOR = {
    "aws": ("eks.amazonaws.com/capacityType", "SPOT"),
    "gcp": ("cloud.google.com/gke-spot", "true"),
    "azure": ("kubernetes.azure.com/scalesetpriority", "spot"),
}


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
    if t.pricing == "spot" and t.provider in SPOT_SELECTOR:
        key, value = SPOT_SELECTOR[t.provider]
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
