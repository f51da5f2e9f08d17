"""AWS: EC2 through Ray's launcher; a spot node's notice two minutes ahead (IMDSv2)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from types import MappingProxyType

from ..errors import GpugeekError
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
# what Ray's launcher does in EC2, each asked with DryRun=True: EC2 answers DryRunOperation where the
# identity may, UnauthorizedOperation where it may not, and does nothing either way
DRY_RUNS = ("DescribeInstances", "DescribeSubnets", "CreateSecurityGroup", "RunInstances", "CreateTags",
            "TerminateInstances")
REFUSED = ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException")
PLACEHOLDER_ID = "i-0123456789abcdef0"    # an instance id for the dry runs that name one (none is touched)
# Service Quotas' vCPU quotas of the GPU instance families (on-demand)
GPU_QUOTAS = (("G and VT", "L-DB2E81BA"), ("P", "L-417A185B"))


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
            raise base.CloudUnanswered(f"EC2 did not list the cluster's instances: {exc} — check your AWS "
                                       "credentials; the cluster's cost stays as last known") from None
        return [instance for instance in map(_instance, found) if instance.launched >= since]

    def terminate(self, instance_ids, region):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            _client(region).terminate_instances(InstanceIds=list(instance_ids))
        except (BotoCoreError, ClientError) as exc:
            raise base.CloudUnanswered(f"EC2 did not terminate {', '.join(instance_ids)}: {exc} — terminate them in "
                                       "the EC2 console; they bill until then") from None

    def readiness(self, region=None):
        """Who the credentials are (STS), whether they may do what Ray's launcher does (EC2's dry
        runs) and the GPU families' vCPU quotas where the account lets them be read."""
        from botocore.exceptions import BotoCoreError, ClientError

        session, region = _session(region)
        try:
            me = _client(region, "sts", session).get_caller_identity()
        except ClientError as exc:
            raise GpugeekError(f"AWS did not accept your credentials ({_code(exc)}) — check them with "
                               f"`aws sts get-caller-identity`, or use another profile (AWS_PROFILE)") from None
        except BotoCoreError as exc:
            raise GpugeekError(f"AWS did not answer ({exc}) — check your network, or the endpoint you set") from None
        refused = [f"ec2:{action}" for action in DRY_RUNS if _refused(_client(region, "ec2", session), action, region)]
        who = f"account {me['Account']} as {me['Arn']}, in {region}"
        if refused:
            raise GpugeekError(f"{who}: may not {', '.join(refused)} — give it those permissions (an IAM policy), "
                               f"or use a profile that has them (AWS_PROFILE)")
        return f"{who}; may launch (dry runs of ec2:{', '.join(DRY_RUNS)}); {_quotas(session, region)}"

    def read_notice(self, node_id=""):
        """``spot/instance-action`` answers 404 until there is a notice, then {"action":
        "terminate"|"stop", "time": "2026-11-23T08:22:00Z"} (IMDSv2: a session token first)."""
        token = base.metadata("PUT", f"{IMDS}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        action = base.metadata("GET", f"{IMDS}/latest/meta-data/spot/instance-action",
                               {"X-aws-ec2-metadata-token": token or ""})
        if not action:
            return None
        return datetime.fromisoformat(json.loads(action)["time"].replace("Z", "+00:00")).timestamp()


def _client(region: str, service: str = "ec2", session=None):
    import boto3
    from botocore.config import Config

    return (session or boto3).client(service, region_name=region, config=Config(
        connect_timeout=base.API_TIMEOUT_S, read_timeout=base.API_TIMEOUT_S, retries={"max_attempts": 2}))


def _session(region: str | None):
    """The SDK's session, its credentials found and its region known (``--region``, else
    AWS_DEFAULT_REGION or the profile's): each missing one is one line saying what to do."""
    if not base.importable("boto3"):
        raise GpugeekError("the AWS SDK is not installed — pip install boto3")
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        session = boto3.Session(region_name=region)
        found = session.get_credentials()
    except BotoCoreError as exc:     # a profile named that does not exist, a broken config file
        raise GpugeekError(f"AWS credentials could not be read: {exc} — run `aws configure`") from None
    if found is None:
        raise GpugeekError(AWS.no_credentials)
    if not session.region_name:
        raise GpugeekError("no AWS region — set AWS_DEFAULT_REGION, name one in your profile (`aws configure`), "
                           "or give --region")
    return session, session.region_name


def _code(exc) -> str:
    return exc.response.get("Error", {}).get("Code", "") if hasattr(exc, "response") else type(exc).__name__


def _refused(ec2, action: str, region: str) -> bool:
    """One dry run: True where EC2 refuses the identity ``action``."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..raynodes import ec2_default_images

    image = (AWS.image(region) or (ec2_default_images() or {}).get(region) or "ami-0123456789abcdef0")
    asked = {"DescribeInstances": lambda: ec2.describe_instances(DryRun=True, MaxResults=5),
             "DescribeSubnets": lambda: ec2.describe_subnets(DryRun=True),
             "CreateSecurityGroup": lambda: ec2.create_security_group(
                 DryRun=True, GroupName="gpugeek-check", Description="gpugeek check (a dry run)"),
             "RunInstances": lambda: ec2.run_instances(DryRun=True, ImageId=image, InstanceType=AWS.head_instance,
                                                       MinCount=1, MaxCount=1),
             "CreateTags": lambda: ec2.create_tags(DryRun=True, Resources=[PLACEHOLDER_ID],
                                                   Tags=[{"Key": CLUSTER_TAG, "Value": "gpugeek-check"}]),
             "TerminateInstances": lambda: ec2.terminate_instances(DryRun=True, InstanceIds=[PLACEHOLDER_ID])}
    try:
        asked[action]()
    except ClientError as exc:
        if _code(exc) == "AuthFailure":
            raise GpugeekError("AWS did not accept your credentials (AuthFailure) — check them with "
                               "`aws sts get-caller-identity`") from None
        return _code(exc) in REFUSED
    except BotoCoreError as exc:
        raise GpugeekError(f"EC2 in {region} did not answer ({exc}) — check your network") from None
    return False


def _quotas(session, region: str) -> str:
    """The GPU families' on-demand vCPU quotas, or "not readable" (they need servicequotas:GetServiceQuota)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        quotas = _client(region, "service-quotas", session)
        found = [f"{family} {quotas.get_service_quota(ServiceCode='ec2', QuotaCode=code)['Quota']['Value']:g}"
                 for family, code in GPU_QUOTAS]
    except (BotoCoreError, ClientError, KeyError):
        return "GPU vCPU quotas not readable (servicequotas:GetServiceQuota)"
    return "GPU vCPU quotas: " + ", ".join(found)


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
