"""What the kernel's ticks cost a 3-host DDP loop: the loop of ``bench_remote.py``'s part B run
through ``gg.run`` as it is, without the output drains, without the samplers' asks, and as plain
``torch.distributed`` processes — alternated round by round on one ``ssh`` cluster of the lab.

    .venv/bin/python benchmarks/bench_ddp_ticks.py [--rounds 4] [--steps 300] [--quiet 15]

While a cell runs, the kernel keeps one drain out to rank 0, which answers when its cell prints
or ends, else after ``DRAIN_WAIT_S``, and asks the node samplers (at most every
``SAMPLE_EVERY_S``) on the kernel's behalf; each drain is a request through the Ray Client. The
variants switch one of them off: a drain held 30 s (so one a cell), or the samplers not asked.
Needs root, like ``bench_remote.py``.

Steps/s swing by ±15 % round to round on a shared machine, so the ticks' cost is also measured
directly: the CPU time that every process of the three hosts and the kernel spend per second of
a cell that only sleeps (``--quiet`` seconds), each variant in turn, twice, after one cell to warm up.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
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
    parser.add_argument("--quiet", type=float, default=15.0, help="seconds of the sleeping cell (0: skip it)")
    args = parser.parse_args()
    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_ddp_ticks: {reason}")
    os.environ["GPUGEEK_HOME"] = tempfile.mkdtemp(prefix="gpugeek-bench-ticks-")
    lab = netlab.up(3)
    lab.serve_index()
    try:
        import gpugeek_jupyter as gg
        from gpugeek_jupyter.group import workergroup as group

        gg.up("ticks", backend="ssh", hosts=",".join(f"root@{h.address}" for h in lab.hosts),
              ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=1.0, pip_index_url=lab.index_url)
        import ray

        from gpugeek_jupyter.kernel.session import current

        default = group.DRAIN_WAIT_S, group.DRAIN_GAP_S, group.SAMPLE_EVERY_S
        variants = {"as is": default, "held 1 s": (1.0, *default[1:]), "held 2 s": (2.0, *default[1:]),
                    "no drains": (30.0, 30.0, default[2])}
        variants = {k: v for k, v in variants.items() if k == "as is" or v != default}

        def use(values):
            group.DRAIN_WAIT_S, group.DRAIN_GAP_S, group.SAMPLE_EVERY_S = values
            workers = current().group
            ray.get(workers.workers[0].keep_samplers.remote(workers.samplers, values[2]))

        code = LOOP_GG.replace("STEPS", str(args.steps)) + "\nsteps_per_s"
        gg.run(LOOP_GG.replace("STEPS", "20") + "\nsteps_per_s", workers=3, monitor=False)   # warm
        bench_remote.plain_steps_per_s(lab, 20)
        got: dict[str, list[float]] = {name: [] for name in [*variants, "plain"]}
        drains = dict.fromkeys(variants, 0.0)     # drains sent per second of the loop
        for r in range(args.rounds):
            for name in list(got) if r % 2 == 0 else list(got)[::-1]:
                if name == "plain":
                    got[name].append(bench_remote.plain_steps_per_s(lab, args.steps))
                    continue
                use(variants[name])
                before = current().group.drains
                got[name].append(gg.run(code, workers=3, monitor=False).shown())
                drains[name] += (current().group.drains - before) / (args.steps / got[name][-1]) / args.rounds
            use(default)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True)
        quiet = quiet_cpu(lab, variants, use, args.quiet) if args.quiet else {}
        gg.reset()
        gg.down("ticks")
    finally:
        lab.down()
    for name, spent in quiet.items():
        print(f"{name:16s} a sleeping cell: " + ", ".join(f"{total:.0f}" for total in spent["total"])
              + " ms CPU per second; of that " + ", ".join(
                  f"{k} {statistics.median(v):.0f}" for k, v in sorted(spent.items(), key=lambda kv: -max(kv[1]))
                  if k != "total" and max(v) >= 1))
    plain = statistics.median(got["plain"])
    for name in drains:      # the same, round by round: a round's variants ran side by side
        ratios = [v / p for v, p in zip(got[name], got["plain"], strict=True)]
        print(f"{name:16s} per-round ratios {' '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    for name, values in got.items():
        print(f"{name:16s} {statistics.median(values):6.1f} steps/s → {statistics.median(values) / plain:.3f} of plain"
              + (f", {drains[name]:.2f} drains/s" if name in drains else ""))


def quiet_cpu(lab, variants: dict, use, seconds: float) -> dict[str, dict[str, list[float]]]:
    """{variant: {process kind or "total": [ms of CPU per second of a sleeping cell, per round]}}."""
    import gpugeek_jupyter as gg

    gg.run("import time\ntime.sleep(1)", workers=3, monitor=False)       # warm
    spent: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in variants}
    for _ in range(2):
        for name, values in variants.items():
            use(values)
            before, start = _cpu_seconds(lab), time.monotonic()
            gg.run(f"time.sleep({seconds})", workers=3, monitor=False)
            took, after = time.monotonic() - start, _cpu_seconds(lab)
            by_kind = collections.Counter()
            for key, (kind, used) in after.items():
                if key in before:             # processes that lived through the cell
                    by_kind[kind] += used - before[key][1]
            spent[name]["total"].append(sum(by_kind.values()) / took * 1000)
            for kind, used in by_kind.items():
                spent[name][kind].append(used / took * 1000)
    return spent


def _cpu_seconds(lab) -> dict[tuple, tuple[str, float]]:
    """(host, pid) → (kind of process, user + system CPU seconds so far), this process included."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for host, pid in [(h.name, pid) for h in lab.hosts for pid in h.pids()] + [("kernel", os.getpid())]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        kind = ("kernel" if host == "kernel" else "Ray client server" if "client.server" in command
                else "raylet" if "raylet" in command else "gcs" if "gcs_server" in command
                else "Ray workers" if "default_worker" in command or command.startswith("ray::")
                else "Ray's agents" if "agent" in command or "log_monitor" in command else "other")
        found[(host, pid)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return found


if __name__ == "__main__":
    main()
