"""The code people already write runs unchanged as one distributed job: the Hugging Face
``Trainer``, Accelerate and Lightning in a ``%%gpugeek run`` cell, and a plain ``torchrun`` script
through ``%gpugeek torchrun``, each on a real local 2-worker group — held against the same code
under ``torchrun --nproc-per-node 2`` on this machine (real ``transformers``, ``accelerate`` and
``lightning``; small random-weight models from configs)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from framework_programs import (
    ACCELERATE,
    EXAMPLE,
    PROGRAMS,
    SCRIPT,
    TRAINER,
    as_cell,
    as_script,
    files_under,
    killed_once,
    magic_torchrun_runs,
    params,
    records,
    torchrun_in,
    under_torchrun,
    written,
)

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import ledger

pytestmark = pytest.mark.slow

STEPS = 6


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("frameworks-home")


@pytest.fixture(autouse=True)
def gpugeek_home(home, monkeypatch):
    """One state dir (and one local cluster) for the whole module."""
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    return home


@pytest.fixture(scope="module", autouse=True)
def cluster(home):
    old = {k: os.environ.get(k) for k in ("GPUGEEK_HOME", "HF_HUB_OFFLINE")}
    os.environ.update(GPUGEEK_HOME=str(home), HF_HUB_OFFLINE="1")   # the workers inherit it: no hub
    gg.up("frameworks")
    yield
    try:
        gg.down("frameworks")
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def last_job_samples():
    record = registry.live("frameworks")
    job = ledger.jobs_of(record.id)[-1]
    return job, ledger.samples_frame(record.id, job["job_id"])


@pytest.mark.parametrize("framework", sorted(PROGRAMS))
def test_a_framework_in_a_cell_trains_as_one_job_on_every_worker_as_under_torchrun(framework, tmp_path, capsys):
    cell, ref = tmp_path / "cell", tmp_path / "torchrun"
    gg.run(as_cell(PROGRAMS[framework], str(cell), STEPS), workers=2, monitor=False)
    under_torchrun(as_script(PROGRAMS[framework], STEPS, devices=2), ref)
    ours, theirs = records(cell), records(ref)

    # the framework's own word: world size 2, a distinct rank each (the one torchrun's RANK says)
    assert [ours[r]["said"]["world_size"] for r in (0, 1)] == [2, 2], ours
    assert [ours[r]["said"]["rank"] for r in (0, 1)] == [0, 1], ours
    assert [ours[r]["said"]["mode"] for r in (0, 1)] == [theirs[r]["said"]["mode"] for r in (0, 1)]
    # different data on every rank, and one model after training
    assert ours[0]["seen"] and ours[1]["seen"] and not set(ours[0]["seen"]) & set(ours[1]["seen"])
    assert all(torch.equal(a, b) for a, b in zip(params(cell, 0), params(cell, 1), strict=True))
    # the same run as torchrun's: same samples per rank, loss curve within float tolerance
    assert [ours[r]["seen"] for r in (0, 1)] == [theirs[r]["seen"] for r in (0, 1)]
    assert len(ours[0]["losses"]) == len(theirs[0]["losses"]) > 0
    assert torch.allclose(torch.tensor(ours[0]["losses"]), torch.tensor(theirs[0]["losses"]), rtol=1e-5, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params(cell, 0), params(ref, 0), strict=True))
    # each rank wrote what it writes under torchrun: the model, logs and checkpoints on rank 0 alone
    for rank in (0, 1):
        assert written(cell, rank) == written(ref, rank), (rank, written(cell, rank), written(ref, rank))
    model_files = [f for f in written(cell, 1) if not ("rng_state" in f or "random_states" in f)]
    assert written(cell, 0) and model_files == [], written(cell, 1)
    # the monitor and the ledger saw the job: its steps, loss and throughput
    job, samples = last_job_samples()
    assert job["status"] == "finished"
    assert samples["step"].max() == STEPS and samples["loss"].notna().any(), samples
    assert (samples["samples_per_s"].dropna() > 0).any(), samples
    assert "note:" not in capsys.readouterr().out


def test_a_torchrun_script_runs_as_one_job_twice_on_the_warm_group(tmp_path):
    """A plain script: argparse, ``init_process_group("gloo")``, DDP, ``destroy_process_group()``
    — run twice on the same warm group (the script's destroy leaves it up), as torchrun runs it."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    first, second, ref = tmp_path / "first", tmp_path / "second", tmp_path / "torchrun"
    gg.torchrun(str(script), str(first), "--steps", "5", workers=2, monitor=False)
    pids = gg.run("import os\nos.getpid()", workers=2, monitor=False).shown()
    gg.torchrun(str(script), str(second), "--steps", "5", workers=2, monitor=False)
    assert gg.run("import os\nos.getpid()", workers=2, monitor=False).shown() == pids, "the same warm group"
    under_torchrun(SCRIPT, ref, "--steps", "5")
    for out in (first, second):
        ours, theirs = records(out), records(ref)
        assert [ours[r]["said"] for r in (0, 1)] == [theirs[r]["said"] for r in (0, 1)]
        assert [ours[r]["seen"] for r in (0, 1)] == [theirs[r]["seen"] for r in (0, 1)]
        assert torch.allclose(torch.tensor(ours[0]["losses"]), torch.tensor(theirs[0]["losses"]), rtol=1e-5)
        assert all(torch.equal(a, b) for a, b in zip(params(out, 0), params(out, 1), strict=True))
    jobs = ledger.jobs_of(registry.live("frameworks").id)
    assert [j["status"] for j in jobs if j["name"] == "train.py"][-2:] == ["finished", "finished"]


def test_a_torchrun_script_beside_its_modules_runs_from_the_notebooks_folder_and_resumes(tmp_path, monkeypatch,
                                                                                         ipython, capsys):
    """As under torchrun: the script's folder first on ``sys.path`` on every rank (its modules
    import, though the notebook stood elsewhere at ``up``), and it runs in the caller's folder,
    which the notebook left (``%cd``) after ``up``: its checkpoint folder lands there, and the
    second run resumes from it — the same files and the same weights as torchrun's, run from a
    folder of its own."""
    examples = tmp_path / "examples" / "ddp"
    shutil.copytree(EXAMPLE, examples)
    notebook, reference = tmp_path / "notebook", tmp_path / "torchrun"
    notebook.mkdir()
    reference.mkdir()
    monkeypatch.chdir(notebook)
    said = magic_torchrun_runs(ipython, capsys, "../examples/ddp/train.py", 3, 6)
    assert "no checkpoint: starting at step 0" in said[0] and f"trained to step 3 in {notebook}" in said[0], said[0]
    assert "resumed from step 3" in said[1] and f"trained to step 6 in {notebook}" in said[1], said[1]
    theirs = [torchrun_in(reference, examples / "train.py", "--steps", str(steps)) for steps in (3, 6)]
    assert "resumed from step 3" in theirs[1], theirs[1]
    assert files_under(notebook) == files_under(reference) == ["checkpoints/model.pt", "checkpoints/shard-0.pt",
                                                              "checkpoints/shard-1.pt"]
    ours, ref = (torch.load(f / "checkpoints" / "model.pt", weights_only=True) for f in (notebook, reference))
    assert ours["step"] == ref["step"] == 6
    assert all(torch.allclose(ours["model"][k], ref["model"][k], rtol=1e-5) for k in ref["model"])
    assert not list((tmp_path / "examples").rglob("checkpoints")), "written beside the script"
    assert gg.fetch("checkpoints") == [notebook / "checkpoints"]
    assert (f"cluster 'frameworks' runs on this machine: its jobs run in the notebook's folder, so "
            f"{notebook / 'checkpoints'} is here — nothing to fetch") in capsys.readouterr().out


def test_a_script_that_exits_nonzero_fails_its_job_in_one_line(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    with pytest.raises(gg.GpugeekError, match=r"bad.py exited with 2"):
        gg.torchrun(str(script), "--no-such-flag", workers=2, monitor=False)
    with pytest.raises(gg.GpugeekError, match=r"torchrun .*missing.py: cannot read it"):
        gg.torchrun(str(tmp_path / "missing.py"), workers=2, monitor=False)


def test_gg_flags_on_a_cell_that_never_calls_gg_are_said_to_do_nothing(capsys):
    gg.run("x = 1", workers=2, amp="bf16", accumulate=4, monitor=False)
    out = capsys.readouterr().out
    assert "note: --amp, --accumulate are for the gg helper, and this cell never calls gg" in out
    gg.run("x = gg.step", workers=2, amp="bf16", monitor=False)
    assert "note:" not in capsys.readouterr().out


def test_a_cell_asking_for_another_backend_is_told_in_one_line_and_a_fitting_one_is_a_no_op():
    gg.run('import torch.distributed as dist\ndist.init_process_group("gloo")\nassert dist.get_world_size() == 2',
           workers=2, monitor=False)
    with pytest.raises(gg.GpugeekError, match=r"init_process_group\(.nccl.\): this worker group runs gloo"):
        gg.run('import torch.distributed as dist\ndist.init_process_group("nccl")', workers=2, monitor=False)


def test_a_lightning_trainer_given_a_shape_the_group_lacks_is_told_the_one_that_fits():
    """Lightning itself fails this on rank 1 with an IndexError; the group's shape is ours to say."""
    cell = ("import lightning as L\n"
            "L.Trainer(accelerator='cpu', strategy='ddp', devices={devices}, num_nodes={nodes}, logger=False,"
            " enable_progress_bar=False, enable_model_summary=False)\n")
    with pytest.raises(gg.GpugeekError, match=r"^Trainer\(devices=1, num_nodes=2\) does not fit this group of 2 "
                                              r"worker\(s\) on 1 node\(s\): give devices=2, num_nodes=1 — or leave"):
        gg.run(cell.format(devices=1, nodes=2), workers=2, monitor=False)
    gg.run(cell.format(devices=2, nodes=1), workers=2, monitor=False)       # the shape that fits, given


def test_accelerate_with_a_tracker_reports_its_logged_values(tmp_path):
    """What ``accelerator.log`` logs reaches the ledger under its own name, as ``gg.log`` does."""
    cell = as_cell(ACCELERATE, str(tmp_path), STEPS).replace(
        "losses.append(", "accelerator.log({'mse': loss.item()}, step=step + 1)\n    losses.append(")
    gg.run(cell, workers=2, monitor=False)
    _, samples = last_job_samples()
    assert "mse" in samples.columns and samples["mse"].notna().any(), samples.columns


def test_a_rebuilt_group_gets_variables_for_its_new_size():
    """The variables follow the group: a group built anew with fewer workers (as after a lost
    host) says its new world size, and a framework reading them agrees with the process group."""
    said = ("import os, torch.distributed as dist\n"
            "(os.environ['WORLD_SIZE'], os.environ['LOCAL_WORLD_SIZE'], dist.get_world_size())")
    assert gg.run(said, workers=1, monitor=False).shown() == ("1", "1", 1)
    assert gg.run(said, workers=2, monitor=False).shown() == ("2", "2", 2)


@pytest.mark.parametrize("framework", sorted(PROGRAMS))
def test_a_frameworks_own_checkpoints_are_kept_in_the_jobs_storage_whole(framework, tmp_path):
    """Every checkpoint the framework wrote (on any rank's disk) lands in the job's storage, each
    file once, with a COMPLETE; ``gg.resume_from`` fetches the newest onto the worker's host."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    gg.run(as_cell(PROGRAMS[framework], str(out), STEPS), workers=2, checkpoint_dir=str(kept), monitor=False)
    steps = sorted(p.parent for p in (kept / "framework").glob("step-*/COMPLETE"))
    assert steps, sorted(str(p) for p in kept.rglob("*"))
    newest = steps[-1]
    said = json.loads((newest / "COMPLETE").read_text())
    stored = sorted(str(p.relative_to(newest)) for p in newest.rglob("*") if p.is_file() and p.name != "COMPLETE")
    local = set()
    for rank in (0, 1):
        for f in written(out, rank):
            parts = Path(f).parts
            if said["name"] in parts:       # this checkpoint's files, as each rank wrote them
                local.add(str(Path(*parts[parts.index(said["name"]):])))
    assert stored == sorted(local) and stored, (stored, sorted(local))
    fetched = gg.run("import os\nr = gg.resume_from\n(os.path.basename(r), sorted(os.listdir(r)) "
                     "if os.path.isdir(r) else None)", workers=2, checkpoint_dir=str(kept), monitor=False).shown()
    assert fetched[0] == said["name"]
    if said["folder"]:
        assert fetched[1] == sorted({Path(f).parts[1] for f in stored})


def test_a_trainer_whose_worker_dies_resumes_from_its_kept_checkpoint_to_its_planned_step(tmp_path, capsys):
    """--max-failures 1: rank 1 dies at step 5; the cell runs again on a new group and the
    Trainer, given no checkpoint, resumes from the kept checkpoint-3 and ends at step 8 — with
    the weights an uncut run ends with."""
    cut, whole, kept = tmp_path / "cut", tmp_path / "whole", tmp_path / "kept"
    cell = killed_once(as_cell(TRAINER, str(cut), 8), str(tmp_path / "killed"))
    gg.run(cell, workers=2, max_failures=1, checkpoint_dir=str(kept), monitor=False)
    out = capsys.readouterr().out
    assert "died" in out and "Trainer.train: run 2 of this cell — resuming from" in out, out
    assert "checkpoint-3 (the job's newest checkpoint" in out, out
    gg.run(as_cell(TRAINER, str(whole), 8), workers=2, monitor=False)
    ours = records(cut)
    assert [ours[r]["said"]["step"] for r in (0, 1)] == [8, 8]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
               for a, b in zip(params(cut, 0), params(whole, 0), strict=True)), "the resumed run ends as an uncut one"
