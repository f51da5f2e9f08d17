"""`%%gpugeek run` on a real 2-worker group (CPU, gloo) of a real local Ray cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from cluster_processes import rays_own_lines, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.group import workergroup
from gpugeek_jupyter.group.driver import RayDriver
from gpugeek_jupyter.group.results import Interrupted, RemoteError
from gpugeek_jupyter.meter import costs, ledger

pytestmark = pytest.mark.slow

MODEL = """
import copy, torch
from torch import nn

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
    def forward(self, x):
        return x + self.mlp(self.norm(x))

class Net(nn.Module):
    def __init__(self, width=32, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)
    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("run-home")


@pytest.fixture(autouse=True)
def gpugeek_home(home, monkeypatch):
    """One state dir (and one local cluster) for the whole module."""
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    return home


@pytest.fixture(scope="module", autouse=True)
def cluster(home):
    import os

    old = os.environ.get("GPUGEEK_HOME")
    os.environ["GPUGEEK_HOME"] = str(home)
    gg.up("runs")
    yield
    import ray

    from gpugeek_jupyter.cells import jobs
    from gpugeek_jupyter.kernel.session import current

    try:
        gg.run("pass", workers=2, monitor=False)
        group = current().group
        assert group.connected(), "the group of the cluster this kernel drives"
    finally:
        gg.down("runs")   # with the worker group still up, as a user would
        if old is not None:
            os.environ["GPUGEEK_HOME"] = old
    # after the cluster is gone nothing may call Ray: an actor call would start a new local Ray
    assert not group.connected()
    assert jobs.drain_telemetry() == 0 and not ray.is_initialized()
    assert gg.reset() and not ray.is_initialized()


def test_a_model_defined_in_one_cell_trains_in_the_next_with_equal_ddp_gradients(ipython):
    ipython.run_cell_magic("gpugeek", "run --workers 2", MODEL + """
torch.manual_seed(rank)                      # different start per rank: DDP broadcasts rank 0's
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = gg.prepare(model, optimizer)
""")
    ipython.run_cell_magic("gpugeek", "run --workers 2 --pull same_start,same_grads,losses", """
import torch.distributed as dist
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
starts = [torch.zeros_like(flat) for _ in range(world_size)]
dist.all_gather(starts, flat)
same_start = all(torch.equal(starts[0], s) for s in starts)
x = torch.randn(8, 16, 32, generator=torch.Generator().manual_seed(100 + rank))   # different data per rank
loss = model(x).pow(2).mean()
loss.backward()                              # DDP all-reduces the gradients
grads = torch.cat([p.grad.flatten() for p in model.parameters()])
everyone = [torch.zeros_like(grads) for _ in range(world_size)]
dist.all_gather(everyone, grads)
same_grads = all(torch.allclose(everyone[0], g) for g in everyone)
optimizer.zero_grad()
losses = []
for step in range(5):
    loss = model(x).pow(2).mean()
    gg.backward(loss)
    losses.append(loss.item())
""")
    ns = ipython.user_ns
    assert ns["same_start"] and ns["same_grads"]
    assert ns["losses"][-1] < ns["losses"][0], "the model from the previous cell trains"


def test_the_workers_run_at_the_hosts_normal_priority(ipython):
    # Ray starts its workers at niceness 15, below its own daemons; ours run at 0, as a driver does
    ipython.run_cell_magic("gpugeek", "run --workers 2 --pull nices", """
import os, torch.distributed as dist
nices = [None] * world_size
dist.all_gather_object(nices, os.getpriority(os.PRIO_PROCESS, 0))
""")
    assert ipython.user_ns["nices"] == [0, 0]


def test_bf16_autocast_is_on_with_amp_bf16(ipython):
    value = ipython.run_cell_magic("gpugeek", "run --workers 2 --amp bf16", """
layer = torch.nn.Linear(4, 4)
with gg.autocast():
    out = layer(torch.randn(2, 4))
str(out.dtype)
""")
    assert value == "torch.bfloat16"


