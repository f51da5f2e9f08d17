"""A cell running when its Slurm job's walltime comes, on a cluster made with ``--requeue``
(``make slurm-lab``; about six minutes).

The job is asked for three minutes with its notice a minute ahead (``--sbatch
"--signal=B:USR2@60"``). The running 2-node DDP cell checkpoints in the cluster's shared home on
the notice; the head's watchdog then requeues the job (``scontrol requeue``), which ends every
process of it. Slurm holds a requeued job two minutes before it runs it again, under the same id,
on an allocation of its own; the kernel waits, reaches the new head through the login node, and
the same cell resumes there and finishes — one ``gg.run`` call. Counted from outside the product:
the step log rank 0 writes in the shared home (every step once, the first after the resume the
checkpoint's + 1), Slurm's own record of the job (a line for the requeued run, the job running
again), the final weights against the same cell run uninterrupted, and the ledger's dollars against
Slurm's record of both runs × nodes × the rate."""

from __future__ import annotations

import os
import time

import pytest
from cluster_processes import wait_until
from models import logged_steps
from netlab import described

import gpugeek_jupyter as gg
from gpugeek_jupyter import store
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.meter import ledger

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_SLURM_LAB"), reason="a job requeued at its walltime takes six minutes: "
    "`make slurm-lab` runs it")]

STEPS, PAUSE_S = 200, 0.6
RATE = 3.6                  # $/h per node
END = "\n(final_step, [p.detach().clone() for p in model.parameters()])"
CHECKPOINTS = "/root/requeue-ckpt"     # in the cluster's shared home, as every node sees it


@pytest.mark.timeout(900)
def test_a_requeued_job_runs_again_and_the_cell_resumes_in_its_next_allocation(slurm, cluster_user, capsys):
    import torch

    log, clean_log = slurm.home / "requeue-steps.log", slurm.home / "requeue-clean.log"
    run = {"workers": 2, "gpus_per_worker": 1, "monitor": False}
    flags = dict(cluster_user, usd_per_hour=RATE)
    try:
        gg.up("rq", nodes=2, gpus_per_host=1, time=3, sbatch="--signal=B:USR2@60", requeue=True, **flags)
        record = registry.live("rq")
        job = ClusterSpec.from_json(record.spec).remote.job_id
        began = time.time()
        final_step, weights = gg.run(logged_steps(STEPS, PAUSE_S) + END, push={"log": "/root/requeue-steps.log"},
                                     checkpoint_dir=CHECKPOINTS, name="long", **run).shown()
        took = time.time() - began
        out = capsys.readouterr().out
        moved = registry.get(record.id)
        # the clean run, on the requeued allocation: the same cell without its pause (the same weights)
        clean = gg.run(logged_steps(STEPS, 0) + END, push={"log": "/root/requeue-clean.log"}, **run).shown()
        runs = slurm.runs(job)
        queued = {row["id"]: row for row in slurm.squeue()}
    finally:
        if registry.live("rq") is not None:
            gg.down("rq")

    assert "its Slurm job is requeued" in out, out
    saved = int(out.split("checkpointed at step ")[1].split(",")[0])
    resumed_at = int(out.split("resumed from step-")[1].split("(step ")[1].split(")")[0])
    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)), f"each step once, none lost: {steps}"
    assert 1 < saved < STEPS and resumed_at == saved and final_step == clean[0] == STEPS, (saved, resumed_at)
    assert [int(line.split()[0]) for line in clean_log.read_text().splitlines()] == list(range(1, STEPS + 1))
    assert all(torch.equal(a, b) for a, b in zip(weights, clean[1], strict=True)), \
        f"the requeued run ended on other weights than the uninterrupted one: {weights} vs {clean[1]}"
    # Slurm's word: the run it requeued ended in its record, and the job ran again under its id
    assert len(runs) == 1 and runs[0]["JobState"] == "PENDING", runs
    assert queued.get(job, {}).get("state") == "RUNNING", queued
    assert ClusterSpec.from_json(moved.spec).remote.restarts == 1, moved.spec
    assert ledger.events(record.id, "requeued"), "the head's word that it requeued the job"
    assert ledger.events(record.id, "head-moved"), "the new head reached"
    # $ held against Slurm's record: the requeued run's start to end, then the run that `down` ended
    ended = wait_until(lambda: slurm.ended(job), 60, "Slurm's record of the job's end", every=1)
    held = (runs[0]["end"] - runs[0]["start"] + ended["end"] - ended["start"]) * 2
    billed, burn = held * RATE / 3600, 2 * RATE
    gg.status("rq")
    metered = gg.cost("rq").total_usd
    interval = settings().meter_interval_s
    rows = store.query("SELECT node_id, started, ended, end_reason FROM nodes WHERE cluster_id=?", (record.id,))
    assert abs(metered - billed) <= burn * (interval + 1.0) / 3600, (metered, billed, rows, runs, ended)
    assert not slurm.squeue(), slurm.squeue()
    deadline = time.monotonic() + 15
    while (left := [p for n in slurm.nodes for p in slurm.strays(n)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left on the compute nodes (counted by namespace): {described(left)}"
    print("\n" + "\n".join(line for line in out.splitlines() if "Slurm" in line or "runs again" in line))
    print(f"slurm requeue: checkpointed at step {saved} of {STEPS} on the notice; the job requeued "
          f"(its first run {runs[0]['end'] - runs[0]['start']:.0f} s) and run again; the cell resumed at step "
          f"{saved + 1} and finished {took:.0f} s after it began, weights equal to the uninterrupted run's; "
          f"ledger ${metered:.5f} vs Slurm's record × the rate ${billed:.5f}")
