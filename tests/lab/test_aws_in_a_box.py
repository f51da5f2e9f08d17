"""The AWS path end to end, with nothing of it stood in for: ``up`` on an AWS GPU offer runs Ray's
cluster launcher and its AWS provider against EC2 in a box (``tests/cloudbox``: moto, a host behind
each instance); Ray's bootstrap makes the key pair and security group and finds the IAM profile
(made by its own code beforehand, ``conftest.py``: without the waits for AWS's propagation); the head's
autoscaler launches the two workers from the head, with the instance profile's credentials from
the head's IMDS and the endpoint from its image's ``~/.aws/config``; a cell runs as DDP across the
two worker instances; ``down`` terminates the cluster's instances and nothing else.

Counted from outside: instances by EC2's own ``describe_instances``, processes by network
namespace, dollars against each instance's lifetime as EC2 records it × the catalog's price."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cloudbox.box import lifetime
from cloudbox.fabric import HOSTS_GONE_S, LOGIN
from cluster_processes import wait_until
from models import DDP_ACROSS_HOSTS
from netlab import described

import gpugeek_jupyter as gg
from gpugeek_jupyter.clouds.aws import AWS
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.kernel.session import current
from gpugeek_jupyter.meter import ledger

pytestmark = pytest.mark.slow

OFFER = "aws/g4dn.xlarge/us-east-1/use1-az1"
# Ray's own knobs, in every instance's environment (as an image could set them) and the laptop's `ray up`:
# the head's autoscaler looks every second (Ray's default: 5 s), and each updater retries a new
# machine's SSH every second (5 s)
AUTOSCALER_ENV = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "AUTOSCALER_NODE_SSH_INTERVAL_S": "1"}


def _runs_raylet(host) -> bool:
    return any("raylet" in line for line in described(host.strays()))


def test_up_on_an_aws_offer_runs_a_ddp_cell_on_two_worker_instances_and_down_ends_them_alone(
        aws_account, capsys, monkeypatch):
    box = aws_account
    for key, value in AUTOSCALER_ENV.items():
        monkeypatch.setitem(box.lab.env, key, value)      # the sshd of every host made from now on
        monkeypatch.setenv(key, value)
    ec2 = box.ec2()
    image = ec2.describe_images()["Images"][0]["ImageId"]
    decoy = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="m5.xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "not-the-cluster"}]}])["Instances"][0]
    began = time.monotonic()
    try:
        gg.up("inbox", offer=OFFER, workers=2, internal_ips=True, yes=True)
        took_up = time.monotonic() - began
        record = registry.live("inbox")
        ours = {"tag:ray-cluster-name": "inbox"}
        workers = wait_until(lambda: len(w := box.instances(**ours, **{"tag:ray-node-type": "worker",
                                                                       "instance-state-name": "running"})) == 2
                           and w, 120, "the head's autoscaler launching two workers")
        wait_until(lambda: all(_runs_raylet(box.host_of(w["InstanceId"])) for w in workers), 240,
                   "both workers' Ray started", every=0.5)
        [head] = box.instances(**ours, **{"tag:ray-node-type": "head"})
        assert box.host_of(head["InstanceId"]).pids_with("AUTOSCALER_UPDATE_INTERVAL_S", "1"), \
            "the head's Ray runs without the test's knobs"
        joined = time.monotonic() - began
        # each instance's runtime made with this machine's uv, which travelled with its files: Ray's
        # launcher starts a cloud's nodes, none asked first as an ssh host is
        made = [json.loads(path.read_text())["how"] for i in box.instances(**ours, **{"instance-state-name": "running"})
                for path in (Path(box.host_of(i["InstanceId"]).disk) / "home" / LOGIN / ".gpugeek" / "runtime").glob(
                    "ray-*/runtime.json")]
        assert made == ["uv"] * 3, made
        warmed = current().group          # `up --workers 2` started it on the head
        # no --gpus-per-worker: on a cluster of GPU machines a cell's workers take one GPU each
        equal, ips = gg.run(DDP_ACROSS_HOSTS, workers=2, monitor=False).shown()
        first_cell = time.monotonic() - began
        assert equal, "gradients differ between the worker instances"
        assert ips == sorted(w["PrivateIpAddress"] for w in workers), f"ranks ran on {ips}"   # EC2's own list
        assert warmed is not None and current().group is warmed, "the cell did not find the warm group"
        # as on ssh: the doctor examines every instance's node — and finds that the box's g4dn.xlarge
        # machines have none of the T4 their type declares (a lab host has no GPU), on each worker
        # and nowhere else; the head's keeper lists the job
        report = gg.doctor()
        assert len(report.rows) == 3, repr(report)
        addresses = {w["PrivateIpAddress"] for w in workers}
        assert report.problems and all(p.host in addresses and ("GPU" in p.what or "CUDA" in p.what)
                                       for p in report.problems), repr(report)
        assert {p.host for p in report.problems} == addresses, repr(report)
        listed = gg.jobs()
        assert list(listed["state"]) == ["finished"], listed
        spec = ClusterSpec.from_json(record.spec)
        assert spec.head_price.usd_per_hour > 0 and spec.head_price.offer_id.startswith("aws/m5.xlarge/us-east-1")
    finally:
        downed = time.monotonic()
        if registry.live("inbox") is not None:
            gg.down("inbox")
        took_down = time.monotonic() - downed
    said = capsys.readouterr().out
    mine = box.instances(**ours)
    assert len(mine) == 3 and {i["State"]["Name"] for i in mine} == {"terminated"}, \
        [(i["InstanceId"], i["State"]["Name"]) for i in mine]
    # down says what it ended, as EC2 lists it: the cluster's three instances, each by id
    [ended] = [line for line in said.splitlines() if line.startswith("inbox: aws lists 3 instances of it")]
    assert all(f"{i['InstanceId']} (" in ended for i in mine) and decoy["InstanceId"] not in ended, ended
    [still] = box.instances(**{"instance-id": decoy["InstanceId"]})
    assert still["State"]["Name"] == "running", "down touched an instance that is not the cluster's"
    try:
        wait_until(lambda: set(box.fabric.machines) == {decoy["InstanceId"]}, HOSTS_GONE_S, "the cluster's hosts gone")
    except AssertionError as late:     # what kept the box from removing them, where it said
        raise AssertionError(f"{late}; the box's last errors: {box.fabric.errors[-3:]}") from None
    left = box.host_of(decoy["InstanceId"]).strays()
    assert not left, f"processes on the decoy's host: {described(left)}"

    # $: each instance's lifetime as EC2 records it (launch to termination, a minute at least) × the
    # catalog's price, against the ledger: one metering interval (and EC2's whole seconds) apart at most
    prices = {"m5.xlarge": spec.head_price.usd_per_hour, "g4dn.xlarge": spec.workers.usd_per_hour}
    lifetimes = {i["InstanceId"]: lifetime(i) for i in mine}
    billed = sum(prices[i["InstanceType"]] * lifetimes[i["InstanceId"]] / 3600 for i in mine)
    ledger = gg.cost("inbox").total_usd
    slack = sum(prices[i["InstanceType"]] for i in mine) * (settings().meter_interval_s + 1.0) / 3600
    print(f"\naws in a box: up {took_up:.1f} s, workers joined {joined:.1f} s, first cell {first_cell:.1f} s, "
          f"down {took_down:.1f} s; lifetimes {sorted(round(v) for v in lifetimes.values())} s; ledger "
          f"${ledger:.5f}, EC2's lifetimes × price ${billed:.5f}")
    assert abs(ledger - billed) <= slack, (ledger, billed, said[-2000:])
    box.ec2().terminate_instances(InstanceIds=[decoy["InstanceId"]])


@pytest.mark.parametrize("code, pricing, says", [
    ("InsufficientInstanceCapacity", "on-demand", "the next offer to try: --offer aws/g4dn.xlarge/"),
    ("VcpuLimitExceeded", "on-demand", "ask AWS to raise it (Service Quotas → Amazon EC2)"),
    ("InvalidAMIID.NotFound", "on-demand", "pick an offer in another region"),
    ("UnauthorizedOperation", "on-demand", "give them EC2 launch rights"),
])
def test_what_a_real_account_refuses_is_one_line_and_leaves_nothing_billing(
        aws_account, code, pricing, says):
    """EC2's refusal of the launch (given by the box as EC2 words it), once for each: one line
    with EC2's code and words and what to do, and no instance of the cluster left running. These
    refuse ``ray up``'s own launch, the head's; a refusal of the workers the head's autoscaler
    launches (a spot price too low among them: the head is on demand) reaches no one yet."""
    box = aws_account
    name = f"refused-{code.split('.')[0].lower()}"
    box.fault(code)          # every RunInstances, till cleared: Ray's launcher tries each subnet
    try:
        with pytest.raises(gg.GpugeekError) as failed:
            gg.up(name, offer=OFFER, pricing=pricing, internal_ips=True, yes=True)
    finally:
        box.clear_faults()
    said = str(failed.value)
    assert "\n" not in said and "Traceback" not in said, said
    assert said.startswith(f"aws refused to launch the cluster's machines: {code} ("), said
    assert says in said and said.endswith(f"(aws launched no instance for it), nothing of {name!r} runs"), said
    assert any(g["code"] == code for g in box.faults_given())
    running = box.instances(**{"tag:ray-cluster-name": name, "instance-state-name": "running"})
    assert not running, [i["InstanceId"] for i in running]
    assert registry.live(name) is None


def test_no_credentials_is_one_line_before_anything_is_launched(aws_account, monkeypatch, tmp_path):
    """With no AWS credentials in the standard chain (variables, ~/.aws), ``up`` says so in one
    line and EC2 lists nothing new."""
    box = aws_account
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(AWS, "credentials", (AWS.credentials[0], (str(tmp_path / "credentials"),)))
    before = {i["InstanceId"] for i in box.instances()}
    with pytest.raises(gg.GpugeekError) as failed:
        gg.up("nocreds", offer=OFFER, internal_ips=True, yes=True)
    said = str(failed.value)
    assert said == AWS.no_credentials, said
    assert {i["InstanceId"] for i in box.instances()} == before
    assert registry.live("nocreds") is None


@pytest.mark.skipif(not os.environ.get("GPUGEEK_CLOUD_LAB"), reason="a head that never answers SSH is given up "
                    "after the wait set in config.toml: `make cloud-lab` runs it")
def test_a_head_that_never_answers_ssh_is_given_up_within_the_wait_and_terminated(aws_account, gpugeek_home):
    """The head's machine launches but never answers SSH (the box drops what this machine sends it,
    as a security group without port 22 does): ``up`` gives it up after ``[cluster] ssh_wait_s``
    — not Ray's own fifteen minutes — in one line that says so and names the instance it launched
    and terminated; EC2 then lists none of the cluster's running."""
    box = aws_account
    wait_s = 30
    config = gpugeek_home / "config.toml"
    config.write_text(config.read_text() + f"\n[cluster]\nssh_wait_s = {wait_s}\n")
    box.silence("m5.xlarge")       # the head's type
    began = time.monotonic()
    try:
        with pytest.raises(gg.GpugeekError) as failed:
            gg.up("silent", offer=OFFER, internal_ips=True, yes=True)
    finally:
        box.hear("m5.xlarge")
    took = time.monotonic() - began
    said = str(failed.value)
    mine = box.instances(**{"tag:ray-cluster-name": "silent"})
    print(f"\naws, a head that never answers SSH: given up and terminated {took:.0f} s after up began "
          f"(wait {wait_s} s): {said}")
    assert "\n" not in said and "Traceback" not in said, said
    assert f"a new machine answered no SSH in {wait_s} s" in said, said
    assert len(mine) == 1 and mine[0]["InstanceType"] == "m5.xlarge", mine
    assert f"{mine[0]['InstanceId']} (head, terminated now)" in said and said.endswith("nothing of 'silent' runs")
    assert mine[0]["State"]["Name"] == "terminated"
    assert registry.live("silent") is None
    assert took < 60 + wait_s + 60, f"up took {took:.0f} s to give up a silent head"