def test_accumulating_k_micro_batches_equals_one_k_times_batch(ipython):
    ipython.run_cell_magic("gpugeek", "run --workers 2 --accumulate 4 --pull max_diff,steps", MODEL + """
torch.manual_seed(0)
base = Net(width=16, depth=2)
data = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))      # same on every rank
reference = copy.deepcopy(base)
reference(data).pow(2).mean().backward()                                    # one 32-sample batch
expected = [p.detach() - 1.0 * p.grad for p in reference.parameters()]     # SGD lr=1 step
model = copy.deepcopy(base)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
model, optimizer = gg.prepare(model, optimizer)
steps = [gg.backward(model(chunk).pow(2).mean()) for chunk in data.split(8)]   # 4 micro-batches
max_diff = max((p.detach() - e).abs().max().item() for p, e in zip(model.parameters(), expected))
""")
    assert ipython.user_ns["steps"] == [False, False, False, True], "one optimizer step per 4 micro-batches"
    assert ipython.user_ns["max_diff"] < 1e-5


SAVED = MODEL + """
def saved_bytes_and_loss():
    torch.manual_seed(0)
    net = gg.prepare(Net(width=64, depth=6))
    x = torch.randn(16, 32, 64, generator=torch.Generator().manual_seed(2))
    total = 0
    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = net(x).pow(2).mean()
    loss.backward()
    return total, loss.item()
measured = saved_bytes_and_loss()
"""


def test_grad_ckpt_saves_fewer_bytes_for_backward_and_gives_the_same_loss(ipython):
    ipython.run_cell_magic("gpugeek", "run --workers 2 --pull measured", SAVED)
    plain_bytes, plain_loss = ipython.user_ns["measured"]
    ipython.run_cell_magic("gpugeek", "run --workers 2 --grad-ckpt --pull measured", SAVED)
    ckpt_bytes, ckpt_loss = ipython.user_ns["measured"]
    print(f"\nsaved for backward: {plain_bytes / 2**20:.2f} MiB plain, {ckpt_bytes / 2**20:.2f} MiB with --grad-ckpt")
    assert ckpt_bytes < 0.5 * plain_bytes
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-6)


def test_push_and_pull(ipython):
    ipython.user_ns["scale_by"] = 3
    ipython.run_cell_magic("gpugeek", "run --workers 2 --push scale_by --pull result", "result = scale_by * (rank + 1)")
    assert ipython.user_ns["result"] == 3, "pull brings back rank 0's value"


def test_an_error_on_rank_1_shows_its_cell_line(ipython, capsys):
    with pytest.raises(RemoteError) as info:
        gg.run("x = 1\ny = 2\nif rank == 1:\n    raise ValueError('bad batch')\n", workers=2)
    lines = info.value._render_traceback_()
    text = "\n".join(lines)
    assert "failed on rank 1" in lines[0]
    assert 'File "<cell' in text and "line 4" in text and "raise ValueError('bad batch')" in text
    assert "ValueError: bad batch" in lines[-1]
    assert "gpugeek_jupyter" not in text, "our frames stay out of the user's traceback"
    assert gg.run("rank", workers=2).shown() == 0, "the group is still usable"



def test_a_pasted_scripts_sys_exit_0_is_a_normal_end_and_another_code_names_itself_and_its_rank(ipython):
    script = "import sys\ndef main():\n    global done\n    done = rank + 10\n    return 0\nsys.exit(main())\n"
    result = gg.run(script, workers=2, pull=["done"])
    assert result.pulled == {"done": 10}, "what the cell made before sys.exit(0) is there to pull"
    assert gg.run("import sys\nsys.exit()\n", workers=2).shown() is None
    with pytest.raises(GpugeekError, match=r"^the cell exited with 3 on rank 1 \("):
        gg.run("import sys\nif rank == 1:\n    sys.exit(3)\n", workers=2)
    assert gg.run("rank", workers=2).shown() == 0, "the group is still usable"

def test_out_of_gpu_memory_is_explained_under_the_traceback_and_the_group_goes_on(ipython):
    # CPU workers cannot run out of GPU memory: the cell raises torch's own error with its message
    with pytest.raises(RemoteError) as info:
        gg.run("import torch\nif rank == 0:\n    raise torch.cuda.OutOfMemoryError("
               "'CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB')\n"
               "import torch.distributed as dist\ndist.barrier()\n", workers=2)
    text = "\n".join(info.value._render_traceback_())
    assert "gpugeek: out of GPU memory. torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in text
    assert "try: --grad-ckpt" in text and "--accumulate K" in text
    assert info.value.memory is None, "a CPU worker has no GPU reading to give"
    assert gg.run("rank", workers=2).shown() == 0, "the group is still usable"


