"""What the watchdog's idle judgement costs per look while a job runs, with a long window.

    .venv/bin/python benchmarks/bench_idle.py [--nodes 4] [--gpus 8] [--minutes 60]

An hour of readings of 4 nodes × 8 GPUs (one a second per device, as the node samplers write
them: 36 rows a second) is written to a fresh ledger; then each look is timed two ways, side by
side: reading the whole window afresh (what a new ``activity.Readings`` does once) and the
watchdog's kept ``Readings``, which reads only the rows added since its last look (2 s of them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--looks", type=int, default=10)
    args = parser.parse_args()
    os.environ["GPUGEEK_HOME"] = tempfile.mkdtemp(prefix="gpugeek-bench-idle-")
    from gpugeek_jupyter.cluster import registry
    from gpugeek_jupyter.meter import activity, ledger, telemetry

    cluster = registry.create("bench", "local", {}, simulated=False, budget_usd=None,
                              idle_minutes=args.minutes).id
    window = args.minutes * 60
    start = time.time() - window
    ledger.job_started(cluster, "j", "train", at=start)

    def readings(first: int, last: int) -> None:
        for node in range(args.nodes):
            telemetry.record_node_samples(cluster, [
                {"t": start + t, "node_id": f"n{node}", "host": {"cpu_percent": 50.0, "cpus": 64},
                 "gpus": [{"gpu": g, "gpu_util": 80, "gpu_mem_used": 1, "gpu_mem_total": 2, "power_w": 300.0}
                          for g in range(args.gpus)]} for t in range(first, last)])

    second = int(window) - 2 * args.looks
    readings(0, second)
    kept = activity.Readings(cluster)
    activity.judge(cluster, [], None, window, readings=kept)
    afresh, incremental = [], []
    for _ in range(args.looks):
        readings(second, second + 2)             # the 2 s between two looks
        second += 2
        now = time.time()          # one instant for both: the same answer is asked of each
        t = time.perf_counter()
        fresh = activity.judge(cluster, [], None, window, now=now)
        afresh.append(time.perf_counter() - t)
        t = time.perf_counter()
        same = activity.judge(cluster, [], None, window, readings=kept, now=now)
        assert same == fresh, (same, fresh)
        incremental.append(time.perf_counter() - t)
    rows = (args.gpus + 1) * args.nodes * int(window)
    a, k = statistics.median(afresh) * 1000, statistics.median(incremental) * 1000
    print(f"{rows:,} rows of readings ({args.nodes} nodes × {args.gpus} GPUs, {args.minutes:g} min): "
          f"a look reading the window afresh {a:.1f} ms, with the kept readings {k:.2f} ms → {k / a:.4f}")


if __name__ == "__main__":
    main()
