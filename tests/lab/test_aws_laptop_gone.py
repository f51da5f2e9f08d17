"""The laptop gone from an AWS cluster with a budget (``make cloud-lab``; about four minutes): once
the head's watchdog holds the cap, this machine's watchdog is killed and the link between this
machine and every instance cut, as a closed lid does. The head's watchdog stops the cluster at the
cap from the head — the autoscaler's workers terminated through Ray's launcher, then the head ends
itself — with no word from here. EC2's own ``describe_instances`` shows every instance terminated,
and its launch and end times × the catalog's prices are the money, held against the cap; back on
the network, the notebook's machine learns from EC2 that its cluster is over, and its ledger holds
the same dollars (the head's ledger went with the head)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from cloudbox.box import lifetime
from cloudbox.fabric import HOSTS_GONE_S
from cluster_processes import wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.guard.headwatch import HEAD_STOP_ALLOWANCE_S
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.remote import headguard

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_CLOUD_LAB"), reason="an AWS cluster left to its head at a budget takes four "
    "minutes: `make cloud-lab` runs it (make test runs the AWS path end to end in test_aws_in_a_box.py)")]

OFFER = "aws/g4dn.xlarge/us-east-1/use1-az1"
CAP_AFTER_S = 45.0     # the cap is set this far ahead at the burn, once the worker has joined
# past the cap, what a stop from the head may add at the burn: its start ahead of the cap is already
# in the cap; a look, the instances' termination (EC2's whole seconds) and the head's own shutdown
OVER_CAP_S = 20.0


def test_the_laptop_gone_the_head_ends_every_instance_at_the_budget(aws_account):
    box = aws_account
    ours = {"tag:ray-cluster-name": "away"}
    try:
        gg.up("away", offer=OFFER, workers=1, internal_ips=True, yes=True)
        record = registry.live("away")
        [worker] = wait_until(lambda: box.instances(**ours, **{"tag:ray-node-type": "worker",
                                                             "instance-state-name": "running"}), 120,
                              "the head's autoscaler launching the worker")
        host = box.host_of(worker["InstanceId"])
        wait_until(lambda: any("raylet" in line for line in _commands(host)), 240, "the worker's Ray started", every=2)
        wait_until(lambda: headguard.beating(record), 60, "the head's watchdog beating", every=1)

        burn = ledger.burn_rate(record.id)
        spec = ClusterSpec.from_json(record.spec)
        assert burn == pytest.approx(spec.head_price.usd_per_hour + spec.workers.usd_per_hour)
        cap_at = time.time() + CAP_AFTER_S
        budget = ledger.spend(record.id) + burn * CAP_AFTER_S / 3600
        gg.limits("away", budget=budget)
        wait_until(lambda: (headguard.heartbeat(record) or {}).get("budget") == budget, 30,
                   "the head's watchdog taking the cap", every=1)

        os.kill(registry.get(record.id).watchdog_pid, signal.SIGKILL)     # the laptop's lid closes
        cut = box.cut_laptop()
        cut_at = time.time()
        assert len(cut) == 2, cut
        ended = wait_until(lambda: (m := box.instances(**ours)) and all(
            i["State"]["Name"] == "terminated" for i in m) and m, 180 + CAP_AFTER_S,
            "the head's watchdog terminating every instance at the cap", every=2)
        gone_after = time.time() - cut_at
    finally:
        box.reconnect_laptop()

    assert len(ended) == 2, f"an instance launched after the stop began: {[i['InstanceId'] for i in ended]}"
    # money from EC2's own records: each instance's launch to its end × the catalog's price
    prices = {"m5.xlarge": spec.head_price.usd_per_hour, "g4dn.xlarge": spec.workers.usd_per_hour}
    billed = sum(prices[i["InstanceType"]] * lifetime(i) / 3600 for i in ended)
    over = (billed - budget) / burn * 3600
    print(f"\naws, laptop gone: every instance terminated {gone_after:.0f} s after the cut; EC2 billed "
          f"${billed:.5f} against the ${budget:.5f} cap ({over:+.1f} s at the ${burn:.3f}/h burn; a stop from "
          f"the head starts {HEAD_STOP_ALLOWANCE_S:.0f} s ahead)")
    print("each instance's end against the cap: " + ", ".join(
        f"{i['InstanceType']} {lifetime(i) + i['LaunchTime'].timestamp() - cap_at:+.1f} s" for i in ended))
    assert billed <= budget + burn * OVER_CAP_S / 3600, (billed, budget)

    # back: the notebook's machine reads EC2, learns the cluster is over and stops what runs here
    shown = gg.status("away")
    record = registry.get(record.id)
    assert record.stopped and "every instance has ended" in record.stop_reason, (record.stop_reason, shown)
    slack = burn * (settings().meter_interval_s + 1.0) / 3600
    assert abs(gg.cost("away").total_usd - billed) <= slack, (gg.cost("away").total_usd, billed)
    assert not processes.session_processes(record.session_id, record.created, record.marker), "the tunnel outlived it"
    wait_until(lambda: not set(box.fabric.machines) & {i["InstanceId"] for i in ended}, HOSTS_GONE_S,
               "the cluster's hosts gone")


def _commands(host) -> list[str]:
    lines = []
    for pid in host.strays():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return lines