STUCK_AFTER_RANK_1_FAILS = """
import time, torch, torch.distributed as dist
if rank == 1:
    time.sleep(1)
    raise ValueError('no data')
dist.all_reduce(torch.ones(1))   # rank 0 waits here for rank 1
"""


def test_rank_0_leading_the_cell_over_its_cell_line_stops_failures(ipython, capsys, stop_button):
    """The notebook sends the cell to rank 0 alone, which hands it on over the cell line
    (``execute_all``): it fails, gets stuck and is interrupted as above, and a rank's death is
    seen at once."""
    from gpugeek_jupyter.kernel.session import current

    gg.run("pass", workers=2)
    assert current().group.line_note is None, "rank 1 did not connect to rank 0's cell line"
    assert gg.run("print('from', rank)\nrank * 10", workers=2, all_ranks=True).shown() == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["[rank 0] from 0", "[rank 1] from 1"]
    with pytest.raises(RemoteError, match="rank 1: ValueError: bad batch"):
        gg.run("if rank == 1:\n    raise ValueError('bad batch')\n", workers=2)
    threading.Timer(1.0, stop_button).start()
    with pytest.raises(Interrupted, match="the group is ready"):
        gg.run("import time\nfor _ in range(600):\n    time.sleep(0.05)\n", workers=2)
    start = time.monotonic()
    with pytest.raises(RemoteError) as info:
        gg.run(STUCK_AFTER_RANK_1_FAILS, workers=2)
    assert time.monotonic() - start < 12 and "rank 0 did not stop" in info.value.extra
    gg.run("pass", workers=2)
    start = time.monotonic()        # a rank's process ends: its cell line closes at once
    with pytest.raises(GpugeekError, match="worker 1 died"):
        gg.run("import os\nif rank == 1:\n    os._exit(1)\n", workers=2)
    assert time.monotonic() - start < 10
    assert gg.run("world_size", workers=2).shown() == 2


def test_interrupt_stops_every_worker_and_keeps_the_group(ipython, stop_button):
    gg.run("import os, time\nkept = 41", workers=2)
    pids = gg.run("os.getpid()", workers=2).shown()
    threading.Timer(1.0, stop_button).start()
    start = time.monotonic()
    with pytest.raises(Interrupted, match="interrupted on all 2 workers — the group is ready"):
        gg.run("for _ in range(600):\n    time.sleep(0.05)\n", workers=2)
    assert time.monotonic() - start < 1.0 + 2.0
    # the same workers, their variables with them
    assert gg.run("kept + 1", workers=2).shown() == 42 and gg.run("os.getpid()", workers=2).shown() == pids


def test_a_group_found_again_is_gone_only_when_the_cluster_says_so(ipython, monkeypatch):
    """After a reconnect the warm group is looked up by name: a link that fails again meanwhile is
    raised (out of reach: the caller tries again), never taken for the workers being gone."""
    import ray

    from gpugeek_jupyter.kernel.session import current

    gg.run("import os\nkept = 7", workers=2)
    group = current().group
    pids = gg.run("os.getpid()", workers=2).shown()
    assert group.refind() and not group.broken

    def link_down(*args, **kwargs):
        raise ConnectionError("the link went down again")   # what a Ray Client raises then

    with monkeypatch.context() as patch:
        patch.setattr(ray, "get_actor", link_down)
        with pytest.raises(ConnectionError):
            group.refind()
    assert not group.broken and gg.run("(kept, os.getpid())", workers=2).shown() == (7, pids)
    ray.kill(group.workers[1])                     # rank 1 is gone: no worker of that name any more
    wait_until(lambda: not group.refind(), 30, "the killed worker's name to be gone")
    assert group.broken
    gg.reset()


def test_output_streams_and_all_ranks_are_prefixed(ipython, capsys):
    gg.run("print('from', rank)", workers=2)
    assert capsys.readouterr().out == "from 0\n"
    gg.run("print('from', rank)", workers=2, all_ranks=True)
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == ["[rank 0] from 0", "[rank 1] from 1"]


