"""The cloud's side of the box, run in a network namespace of its own on the lab's bridge:

- EC2 (with IAM and STS): moto's server, on the namespace's loopback, behind a front on the box's
  endpoint address that passes every call through, or answers it with a fault EC2 would give
  (``/_box/faults``: capacity, spot price, quota, a missing AMI, a permission denied);
- each instance's metadata service (IMDSv2) at 169.254.169.254, which the hosts reach over the
  bridge: the instance is known by the address a request comes from;
- what a machine does to its instance: ``/_box/shutdown`` (a host's ``shutdown``: the instance
  ends or stops, as its ``InstanceInitiatedShutdownBehavior`` says), ``/_box/preempt`` (a spot
  notice in IMDS, then the instance terminated), ``/_box/reboots`` (for the fabric to act on).

    python cloud.py ENDPOINT_IP PORT REGION[,REGION…]

It prints ``ready`` once both servers answer and the regions' subnets give no public address.
"""

from __future__ import annotations

import http.client
import http.server
import json
import secrets
import sys
import threading
import time
import urllib.parse
from datetime import UTC, datetime, timedelta

import boto3

METADATA = "169.254.169.254"
MOTO_PORT = 5000
HOP_BY_HOP = ("content-length", "connection", "transfer-encoding", "keep-alive", "server", "date")
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

# EC2's own words and HTTP statuses for what a real account meets (moto gives none of them)
FAULTS = {
    "InsufficientInstanceCapacity": (500, "We currently do not have sufficient {type} capacity in the "
                                          "Availability Zone you requested ({zone}). Our system will be working on "
                                          "provisioning additional capacity."),
    "SpotMaxPriceTooLow": (400, "Your Spot request price is lower than the minimum required Spot request "
                                "fulfillment price."),
    "VcpuLimitExceeded": (400, "You have requested more vCPU capacity than your current vCPU limit of 0 allows "
                               "for the instance bucket that the specified instance type belongs to. Please visit "
                               "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."),
    "InvalidAMIID.NotFound": (400, "The image id '[{image}]' does not exist"),
    "UnauthorizedOperation": (403, "You are not authorized to perform this operation. User: "
                                   "arn:aws:iam::123456789012:user/box is not authorized to perform: ec2:{action}"),
}


