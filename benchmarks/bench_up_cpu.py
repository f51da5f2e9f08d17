"""What a local cluster costs the machine in CPU, with and without Ray's prestarted idle workers.

    .venv/bin/python benchmarks/bench_up_cpu.py [--rounds 3]

When the first driver joins, a raylet starts one idle worker per CPU for tasks to come (Ray's
default, ``prestart_worker_first_driver``). A cell's ranks never take them: each needs its own
environment, so they boot Ray, idle, and are reaped when the group starts. Our nodes start
without them (``raynodes.NODE_ENV``). Each trial, in a fresh process: ``up``, one 2-worker cell,
``down``; the figure is the whole machine's CPU time over the trial (``/proc/stat``: every
process Ray started counts, whoever's child it is) and its wall time. Trials alternate (Ray's
default, ours, …) so the machine's noise hits both alike; medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile

import bench_cluster  # its trial(): a fresh process, the figures from its last line

TRIAL = """
import json, os, time
from gpugeek_jupyter import raynodes
if "VARIANT" == "rays-default":   # the same dict the backends read: Ray's default again
    raynodes.HEAD_ENV.pop("RAY_prestart_worker_first_driver")
import gpugeek_jupyter as gg
def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
c, t = cpu(), time.perf_counter()
gg.up("bench")
gg.run("x = 1", workers=2, monitor=False)
gg.down("bench")
print(json.dumps({"cpu": cpu() - c, "wall": time.perf_counter() - t}))
"""


def trial(variant: str, home: str) -> dict:
    return bench_cluster.trial(TRIAL.replace("VARIANT", variant), home)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpugeek-bench-")
    runs: dict[str, list[dict]] = {"rays-default": [], "ours": []}
    for _ in range(args.rounds):
        for variant in runs:
            runs[variant].append(trial(variant, home))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("cpu", "wall")} for v, rs in runs.items()}
    for variant, rs in runs.items():
        cpus = ", ".join(f"{r['cpu']:.1f}" for r in rs)
        walls = ", ".join(f"{r['wall']:.1f}" for r in rs)
        print(f"{variant:>13}: machine CPU median {med[variant]['cpu']:.1f} s ({cpus}); "
              f"wall median {med[variant]['wall']:.1f} s ({walls})")
    print(f"ours / Ray's default: CPU {med['ours']['cpu'] / med['rays-default']['cpu']:.2f}×, "
          f"wall {med['ours']['wall'] / med['rays-default']['wall']:.2f}×")


if __name__ == "__main__":
    main()