def test_prints_and_node_reports_arrive_while_the_cell_runs_with_a_drain_every_two_seconds(ipython, monkeypatch):
    """A print shows while the cell still runs; the node samplers report during it too; and a
    cell that prints nothing for 5.5 s costs the notebook a drain every 2 s, not ten a second."""
    import sys

    from gpugeek_jupyter.kernel.session import current

    gg.run("import time", workers=2)
    group = current().group
    deadline = time.monotonic() + 20      # a new group's samplers take a moment to start
    while group.drain_telemetry() == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    seen: list[tuple[float, str]] = []
    start = time.monotonic()

    class Clocked:
        def write(self, text):
            seen.append((time.monotonic() - start, text))
            return len(text)

        def flush(self):
            pass

    record_nodes = group.on_node_samples
    monkeypatch.setattr(group, "on_node_samples", lambda s: (seen.append((time.monotonic() - start, "nodes")),
                                                             record_nodes(s)))
    monkeypatch.setattr(sys, "stdout", Clocked())
    start = time.monotonic()
    drains = group.drains
    gg.run("print('early', flush=True)\ntime.sleep(5.5)\nprint('late')", workers=2, monitor=False)
    took = time.monotonic() - start
    monkeypatch.undo()
    early = next(t for t, text in seen if "early" in text)
    late = next(t for t, text in seen if "late" in text)
    assert early < 1.5 < 5.5 <= late, seen
    assert sum(1 for t, text in seen if text == "nodes" and t < took - 0.3) >= 2, seen
    assert group.drains - drains <= 5, f"{group.drains - drains} drains in {took:.1f} s"


def test_each_run_is_a_ledger_job_with_samples(ipython):
    record = registry.live("runs")
    before = len(costs.cost_table(record.id, "job"))
    gg.run("""
import torch
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.1)
m, o = gg.prepare(m, o)
for batch in gg.steps([torch.randn(8, 4) for _ in range(30)]):
    loss = m(batch).pow(2).mean()
    gg.backward(loss)
    gg.log(loss=loss.item())
""", workers=2, name="logged")
    jobs = costs.cost_table(record.id, "job")
    assert len(jobs) == before + 1 and jobs.iloc[-1]["name"] == "logged" and jobs.iloc[-1]["status"] == "finished"
    job_id = jobs.iloc[-1]["job_id"]
    samples = ledger.samples_frame(record.id, job_id)
    assert not samples.empty and {"loss", "samples_per_s", "memory_bytes"} <= set(samples.columns)
    assert samples["step"].max() == 30
    # a CPU job: right-sizing has no GPU telemetry to read, says so and advises nothing
    advice = ipython.run_line_magic("gpugeek", "advise logged")
    assert advice.offers.empty
    assert str(advice) == ("no GPU telemetry for this job (it ran on CPU, or NVML was not available) "
                           "— nothing to advise")


RESUMABLE = """
import os, signal, time, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = gg.prepare(model, optimizer)
data = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(40)]
for batch in gg.steps(data):
    gg.backward(model(batch).pow(2).mean())
    if rank == 1 and gg.step == 12 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)       # a worker dies mid-training
final_step = gg.step
"""


def test_the_check_for_rays_lines_finds_each_line_rays_own_printer_makes():
    """The checks that no Ray line reaches a cell are only as good as their pattern: Ray's printer
    (the one ``kernel/raylines.py`` wraps) writes the records that pattern must find."""
    import io

    from ray._private.worker import print_worker_logs
    records = [{"pid": "raylet", "lines": ["A worker died or was killed while executing a task"]},
               {"pid": "raylet", "ip": "10.9.0.3", "lines": ["A worker died"]},
               {"pid": "gcs_server", "lines": ["Failed to remove 1 bundle(s) for placement group"]},
               {"pid": "4242", "lines": ["a worker's own print"]},
               {"pid": "4243", "ip": "10.9.0.3", "actor_name": "RankWorker", "lines": ["gloo: connection closed"]}]
    printed = io.StringIO()
    for record in records:
        print_worker_logs({"ip": "127.0.0.1", **record}, printed)
    lines = printed.getvalue().splitlines()
    assert len(lines) == len(records) and rays_own_lines(printed.getvalue()) == lines, lines
    assert not rays_own_lines("worker 2 died (its process ended); rebuilding the group", "watchdog (pid 77) up")


def test_a_killed_worker_resumes_from_its_checkpoint_three_times_in_a_row(ipython, tmp_path, capsys):
    for attempt in range(3):
        ckpt = tmp_path / f"ckpt-{attempt}"
        ipython.user_ns["marker"] = str(tmp_path / f"killed-{attempt}")
        ipython.run_cell_magic(
            "gpugeek", f"run --workers 2 --checkpoint-every 5 --checkpoint-dir {ckpt} --max-failures 1 "
                       f"--push marker --pull final_step", RESUMABLE)
        out, err = capsys.readouterr()
        assert "died" in out and "resumed from step-00000010 (step 10)" in out, out
        assert not rays_own_lines(out, err), f"Ray's own lines reached the cell: {rays_own_lines(out, err)}"
        assert ipython.user_ns["final_step"] == 40
    gg.reset()