class Cloud:
    """The state beside moto's: faults to give, notices given, reboots asked, IMDS tokens."""

    def __init__(self, regions: list[str]):
        self.regions = regions
        self.lock = threading.Lock()
        self.faults: list[dict] = []   # {"code", "action", "type"?, "zone"?, "market"?, "times" (-1: till cleared)}
        self.notices: dict[str, dict] = {}    # instance id → {"action", "time"}
        self.reboots: list[str] = []
        self.tokens: set[str] = set()
        self.given: list[dict] = []           # every fault answered, for the tests to read

    def ec2(self, region: str):
        return boto3.client("ec2", endpoint_url=f"http://127.0.0.1:{MOTO_PORT}", region_name=region, **CREDENTIALS)

    def instance_at(self, address: str) -> tuple[str, dict] | None:
        """The region and description of the live instance whose private address is ``address``."""
        for region in self.regions:
            for reservation in self.ec2(region).describe_instances(Filters=[
                    {"Name": "private-ip-address", "Values": [address]},
                    {"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]}])["Reservations"]:
                for instance in reservation["Instances"]:
                    return region, instance
        return None

    def default_subnet(self, region: str, zone: str | None) -> str:
        subnets = self.ec2(region).describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        return next(s["SubnetId"] for s in sorted(subnets, key=lambda s: s["AvailabilityZone"])
                    if zone in (None, s["AvailabilityZone"]))

    def fault_for(self, params: dict[str, str]) -> tuple[int, str] | None:
        """The fault to answer this call with, if a rule asks for one (and counts it given)."""
        action = params.get("Action", "")
        kind, zone = params.get("InstanceType", ""), params.get("Placement.AvailabilityZone", "")
        with self.lock:
            for rule in self.faults:
                if rule["action"] != action or rule["times"] == 0:
                    continue
                if rule.get("type") not in (None, kind) or rule.get("zone") not in (None, zone):
                    continue
                spot = "InstanceMarketOptions.MarketType" in params
                if (rule["code"] == "SpotMaxPriceTooLow" or rule.get("market") == "spot") and not spot:
                    continue        # an on-demand launch has no spot price to be too low, nor spot's capacity
                rule["times"] -= rule["times"] > 0
                status, words = FAULTS[rule["code"]]
                self.given.append({"code": rule["code"], "action": action, "type": kind, "zone": zone})
                return status, words.format(type=kind, zone=zone or "the one chosen", action=action,
                                            image=params.get("ImageId", ""))
        return None

    def preempt(self, instance_id: str, region: str, notice_s: float) -> None:
        """A spot instance's notice in its IMDS, then the instance terminated ``notice_s`` later,
        with EC2's own reason for a spot interruption."""
        when = datetime.now(UTC) + timedelta(seconds=notice_s)
        with self.lock:
            self.notices[instance_id] = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        threading.Timer(notice_s, self._interrupt, (instance_id, region)).start()

    def _interrupt(self, instance_id: str, region: str) -> None:
        """EC2 takes a spot instance back: terminated, its StateReason ``Server.SpotInstanceTermination``
        (moto's terminate says the user did it; its record, in this process, is given EC2's code, and
        keeps moto's dated StateTransitionReason)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.instances import StateReason

        self.ec2(region).terminate_instances(InstanceIds=[instance_id])
        instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
        instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                            "Server.SpotInstanceTermination")

    def shut_down(self, address: str) -> str:
        """The instance at ``address`` shut itself down: it ends or stops, as it was launched to."""
        found = self.instance_at(address)
        if found is None:
            return "no instance"
        region, instance = found
        ec2, iid = self.ec2(region), instance["InstanceId"]
        behaviour = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        if behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
            ec2.terminate_instances(InstanceIds=[iid])
            return "terminated"
        ec2.stop_instances(InstanceIds=[iid])
        return "stopped"


def _region(authorization: str) -> str:
    """The region a SigV4 call was signed for (``Credential=KEY/DATE/REGION/SERVICE/…``)."""
    try:
        return authorization.split("Credential=", 1)[1].split("/")[2]
    except IndexError:
        return "us-east-1"


def ec2_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>{secrets.token_hex(16)}</RequestID>"
            f"</Response>").encode()


def front(cloud: Cloud):
    class Front(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _reply(self, status: int, body: bytes, kind: str = "text/xml") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self):
            self._pass(b"")

        def do_DELETE(self):
            self._pass(b"")

        def do_HEAD(self):          # S3's HeadObject and HeadBucket (s3fs asks before it reads)
            self._pass(b"")

        def do_PUT(self):
            self._pass(self._body())

        def do_POST(self):
            body = self._body()
            if self.path.startswith("/_box/"):
                return self._box(self.path[len("/_box/"):], json.loads(body or b"{}"))
            pairs = urllib.parse.parse_qsl(body.decode(errors="replace"), keep_blank_values=True)
            params = dict(pairs)
            if (fault := cloud.fault_for(params)) is not None:
                code = cloud.given[-1]["code"]
                return self._reply(fault[0], ec2_error(code, fault[1]))
            if params.get("Action") == "RunInstances" and not any("SubnetId" in k for k in params):
                # EC2 launches into the zone's default subnet (moto would give an address outside the VPC)
                region = _region(self.headers.get("Authorization", ""))
                pairs.append(("SubnetId", cloud.default_subnet(region, params.get("Placement.AvailabilityZone"))))
                body = urllib.parse.urlencode(pairs).encode()
                self.headers.replace_header("Content-Length", str(len(body)))
            self._pass(body)

        def _box(self, what: str, order: dict) -> None:
            if what == "faults":
                with cloud.lock:
                    cloud.faults.append({"times": -1, **order})
                answer = {"faults": len(cloud.faults)}
            elif what == "clear":
                with cloud.lock:
                    cloud.faults.clear()
                answer = {"faults": 0}
            elif what == "given":
                answer = {"given": cloud.given}
            elif what == "shutdown":
                answer = {"done": cloud.shut_down(self.client_address[0])}
            elif what == "reboot":
                found = cloud.instance_at(self.client_address[0])
                with cloud.lock:
                    cloud.reboots += [found[1]["InstanceId"]] if found else []
                answer = {"done": "rebooting" if found else "no instance"}
            elif what == "reboots":
                with cloud.lock:
                    answer, cloud.reboots = {"reboots": cloud.reboots}, []
            elif what == "preempt":
                cloud.preempt(order["instance_id"], order["region"], float(order.get("notice_s", 120)))
                answer = {"notice": cloud.notices[order["instance_id"]]}
            else:
                return self._reply(404, b"{}", "application/json")
            self._reply(200, json.dumps(answer).encode(), "application/json")

        def _pass(self, body: bytes) -> None:
            moto = http.client.HTTPConnection("127.0.0.1", MOTO_PORT, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            moto.request(self.command, self.path, body=body, headers=headers)
            answer = moto.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            # a HEAD's answer has no body, and says the length of the one a GET would have
            length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            moto.close()

    return Front


def metadata(cloud: Cloud):
    """IMDSv2 as an instance sees it: a token first (PUT), then GETs that carry it."""

    class Metadata(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _reply(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._reply(400, "")
            token = secrets.token_urlsafe(32)
            with cloud.lock:
                cloud.tokens.add(token)
            self._reply(200, token)

        def do_GET(self):
            if self.headers.get("X-aws-ec2-metadata-token") not in cloud.tokens:
                return self._reply(401, "")
            found = cloud.instance_at(self.client_address[0])
            if found is None:
                return self._reply(404, "")
            region, instance = found
            answer = self._answer(self.path.rstrip("/"), region, instance)
            self._reply(200, answer) if answer is not None else self._reply(404, "")

        def _answer(self, path: str, region: str, instance: dict) -> str | None:
            meta = "/latest/meta-data"
            profile = (instance.get("IamInstanceProfile") or {}).get("Arn", "").rsplit("/", 1)[-1]
            zone = instance["Placement"]["AvailabilityZone"]
            if path == f"{meta}/spot/instance-action":
                with cloud.lock:
                    notice = cloud.notices.get(instance["InstanceId"])
                return json.dumps(notice) if notice else None
            if path.startswith(f"{meta}/iam/security-credentials"):
                if not profile:
                    return None
                if path == f"{meta}/iam/security-credentials":
                    return profile
                now = datetime.now(UTC)
                return json.dumps({"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "testing",
                                   "SecretAccessKey": "testing", "Token": secrets.token_hex(16),
                                   "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                   "Expiration": (now + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")})
            if path == "/latest/dynamic/instance-identity/document":
                return json.dumps({"instanceId": instance["InstanceId"], "instanceType": instance["InstanceType"],
                                   "region": region, "availabilityZone": zone,
                                   "privateIp": instance["PrivateIpAddress"], "imageId": instance["ImageId"],
                                   "accountId": "123456789012"})
            return {f"{meta}/instance-id": instance["InstanceId"], f"{meta}/instance-type": instance["InstanceType"],
                    f"{meta}/local-ipv4": instance["PrivateIpAddress"], f"{meta}/ami-id": instance["ImageId"],
                    f"{meta}/placement/availability-zone": zone, f"{meta}/placement/region": region,
                    f"{meta}/instance-life-cycle": instance.get("InstanceLifecycle", "on-demand"),
                    f"{meta}/iam/info": json.dumps({"Code": "Success", "InstanceProfileArn":
                                                    (instance.get("IamInstanceProfile") or {}).get("Arn", "")}),
                    }.get(path)

    return Metadata


def no_public_addresses(cloud: Cloud) -> None:
    """Every subnet of the box's regions launches without a public address: nothing is reachable
    from the laptop but the private range the box routes to its bridge."""
    for region in cloud.regions:
        ec2 = cloud.ec2(region)
        for subnet in ec2.describe_subnets()["Subnets"]:
            ec2.modify_subnet_attribute(SubnetId=subnet["SubnetId"], MapPublicIpOnLaunch={"Value": False})


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 256        # Ray's launcher asks from many threads at once
    daemon_threads = True


def main() -> None:
    endpoint, port, regions = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    ThreadedMotoServer(ip_address="127.0.0.1", port=MOTO_PORT, verbose=False).start()
    cloud = Cloud(regions)
    no_public_addresses(cloud)
    for address, handler in ((endpoint, front(cloud)), (METADATA, metadata(cloud))):
        server = Server((address, port if address == endpoint else 80), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
