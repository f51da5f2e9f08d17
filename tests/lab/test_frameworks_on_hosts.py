"""The code people already write, on three lab hosts that share nothing with the laptop: the
Hugging Face ``Trainer``, Accelerate and Lightning, unchanged, each as one job of three ranks on an
``ssh`` cluster — held against the same code under ``torchrun --nproc-per-node 3`` on this machine
— and a Trainer that loses a host mid-job and resumes from the checkpoint kept in the cluster's
S3 storage, on the hosts left.

The frameworks reach the hosts as a user's would: ``up --env requirements.txt``, installed for
the job from the package index the hosts' runtime came from (``--pip-index-url``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
from cluster_processes import wait_until
from framework_programs import (
    PROGRAMS,
    TRAINER,
    as_cell,
    as_script,
    params,
    records,
    under_torchrun,
    written,
)
from lab_files import FRAMEWORKS

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_LAB_FRAMEWORKS"),
    reason="the frameworks on three hosts build the job's pip environment on each (a minute of every core, "
           "beside make test's timed tests): `make frameworks-lab` runs it; make test runs them on a local cluster")]

STEPS = 6


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    """"fw3": the three hosts, one CPU each, S3 storage, the frameworks in the job's environment."""
    home = tmp_path_factory.mktemp("fw3-home")
    requirements = home / "requirements.txt"
    requirements.write_text("".join(f"{name}=={metadata.version(name)}\n" for name in FRAMEWORKS))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUGEEK_HOME", str(home))
        try:
            began = time.monotonic()
            gg.up("fw3", backend="ssh", hosts=",".join(f"root@{h.address}" for h in lab.hosts), ssh_key=str(lab.key),
                  cpus_per_host=1, usd_per_hour=0, pip_index_url=lab.index_url, storage="s3://lab/fw3",
                  env=str(requirements))
            print(f"\nup fw3: {time.monotonic() - began:.1f} s")
            yield home
        finally:
            if registry.live("fw3") is not None:
                gg.down("fw3")


@pytest.fixture
def on_fw3(cluster, monkeypatch):
    monkeypatch.setenv("GPUGEEK_HOME", str(cluster))
    return cluster


@pytest.mark.parametrize("framework", sorted(PROGRAMS))
def test_a_framework_trains_as_one_job_on_three_hosts_as_under_torchrun(framework, lab, on_fw3, tmp_path):
    out, ref = lab.shared / f"fw-{framework}", tmp_path / "torchrun"    # the records: where the laptop reads them
    began = time.monotonic()
    gg.run(as_cell(PROGRAMS[framework], str(out), STEPS), workers=3, monitor=False)
    print(f"\n{framework} on 3 hosts: {time.monotonic() - began:.1f} s")
    under_torchrun(as_script(PROGRAMS[framework], STEPS, devices=3), ref, ranks=3)
    ours, theirs = records(out, 3), records(ref, 3)
    assert [ours[r]["said"]["world_size"] for r in range(3)] == [3, 3, 3], ours
    assert [ours[r]["said"]["rank"] for r in range(3)] == [0, 1, 2], ours
    # a shard each (in a second epoch, or the sampler's padding, a sample may come round again)
    seen = [tuple(ours[r]["seen"]) for r in range(3)]
    assert all(seen) and len(set(seen)) == 3 and len(set().union(*seen)) > max(len(set(s)) for s in seen), seen
    assert all(torch.equal(a, b) for r in (1, 2) for a, b in zip(params(out, 0), params(out, r), strict=True))
    assert [ours[r]["seen"] for r in range(3)] == [theirs[r]["seen"] for r in range(3)]
    assert torch.allclose(torch.tensor(ours[0]["losses"]), torch.tensor(theirs[0]["losses"]), rtol=1e-5, atol=1e-6)
    for rank in range(3):
        assert written(out, rank) == written(ref, rank), (rank, written(out, rank), written(ref, rank))


def test_a_trainer_on_a_killed_host_resumes_from_its_s3_checkpoint_on_the_hosts_left(lab, on_fw3, capsys):
    """Every process of a worker host SIGKILLed at step 5 of 12 (save_steps 3, output_dir on each
    host's own disk, ``--max-failures 1``): the cell runs again on the two hosts left, the Trainer
    resumes from the newest checkpoint kept in S3 and ends at step 12, saying where it resumed."""
    import ray

    log = lab.shared / "trainer-steps.log"
    victim = lab.hosts[2]          # a worker host (the head is the first), holding one of the 3 ranks
    # rank 0 logs each step where the laptop reads it, and steps slowly enough to be cut mid-job
    cell = as_cell(TRAINER, "/tmp/fw-killed", 12).replace(
        "trainer = Trainer(model=model, args=args, train_dataset=data)\n", STEP_LOG.format(log=str(log)), 1)

    def kill_at_step_5():
        wait_until(lambda: log.exists() and len(log.read_text().split()) >= 5, 180, "step 5")
        lab.kill_host(victim)

    killer = threading.Thread(target=kill_at_step_5)
    killer.start()
    began = time.monotonic()
    try:
        gg.run(cell, workers=3, max_failures=1, monitor=False, name="trainer-killed")
    finally:
        killer.join()
        lab.start_sshd(victim)
    said = capsys.readouterr().out
    resumed = re.search(r"Trainer\.train: run 2 of this cell — resuming from \S*/checkpoint-(\d+) \(the job's "
                        r"newest checkpoint, kept in s3://lab/fw3/checkpoints/trainer-killed\)", said)
    assert "died" in said and resumed, said
    resumed = int(resumed.group(1))
    assert resumed in (3, 6, 9), said
    steps = [int(s) for s in log.read_text().split()]
    restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert steps[restart] == resumed + 1 and steps[-1] == 12 and set(steps) == set(range(1, 13)), steps
    with capsys.disabled():
        print(f"\n{victim.name} killed after step {steps[restart - 1]}; resumed from checkpoint-{resumed} kept in S3; "
              f"steps logged {steps}; the cell took {time.monotonic() - began:.1f} s")
    kept = [h for h in lab.hosts if h is not victim]
    finished = [json.loads(f.read_text()) for h in kept for f in Path(h.file("/tmp/fw-killed")).glob("record-0.json")]
    assert finished and finished[0]["said"]["step"] == 12 and finished[0]["said"]["world_size"] == 2, finished
    gg.scale(2, "fw3")
    wait_until(lambda: len([n for n in ray.nodes() if n["Alive"]]) == 3, 90, "the host rejoined")


STEP_LOG = """
import time
from transformers import TrainerCallback
class StepLog(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(1.0)
        if RANK == 0:
            with open({log!r}, "a") as f:
                f.write(f"{{state.global_step}}\\n")
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[StepLog()])
"""