def test_fsdp_trains_and_checkpoints_sharded(ipython, tmp_path):
    ipython.run_cell_magic("gpugeek", f"run --workers 2 --strategy fsdp --checkpoint-every 2 "
                                      f"--checkpoint-dir {tmp_path} --pull losses,sharded", MODEL + """
from torch.distributed.tensor import DTensor
torch.manual_seed(0)
model = Net(width=16, depth=2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = gg.prepare(model, optimizer)
sharded = all(isinstance(p, DTensor) for p in model.parameters())
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
losses = []
for _ in gg.steps(range(6)):
    loss = model(x).pow(2).mean()
    gg.backward(loss)
    losses.append(loss.item())
""")
    assert ipython.user_ns["sharded"], "FSDP2 shards every parameter"
    assert ipython.user_ns["losses"][-1] < ipython.user_ns["losses"][0]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000004", "step-00000006"]
    gg.reset()


def test_a_group_waiting_on_a_cluster_that_grows_says_what_it_waits_for(capsys):
    """Where waiting can help (an autoscaler adds nodes), the wait says at once what it is for."""
    import ray

    from gpugeek_jupyter.group import orphans, placement

    gg.reset()          # no group of this kernel holds room: the wait is for the cluster to grow (the
    # test before this one ends with a reset too: here, no group is started only to be stopped)

    @ray.remote(num_cpus=0)
    def never_ready():
        time.sleep(30)      # stands for a placement group that is not ready within the wait

    ready = never_ready.remote()
    try:
        began = time.monotonic()
        assert not orphans.wait_for_room(RayDriver(), ready, 2.0, "no-such-group",
                                         growing=lambda: placement.growing(4, 1))
        assert time.monotonic() - began < 4
    finally:
        ray.cancel(ready, force=True)
    out = capsys.readouterr().out
    assert "note: waiting for the cluster to make room for 4 workers × 1 GPU (0 GPUs free now): it starts nodes " \
           "for them by itself, or a group that holds them ends — this cell waits up to 2 s in all" in out, out


def test_changing_training_flags_keeps_the_workers_variables(ipython):
    gg.run("kept = 42 + rank", workers=2)
    assert gg.run("kept", workers=2, amp="bf16", accumulate=2, clip=1.0).shown() == 42


def test_a_placement_group_that_will_not_go_is_said_as_held_never_as_scale_the_cluster(ipython, monkeypatch):
    """An old group's placement group whose removal fails still reserves its CPUs or GPUs: the
    next group that does not fit names it (and `reset` frees it), never "scale the cluster",
    which would have the user pay for nodes to work around it."""
    import sys

    import ray

    from gpugeek_jupyter.group import placement
    from gpugeek_jupyter.kernel import connection

    rays = sys.modules["ray.util.placement_group"]     # (ray.util's name for it is the function)

    cpus = int(ray.cluster_resources()["CPU"])
    gg.run("x = 1", workers=cpus, monitor=False)
    real = rays.remove_placement_group

    def refused(pg):
        raise RuntimeError("the GCS did not take the removal")
    monkeypatch.setattr(rays, "remove_placement_group", refused)
    # no room comes while it is held, and each removal is refused: how long and how often is not the point
    monkeypatch.setattr(workergroup, "HELD_WAIT_S", 2.0)
    monkeypatch.setattr(placement, "PG_REMOVE_TRIES", 1)
    with pytest.raises(GpugeekError) as told:     # a new shape: the old group goes, but its group will not
        gg.run("x = 2", workers=cpus, collective_timeout=61, monitor=False)
    said = str(told.value)
    assert f"still holds 0 GPUs and {cpus} CPUs" in said and "the GCS did not take the removal" in said, said
    assert "scale" not in said, said
    monkeypatch.setattr(rays, "remove_placement_group", real)
    assert gg.reset(), "reset freed the held placement group"
    assert placement.release_held(connection.connected_address()) == []
    gg.run("x = 3", workers=cpus, monitor=False)


