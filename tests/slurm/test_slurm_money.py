"""A Slurm cluster's money and its budget, and another's idle stop, with the laptop gone, held
against Slurm's own record.

Beside the capped cluster a second one, on one node, has ``--idle 1`` and runs nothing. Once the
head's watchdog holds the cap, this machine's watchdogs are killed and the link between
this machine and the login host (the one host of the cluster it reaches) cut, as a closed lid does. The
head's watchdog ends the job at the cap from inside the allocation, with no word from here. The
job's end is read from Slurm's record of ended jobs (``jobcomp``, written by ``slurmctld``), and its
start to its end × its nodes × the rate is the money, held against the cap; back on the network,
the notebook's machine learns that its cluster is over, its ledger holds the same dollars to one
metering interval, the queue is empty and no process of the job is left on any node (counted by
network namespace). The idle cluster's head ends its job a minute after it went idle, after the
lid closed, and the notebook's machine, back, says it was the idle stop."""

from __future__ import annotations

import os
import signal
import time

import pytest
from cluster_processes import wait_until
from netlab import described

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.guard.headwatch import HEAD_STOP_ALLOWANCE_S
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.remote import headguard

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_SLURM_LAB"), reason="the laptop gone from Slurm clusters with a budget and an idle "
    "stop takes two minutes beside make test's timed tests: `make slurm-lab` runs it")]

RATE = 3.6             # $/h per node: two nodes burn $0.002 a second
CAP_AFTER_S = 30.0     # the cap is set this far ahead at the burn, once the head's watchdog beats
OVER_CAP_S = 10.0      # past the cap, what a stop from the head may add: a look, Ray's end, the job's end
IDLE_MIN = 1.0         # the second cluster's idle stop, in minutes


def test_the_laptop_gone_the_heads_end_their_jobs_at_the_cap_and_when_idle_and_the_money_is_slurms(
        slurm, cluster_user):
    flags = dict(cluster_user, usd_per_hour=RATE)
    try:
        gg.up("away", nodes=2, **flags)
        # beside it on one node (a CPU of each node each): nothing will run on it
        gg.up("idler", nodes=1, idle=IDLE_MIN, **flags)
        record, idler = registry.live("away"), registry.live("idler")
        job, idle_job = (ClusterSpec.from_json(r.spec).remote.job_id for r in (record, idler))
        for each in (record, idler):
            wait_until(lambda each=each: headguard.beating(each), 60, "the head's watchdog beating", every=1)
        metered = ledger.events(record.id, "metered-by-slurm")
        assert metered and f"job {job} (scontrol show job)" in metered[0]["message"], metered
        burn = ledger.burn_rate(record.id)
        assert burn == pytest.approx(2 * RATE), burn
        budget = ledger.spend(record.id) + burn * CAP_AFTER_S / 3600
        gg.limits("away", budget=budget)
        wait_until(lambda: (headguard.heartbeat(record) or {}).get("budget") == budget, 30,
                   "the head's watchdog taking the cap", every=1)

        for each in (record, idler):
            os.kill(registry.get(each.id).watchdog_pid, signal.SIGKILL)     # the laptop's lid closes
        slurm.lab.cut_laptop([slurm.login])     # the one host it reaches
        cut_at = time.time()
        ended = wait_until(lambda: slurm.ended(job), 90 + CAP_AFTER_S, "Slurm's record of the job's end", every=1)
        gone_after = time.time() - cut_at
        idle_ended = wait_until(lambda: slurm.ended(idle_job), 60 * IDLE_MIN + 60, "Slurm's record of the idle "
                                "job's end", every=1)
        idle_gone_after = time.time() - cut_at
    finally:
        slurm.lab.reconnect_laptop([slurm.login])

    # money from Slurm's own record: the job's start to its end × its nodes × the rate
    held = ended["end"] - ended["start"]
    billed = held * int(ended["NodeCnt"]) * RATE / 3600
    over = (billed - budget) / burn * 3600
    print(f"\nslurm, laptop gone: the job ended {gone_after:.0f} s after the cut ({ended['JobState']}); Slurm "
          f"records {held:.0f} s × {ended['NodeCnt']} nodes = ${billed:.5f} against the ${budget:.5f} cap "
          f"({over:+.1f} s at the ${burn:.2f}/h burn; a stop from the head starts {HEAD_STOP_ALLOWANCE_S:.0f} s ahead)")
    assert ended["NodeCnt"] == "2" and ended["JobState"] in ("COMPLETED", "CANCELLED"), ended
    assert billed <= budget + burn * OVER_CAP_S / 3600, (billed, budget)

    # back: the notebook's machine learns the cluster is over, with Slurm's dollars
    gg.status("away")
    record = registry.get(record.id)
    assert record.stopped and "budget" in record.stop_reason, record.stop_reason
    interval = settings().meter_interval_s
    shown = gg.cost("away").total_usd
    print(f"the ledger: ${shown:.5f}; Slurm's record × the rate: ${billed:.5f} "
          f"({(shown - billed) / burn * 3600:+.1f} s at the burn; Slurm records whole seconds)")
    assert abs(shown - billed) <= burn * (interval + 1.0) / 3600, (shown, billed)
    assert not [j for j in slurm.squeue() if j["id"] in (job, idle_job)], slurm.squeue()

    # the idle one: ended by its head once idle that long, after the lid closed, not held till its walltime
    held = idle_ended["end"] - idle_ended["start"]
    print(f"slurm, laptop gone, idle: the job ended {idle_gone_after:.0f} s after the cut, {held:.0f} s after it "
          f"started ({idle_ended['JobState']}), its idle limit {IDLE_MIN * 60:.0f} s")
    assert idle_ended["JobState"] in ("COMPLETED", "CANCELLED") and idle_ended["end"] >= cut_at - 1, idle_ended
    assert 60 * IDLE_MIN <= held <= 60 * IDLE_MIN + 60, held
    gg.status("idler")
    idler = registry.get(idler.id)
    assert idler.stopped and "idle" in idler.stop_reason, idler.stop_reason
    shown = gg.cost("idler").total_usd
    assert abs(shown - held * RATE / 3600) <= RATE * (interval + 1.0) / 3600, (shown, held)
    deadline = time.monotonic() + 15
    while (left := [p for n in slurm.nodes for p in slurm.strays(n)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left on the compute nodes (counted by namespace): {described(left)}"
