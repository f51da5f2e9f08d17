"""AWS: EC2 through Ray's launcher; a spot node's notice two minutes ahead (IMDSv2)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from types import MappingProxyType

from . import base

IMDS = "http://169.254.169.254"
# Ray's tags on every instance its launcher makes (ray.autoscaler.tags)
CLUSTER_TAG, NODE_TYPE_TAG, NODE_KIND_TAG = "ray-cluster-name", "ray-user-node-type", "ray-node-kind"
# EC2 bills an instance until it begins shutting down or stopping; describe_instances then says when,
# in StateTransitionReason: "User initiated (2026-12-02 19:55:21 GMT)"
NOT_BILLED = ("shutting-down", "terminated", "stopping", "stopped")
# StateReason's codes for a spot instance EC2 took back (its interruption: terminated or stopped)
SPOT_INTERRUPTED = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")
# the instance profile Ray's launcher makes for the head (ray.autoscaler._private.aws.config), whose
# role may use S3: workers that checkpoint there are launched with it too
RAY_PROFILE = "ray-autoscaler-v1"
_WHEN = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


class Aws(base.Cloud):
    name = "aws"
    head_instance = "m5.xlarge"
    kubernetes_spot = ("eks.amazonaws.com/capacityType", "SPOT")
    # an instance whose InstanceInitiatedShutdownBehavior is terminate ends when it shuts down
    self_stop = "sudo shutdown -h now"
    sdk = ("boto3", "boto3")
    credentials = (("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"),
                   ("~/.aws/credentials", "~/.aws/config"))
    no_credentials = "no AWS credentials found (AWS_* variables, ~/.aws) — run `aws configure` or set AWS_PROFILE"
    no_capacity = ("InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity")
    lists_instances = True
    billing_minimum_s = 60.0     # per-second billing, a minute at least (Linux on-demand and spot)
    # EC2's error codes (docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html): what to do
    refusals = MappingProxyType({
        "InsufficientInstanceCapacity": "AWS has none of that type free there now",
        "SpotMaxPriceTooLow": "the spot price there is above the most this launch would pay — "
                              "use --pricing on-demand, or --spot-fallback",
        "VcpuLimitExceeded": "your account's vCPU quota for that instance family is too low — ask AWS to raise it "
                             "(Service Quotas → Amazon EC2), or pick an offer with fewer vCPUs",
        "InvalidAMIID.NotFound": "the machine image Ray's launcher chose does not exist in that region — "
                                 "pick an offer in another region",
        "UnauthorizedOperation": "your AWS credentials may not launch instances — give them EC2 launch rights "
                                 "(ec2:RunInstances, ec2:CreateTags, iam:PassRole), or use a profile that has them "
                                 "(AWS_PROFILE)",
        "AuthFailure": "AWS did not accept your credentials — check them with `aws sts get-caller-identity`",
    })

    def provider_section(self, node_type, cluster_name):
        out = {"type": "aws", "region": node_type.region, "cache_stopped_nodes": False}
        zone = node_type.zone
        if zone and not re.fullmatch(r"[a-z0-9]+-az\d+", zone):  # an AZ *id* differs per account
            out["availability_zone"] = zone
        return out

    def node_config(self, instance, node_type, *, spot):
        config: dict = {"InstanceType": instance}
        image = self.image(node_type.region) if node_type is not None else None
        if image:      # yours; else Ray's launcher fills in its own for the region
            config["ImageId"] = image
        if spot:
            config["InstanceMarketOptions"] = {"MarketType": "spot"}
        return config

    def cannot_start_in(self, region):
        """Ray's launcher gives a node its own Deep Learning AMI, which it has for some regions only
        (``raynodes.ec2_default_images``); elsewhere ``ray up`` would stop after making the IAM role,
        key pair and security group."""
        from ..raynodes import ec2_default_images

        known = ec2_default_images()
        if self.image(region) or known is None or region in known:
            return None
        return (f"Ray's launcher has no machine image of its own in {region} — name yours in config.toml, "
                f'[cluster.images] aws = {{"{region}" = "ami-…"}} (an Ubuntu with NVIDIA\'s driver), or pick '
                f"an offer in another region")

    def head_config(self, config, region):
        image = self.image(region)
        return {**config, "InstanceInitiatedShutdownBehavior": "terminate",    # for self_stop
                **({"ImageId": image} if image else {})}

    def worker_config(self, config, storage):
        """A worker's machine reaches S3 through its role: Ray's launcher gives one to the head
        alone, so workers whose jobs checkpoint to ``s3://`` get the head's (its role may use S3;
        the head's own role passes it on launch: ``iam:PassRole``)."""
        if storage and storage.startswith("s3://"):
            return {**config, "IamInstanceProfile": {"Name": RAY_PROFILE}}
        return config

    def instances(self, cluster_name, region, since=0.0):
        """``describe_instances`` by Ray's cluster tag (EC2 lists an ended instance for about an
        hour after)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = _client(region)
        try:
            pages = client.get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster_name]}])
            found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        except (BotoCoreError, ClientError) as exc:
            raise base.CloudUnanswered(f"EC2 did not list the cluster's instances: {exc}") from None
        return [instance for instance in map(_instance, found) if instance.launched >= since]

    def terminate(self, instance_ids, region):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            _client(region).terminate_instances(InstanceIds=list(instance_ids))
        except (BotoCoreError, ClientError) as exc:
            raise base.CloudUnanswered(f"EC2 did not terminate {', '.join(instance_ids)}: {exc}") from None

    def read_notice(self, node_id=""):
        """``spot/instance-action`` answers 404 until there is a notice, then {"action":
        "terminate"|"stop", "time": "2026-11-23T08:22:00Z"} (IMDSv2: a session token first)."""
        token = base.metadata("PUT", f"{IMDS}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        action = base.metadata("GET", f"{IMDS}/latest/meta-data/spot/instance-action",
                               {"X-aws-ec2-metadata-token": token or ""})
        if not action:
            return None
        return datetime.fromisoformat(json.loads(action)["time"].replace("Z", "+00:00")).timestamp()


def _client(region: str):
    import boto3
    from botocore.config import Config

    return boto3.client("ec2", region_name=region, config=Config(
        connect_timeout=base.API_TIMEOUT_S, read_timeout=base.API_TIMEOUT_S, retries={"max_attempts": 2}))


def _instance(described: dict) -> base.Instance:
    tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
    state = described["State"]["Name"]
    when = _WHEN.search(described.get("StateTransitionReason") or "")
    ended = datetime.fromisoformat(when.group(1)).replace(tzinfo=timezone.utc).timestamp() \
        if when and state in NOT_BILLED else None
    return base.Instance(id=described["InstanceId"], node_type=tags.get(NODE_TYPE_TAG, ""),
                         launched=described["LaunchTime"].timestamp(), ended=ended, state=state,
                         address=described.get("PrivateIpAddress", ""),
                         spot=described.get("InstanceLifecycle") == "spot", gone=state in NOT_BILLED,
                         head=tags.get(NODE_KIND_TAG) == "head",
                         preempted=(described.get("StateReason") or {}).get("Code") in SPOT_INTERRUPTED)


AWS = Aws()
