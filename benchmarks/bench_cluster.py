"""How fast a cluster is ready: local `up` against a bare `ray.init()`, and sim scale-up.

    .venv/bin/python benchmarks/bench_cluster.py [--rounds 3]

Each trial runs in a fresh Python process that has already imported ray (a notebook has too by
the second cell), so both sides pay for starting Ray's processes and connecting, nothing else:

- bare:  `ray.init()`  (Ray starts a head owned by this process; it dies with the process)
- local: `gpugeek_jupyter.up()` → ready (a head in its own session that outlives the kernel,
         registered, watched, and this process connected as a driver)

Trials alternate (bare, local, bare, local, …) so machine noise hits both alike; the figure is
the ratio of medians (goal ≤ 1.3×). Then the simulated cluster: `up --backend sim` with one
A100×8 worker node, and `scale 2` → the second node joined (Ray's fake multi-node autoscaler).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

GOAL_RATIO = 1.3

BARE = """
import json, time, ray
t = time.perf_counter()
ray.init(logging_level="ERROR")
ready = time.perf_counter() - t
ray.shutdown()
print(json.dumps({"ready": ready}))
"""

LOCAL = """
import json, time, ray
import gpugeek_jupyter as gg
t = time.perf_counter()
gg.up("bench")
ready = time.perf_counter() - t
t = time.perf_counter()
gg.down("bench")
print(json.dumps({"ready": ready, "down": time.perf_counter() - t}))
"""

SIM = """
import json, time, ray
import gpugeek_jupyter as gg
t = time.perf_counter()
gg.up("benchsim", backend="sim", gpu="A100", count=8, workers=1)
ready = time.perf_counter() - t
def workers():
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU"))
t = time.perf_counter()
gg.scale(2)
while workers() < 2:
    time.sleep(0.05)
scale = time.perf_counter() - t
gg.down("benchsim")
print(json.dumps({"ready": ready, "scale_up": scale}))
"""


def trial(code: str, home: str) -> dict:
    env = {**os.environ, "GPUGEEK_HOME": home}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"trial failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpugeek-bench-")
    bare, local, down = [], [], []
    for _ in range(args.rounds):
        bare.append(trial(BARE, home)["ready"])
        result = trial(LOCAL, home)
        local.append(result["ready"])
        down.append(result["down"])
    sims = [trial(SIM, home) for _ in range(args.rounds)]
    b, l_ = statistics.median(bare), statistics.median(local)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}")
    print(f"bare ray.init():        median {b:.2f} s  ({', '.join(f'{x:.2f}' for x in bare)})")
    print(f"local up → ready:       median {l_:.2f} s  ({', '.join(f'{x:.2f}' for x in local)})")
    print(f"ratio local / bare:     {l_ / b:.2f}×  (goal ≤ {GOAL_RATIO}×)")
    print(f"local down:             median {statistics.median(down):.2f} s")
    print(f"sim up (1 A100×8 node): median {statistics.median(s['ready'] for s in sims):.2f} s")
    print(f"sim scale 1 → 2 nodes:  median {statistics.median(s['scale_up'] for s in sims):.2f} s")


if __name__ == "__main__":
    main()
