"""A cell running when the scheduler preempts its Slurm job (``make slurm-lab``).

The lab's Slurm preempts the ``gpu`` partition's jobs for the ``urgent`` partition's
(``preempt/partition_prio``), with a grace time, telling the job by its own signal
(``preempt_send_user_signal``): the path a walltime's notice takes. Mid-cell, a job that wants every
node whole is submitted to ``urgent``. The running cell checkpoints in the cluster's shared home at
its next step and stops, saying the job was preempted (not that its walltime came). Without
``--requeue`` Slurm ends the job at the end of its grace time; with it the head's watchdog requeues
the job once the cell has checkpointed, and the cell resumes in the job's next run. Counted from
outside the product: Slurm's own record of both jobs (ours preempted, the urgent one run), the
step log rank 0 writes in the shared home (every step once, the first after the resume the
checkpoint's + 1), the checkpoint's folder there, the ledger's dollars against Slurm's record × the
rate, the queue, and what is left on the nodes (counted by namespace)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import slurmlab
from cluster_processes import wait_until
from models import logged_steps
from netlab import described

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.meter import ledger

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_SLURM_LAB"), reason="a job preempted by the scheduler waits out its grace time: "
    "`make slurm-lab` runs it")]

STEPS, PAUSE_S = 120, 0.5
PREEMPT_AT = 15             # the urgent job comes once the cell has logged this many steps
RATE = 3.6                  # $/h per node
END = "\n(final_step, [p.detach().clone() for p in model.parameters()])"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("requeue", [False, pytest.param(True, marks=pytest.mark.skipif(
    os.environ.get("GPUGEEK_SLURM_LAB") != "long", reason="five minutes, two of them Slurm's hold on a requeued job: "
    "`make slurm-lab SLURM_LAB=long` runs it"))], ids=["ended", "requeued"])
def test_a_cell_on_a_job_the_scheduler_preempts_checkpoints_on_its_signal(slurm, cluster_user, capsys, requeue):
    import torch

    name = "pre-rq" if requeue else "pre"
    log = slurm.home / f"{name}-steps.log"
    checkpoints = f"/root/{name}-ckpt"          # in the cluster's shared home, as every node sees it
    run = {"workers": 1, "gpus_per_worker": 1, "monitor": False}
    urgent: list[str] = []

    def preempt_mid_cell():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= PREEMPT_AT:
                urgent.append(slurm.preempt(seconds=5))
                return
            time.sleep(0.2)

    try:
        gg.up(name, nodes=1, gpus_per_host=1, time=20, requeue=requeue, **dict(cluster_user, usd_per_hour=RATE))
        record = registry.live(name)
        job = ClusterSpec.from_json(record.spec).remote.job_id
        threading.Thread(target=preempt_mid_cell, daemon=True).start()
        began = time.time()
        cell = logged_steps(STEPS, PAUSE_S) + END
        if requeue:
            final_step, weights = gg.run(cell, push={"log": f"/root/{name}-steps.log"}, checkpoint_dir=checkpoints,
                                         name="long", **run).shown()
            said = capsys.readouterr().out
            assert "is preempted by the scheduler" in said and "its Slurm job is requeued" in said, said
            clean = gg.run(logged_steps(STEPS, 0) + END, push={"log": f"/root/{name}-clean.log"}, **run).shown()
        else:
            with pytest.raises(GpugeekError) as stopped:
                gg.run(cell, push={"log": f"/root/{name}-steps.log"}, checkpoint_dir=checkpoints, name="long", **run)
            said = str(stopped.value)
            assert "is preempted by the scheduler" in said and "it resumes from there" in said, said
            assert "walltime" not in said, said
            # the countdown, while the grace time runs: to its end, not the walltime's
            wait_until(lambda: "preempted by the scheduler: its job ends at" in gg.status(name).status, 15,
                       "the status's countdown to the grace time's end", every=1)
        took = time.time() - began
        assert urgent, "the urgent job was never submitted"
        heard = wait_until(lambda: ledger.events(record.id, "slurm-preempted"), 30, "the head's preemption event")
        assert f"Slurm job {job} preempted by the scheduler" in heard[0]["message"], heard
        saved = int(said.split("checkpointed at step ")[1].split(" ")[0].rstrip(","))
        assert PREEMPT_AT <= saved < STEPS, said
        assert (slurm.home / f"{name}-ckpt" / f"step-{saved:08d}").is_dir(), \
            list((slurm.home / f"{name}-ckpt").iterdir())
        if not requeue:
            # Slurm's word: our job ended preempted once its grace time was over, and the urgent one ran
            ended = wait_until(lambda: slurm.ended(job), 60 + slurmlab.GRACE_S, "Slurm's record of the job's end",
                               every=1)
            assert ended["JobState"] in ("PREEMPTED", "CANCELLED"), ended
            ran = wait_until(lambda: slurm.ended(urgent[0]), 60, "Slurm's record of the urgent job", every=1)
            assert ran["JobState"] == "COMPLETED", ran
            wait_until(lambda: registry.get(record.id).stopped, 60, "the notebook's machine learning the job is over",
                       every=1)
            runs = []
        else:
            runs = slurm.runs(job)
            assert ClusterSpec.from_json(registry.get(record.id).spec).remote.restarts == 1
    finally:
        if registry.live(name) is not None:
            gg.down(name)

    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    if requeue:
        assert steps == list(range(1, STEPS + 1)), f"each step once, none lost: {steps}"
        resumed_at = int(said.split("resumed from step-")[1].split("(step ")[1].split(")")[0])
        assert resumed_at == saved and final_step == clean[0] == STEPS, (resumed_at, saved, final_step)
        assert all(torch.equal(a, b) for a, b in zip(weights, clean[1], strict=True)), \
            f"the requeued run ended on other weights than the uninterrupted one: {weights} vs {clean[1]}"
        ended = wait_until(lambda: slurm.ended(job), 60, "Slurm's record of the job's end", every=1)
    else:
        assert steps == list(range(1, len(steps) + 1)) and steps[-1] == saved, (saved, steps)
    # $ held against Slurm's record: each run start to end × its node × the rate
    held = sum(r["end"] - r["start"] for r in runs if r["JobState"] in ("PENDING", "REQUEUED")) + \
        ended["end"] - ended["start"]
    billed, burn = held * RATE / 3600, RATE
    gg.status(name)
    metered = gg.cost(name).total_usd
    assert abs(metered - billed) <= burn * (settings().meter_interval_s + 1.0) / 3600, (metered, billed, runs, ended)
    assert not [q for q in slurm.squeue() if q["id"] == job], slurm.squeue()
    deadline = time.monotonic() + 15
    while (left := [p for n in slurm.nodes for p in slurm.strays(n)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left on the compute nodes (counted by namespace): {described(left)}"
    print(f"\nslurm preempt ({'requeued' if requeue else 'ended'}): {heard[0]['message']}; the cell checkpointed at "
          f"step {saved} of {STEPS} and {'resumed in the next run' if requeue else 'stopped'} {took:.0f} s after it "
          f"began; Slurm recorded {ended['JobState']}; ledger ${metered:.5f} vs Slurm's record × the rate "
          f"${billed:.5f}")
