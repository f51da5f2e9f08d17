"""Real clouds through Ray's cluster launcher: a ``ray up`` YAML made from the offers.

We write the config (instance types, spot market options, min/max workers, idle timeout, head
node type), have Ray fill its defaults and validate it against its own schema, and run
``ray up -y`` / ``ray down -y`` only when the user says ``--yes``. Credentials stay where the
providers' standard chains keep them; we only check that some exist and never print them.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ..config import home
from ..errors import GpugeekError
from .spec import ClusterSpec, NodeType

NODE_IDLE_MINUTES = 5
# The head runs Ray's control plane, not training: a small CPU machine. The catalog holds GPU
# offers only, so the head is not priced — status and cost say so.
HEAD_INSTANCE = {"aws": "m5.xlarge", "gcp": "n2-standard-4", "azure": "Standard_D4s_v5"}
GCP_ACCELERATOR = {  # machine families that take attached GPUs (a2/a3/g2 carry theirs built in)
    "T4": "nvidia-tesla-t4", "V100": "nvidia-tesla-v100", "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4", "K80": "nvidia-tesla-k80",
}
GCP_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"


def cluster_config(name: str, spec: ClusterSpec) -> dict:
    """The cluster-launcher config for ``spec`` (before Ray fills its defaults)."""
    provider = spec.backend
    workers = {t.name: _worker(provider, t) for t in spec.node_types}
    head = {"node_config": _node_config(provider, HEAD_INSTANCE[provider], None, spot=False),
            "resources": {}}
    return {
        "cluster_name": name,
        "max_workers": sum(t.max_workers for t in spec.node_types),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": NODE_IDLE_MINUTES,
        "provider": _provider(provider, spec.node_types[0], name),
        "auth": _auth(provider),
        "available_node_types": {"head": head, **workers},
        "head_node_type": "head",
    }


def _worker(provider: str, t: NodeType) -> dict:
    return {
        "min_workers": t.min_workers,
        "max_workers": t.max_workers,
        "node_config": _node_config(provider, t.instance_type, t, spot=t.pricing == "spot"),
        "resources": {"GPU": t.gpu_count, f"accelerator_type:{t.gpu}": 1},
    }


def _provider(provider: str, t: NodeType, name: str) -> dict:
    if provider == "aws":
        out = {"type": "aws", "region": t.region, "cache_stopped_nodes": False}
        if t.zone and not re.fullmatch(r"[a-z0-9]+-az\d+", t.zone):  # an AZ *id* differs per account
            out["availability_zone"] = t.zone
        return out
    if provider == "gcp":
        return {"type": "gcp", "region": t.region, "availability_zone": t.zone or f"{t.region}-a",
                "project_id": os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
                or "YOUR-GCP-PROJECT"}
    out = {"type": "azure", "location": t.region, "resource_group": f"gpugeek-{name}",
           "cache_stopped_nodes": False}
    if os.environ.get("AZURE_SUBSCRIPTION_ID"):
        out["subscription_id"] = os.environ["AZURE_SUBSCRIPTION_ID"]
    return out


def _auth(provider: str) -> dict:
    if provider == "azure":
        return {"ssh_user": "ubuntu", "ssh_private_key": "~/.ssh/id_rsa", "ssh_public_key": "~/.ssh/id_rsa.pub"}
    return {"ssh_user": "ubuntu"}


def _node_config(provider: str, instance: str, t: NodeType | None, *, spot: bool) -> dict:
    if provider == "aws":
        config: dict = {"InstanceType": instance}
        if spot:
            config["InstanceMarketOptions"] = {"MarketType": "spot"}
        return config
    if provider == "gcp":
        config = {
            "machineType": instance,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {"diskSizeGb": 100, "sourceImage": GCP_IMAGE}}],
        }
        if t is not None:
            config["scheduling"] = {"onHostMaintenance": "TERMINATE"}
            if t.gpu in GCP_ACCELERATOR and instance.startswith("n1-"):
                config["guestAccelerators"] = [{"acceleratorType": GCP_ACCELERATOR[t.gpu],
                                                "acceleratorCount": t.gpu_count}]
        if spot:
            config["scheduling"] = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                    "onHostMaintenance": "TERMINATE"}
        return config
    params: dict = {"vmSize": instance, "imagePublisher": "microsoft-dsvm", "imageOffer": "ubuntu-hpc",
                    "imageSku": "2204", "imageVersion": "latest"}
    if spot:
        params.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
    return {"azure_arm_parameters": params}


def validate(config: dict) -> dict:
    """Ray fills its provider defaults and checks the result against its own JSON schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    quiet = logging.getLogger("ray.autoscaler._private.util")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        prepared = prepare_config(copy.deepcopy(config))
        validate_config(prepared)
    except Exception as exc:  # noqa: BLE001 - jsonschema.ValidationError, ValueError, …: Ray's words, one line
        message = getattr(exc, "message", None) or str(exc).splitlines()[0]
        raise GpugeekError(f"Ray rejects the generated {config['provider']['type']} config: {message}") from None
    finally:
        quiet.setLevel(level)
    return prepared