def test_attach_takes_a_jobs_name_the_newest_of_several_and_says_so(ipython, capsys):
    gg.run("print('first', flush=True)\n1", workers=2, name="outlive")
    gg.run("print('second', flush=True)\n41 + 1", workers=2, name="outlive")
    capsys.readouterr()
    assert gg.attach("outlive", monitor=False).shown() == 42
    out = capsys.readouterr().out
    assert "second" in out and "first" not in out, out
    assert "note: 2 jobs are named 'outlive': following the newest" in out, out
    assert list(gg.jobs().columns[:2]) == ["name", "job"], "the name first"
    with pytest.raises(GpugeekError, match="no job 'never-ran' on 'runs'"):
        gg.attach("never-ran", monitor=False)


def test_a_group_that_can_never_fit_a_cluster_that_does_not_grow_is_refused_at_once():
    """A local cluster never grows by itself: more workers than its CPUs is said at once, in the
    line a two-minute wait used to end in, and the warm group is kept."""
    import ray

    cpus = int(ray.cluster_resources()["CPU"])
    gg.run("kept = 7", workers=2)
    began = time.monotonic()
    with pytest.raises(GpugeekError, match=rf"{cpus + 1} workers × 1 CPU do not fit the cluster \(it has {cpus} "
                                           r"CPUs on 1 node, and does not grow by itself\) — use fewer --workers"):
        gg.run("pass", workers=cpus + 1)
    took = time.monotonic() - began
    assert took <= 2.0, f"refused after {took:.1f} s"
    assert gg.run("kept", workers=2).shown() == 7, "refused before the warm group went: its variables are there"


def test_the_clusters_processes_leave_out_the_parsers_that_cost_seconds_to_import(ipython):
    """jsonschema loads ``rfc3987_syntax`` where it is installed (Jupyter installs it), and that
    builds ~40 parsers on import: seconds of CPU in every Ray process. A cell's workers, and the
    head's own agents (read from outside, in their environment), go without it."""
    import importlib.util

    import psutil

    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987_syntax is not installed here: nothing to leave out")
    ipython.run_cell_magic("gpugeek", "run --workers 2 --pull lean", """
import sys, torch.distributed as dist
lean = [None] * world_size
dist.all_gather_object(lean, ("jsonschema" in sys.modules, "rfc3987_syntax" in sys.modules))
""")
    assert ipython.user_ns["lean"] == [(True, False), (True, False)]
    head = registry.live("runs")
    agents = [p for p in psutil.process_iter(["cmdline"]) if "dashboard/agent.py" in " ".join(p.info["cmdline"] or [])
              and os.getsid(p.pid) == head.session_id]
    assert agents and all("lean_imports" in p.environ().get("PYTHONPATH", "") for p in agents)


def test_a_kernel_imports_ray_without_the_slow_parsers_and_anyone_else_still_gets_them():
    """The kernel's side of the same: ``import gpugeek_jupyter`` first, and jsonschema (under
    ``import ray``) goes without ``rfc3987_syntax``; the user's own import of it still works. In a
    process without us, jsonschema still asks for it from ``jsonschema._format``: when that moves,
    this says so, and ``gpugeek_jupyter/lean.py`` can go."""
    import importlib.util

    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987_syntax is not installed here: nothing to leave out")
    probe = ("import sys, time\n{first}began = time.process_time()\nimport ray\n"
             "print(round(time.process_time() - began, 2), 'rfc3987_syntax' in sys.modules)\n"
             "import rfc3987_syntax\nprint('direct', rfc3987_syntax.__name__)")
    ours, plain = (subprocess.run([sys.executable, "-c", probe.format(first=first)], capture_output=True, text=True,
                                  timeout=120) for first in ("import gpugeek_jupyter\n", ""))
    assert ours.returncode == 0 and plain.returncode == 0, (ours.stderr[-2000:], plain.stderr[-2000:])
    (ours_cpu, ours_loaded), (plain_cpu, plain_loaded) = (out.stdout.split("\n")[0].split() for out in (ours, plain))
    assert plain_loaded == "True", ("jsonschema no longer imports rfc3987_syntax when Ray loads it: "
                                    "gpugeek_jupyter/lean.py's SLOW_OPTIONAL has nothing left to do")
    assert ours_loaded == "False", ours.stdout
    assert "direct rfc3987_syntax" in ours.stdout and "direct rfc3987_syntax" in plain.stdout
    print(f"import ray: {ours_cpu} CPU-s after gpugeek_jupyter, {plain_cpu} CPU-s without")
