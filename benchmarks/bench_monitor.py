"""What the live job monitor costs training: steps/s with and without it, side by side.

    .venv/bin/python benchmarks/bench_monitor.py [--rounds 5] [--steps 1500]

A real Jupyter kernel (so the monitor is really built and its updates really go out on the
kernel's iopub channel, which this script reads like a front end would) runs ``%%gpugeek run
--workers 2`` on a local cluster: the P5 loop of bench_run.py (``gg.steps`` + ``gg.log`` every
step), alternately with the monitor and with ``--no-monitor``. Each cell times its own loop on
rank 0. Goal: with the monitor ≥ 99 % of the steps/s without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

sys.path.insert(0, str(Path(__file__).parent))
from bench_run import LOGGED, LOOP


def execute(client, code: str, timeout: float = 600) -> tuple[str | None, int]:
    """Run ``code``; returns its result's text and how many display messages the cell sent."""
    msg_id = client.execute(code)
    result, displays = None, 0
    deadline = time.monotonic() + timeout
    while True:
        msg = client.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        if kind == "execute_result":
            result = content["data"].get("text/plain")
        if kind in ("display_data", "update_display_data", "comm_msg", "comm_open"):
            displays += 1
        if kind == "status" and content["execution_state"] == "idle":
            return result, displays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpugeek-bench-monitor-")
    os.environ["GPUGEEK_HOME"] = home
    manager, client = start_new_kernel(kernel_name="python3", env={**os.environ, "GPUGEEK_HOME": home})
    try:
        execute(client, "%load_ext gpugeek_jupyter\n%gpugeek up bench-monitor")
        execute(client, "%%gpugeek run --workers 2 --no-monitor\n" + LOOP.replace("STEPS", str(args.steps)))
        cell = LOGGED.replace("STEPS", str(args.steps)) + "\nsteps_per_s"
        watched, unwatched, messages = [], [], []
        for _ in range(args.rounds):
            value, _ = execute(client, "%%gpugeek run --workers 2 --no-monitor\n" + cell)
            unwatched.append(float(value))
            value, sent = execute(client, "%%gpugeek run --workers 2\n" + cell)
            watched.append(float(value))
            messages.append(sent)
        execute(client, "%gpugeek reset\n%gpugeek down bench-monitor")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    with_monitor, without = statistics.median(watched), statistics.median(unwatched)
    print(f"cpus: {os.cpu_count()}, 2 workers (gloo, CPU), {args.steps} steps per cell, "
          f"{args.rounds} rounds alternated")
    print(f"with monitor: {', '.join(f'{v:.1f}' for v in watched)} steps/s; "
          f"messages per monitored cell: {messages}")
    print(f"without:      {', '.join(f'{v:.1f}' for v in unwatched)} steps/s")
    print(f"median {with_monitor:.1f} vs {without:.1f} steps/s → ratio {with_monitor / without:.3f} (goal ≥ 0.99)")


if __name__ == "__main__":
    main()
