"""A cell running when its Slurm job's walltime comes (``make slurm-lab``; about six minutes).

The job is asked for three minutes with its notice 100 s ahead (``--sbatch "--signal=B:USR2@100"``,
sbatch's own option; without it the notice comes two minutes ahead). Slurm signals the batch step,
the head's watchdog tells every node in the cluster's KV store, and the running DDP cell
checkpoints in the cluster's shared home at its next step and stops, saying so. Slurm then ends
the job at its walltime, and the notebook's machine learns from Slurm's record that the cluster is
over. A new cluster runs the same cell again: it resumes from the checkpoint. Counted from outside
the product: the step log rank 0 writes in the shared home (every step once, the first after the
resume the checkpoint's + 1), the checkpoint's folder there, Slurm's own record of the job
(``TIMEOUT``), and the final weights against the same cell run uninterrupted."""

from __future__ import annotations

import os
import time

import pytest
from cluster_processes import wait_until
from models import logged_steps

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.meter import ledger

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_SLURM_LAB"), reason="a job run to its walltime takes six minutes: "
    "`make slurm-lab` runs it")]

STEPS, PAUSE_S = 150, 0.6
CELL = logged_steps(STEPS, PAUSE_S) + "\n(final_step, [p.detach().clone() for p in model.parameters()])"
CHECKPOINTS = "/root/walltime-ckpt"     # in the cluster's shared home, as every node sees it


@pytest.mark.timeout(900)
def test_a_cell_at_the_walltime_checkpoints_on_slurms_signal_and_resumes_in_the_next_cluster(slurm, cluster_user,
                                                                                           capsys):
    import torch

    log, clean_log = slurm.home / "walltime-steps.log", slurm.home / "walltime-clean.log"
    run = {"workers": 2, "gpus_per_worker": 1, "monitor": False}
    try:
        gg.up("wall", nodes=2, gpus_per_host=1, time=3, sbatch="--signal=B:USR2@100", **cluster_user)
        record = registry.live("wall")
        job = ClusterSpec.from_json(record.spec).remote.job_id
        began = time.time()
        with pytest.raises(GpugeekError) as stopped:
            gg.run(CELL, push={"log": "/root/walltime-steps.log"}, checkpoint_dir=CHECKPOINTS, name="long", **run)
        said = str(stopped.value)
        assert "reaches its walltime" in said and "it resumes from there" in said, said
        saved = int(said.split("checkpointed at step ")[1].split(" ")[0])
        assert 1 < saved < STEPS, said
        # the head's word, copied from its heartbeat
        noticed = wait_until(lambda: ledger.events(record.id, "walltime"), 10, "the head's walltime event here")
        assert f"Slurm job {job} reaches its walltime" in noticed[0]["message"], noticed
        assert (slurm.home / "walltime-ckpt" / f"step-{saved:08d}").is_dir(), \
            list((slurm.home / "walltime-ckpt").iterdir())
        ended = wait_until(lambda: slurm.ended(job), 240, "Slurm's record of the job's end", every=1)
        assert ended["JobState"] == "TIMEOUT", ended
        wait_until(lambda: registry.get(record.id).stopped, 60, "the notebook's machine learning the job is over",
                   every=1)
        assert f"Slurm job {job} has ended" in registry.get(record.id).stop_reason
        first = time.time() - began

        gg.up("again", nodes=2, gpus_per_host=1, time=10, **cluster_user)
        final_step, weights = gg.run(CELL, push={"log": "/root/walltime-steps.log"}, checkpoint_dir=CHECKPOINTS,
                                     name="long", **run).shown()
        out = capsys.readouterr().out
        # the uninterrupted run: the same cell without its pause (the same weights)
        clean = gg.run(CELL.replace(f"time.sleep({PAUSE_S})", "time.sleep(0)"),
                       push={"log": "/root/walltime-clean.log"}, **run).shown()
    finally:
        for name in ("wall", "again"):
            if registry.live(name) is not None:
                gg.down(name)

    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)), f"each step once, none lost: {steps}"
    resumed_at = int(out.split("resumed from step-")[1].split("(step ")[1].split(")")[0])
    assert resumed_at == saved and final_step == clean[0] == STEPS, (resumed_at, saved, final_step)
    assert [int(line.split()[0]) for line in clean_log.read_text().splitlines()] == list(range(1, STEPS + 1))
    assert all(torch.equal(a, b) for a, b in zip(weights, clean[1], strict=True)), \
        f"the resumed run ended on other weights than the uninterrupted one: {weights} vs {clean[1]}"
    print(f"\nslurm walltime: checkpointed at step {saved} of {STEPS} on Slurm's notice ({noticed[0]['message']}); "
          f"the job ended {ended['JobState']} {first:.0f} s after the cell began; the next cluster resumed at step "
          f"{saved + 1} and finished, weights equal to the uninterrupted run's")
    assert not slurm.squeue(), slurm.squeue()
