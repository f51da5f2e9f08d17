"""How fast `%%gpugeek run` is, against the other ways of running the same DDP loop.

    .venv/bin/python benchmarks/bench_run.py [--quick]

All on CPU with 2 workers (gloo), side by side in one run:

- P1: a trivial 20-step DDP cell on the warm group vs `TorchTrainer(...).fit()` of the same loop
      (Ray Train builds a new worker group per fit). Median wall time per cell.
- P2: steps/s of a DDP training loop inside `%%gpugeek run` (through `gg.prepare`/`gg.backward`)
      vs the same loop in plain `torch.distributed` processes (`torch.multiprocessing.spawn`, one
      thread each, as a 1-CPU Ray worker has), timed inside the loop.
- P3: cold start — `up` + the first cell (fresh process) vs bare `ray.init()` + two actors that
      initialise a process group and run the same cell.
- P5: the cost of reporting: the P2 loop with `gg.steps` + `gg.log(loss=…)` every step vs the same
      loop with neither, on the same warm group, alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STEPS20 = """
import torch
if "ddp20" not in globals():
    layer = torch.nn.Linear(8, 1)
    ddp20, opt20 = gg.prepare(layer, torch.optim.SGD(layer.parameters(), lr=0.01))
for _ in range(20):
    gg.backward(ddp20(torch.randn(16, 8)).pow(2).mean())
"""

LOOP = """
import time, torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
net = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
batches = [torch.randn(64, 256) for _ in range(STEPS)]
t0 = time.perf_counter()
for x in batches:
    loss = net(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
steps_per_s = STEPS / (time.perf_counter() - t0)
"""

# the same loop through gg: prepare (DDP), backward (step, zero_grad)
LOOP_GG = LOOP.replace(
    "net = torch.nn.parallel.DistributedDataParallel(net)\nopt = torch.optim.SGD(net.parameters(), lr=0.01)",
    "net, opt = gg.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))",
).replace("    loss.backward()\n    opt.step()\n    opt.zero_grad()", "    gg.backward(loss)")

LOGGED = """
t0 = time.perf_counter()
for x in gg.steps(batches):
    loss = net(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    gg.log(loss=loss.item())
steps_per_s = STEPS / (time.perf_counter() - t0)
"""

# the P5 baseline: LOGGED without gg.steps/gg.log (the loss is still read, as logging does)
PLAIN = LOGGED.replace("gg.steps(batches)", "batches").replace("gg.log(loss=loss.item())", "loss.item()")


def _spawned(rank: int, world: int, port: int, steps: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)   # as in a Ray worker with one CPU: same threads on both sides
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ns = {"STEPS": steps}
    exec(LOOP, ns)
    if rank == 0:
        out.put(ns["steps_per_s"])
    dist.destroy_process_group()


def plain_torch_distributed(steps: int) -> float:
    import torch.multiprocessing as mp

    from gpugeek_jupyter.ports import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(2, free_port(), steps, queue), nprocs=2, join=True, start_method="spawn")
    return queue.get()


def torch_trainer_seconds(storage: str) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def loop():
        import ray.train.torch as rt
        import torch

        model = rt.prepare_model(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(20):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

    start = time.perf_counter()
    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=storage)).fit()
    return time.perf_counter() - start


COLD_OURS = """
import json, time
t = time.perf_counter()
import gpugeek_jupyter as gg
gg.up("cold")
gg.run("x = rank", workers=2)
took = time.perf_counter() - t
gg.reset(); gg.down("cold")
print(json.dumps({"s": took}))
"""

COLD_BARE = """
import json, time
t = time.perf_counter()
import ray, socket
ray.init(logging_level="ERROR")

@ray.remote(num_cpus=1)
class W:
    def addr(self):
        s = socket.socket(); s.bind(("", 0)); p = s.getsockname()[1]; s.close()
        return ray.util.get_node_ip_address(), p
    def setup(self, rank, master, port):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2)
    def run(self, code, rank):
        ns = {"rank": rank}
        exec(code, ns)

ws = [W.remote() for _ in range(2)]
master, port = ray.get(ws[0].addr.remote())
ray.get([w.setup.remote(i, master, port) for i, w in enumerate(ws)])
ray.get([w.run.remote("x = rank", i) for i, w in enumerate(ws)])
took = time.perf_counter() - t
ray.shutdown()
print(json.dumps({"s": took}))
"""


def cold(code: str, home: str) -> float:
    env = {**os.environ, "GPUGEEK_HOME": home}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--parts", default="p1,p2,p3,p5", help="which comparisons to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    reps = 2 if args.quick else 3
    home = tempfile.mkdtemp(prefix="gpugeek-bench-")
    os.environ["GPUGEEK_HOME"] = home

    # P3 first, each side in fresh processes, alternated
    ours, bare = [], []
    for _ in range(reps if "p3" in parts else 0):
        bare.append(cold(COLD_BARE, home))
        ours.append(cold(COLD_OURS, home))

    import ray

    import gpugeek_jupyter as gg

    gg.up("bench")
    # P1
    gg.run(STEPS20, workers=2)
    warm, trainer = [], []
    for _ in range(30 if "p1" in parts else 0):
        t = time.perf_counter()
        gg.run(STEPS20, workers=2)
        warm.append(time.perf_counter() - t)
    gg.reset()                 # Ray Train needs the CPUs our warm group holds
    if "p1" in parts:
        trainer = [torch_trainer_seconds(tempfile.mkdtemp(prefix="gpugeek-train-")) for _ in range(reps)]

    # P2 and P5: alternate so noise hits both alike
    steps = 300
    via_run, via_plain, logged, unlogged = [], [], [], []
    for _ in range(reps if "p2" in parts else 0):
        via_run.append(gg.run(LOOP_GG.replace("STEPS", str(steps)) + "\nsteps_per_s", workers=2).shown())
        via_plain.append(plain_torch_distributed(steps))
    if "p5" in parts:           # the loops below reuse its net, opt and batches
        gg.run(LOOP.replace("STEPS", str(steps)), workers=2)
    for _ in range(reps + 2 if "p5" in parts else 0):
        unlogged.append(gg.run(PLAIN.replace("STEPS", str(steps)) + "\nsteps_per_s", workers=2).shown())
        logged.append(gg.run(LOGGED.replace("STEPS", str(steps)) + "\nsteps_per_s", workers=2).shown())
    gg.reset()
    gg.down("bench")
    ray.shutdown()

    def med(values):
        return statistics.median(values) if values else float("nan")

    print(f"cpus: {os.cpu_count()}, 2 workers, gloo")
    if warm:
        print(f"P1 warm 20-step DDP cell: median {med(warm) * 1000:.1f} ms (p90 "
              f"{sorted(warm)[int(0.9 * len(warm))] * 1000:.1f} ms); TorchTrainer.fit median {med(trainer):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in trainer)}); ratio {med(trainer) / med(warm):.0f}×")
    print(f"P2 steps/s: run {med(via_run):.1f} vs plain torch.distributed {med(via_plain):.1f} "
          f"→ {med(via_run) / med(via_plain):.3f}")
    print(f"P3 cold: up + first cell {med(ours):.2f} s vs bare ray.init + 2 actors + process group "
          f"{med(bare):.2f} s → {med(ours) / med(bare):.2f}×  ({ours} vs {bare})")
    print(f"P5 reporting: steps/s with gg.steps + gg.log {med(logged):.1f} vs without {med(unlogged):.1f} "
          f"→ cost {100 * (1 - med(logged) / med(unlogged)):.2f} %")


if __name__ == "__main__":
    main()