def write(name: str, config: dict) -> Path:
    folder = home() / "launch"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{name}-{config['provider']['type']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- credentials: checked, never read out ---------------------------------------------------------

AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
           "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


def check_credentials(provider: str) -> None:
    """One clear line when nothing in the provider's standard chain could authenticate ``ray up``,
    or when the SDK ``ray up`` needs for it is missing. Nothing is read out or printed."""
    if provider == "aws":
        files = [Path(p).expanduser() for p in ("~/.aws/credentials", "~/.aws/config")]
        if not (any(os.environ.get(v) for v in AWS_ENV) or any(f.exists() for f in files)):
            raise GpugeekError("no AWS credentials found (AWS_* variables, ~/.aws) — run `aws configure` "
                               "or set AWS_PROFILE")
    elif provider == "gcp":
        adc = Path("~/.config/gcloud/application_default_credentials.json").expanduser()
        if not (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or adc.exists()):
            raise GpugeekError("no Google Cloud credentials found — run `gcloud auth application-default "
                               "login` or set GOOGLE_APPLICATION_CREDENTIALS")
        if not (os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")):
            raise GpugeekError("no Google Cloud project — set GOOGLE_CLOUD_PROJECT")
    else:
        profile = Path("~/.azure/azureProfile.json").expanduser()
        if not (os.environ.get("AZURE_CLIENT_ID") or profile.exists()):
            raise GpugeekError("no Azure credentials found — run `az login` or set AZURE_CLIENT_ID/"
                               "AZURE_TENANT_ID/AZURE_CLIENT_SECRET")
    need = {"aws": "boto3", "gcp": "googleapiclient", "azure": "azure.identity"}[provider]
    hint = {"aws": "boto3", "gcp": "google-api-python-client",
            "azure": "azure-identity azure-mgmt-compute azure-mgmt-network azure-mgmt-resource"}[provider]
    if not _importable(need):
        raise GpugeekError(f"`ray up` on {provider} needs the {provider} SDK — pip install {hint}")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


RAY = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]  # this env's `ray` CLI


def ray_cli(*args: str, log: Path, timeout: float | None = None) -> str:
    """Run the ``ray`` CLI of this environment; its output goes to ``log``; one line if it fails."""
    cmd = [*RAY, *args]
    with open(log, "ab") as out:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, timeout=timeout)
        out.write(done.stdout)
    if done.returncode != 0:
        raise GpugeekError(f"`ray {' '.join(args[:2])}` failed (exit {done.returncode}) — see {log}")
    return done.stdout.decode(errors="replace")


def kubectl_available() -> bool:
    return shutil.which("kubectl") is not None
