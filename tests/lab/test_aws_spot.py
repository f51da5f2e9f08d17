"""A spot worker taken back by EC2 in the middle of a job (``make cloud-lab``; about five minutes).

A cluster on an AWS spot offer in the box: the head on demand, two spot workers launched by the
head's autoscaler, the jobs' checkpoints in S3 (the box's). At step 5 of a DDP job, the box gives
one worker's instance its interruption notice in IMDS (shorter than EC2's two minutes), then
terminates it as EC2 does, with EC2's reason for a spot interruption. The workers read the notice
where EC2 puts it, checkpoint at their next step and stop; the autoscaler launches a replacement;
the cell resumes on it from the checkpoint. Counted from outside the product: the step log rank 0
writes to a shared folder (every step once, the first after the resume the checkpoint's + 1), the
checkpoint in the box's S3, EC2's own list of the cluster's instances, and the final weights against
the same cell run uninterrupted on the same cluster before."""

from __future__ import annotations

import os
import threading
import time

import pytest
from cloudbox.box import lifetime
from cloudbox.fabric import HOSTS_GONE_S
from cluster_processes import wait_until
from models import DDP_ACROSS_HOSTS, at_step, logged_steps

import gpugeek_jupyter as gg
from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.meter import costs, ledger

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_CLOUD_LAB"), reason="a spot worker preempted mid-job and replaced takes five "
    "minutes: `make cloud-lab` runs it (make test runs the AWS path end to end in test_aws_in_a_box.py)")]

OFFER = "aws/g4dn.xlarge/us-east-1/use1-az1"
STEPS, PAUSE_S = 30, 0.5
NOTICE_S = 20.0        # EC2 gives two minutes; the box's notice is shorter, the path the same
CELL = logged_steps(STEPS, PAUSE_S) + "\n(final_step, [p.detach().clone() for p in model.parameters()])"


def _runs_raylet(host) -> bool:
    from netlab import described

    return any("raylet" in line for line in described(host.strays()))


def test_a_spot_worker_taken_back_mid_job_is_replaced_and_the_job_resumes_losing_no_step(aws_account, capsys):
    import boto3
    import torch

    box = aws_account
    s3 = boto3.client("s3", **box.client_options())
    s3.create_bucket(Bucket="spot")
    shared = box.lab.shared / "spot"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)        # rank 0 runs as the image's login user
    ours = {"tag:ray-cluster-name": "spotty"}
    try:
        gg.up("spotty", offer=OFFER, pricing="spot", workers=2, internal_ips=True, storage="s3://spot/spotty",
              yes=True)
        record = registry.live("spotty")
        spec = ClusterSpec.from_json(record.spec)
        first = wait_until(lambda: len(w := box.instances(**ours, **{"tag:ray-node-type": "worker",
                                                                     "instance-state-name": "running"})) == 2
                           and w, 120, "the head's autoscaler launching two spot workers")
        assert {i.get("InstanceLifecycle") for i in first} == {"spot"}, [i.get("InstanceLifecycle") for i in first]
        wait_until(lambda: all(_runs_raylet(box.host_of(w["InstanceId"])) for w in first), 240,
                   "both workers' Ray started", every=2)

        clean = gg.run(CELL, workers=2, gpus_per_worker=1, push={"log": str(shared / "clean.log")},
                       monitor=False).shown()
        assert clean[0] == STEPS

        log = shared / "steps.log"
        victim = first[1]
        noticed = []

        def preempt_at_step_5():
            at_step(log, 5, timeout=120)
            noticed.append((time.time(), box.preempt(victim["InstanceId"], notice_s=NOTICE_S)))

        threading.Thread(target=preempt_at_step_5, daemon=True).start()
        began = time.monotonic()
        result = gg.run(CELL, workers=2, gpus_per_worker=1, push={"log": str(log)}, monitor=False,
                        checkpoint_dir="s3://spot/spotty/ckpt", max_failures=0, name="spot-job")
        took = time.monotonic() - began
        out, _ = capsys.readouterr()
        final_step, weights = result.shown()

        # the step log, as rank 0 wrote it: every step once; the first after the resume is the checkpoint's + 1
        steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
        assert steps == list(range(1, STEPS + 1)), f"each step once, none lost: {steps}"
        assert final_step == STEPS
        assert all(torch.equal(a, b) for a, b in zip(weights, clean[1], strict=True)), \
            f"the resumed run ended on other weights than the uninterrupted one: {weights} vs {clean[1]}"
        assert "preemption notice: checkpointed at step" in out and "resumed from step-" in out, out
        saved = int(out.split("preemption notice: checkpointed at step ")[1].split(";")[0])
        resumed_at = int(out.split("resumed from step-")[1].split("(step ")[1].split(")")[0])
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="spot", Prefix="spotty/ckpt/").get("Contents", [])]
        assert any(k.startswith(f"spotty/ckpt/step-{saved:08d}/") for k in keys), keys
        assert resumed_at == saved and 5 <= saved < STEPS, (saved, resumed_at)

        # EC2's own list: the victim terminated as a spot interruption, a spot replacement launched after
        mine = {i["InstanceId"]: i for i in box.instances(**ours)}
        gone = mine[victim["InstanceId"]]
        assert gone["State"]["Name"] == "terminated"
        assert gone["StateReason"]["Code"] == "Server.SpotInstanceTermination"
        replacements = [i for i in mine.values() if i["InstanceId"] not in {w["InstanceId"] for w in first}
                        and i.get("InstanceLifecycle") == "spot"]
        assert len(replacements) == 1, list(mine)
        assert replacements[0]["LaunchTime"].timestamp() >= noticed[0][0]

        # the ledger: a preemption, not a failure
        by_node = costs.nodes_frame(record.id).set_index("node_id")
        assert by_node.loc[victim["InstanceId"], "end_reason"] == "preempted"
        job = store.query("SELECT status, preemptions FROM jobs WHERE cluster_id=? AND name=?",
                          (record.id, "spot-job"))[0]
        assert (job["status"], job["preemptions"]) == ("finished", 1)
        kinds = [e["kind"] for e in ledger.events(record.id)]
        assert kinds.index("job-preempted") < kinds.index("preempted"), kinds
        print(f"\naws spot: notice at step 5, checkpoint at step {saved}, the job finished {STEPS} steps in "
              f"{took:.0f} s with the replacement {replacements[0]['InstanceId']} "
              f"(launched {replacements[0]['LaunchTime'].timestamp() - noticed[0][0]:.0f} s after the notice)")
    finally:
        if registry.live("spotty") is not None:
            gg.down("spotty")

    ended = box.instances(**ours)
    assert ended and all(i["State"]["Name"] == "terminated" for i in ended), \
        [(i["InstanceId"], i["State"]["Name"]) for i in ended]
    prices = {"m5.xlarge": spec.head_price.usd_per_hour, "g4dn.xlarge": spec.workers.usd_per_hour}
    billed = sum(prices[i["InstanceType"]] * lifetime(i) / 3600 for i in ended)
    slack = sum(prices[i["InstanceType"]] for i in ended) * (settings().meter_interval_s + 1.0) / 3600
    assert abs(gg.cost("spotty").total_usd - billed) <= slack, (gg.cost("spotty").total_usd, billed)
    wait_until(lambda: not set(box.fabric.machines) & {i["InstanceId"] for i in ended}, HOSTS_GONE_S,
               "the cluster's hosts gone")