@pytest.mark.skipif(not os.environ.get("GPUGEEK_CLOUD_LAB"), reason="an up that crashed half-way, then downed by its "
                    "tag: `make cloud-lab` runs it")
def test_an_up_that_crashed_half_way_is_listed_and_downed_by_its_tag(aws_account, gpugeek_home):
    """The notebook's machine dies while ``up`` runs Ray's launcher (the kernel and ``ray up``
    killed together, as a laptop that loses power), after EC2 launched the head: the cluster is
    still listed, as failed half-way and maybe billing, and ``down`` finds its instances by the cluster's tag in EC2 and
    terminates them — EC2 then lists none of them running."""
    box = aws_account
    ours = {"tag:ray-cluster-name": "crashed"}
    up = subprocess.Popen([sys.executable, "-c", "import gpugeek_jupyter as gg\n"
                           f"gg.up('crashed', offer={OFFER!r}, workers=1, internal_ips=True, yes=True)\n"],
                          env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)}, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        [head] = wait_until(lambda: box.instances(**ours, **{"instance-state-name": "running"}), 240,
                            "EC2 launching the head")
    finally:
        os.killpg(up.pid, signal.SIGKILL)      # the kernel and its `ray up`, at once
        up.wait(timeout=30)
    listed = gg.clusters().set_index("name")
    said = listed.loc["crashed", "status"]
    assert said.startswith("failed: its `up` ended half-way") and "may still be running and billing" in said, said
    gg.down("crashed")
    left = box.instances(**ours, **{"instance-state-name": "running"})
    assert not left, [i["InstanceId"] for i in left]
    [ended] = [e["message"] for e in ledger.events(registry.latest("crashed").id, "instances-ended")]
    assert f"{head['InstanceId']} (head, terminated now)" in ended, ended
