"""What the kernel's ticks cost a 3-host DDP loop: the loop of ``bench_remote.py``'s part B run
through ``gg.run`` as it is, without the output drains, without the samplers' asks, and as plain
``torch.distributed`` processes — alternated round by round on one ``ssh`` cluster of the lab.

    .venv/bin/python benchmarks/bench_ddp_ticks.py [--rounds 4] [--steps 300]

While a cell runs, the kernel asks rank 0 for the ranks' output (every 0.05 s, backing off to
``DRAIN_EVERY_S[1]``) and the node samplers for their reports (every ``SAMPLE_EVERY_S``); each is a
request through the Ray Client. The variants switch one of them off by setting the group's
constants in this process (a drain every 30 s; no ask). Needs root, like ``bench_remote.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

import bench_remote  # noqa: E402
from bench_run import LOOP_GG  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_ddp_ticks: {reason}")
    os.environ["GPUGEEK_HOME"] = tempfile.mkdtemp(prefix="gpugeek-bench-ticks-")
    lab = netlab.up(3)
    try:
        import gpugeek_jupyter as gg
        from gpugeek_jupyter.workers import group

        gg.up("ticks", backend="ssh", hosts=",".join(f"root@{h.address}" for h in lab.hosts),
              ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=1.0)
        default = group.DRAIN_EVERY_S, group.SAMPLE_EVERY_S
        variants = {"as is": default, "no drains": ((30.0, 30.0), default[1]),
                    "no sampler asks": (default[0], 3600.0)}
        code = LOOP_GG.replace("STEPS", str(args.steps)) + "\nsteps_per_s"
        gg.run(LOOP_GG.replace("STEPS", "20") + "\nsteps_per_s", workers=3, monitor=False)   # warm
        bench_remote.plain_steps_per_s(lab, 20)
        got: dict[str, list[float]] = {name: [] for name in [*variants, "plain"]}
        for r in range(args.rounds):
            for name in list(got) if r % 2 == 0 else list(got)[::-1]:
                if name == "plain":
                    got[name].append(bench_remote.plain_steps_per_s(lab, args.steps))
                    continue
                group.DRAIN_EVERY_S, group.SAMPLE_EVERY_S = variants[name]
                got[name].append(gg.run(code, workers=3, monitor=False).shown())
            group.DRAIN_EVERY_S, group.SAMPLE_EVERY_S = default
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True)
        gg.reset()
        gg.down("ticks")
    finally:
        lab.down()
    plain = statistics.median(got["plain"])
    for name, values in got.items():
        print(f"{name:16s} {statistics.median(values):6.1f} steps/s → {statistics.median(values) / plain:.3f} of plain")


if __name__ == "__main__":
    main()
