"""The machines behind the box's instances: a lab host (``netlab``: a network namespace with sshd,
its own disk, the machine image a GPU AMI would have: Python and torch, no Ray) at each live
instance's private address, made when EC2 says the instance is pending or running, its
processes killed when it is stopped (sshd started again when it runs again), and deleted
when it is terminated.

What the host has of EC2, as a real instance has it:
- the login user of a cloud image (``ubuntu``), with passwordless sudo there only, who logs in
  with the instance's key pair;
- IMDSv2 at 169.254.169.254 (served by ``cloud.py``, reached over the bridge);
- ``~/.aws/config`` naming the region and the box's endpoint, as an image carries its settings;
- ``shutdown``, ``poweroff``, ``halt`` and ``reboot`` (``systemctl``, which they point to) that
  ask the box, in the host's own mount namespace: never this machine's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import netlab

LOGIN = "ubuntu"
POLL_S = 0.3
# a terminated instance's host gone: the next look, the host's processes killed, its namespace and disk
# removed (a second or two; a bound for a loaded machine)
HOSTS_GONE_S = 60.0
LIVE = ("pending", "running")
GONE = ("shutting-down", "terminated")

# the host's systemctl, which its shutdown, poweroff, halt and reboot point to: the box is asked
POWER = """#!/bin/sh
# this instance's power: the cloud in a box is asked (it ends or stops the instance, as EC2 would)
what=$(basename "$0")
[ "$what" = systemctl ] && what=$1
case "$what" in reboot) ask=reboot ;; shutdown|poweroff|halt) ask=shutdown ;;
  *) echo "systemctl: no systemd on this machine" >&2; exit 1 ;; esac
exec /usr/bin/python3 -c "import urllib.request as u
u.urlopen(u.Request('{endpoint}/_box/$ask', b'{}', method='POST'), timeout=10)"
"""


@dataclass
class Machine:
    """One instance's host, and what the fabric last saw of the instance."""

    instance_id: str
    region: str
    host: netlab.Host
    state: str = "running"


