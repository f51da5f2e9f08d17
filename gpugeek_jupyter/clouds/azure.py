"""Azure: VMs through Ray's launcher; a spot VM's Scheduled Event at least 30 s ahead."""

from __future__ import annotations

import json
import os
import time
from email.utils import parsedate_to_datetime

from . import base

IMDS = "http://169.254.169.254/metadata"


class Azure(base.Cloud):
    name = "azure"
    head_instance = "Standard_D4s_v5"
    kubernetes_spot = ("kubernetes.azure.com/scalesetpriority", "spot")
    # a VM that shuts down is stopped but kept (and billed): the head deletes itself with its
    # managed identity
    self_stop = ("az login --identity >/dev/null && az vm delete --yes --ids \"$(curl -sf -H Metadata:true "
                 f"'{IMDS}/instance/compute/resourceId?api-version=2021-02-01&format=text')\"")
    sdk = ("azure.identity", "azure-identity azure-mgmt-compute azure-mgmt-network azure-mgmt-resource")
    credentials = (("AZURE_CLIENT_ID",), ("~/.azure/azureProfile.json",))
    no_credentials = (
        "no Azure credentials found — run `az login` or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET")

    def provider_section(self, node_type, cluster_name):
        out = {"type": "azure", "location": node_type.region, "resource_group": f"gpugeek-{cluster_name}",
               "cache_stopped_nodes": False}
        if os.environ.get("AZURE_SUBSCRIPTION_ID"):
            out["subscription_id"] = os.environ["AZURE_SUBSCRIPTION_ID"]
        return out

    def auth(self):
        return {"ssh_user": "ubuntu", "ssh_private_key": "~/.ssh/id_rsa", "ssh_public_key": "~/.ssh/id_rsa.pub"}

    def node_config(self, instance, node_type, *, spot):
        params: dict = {"vmSize": instance, "imagePublisher": "microsoft-dsvm", "imageOffer": "ubuntu-hpc",
                        "imageSku": "2204", "imageVersion": "latest"}
        if spot:
            params.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
        return {"azure_arm_parameters": params}

    def read_notice(self, node_id=""):
        """Scheduled Events: a ``Preempt`` event's ``NotBefore`` (an RFC 1123 date)."""
        body = base.metadata("GET", f"{IMDS}/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        events = json.loads(body or "{}").get("Events", [])
        times = [parsedate_to_datetime(e["NotBefore"]).timestamp() if e.get("NotBefore") else time.time() + 30.0
                 for e in events if e.get("EventType") == "Preempt"]
        return min(times) if times else None


AZURE = Azure()
