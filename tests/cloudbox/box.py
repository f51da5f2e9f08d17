"""The cloud in a box: EC2 (moto) in a namespace on a lab bridge, and a host behind each instance.

Safety first, before the first launch:
- the VPC's range (moto's default VPC, 172.31.0.0/16) must overlap no route or address of this
  machine, or the box refuses to start;
- that whole range is routed to the lab's bridge: a packet to an address no instance holds dies
  there unanswered, and none leaves by the default route;
- every subnet of the box's regions launches without a public address (``cloud.py``);
- the laptop's environment the box prints sets ``AWS_EC2_METADATA_DISABLED=true``: only the hosts
  have a metadata service, their own (this machine's route to 169.254.169.254 is never touched).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import netlab
from cluster_processes import wait_until

from .fabric import Fabric

VPC = ipaddress.ip_network("172.31.0.0/16")    # moto's default VPC, in every region
PORT = 80
REGIONS = ("us-east-1",)
CLOUD = Path(__file__).with_name("cloud.py")
START_TIMEOUT_S = 60


@dataclass
class Box:
    lab: netlab.Lab
    regions: tuple[str, ...]
    netns: str
    link: str
    address: str                   # the EC2 endpoint's, on the bridge
    cloud: subprocess.Popen | None = None
    fabric: Fabric | None = None
    routed: bool = False
    cut: list[str] = field(default_factory=list)   # instances' addresses this machine is cut off from

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{PORT}"

    def env(self) -> dict[str, str]:
        """What points the AWS SDK (boto3, Ray's AWS provider, the product) at the box."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": self.regions[0], "AWS_EC2_METADATA_DISABLED": "true"}

    def exports(self) -> str:
        return "".join(f"export {k}={v}\n" for k, v in self.env().items())

    def client_options(self, region: str | None = None) -> dict:
        """boto3's client arguments for the box (any of its services: EC2, S3, IAM)."""
        return {"endpoint_url": self.endpoint, "region_name": region or self.regions[0],
                "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

    def ec2(self, region: str | None = None):
        import boto3

        return boto3.client("ec2", **self.client_options(region))

    # -- what the box does to instances, as the cloud does ---------------------------------------

    def _ask(self, what: str, order: dict | None = None) -> dict:
        body = json.dumps(order or {}).encode()
        request = urllib.request.Request(f"{self.endpoint}/_box/{what}", body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def fault(self, code: str, action: str = "RunInstances", times: int = -1, **where: str) -> None:
        """The next ``times`` calls of ``action`` (that match ``where``: ``type``, ``zone``, ``market``
        ``"spot"`` for spot launches alone; -1: every one, till ``clear_faults``) get EC2's ``code``
        (``cloud.FAULTS``) in place of moto's answer."""
        self._ask("faults", {"code": code, "action": action, "times": times, **where})

    def clear_faults(self) -> None:
        self._ask("clear")

    def faults_given(self) -> list[dict]:
        return self._ask("given")["given"]

    def silence(self, instance_type: str) -> None:
        """Machines of ``instance_type`` launched from now on never answer this machine (what it
        sends them is dropped, as a security group without port 22 drops it); each still reaches
        EC2 and its metadata. ``hear`` undoes it for later launches."""
        self.fabric.silent.add(instance_type)

    def hear(self, instance_type: str) -> None:
        self.fabric.silent.discard(instance_type)

    def preempt(self, instance_id: str, notice_s: float = 120.0, region: str | None = None) -> dict:
        """A spot instance's interruption: its notice in IMDS, then the instance terminated."""
        return self._ask("preempt", {"instance_id": instance_id, "region": region or self.regions[0],
                                     "notice_s": notice_s})["notice"]

    def instances(self, region: str | None = None, **filters: str) -> list[dict]:
        """Every instance EC2 lists (``filters``: ``tag:Name`` → value, or any EC2 filter)."""
        found = self.ec2(region).describe_instances(
            Filters=[{"Name": k, "Values": [v]} for k, v in filters.items()])["Reservations"]
        return [i for r in found for i in r["Instances"]]

    def host_of(self, instance_id: str) -> netlab.Host:
        return wait_until(lambda: (m := self.fabric.machines.get(instance_id)) and m.host, 30,
                        f"a host behind {instance_id}")

    def cut_laptop(self) -> list[str]:
        """Take this machine off the instances' network, as a laptop's lid closing does: every
        instance's host still reaches the others, EC2 and its metadata service, but what passes
        between it and this machine is dropped, silently, both ways (blackhole routes). Returns
        the addresses cut off."""
        for machine in list(self.fabric.machines.values()):
            if machine.host is None or machine.host.address in self.cut + self.fabric.silenced:
                continue
            _ip("route", "add", "blackhole", f"{machine.host.address}/32")
            self.cut.append(machine.host.address)
            machine.host.ns("ip", "route", "add", "blackhole", f"{self.lab.gateway}/32", check=False)
        return list(self.cut)

    def reconnect_laptop(self) -> None:
        """Undo ``cut_laptop`` (a host whose instance ended went with its own routes)."""
        for machine in list(self.fabric.machines.values()):
            if machine.host is not None and machine.host.address in self.cut:
                machine.host.ns("ip", "route", "del", "blackhole", f"{self.lab.gateway}/32", check=False)
        for address in self.cut:
            _ip("route", "del", "blackhole", f"{address}/32", check=False)
        self.cut.clear()

    # -- life -------------------------------------------------------------------------------------

    def down(self) -> None:
        """Every host, the cloud's namespace, the routes and the lab's bridge: gone."""
        if self.fabric is not None:
            self.reconnect_laptop()
            self.fabric.stop()
        if self.cloud is not None and self.cloud.poll() is None:
            self.cloud.kill()
            self.cloud.wait(timeout=10)
        _ip("link", "del", self.link, check=False)
        _ip("netns", "del", self.netns, check=False)
        if self.routed:
            _ip("route", "del", str(VPC), "dev", self.lab.bridge, check=False)
        for address in self.fabric.blackholed if self.fabric is not None else ():
            _ip("route", "del", "blackhole", address, check=False)
        self.lab.down()

    def leftovers(self) -> list[str]:
        left = self.lab.leftovers()
        if self.netns in _ip("netns", "list", check=False).stdout.split():
            left.append(f"namespace {self.netns}")
        routes = _ip("-4", "route", "show", "table", "all", check=False).stdout
        left += [f"route {line}" for line in routes.splitlines() if line.split()[:1] == [str(VPC)]
                 or (line.split()[:1] == ["blackhole"] and ipaddress.ip_address(line.split()[1].split("/")[0]) in VPC)]
        return left


def lifetime(instance: dict, now: float | None = None) -> float:
    """How long EC2 billed the instance, from its own record: launch to the moment it ended
    (``StateTransitionReason``: "User initiated (… UTC)"), or to ``now`` while it runs; a minute
    at least, as EC2 bills."""
    ended = now if now is not None else time.time()
    if instance["State"]["Name"] in ("shutting-down", "terminated", "stopping", "stopped"):
        when = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\)", instance["StateTransitionReason"])[1]
        ended = datetime.strptime(when, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return max(60.0, ended - instance["LaunchTime"].timestamp())


def overlaps(network: ipaddress.IPv4Network) -> list[str]:
    """This machine's routes and addresses that overlap ``network``: the box will not start over them."""
    found = []
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        words = line.split()
        if words and words[0] in ("local", "broadcast", "blackhole", "unreachable", "prohibit", "throw",
                                  "unicast", "anycast", "multicast"):
            words = words[1:]
        if not words or words[0] == "default":
            continue
        try:
            if ipaddress.ip_network(words[0], strict=False).overlaps(network):
                found.append(f"route {line.strip()}")
        except ValueError:
            continue
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        words = line.split()
        if "inet" in words and ipaddress.ip_interface(words[words.index("inet") + 1]).network.overlaps(network):
            found.append(f"address {' '.join(words[1:4])}")
    return found


def start(regions: tuple[str, ...] = REGIONS) -> Box:
    """The box, up and safe: the lab's bridge (and its wheel index), EC2 on it, the fabric watching."""
    netlab.sweep_orphans()      # a box whose run was killed outright still holds the VPC's route
    taken = overlaps(VPC)
    if taken:
        raise RuntimeError(f"the box's VPC range {VPC} overlaps this machine's {'; '.join(taken)}: not started")
    lab = netlab.up(0)
    lab_id = lab.bridge[2:-2]
    box = Box(lab, tuple(regions), netns=f"{netlab.PREFIX}{lab_id}-ec2", link=f"gl{lab_id}ec2",
              address=lab.gateway.rsplit(".", 1)[0] + ".6")
    try:
        lab.serve_index()
        _ip("route", "add", str(VPC), "dev", lab.bridge)
        box.routed = True
        _ip("netns", "add", box.netns)
        _ip("link", "add", box.link, "type", "veth", "peer", "name", "eth0", "netns", box.netns)
        _ip("link", "set", box.link, "master", lab.bridge)
        _ip("link", "set", box.link, "up")
        for cmd in (("addr", "add", f"{box.address}/24", "dev", "eth0"),
                    ("addr", "add", "169.254.169.254/32", "dev", "eth0"),     # in the box's namespace alone
                    ("link", "set", "eth0", "up"), ("link", "set", "lo", "up"),
                    ("route", "add", str(VPC), "dev", "eth0")):
            _ip("-n", box.netns, *cmd)
        log = open(lab.dir / "cloud.log", "ab")  # noqa: SIM115 - the child keeps it
        box.cloud = subprocess.Popen(
            ["ip", "netns", "exec", box.netns, sys.executable, str(CLOUD), box.address, str(PORT), ",".join(regions)],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            env={**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "true", "AWS_EC2_METADATA_DISABLED": "true"})
        log.close()
        began = time.monotonic()
        ready = select.select([box.cloud.stdout], [], [], START_TIMEOUT_S)[0]
        line = box.cloud.stdout.readline() if ready else b""     # "ready", once moto and the front answer
        if line.strip() != b"ready":
            raise RuntimeError(f"the box's EC2 did not start ({time.monotonic() - began:.0f} s): "
                               f"{(lab.dir / 'cloud.log').read_text(errors='replace')[-800:]}")
        box.fabric = Fabric(lab, {r: box.ec2(r) for r in regions}, box.endpoint, VPC)
        box.fabric.start()
    except BaseException:
        box.down()
        raise
    return box


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)
