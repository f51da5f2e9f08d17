"""The cloud in a box itself (``tests/cloudbox``), held to what EC2 gives a machine: an instance
launched by hand with EC2's own API gets a host at its private address that logs in ``ubuntu``
with the key pair, has sudo there, IMDSv2 and the box's endpoint in ``~/.aws/config``; its
``shutdown`` ends the instance (or stops it, as it was launched to); a spot notice shows in its
IMDS before the instance goes; the faults a real account meets come back as EC2 words them; and
the box refuses a VPC range this machine routes. Counted from outside: EC2's ``describe_instances``
and the namespaces ``ip netns`` lists."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time

import botocore.exceptions
import cloudbox
import pytest
from cloudbox import box as boxes
from cloudbox.cloud import FAULTS
from cluster_processes import wait_until

pytestmark = pytest.mark.slow

IMDS = ("import json, sys, urllib.request as u\n"
        "def get(path, token):\n"
        "    try:\n"
        "        return u.urlopen(u.Request('http://169.254.169.254' + path,"
        " headers={'X-aws-ec2-metadata-token': token}), timeout=5).read().decode()\n"
        "    except u.HTTPError as e:\n"
        "        return e.code\n"
        "token = u.urlopen(u.Request('http://169.254.169.254/latest/api/token', method='PUT',"
        " headers={'X-aws-ec2-metadata-token-ttl-seconds': '60'}), timeout=5).read().decode()\n"
        "print(json.dumps({p: get(p, token) for p in sys.argv[1:]} | {'no token': get(sys.argv[1], '')}))\n")


@pytest.fixture(scope="module")
def pem(box):
    key = box.ec2().create_key_pair(KeyName="by-hand")
    path = box.lab.dir / "by-hand.pem"
    path.write_text(key["KeyMaterial"])
    path.chmod(0o600)
    return path


def _launch(box, **extra) -> dict:
    image = box.ec2().describe_images()["Images"][0]["ImageId"]
    return box.ec2().run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p3.2xlarge",
                                   KeyName="by-hand", **extra)["Instances"][0]


def _ssh(pem, host, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", str(pem), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                           f"ubuntu@{host.address}", command], capture_output=True, text=True, timeout=timeout)


def _state(box, iid: str) -> str:
    return box.instances(**{"instance-id": iid})[0]["State"]["Name"]


def test_an_instance_launched_by_hand_is_a_machine_that_ends_itself(box, pem):
    instance = _launch(box, InstanceInitiatedShutdownBehavior="terminate")
    iid, address = instance["InstanceId"], instance["PrivateIpAddress"]
    assert ipaddress.ip_address(address) in boxes.VPC and "PublicIpAddress" not in instance, instance
    host = box.host_of(iid)
    assert host.address == address
    said = _ssh(pem, host, "hostname; id -un; sudo -n id -u; python3 -c 'import torch' && echo torch; "
                           "python3 -c 'import ray' 2>/dev/null || echo no-ray; cat ~/.aws/config")
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    assert lines[:5] == [f"ip-{address.replace('.', '-')}", "ubuntu", "0", "torch", "no-ray"], said.stdout
    assert f"endpoint_url = {box.endpoint}" in said.stdout
    assert _ssh(pem, host, "true").returncode == 0
    root = subprocess.run(["ssh", "-i", str(pem), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", f"root@{address}", "true"],
                          capture_output=True, text=True, timeout=30)
    assert root.returncode != 0, "a cloud image's root logs in over SSH"
    meta = "/latest/meta-data"
    paths = [f"{meta}/instance-id", f"{meta}/instance-type", f"{meta}/local-ipv4", f"{meta}/spot/instance-action"]
    answer = json.loads(_ssh(pem, host, f"python3 -c {subprocess.list2cmdline([IMDS])} {' '.join(paths)}").stdout)
    assert answer == {paths[0]: iid, paths[1]: "p3.2xlarge", paths[2]: address, paths[3]: 404,
                      "no token": 401}, answer
    # the address no instance holds is the bridge's, and dies there: nothing for the range leaves
    route = subprocess.run(["ip", "route", "get", "172.31.250.250"], capture_output=True, text=True).stdout
    assert f"dev {box.lab.bridge}" in route, route
    _ssh(pem, host, "sudo shutdown -h now")
    wait_until(lambda: _state(box, iid) == "terminated", 20, "the instance ended by its own shutdown")
    wait_until(lambda: host.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                      text=True).stdout, 20, "its host gone")


def test_a_stopped_instance_keeps_its_disk_and_takes_logins_again_when_started(box, pem):
    instance = _launch(box)       # EC2's default InstanceInitiatedShutdownBehavior: stop
    iid = instance["InstanceId"]
    host = box.host_of(iid)
    assert _ssh(pem, host, "echo kept > ~/mark").returncode == 0
    _ssh(pem, host, "sudo poweroff")
    wait_until(lambda: _state(box, iid) == "stopped", 20, "the instance stopped by its own poweroff")
    wait_until(lambda: not host.pids(), 20, "its host's processes ended")
    box.ec2().start_instances(InstanceIds=[iid])
    wait_until(lambda: _ssh(pem, host, "cat ~/mark", timeout=15).stdout.strip() == "kept", 30,
               "a login after the start")
    box.ec2().terminate_instances(InstanceIds=[iid])
    wait_until(lambda: iid not in box.fabric.machines, 20, "its host gone with the instance")


def test_a_spot_notice_shows_in_the_instances_metadata_before_it_goes(box, pem):
    instance = _launch(box, InstanceMarketOptions={"MarketType": "spot"})
    iid = instance["InstanceId"]
    host = box.host_of(iid)
    notice = box.preempt(iid, notice_s=3)
    path = "/latest/meta-data/spot/instance-action"
    answer = json.loads(_ssh(pem, host, f"python3 -c {subprocess.list2cmdline([IMDS])} {path}").stdout)
    assert json.loads(answer[path]) == notice and notice["action"] == "terminate", answer
    wait_until(lambda: _state(box, iid) == "terminated", 20, "the spot instance taken after its notice")
    wait_until(lambda: iid not in box.fabric.machines, 20, "its host gone")


@pytest.mark.parametrize("code", sorted(FAULTS))
def test_a_fault_of_a_real_account_comes_back_as_ec2_words_it(box, pem, code):
    before = {i["InstanceId"] for i in box.instances()}
    box.fault(code, type="p3.2xlarge")      # till cleared: the SDK's retries (of a 5xx) meet it too
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if code == "SpotMaxPriceTooLow" else {}
    began = time.monotonic()
    try:
        with pytest.raises(botocore.exceptions.ClientError) as failed:
            _launch(box, **extra)
    finally:
        box.clear_faults()
    assert failed.value.response["Error"]["Code"] == code, failed.value.response
    assert {i["InstanceId"] for i in box.instances()} == before, "a refused launch left an instance"
    assert time.monotonic() - began < 30
    assert box.faults_given()[-1]["code"] == code


def test_the_box_will_not_start_over_a_range_this_machine_routes(monkeypatch):
    taken = ipaddress.ip_network(subprocess.run(["ip", "-4", "-o", "addr", "show", "lo"], capture_output=True,
                                                text=True).stdout.split()[3], strict=False)
    assert cloudbox.overlaps(taken)
    monkeypatch.setattr(boxes, "VPC", taken)
    with pytest.raises(RuntimeError, match=f"the box's VPC range {taken} overlaps this machine's"):
        cloudbox.start()
