"""A rented cluster is billed as its provider bills it: each instance from its launch (boot and
set-up included, which Ray's node table never sees) to where the provider says it ended, a minute
at least on EC2. EC2 here is moto's, in this process; ``tests/lab/test_aws_in_a_box.py`` holds the
same against a cluster Ray's launcher made."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from gpugeek_jupyter.backends.rented import ENDED, terminate_all
from gpugeek_jupyter.clouds import base
from gpugeek_jupyter.clouds.aws import AWS, _instance
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec, NodeType
from gpugeek_jupyter.guard.lifecycle import machines_gone, meter_instances
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.meter.instances import sync_instances
from gpugeek_jupyter.vocab import NodePrice

moto = pytest.importorskip("moto")

WORKER = NodeType(name="gpu-g4dn-xlarge", offer_id="aws/g4dn.xlarge/us-east-1/use1-az1", provider="aws",
                  instance_type="g4dn.xlarge", region="us-east-1", zone="use1-az1", gpu="T4", gpu_count=1,
                  gpu_mem_gib=16, vcpus=4, mem_gib=16, pricing="on-demand", usd_per_hour=0.526,
                  on_demand_usd_per_hour=0.526, min_workers=1, max_workers=1)
HEAD = NodePrice("aws/m5.xlarge/us-east-1", "on-demand", 0.192, 0.192)


@pytest.fixture
def ec2(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        import boto3

        client = boto3.client("ec2", region_name="us-east-1")
        yield client


def _launch(ec2, cluster: str | None, node_type: str = WORKER.name) -> str:
    image = ec2.describe_images()["Images"][0]["ImageId"]
    tags = [{"Key": "ray-cluster-name", "Value": cluster}, {"Key": "ray-user-node-type", "Value": node_type}] \
        if cluster else [{"Key": "Name", "Value": "someone-elses"}]
    return ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="m5.xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": tags}])["Instances"][0]["InstanceId"]


def test_the_clusters_instances_are_found_by_its_tag_with_launch_and_end_as_ec2_records_them(ec2):
    mine, theirs, other = _launch(ec2, "c1"), _launch(ec2, None), _launch(ec2, "c2")
    ec2.terminate_instances(InstanceIds=[mine])
    [found] = AWS.instances("c1", "us-east-1")
    described = ec2.describe_instances(InstanceIds=[mine])["Reservations"][0]["Instances"][0]
    assert (found.id, found.node_type, found.state, found.gone) == (mine, WORKER.name, "terminated", True)
    assert found.launched == described["LaunchTime"].timestamp()
    assert found.ended is not None and abs(found.ended - time.time()) < 5
    assert {i.id for i in AWS.instances("c2", "us-east-1")} == {other} and theirs not in {mine, other}
    assert AWS.instances("c1", "us-east-1", since=time.time() + 60) == []   # an earlier cluster of the name


def test_ec2s_own_wording_of_an_end_is_read_and_a_running_instance_has_none():
    launched = datetime(2026, 12, 2, 19, 0, tzinfo=UTC)
    described = {"InstanceId": "i-1", "State": {"Name": "terminated"}, "LaunchTime": launched,
                 "StateTransitionReason": "User initiated (2026-12-02 19:55:21 GMT)", "PrivateIpAddress": "10.0.0.5",
                 "InstanceLifecycle": "spot", "Tags": [{"Key": "ray-user-node-type", "Value": "head"}]}
    ended = _instance(described)
    assert ended.ended == datetime(2026, 12, 2, 19, 55, 21, tzinfo=UTC).timestamp()
    assert (ended.spot, ended.node_type, ended.address, ended.gone) == (True, "head", "10.0.0.5", True)
    running = _instance({**described, "State": {"Name": "running"}, "StateTransitionReason": ""})
    assert (running.ended, running.gone) == (None, False)


def test_rows_are_priced_by_node_type_billed_a_minute_at_least_and_closed_once(gpugeek_home):
    record = registry.create("c1", "aws", {}, simulated=False, budget_usd=None, idle_minutes=None)
    t0 = 1_800_000_000.0

    def instance(iid, node_type, ended=None, state="running"):
        return base.Instance(iid, node_type, t0, ended, state, "", False, state != "running")

    prices, gpus = {"head": HEAD, WORKER.name: WORKER.price()}, {WORKER.name: 1.0}
    assert sync_instances(record.id, [instance("i-h", "head"), instance("i-w", WORKER.name)], prices, gpus,
                          t0 + 10, 60.0) == 2
    assert ledger.burn_rate(record.id) == pytest.approx(0.192 + 0.526)
    gone = [instance("i-h", "head", t0 + 600, "terminated"), instance("i-w", WORKER.name, t0 + 20, "terminated")]
    sync_instances(record.id, gone, prices, gpus, t0 + 700, 60.0, reason="down")
    sync_instances(record.id, [instance("i-h", "head", t0 + 900, "terminated")], prices, gpus, t0 + 950, 60.0)
    rows = {r["node_id"]: r for r in costs.nodes_frame(record.id, t0 + 1000).to_dict("records")}
    assert (rows["i-h"]["ended"], rows["i-h"]["end_reason"]) == (t0 + 600, "down")   # closed once
    assert rows["i-w"]["ended"] == t0 + 60 and rows["i-w"]["gpus"] == 1.0        # EC2's first minute whole
    assert ledger.spend(record.id, t0 + 1000) == pytest.approx(0.192 * 600 / 3600 + 0.526 * 60 / 3600)
    # an end the provider does not date ends at the look that saw it go
    sync_instances(record.id, [base.Instance("i-x", WORKER.name, t0, None, "stopped", "", False, True)],
                   prices, gpus, t0 + 300, 60.0)
    assert costs.nodes_frame(record.id, t0 + 1000).set_index("node_id").loc["i-x", "ended"] == t0 + 300


def test_a_rented_cluster_is_metered_from_ec2_and_over_once_every_instance_ended(gpugeek_home, ec2):
    spec = ClusterSpec("aws", [WORKER], head_price=HEAD)
    record = registry.create("c1", "aws", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    head, worker = _launch(ec2, "c1", "head"), _launch(ec2, "c1")
    assert meter_instances(record) is True
    assert ledger.burn_rate(record.id) == pytest.approx(0.192 + 0.526) and machines_gone(record) is None
    ec2.terminate_instances(InstanceIds=[worker])
    meter_instances(record)
    assert ledger.burn_rate(record.id) == pytest.approx(0.192) and machines_gone(record) is None
    ec2.terminate_instances(InstanceIds=[head])
    meter_instances(record)
    assert "every instance has ended, as aws lists them" in machines_gone(record)
    other = registry.create("mine", "local", ClusterSpec("local").to_json(), simulated=False, budget_usd=None,
                            idle_minutes=None)
    assert meter_instances(other) is None and machines_gone(other) is None     # Ray's node table is its record


def test_an_instance_ec2_took_back_ends_as_a_preemption_with_an_event(gpugeek_home):
    """EC2's StateReason for a spot interruption makes the row end ``preempted`` (not a failure,
    not our stop), with an event, once; an instance we terminated keeps the stop's reason."""
    described = {"InstanceId": "i-s", "State": {"Name": "terminated"}, "LaunchTime": datetime(2026, 12, 2, tzinfo=UTC),
                 "StateTransitionReason": "User initiated (2026-12-02 00:10:00 GMT)", "InstanceLifecycle": "spot",
                 "StateReason": {"Code": "Server.SpotInstanceTermination",
                                 "Message": "Server.SpotInstanceTermination: Spot instance termination"}}
    taken = _instance(described)
    assert taken.preempted and taken.gone
    ours = _instance({**described, "InstanceId": "i-o", "StateReason": {"Code": "Client.UserInitiatedShutdown"}})
    assert not ours.preempted
    record = registry.create("c1", "aws", {}, simulated=False, budget_usd=None, idle_minutes=None)
    prices = {WORKER.name: WORKER.price()}
    for _ in range(2):
        sync_instances(record.id, [taken, ours], prices, {}, time.time(), 60.0, reason="down")
    rows = costs.nodes_frame(record.id).set_index("node_id")["end_reason"].to_dict()
    assert rows == {"i-s": "preempted", "i-o": "down"}
    assert [e["kind"] for e in ledger.events(record.id)] == ["preempted"]


def test_a_stop_terminates_every_instance_of_the_clusters_tag_and_no_other(gpugeek_home, ec2):
    """``rented.terminate_all``: the cluster's instances found by Ray's tag and terminated through
    EC2 (one already ended is listed, not terminated again); another cluster's, and one without the
    tag, still run; what it did is one line in the ledger, by instance id."""
    spec = ClusterSpec("aws", [WORKER], head_price=HEAD)
    record = registry.create("c1", "aws", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    head, worker, gone = _launch(ec2, "c1", "head"), _launch(ec2, "c1"), _launch(ec2, "c1")
    ec2.terminate_instances(InstanceIds=[gone])
    others = [_launch(ec2, "c2"), _launch(ec2, None)]
    ended = terminate_all(record, wait_s=10)
    assert {i.id for i in ended} == {head, worker}
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert {states[i] for i in (head, worker, gone)} == {"terminated"}
    assert {states[i] for i in others} == {"running"}
    [said] = ledger.events(record.id, ENDED)
    assert said["message"].startswith("aws lists 3 instances of it, none running: ")
    assert f"{head} (head, terminated now)" in said["message"], said["message"]
    assert f"{gone} ({WORKER.name}, terminated)" in said["message"], said["message"]
