"""Google Cloud: Compute Engine through Ray's launcher; a spot VM's notice about 30 s ahead."""

from __future__ import annotations

import os
import time

from ..errors import GpugeekError
from . import base

METADATA = "http://metadata.google.internal/computeMetadata/v1"
# machine families that take attached GPUs (a2/a3/g2 carry theirs built in)
ACCELERATOR = {"T4": "nvidia-tesla-t4", "V100": "nvidia-tesla-v100", "P100": "nvidia-tesla-p100",
               "P4": "nvidia-tesla-p4", "K80": "nvidia-tesla-k80"}
IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"
PROJECT_VARIABLES = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")


def project() -> str | None:
    return next((os.environ[v] for v in PROJECT_VARIABLES if os.environ.get(v)), None)


class Gcp(base.Cloud):
    name = "gcp"
    head_instance = "n2-standard-4"
    kubernetes_spot = ("cloud.google.com/gke-spot", "true")
    # a VM that shuts down is stopped but kept (and billed): the head deletes itself with its
    # own service account
    self_stop = ("gcloud compute instances delete \"$(hostname)\" --quiet --zone=\"$(curl -sf -H 'Metadata-Flavor: "
                 f"Google' {METADATA}/instance/zone | cut -d/ -f4)\"")
    sdk = ("googleapiclient", "google-api-python-client")
    credentials = (("GOOGLE_APPLICATION_CREDENTIALS",), ("~/.config/gcloud/application_default_credentials.json",))
    no_credentials = ("no Google Cloud credentials found — run `gcloud auth application-default login` or set "
                      "GOOGLE_APPLICATION_CREDENTIALS")

    def check_more(self):
        if project() is None:
            raise GpugeekError("no Google Cloud project — set GOOGLE_CLOUD_PROJECT")

    def provider_section(self, node_type, cluster_name):
        return {"type": "gcp", "region": node_type.region,
                "availability_zone": node_type.zone or f"{node_type.region}-a",
                "project_id": project() or "YOUR-GCP-PROJECT"}

    def node_config(self, instance, node_type, *, spot):
        config: dict = {
            "machineType": instance,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {"diskSizeGb": 100, "sourceImage": IMAGE}}],
        }
        if node_type is not None:
            config["scheduling"] = {"onHostMaintenance": "TERMINATE"}
            if node_type.gpu in ACCELERATOR and instance.startswith("n1-"):
                config["guestAccelerators"] = [{"acceleratorType": ACCELERATOR[node_type.gpu],
                                                "acceleratorCount": node_type.gpu_count}]
        if spot:
            config["scheduling"] = {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                    "onHostMaintenance": "TERMINATE"}
        return config

    def read_notice(self, node_id=""):
        """``instance/preempted`` says ``TRUE`` once the VM is being preempted (it has about 30 s)."""
        flag = base.metadata("GET", f"{METADATA}/instance/preempted", {"Metadata-Flavor": "Google"})
        return time.time() + 30.0 if (flag or "").strip().upper() == "TRUE" else None


GCP = Gcp()
