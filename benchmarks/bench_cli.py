"""How fast the ``gpugeek`` terminal command answers: wall time of the installed console script.

    .venv/bin/python benchmarks/bench_cli.py [--runs 30] [--clusters 10]

The registry of ``bench_ticker.py`` (``--clusters`` live clusters, each with a head and two GPU
nodes, events and a minute of telemetry, plus 20 stopped ones) is written to a fresh
``$GPUGEEK_HOME``; then each command runs ``--runs`` times as a new process, the commands
alternated run by run, after two runs each to warm the disk cache. Beside them, a bare
``python -c pass``: what the interpreter itself costs. Goal: ``gpugeek clusters`` < 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ticker import populate  # noqa: E402 - the same registry

GPUGEEK = str(Path(sys.executable).parent / "gpugeek")
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "gpugeek clusters": [GPUGEEK, "clusters"],
    "gpugeek cost": [GPUGEEK, "cost"],
    "gpugeek status c0": [GPUGEEK, "status", "c0"],
    "gpugeek log --since 2h": [GPUGEEK, "log", "--since", "2h"],
}


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--clusters", type=int, default=10)
    args = parser.parse_args()
    os.environ["GPUGEEK_HOME"] = tempfile.mkdtemp(prefix="gpugeek-bench-cli-")
    populate(args.clusters, stopped=20)
    for command in COMMANDS.values():
        for _ in range(2):
            timed(command)
    took: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for r in range(args.runs):
        for name in list(COMMANDS) if r % 2 == 0 else list(COMMANDS)[::-1]:
            took[name].append(timed(COMMANDS[name]))
    print(f"{args.clusters} live clusters + 20 stopped, {args.runs} runs each, load average "
          f"{os.getloadavg()[0]:.2f}")
    for name, values in took.items():
        values.sort()
        print(f"{name:24s} median {statistics.median(values) * 1000:6.0f} ms   "
              f"p90 {values[int(0.9 * (len(values) - 1))] * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