@dataclass
class Fabric:
    """Watches the box's instances (EC2's own ``describe_instances``) and keeps a host behind each."""

    lab: netlab.Lab
    ec2: dict                  # region → boto3 client to the box
    endpoint: str              # the box's EC2 endpoint, as a host reaches it
    vpc: ipaddress.IPv4Network
    machines: dict[str, Machine] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    blackholed: list[str] = field(default_factory=list)     # public addresses EC2 gave anyway
    silent: set[str] = field(default_factory=set)    # instance types whose machines this machine never hears
    silenced: list[str] = field(default_factory=list)       # their addresses, dropped on this machine's side
    made: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="cloudbox-fabric", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for machine in list(self.machines.values()):
            self._remove(machine)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - kept and said by the box; the watch goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(POLL_S)

    def step(self) -> None:
        """One look at every instance: hosts made, stopped, started or removed to match."""
        seen = {}
        for region, ec2 in self.ec2.items():
            for reservation in ec2.describe_instances()["Reservations"]:
                for instance in reservation["Instances"]:
                    seen[instance["InstanceId"]] = (region, instance)
        for iid, (region, instance) in seen.items():
            public = instance.get("PublicIpAddress")
            if public and public not in self.blackholed:     # never reached: no packet leaves for it
                _ip("route", "add", "blackhole", public)
                self.blackholed.append(public)
            state, machine = instance["State"]["Name"], self.machines.get(iid)
            if machine is None and state in LIVE:
                self.machines[iid] = self._make(region, instance)
            elif machine is not None and state in GONE:
                self._remove(machine)
            elif machine is not None and state in ("stopping", "stopped") and machine.state in LIVE:
                self.lab.kill_host(machine.host)
                machine.state = state
            elif machine is not None and state in LIVE and machine.state not in LIVE:
                self.lab.start_sshd(machine.host)
                machine.state = state
        for iid in [i for i in self.machines if i not in seen]:
            self._remove(self.machines[iid])
        for iid in self._reboots():
            if (machine := self.machines.get(iid)) is not None:
                self.lab.restart_host(machine.host)

    def _reboots(self) -> list[str]:
        import urllib.request

        request = urllib.request.Request(f"{self.endpoint}/_box/reboots", b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())["reboots"]

    def _make(self, region: str, instance: dict) -> Machine:
        address = instance["PrivateIpAddress"]
        if ipaddress.ip_address(address) not in self.vpc:
            raise RuntimeError(f"{instance['InstanceId']} has {address}, outside the box's {self.vpc}: no host made")
        self.made += 1
        lab_id, n = self.lab.bridge[2:-2], self.made
        disk = self.lab.dir / "disks" / f"i{n}"
        host = netlab.Host(name=f"ip-{address.replace('.', '-')}", netns=f"{netlab.PREFIX}{lab_id}-i{n}",
                           address=address, link=f"gl{lab_id}i{n}", disk=str(disk), login=LOGIN,
                           keys=".ssh/authorized_keys")          # in the user's home, as a cloud image has it
        self._image(host, region, instance)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f",
                        str(self.lab.dir / f"host_key-{host.name}")], check=True, capture_output=True)
        run = _ip
        run("netns", "add", host.netns)
        try:
            run("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            run("link", "set", host.link, "master", self.lab.bridge)
            run("link", "set", host.link, "up")
            for cmd in (("addr", "add", f"{address}/{self.vpc.prefixlen}", "dev", "eth0"),
                        ("link", "set", "eth0", "up"), ("link", "set", "lo", "up"),
                        ("route", "add", self.lab.subnet, "dev", "eth0"),       # the laptop and the box's EC2
                        ("route", "add", "169.254.169.254/32", "dev", "eth0")):  # its IMDS, in the box's namespace
                run("-n", host.netns, *cmd)
            self.lab.hosts.append(host)
            self.lab.save()
            if instance["InstanceType"] in self.silent:    # as a firewall that drops port 22 would: no answer
                _ip("route", "add", "blackhole", f"{address}/32")
                self.silenced.append(address)
            self.lab.start_sshd(host)
        except BaseException:
            self._remove(Machine(instance["InstanceId"], region, host))
            raise
        return Machine(instance["InstanceId"], region, host, instance["State"]["Name"])

    def _image(self, host: netlab.Host, region: str, instance: dict) -> None:
        """The instance's disk as its image leaves it: ``ubuntu`` with the key pair's public key,
        sudo for it, the AWS settings, and the box's power commands."""
        disk = Path(host.disk)
        home, etc = disk / "home" / LOGIN, disk / "etc"
        for folder in (home / ".ssh", home / ".aws", disk / "root" / ".aws", etc / "sudoers.d"):
            folder.mkdir(parents=True, exist_ok=True)
        uid = _free_uid()
        user = f"{LOGIN}:x:{uid}:{uid}::/home/{LOGIN}:/bin/bash\n"
        (etc / "passwd").write_text(Path("/etc/passwd").read_text() + user)
        (etc / "group").write_text(Path("/etc/group").read_text() + f"{LOGIN}:x:{uid}:\n")
        (etc / "shadow").write_text(Path("/etc/shadow").read_text() + f"{LOGIN}:*:20000:0:99999:7:::\n")
        (etc / "shadow").chmod(0o640)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")   # EC2's DNS names it
        sudoers = etc / "sudoers.d" / "90-cloud-image"
        sudoers.write_text(f"{LOGIN} ALL=(ALL) NOPASSWD:ALL\n")
        sudoers.chmod(0o440)
        key = instance.get("KeyName")
        public = ""
        if key:
            [pair] = self.ec2[region].describe_key_pairs(KeyNames=[key], IncludePublicKey=True)["KeyPairs"]
            public = pair.get("PublicKey", "")
        (home / ".ssh" / "authorized_keys").write_text(public + "\n")
        settings = f"[default]\nregion = {region}\nendpoint_url = {self.endpoint}\n"
        for aws in (home / ".aws", disk / "root" / ".aws"):
            (aws / "config").write_text(settings)
        (home / ".bashrc").write_text("# the image's\n")
        power = disk / "power"
        power.write_text(POWER.replace("{endpoint}", self.endpoint))
        power.chmod(0o755)
        subprocess.run(["chown", "-R", f"{uid}:{uid}", str(home)], check=True)
        host.setup = "\n".join([
            *(f"mount --bind {etc}/{name} /etc/{name}" for name in ("passwd", "group", "shadow", "hosts", "sudoers.d")),
            f"mount --bind {disk}/home /home", f"mount --bind {power} /usr/bin/systemctl"])

    def _remove(self, machine: Machine) -> None:
        host = machine.host
        if host.address in self.silenced:
            subprocess.run(["ip", "route", "del", "blackhole", f"{host.address}/32"], capture_output=True)
            self.silenced.remove(host.address)
        self.lab.delete_host(host)
        if host in self.lab.hosts:
            self.lab.hosts.remove(host)
            self.lab.save()
        kept = os.environ.get("GPUGEEK_BOX_KEEP_DISKS")    # a folder: a terminated host's disk moves there
        if kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
            shutil.move(host.disk, Path(kept) / machine.instance_id)
        shutil.rmtree(host.disk, ignore_errors=True)
        self.machines.pop(machine.instance_id, None)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _free_uid() -> int:
    """A uid this machine's own users do not have (the host's ``ubuntu`` is the host's alone)."""
    taken = {int(line.split(":")[2]) for line in Path("/etc/passwd").read_text().splitlines() if line.count(":") >= 2}
    return next(uid for uid in range(1000, 60000) if uid not in taken)