def test_no_spot_capacity_with_spot_fallback_brings_on_demand_workers_and_says_so(aws_account):
    """EC2 has no spot g4dn.xlarge (``InsufficientInstanceCapacity`` for spot launches alone, as the
    box gives it) for a cluster made with ``--spot-fallback``: the head's autoscaler is refused, the
    head's watchdog reads the refusal in the autoscaler's log and moves the workers to their
    on-demand stand-in, EC2 lists two on-demand workers, a cell runs on them, and the notebook's
    machine is told both — the refusal with EC2's code and the fallback — after its next cell."""
    from gpugeek_jupyter import api

    box = aws_account
    ours = {"tag:ray-cluster-name": "fallback"}
    box.fault("InsufficientInstanceCapacity", type="g4dn.xlarge", market="spot")
    began = time.monotonic()
    try:
        gg.up("fallback", offer=OFFER, pricing="spot", spot_fallback=True, workers=2, internal_ips=True, yes=True)
        record = registry.live("fallback")
        workers = wait_until(lambda: len(w := box.instances(**ours, **{"tag:ray-node-type": "worker",
                                                                       "instance-state-name": "running"})) == 2
                             and w, 180, "two workers launched in the place of spot ones")
        fell_back = time.monotonic() - began
        assert {(i["InstanceType"], i.get("InstanceLifecycle", "on-demand")) for i in workers} == \
            {("g4dn.xlarge", "on-demand")}, workers
        tags = [{t["Key"]: t["Value"] for t in i["Tags"]}["ray-user-node-type"] for i in workers]
        assert tags == ["t4x1-on-demand"] * 2, tags
        assert any(g["code"] == "InsufficientInstanceCapacity" for g in box.faults_given())
        wait_until(lambda: all(_runs_raylet(box.host_of(w["InstanceId"])) for w in workers), 240,
                   "both workers' Ray started", every=2)
        equal, ips = gg.run(DDP_ACROSS_HOSTS, workers=2, gpus_per_worker=1, monitor=False).shown()
        assert equal and ips == sorted(w["PrivateIpAddress"] for w in workers), ips
        told = api.news()
        refused = [line for line in told if "refused the head's autoscaler a t4x1-spot worker: "
                   "InsufficientInstanceCapacity (We currently do not have sufficient g4dn.xlarge capacity" in line]
        fallback = [line for line in told if "aws has no spot g4dn.xlarge for the workers (InsufficientInstance"
                    "Capacity): 2 on-demand workers (t4x1-on-demand, $0.526/h each) launch in their place" in line]
        assert refused and fallback, told
        by_node = costs.nodes_frame(record.id).set_index("node_id")
        assert set(by_node.loc[[w["InstanceId"] for w in workers], "pricing"]) == {"on-demand"}
        print(f"\naws spot fallback: two on-demand workers running {fell_back:.0f} s after up began; told: "
              f"{fallback[0]}")
    finally:
        box.clear_faults()
        if registry.live("fallback") is not None:
            gg.down("fallback")
    assert all(i["State"]["Name"] == "terminated" for i in box.instances(**ours))
