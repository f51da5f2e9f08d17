"""Remote clusters: a cell run from a kernel outside an ``ssh`` cluster, against the local way.

    .venv/bin/python benchmarks/bench_remote.py [--rounds 7] [--cells 100] [--steps 300] [--against REV]

Needs root, ``ip``, ``unshare`` and ``/usr/sbin/sshd`` (it builds the multi-host lab of
``tests/netlab.py``: three "hosts" in network namespaces, each with its own sshd) and takes it all
down at the end, errors included. Each side is a warm process of its own, and the two sides
alternate round by round (the order flipped every round), so the machine's noise hits both alike;
figures are medians of the rounds' medians.

- A: an empty cell, ``gg.run("pass", workers=2)``, on an ``ssh`` cluster of the three hosts (the
     kernel a Ray Client through the cluster's SSH tunnel) against a local cluster
     (``gg.up(backend="local")``, the kernel a Ray driver); and one bare Ray Client round trip on the
     ssh cluster — ``ray.get(actor.nop.remote())`` with an actor whose method does nothing — which
     the remote cell is held against. The Ray Client requests of one cell are counted too.
     ``--against REV`` adds a third side: the local empty cell with the package of git revision
     REV (``git archive``d to a temporary folder put first on the path of that side and its workers).
- C: rank 0's hop to a rank on another host and back, the two ways it can go: a Ray actor call,
     and the cell line (``workers/line.py``), timed call by call inside one actor, interleaved.
- B: steps/s of the DDP loop of ``bench_run.py``'s P2 (MLP 256→1024→256, batch 64) across the three
     hosts, through ``gg.run(..., workers=3)`` on the ssh cluster, against the same loop in plain
     ``torch.distributed`` processes started on the same hosts (``ip netns exec``; gloo on
     ``eth0``, one thread each, as a 1-CPU Ray worker has).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_run import LOOP, LOOP_GG  # noqa: E402 - the same loop as P2

REPLY = "@@bench@@ "          # marks a side's answer among whatever else it prints
REMOTE, LOCAL, BEFORE = "bench-remote", "bench-local", "bench-before"
SIDE_TIMEOUT_S = 900          # the longest a side may take to answer (starting a cluster)

PLAIN = """
import json, os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
torch.set_num_threads(1)
rank, world, master, port, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=120))
ns = {"STEPS": steps}
exec(LOOP, ns)
if rank == 0:
    print(json.dumps({"steps_per_s": ns["steps_per_s"]}), flush=True)
dist.destroy_process_group()
"""


# -- a side: one warm process driving one cluster ------------------------------------------------

def side(kind: str) -> None:
    """Answer the orchestrator's requests (one JSON line each) until told to quit."""
    import gpugeek_jupyter as gg

    spec = json.loads(sys.stdin.readline())
    name = spec["name"]
    if kind == "remote":
        gg.up(name, backend="ssh", hosts=spec["hosts"], ssh_key=spec["key"], cpus_per_host=1,
              usd_per_hour=1.0)
    else:
        gg.up(name, backend="local")
    answer({"ready": True})
    nop = None
    for line in sys.stdin:
        ask = json.loads(line)
        op = ask["op"]
        if op == "quit":
            break
        if op == "cells":
            answer({"s": [timed(empty_cell(gg, ask["workers"])) for _ in range(ask["n"])]})
        elif op == "rtt":
            import ray

            if nop is None:
                nop = ray.remote(num_cpus=0)(Nop).remote()
                ray.get(nop.nop.remote())
            answer({"s": [timed(round_trip(ray, nop)) for _ in range(ask["n"])]})
        elif op == "hop":
            answer(hop(ask["n"]))
        elif op == "requests":
            answer(count_requests(empty_cell(gg, ask["workers"]), ask["n"]))
        elif op == "where":       # which package the kernel and a worker load
            answer({"kernel": gg.__file__,
                    "worker": gg.run("__import__('gpugeek_jupyter').__file__", workers=ask["workers"],
                                     monitor=False).shown()})
        elif op == "loop":
            code = LOOP_GG.replace("STEPS", str(ask["steps"])) + "\nsteps_per_s"
            answer({"steps_per_s": gg.run(code, workers=ask["workers"], monitor=False).shown()})
    gg.reset()
    gg.down(name)
    answer({"down": True})


class Nop:
    def nop(self):
        return None


class Near:
    """Plays rank 0: holds the cell line's end, and times both ways of reaching ``Far``."""

    def open(self):
        import ray

        from gpugeek_jupyter.workers import line

        self.board = line.Switchboard(ray.util.get_node_ip_address())
        return self.board.address, self.board.key

    def time(self, far, n: int) -> dict:
        import ray

        assert not self.board.accept({1}), "no cell line"
        call = pickle.dumps(("pass", "<cell 1>", [], False, None, 1))
        by_actor, by_line = [], []
        for i in range(n):
            by_actor.append(timed(lambda: ray.get(far.answer.remote(call))))
            by_line.append(timed(lambda i=i: (self.board.send(1, i, call, None), self.board.receive({1}, i, None))))
        self.board.close()
        return {"actor": by_actor, "line": by_line}


class Far:
    """Plays another rank, on another host: answers at once, by actor call or by the line."""

    def serve(self, address, key) -> None:
        from gpugeek_jupyter.workers import line

        line.serve(tuple(address), key, 1, lambda call, pushed: self.answer(call))

    def answer(self, call: bytes) -> dict:
        return {"ok": True, "output": "", "samples": []}


def hop(n: int) -> dict:
    """Rank 0's hop to a rank on another host, both ways it can go: a Ray actor call, the line."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])

    def on(node):
        return NodeAffinitySchedulingStrategy(node, soft=False)

    near = ray.remote(num_cpus=0)(Near).options(scheduling_strategy=on(nodes[0])).remote()
    far = ray.remote(num_cpus=0)(Far).options(scheduling_strategy=on(nodes[1]), max_concurrency=2).remote()
    address, key = ray.get(near.open.remote())
    ray.get(far.serve.remote(address, key))
    timings = ray.get(near.time.remote(far, n))
    for actor in (near, far):
        ray.kill(actor)
    return timings


def empty_cell(gg, workers: int):
    return lambda: gg.run("pass", workers=workers, monitor=False)


def round_trip(ray, actor):
    return lambda: ray.get(actor.nop.remote())


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def answer(data: dict) -> None:
    print(REPLY + json.dumps(data), flush=True)


def count_requests(call, n: int) -> dict:
    """What one call sends over the Ray Client connection: requests per kind, averaged over ``n``
    calls. Blocking ones (a get, a wait) each cost a round trip; a Schedule returns at once, but
    its result's id arrives one round trip later (every Schedule of a cell in that same trip)."""
    from ray.util.client import dataclient, worker

    counts: dict[str, int] = {}
    patched = []

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[label] = counts.get(label, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, name, counted)
        patched.append((owner, name, original))

    wrap(dataclient.DataClient, "Schedule", "Schedule")
    wrap(dataclient.DataClient, "PutObject", "PutObject")
    wrap(worker.Worker, "_get", "GetObject")
    wrap(worker.Worker, "wait", "WaitObject")
    try:
        for _ in range(n):
            call()
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
    return {k: v / n for k, v in sorted(counts.items())}


class Side:
    """The orchestrator's handle on a side process."""

    def __init__(self, kind: str, spec: dict, log: Path, package_from: str | None = None):
        self.kind = kind
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if package_from:          # an earlier revision's package first on the path (its workers too)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_from, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, __file__, "--side", kind], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
                                     env=env, cwd=package_from)   # a driver's folder leads its workers' path
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()

    def _read_lines(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float = SIDE_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"the {self.kind} side did not answer within {timeout:.0f} s; "
                                   f"see {self.log.name}") from None
            if line is None:
                raise RuntimeError(f"the {self.kind} side ended (exit {self.proc.wait()}); see {self.log.name}")
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
            self.log.write(line)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        """Quit (its cluster goes down with it); kill it if it does not."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.read(timeout=180)
                self.proc.wait(timeout=60)
            except Exception:  # noqa: BLE001 - it is killed below
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def down_leftover_clusters() -> None:
    """A side that failed may have left its cluster up (tunnel, watchdog, Ray): stop it here."""
    import gpugeek_jupyter as gg
    from gpugeek_jupyter.cluster import registry

    for name in (REMOTE, LOCAL, BEFORE):
        if registry.live(name) is not None:
            try:
                gg.down(name)
            except Exception as exc:  # noqa: BLE001 - say it, and go on taking the rest down
                print(f"could not stop {name}: {type(exc).__name__}: {exc}", flush=True)


# -- the plain torch.distributed side ---------------------------------------------------------------

def plain_steps_per_s(lab, steps: int) -> float:
    """The loop on the lab's hosts, one rank per host, started in each host's network namespace."""
    master = lab.hosts[0].address
    port = random.randint(29000, 29900)        # Ray's own ports on the head are below 20000
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    code = f"LOOP = {LOOP!r}\n" + PLAIN
    procs = [subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-c", code, str(rank),
                               str(len(lab.hosts)), master, str(port), str(steps)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank, host in enumerate(lab.hosts)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("plain torch.distributed failed: " + " | ".join(e[-500:] for _, e in outs))
    return json.loads(outs[0][0].strip().splitlines()[-1])["steps_per_s"]


# -- the run ----------------------------------------------------------------------------------------

def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def listed(values, scale: float = 1.0) -> str:
    return ", ".join(f"{v * scale:.2f}" for v in values)


def ms(values) -> str:
    return f"{med(values) * 1000:.2f} ms"


def export(rev: str) -> str:
    """The package as it was at ``rev`` (``git archive``: the working tree is left alone)."""
    folder = tempfile.mkdtemp(prefix="gpugeek-bench-before-")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpugeek_jupyter"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cells", type=int, default=100, help="empty cells per side per round")
    parser.add_argument("--steps", type=int, default=300, help="DDP steps per loop")
    parser.add_argument("--against", metavar="REV",
                        help="also time the local empty cell with the package of git revision REV")
    parser.add_argument("--side", choices=("local", "remote"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side(args.side)

    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_remote: {reason}")
    home = tempfile.mkdtemp(prefix="gpugeek-bench-remote-")
    os.environ["GPUGEEK_HOME"] = home
    logs = Path(home)
    before_tree = export(args.against) if args.against else None
    print(f"load average before: {os.getloadavg()[0]:.2f} (logs in {home})", flush=True)
    lab = netlab.up(3)
    sides: dict[str, Side] = {}
    try:
        spec = {"hosts": ",".join(f"root@{h.address}" for h in lab.hosts), "key": str(lab.key)}
        began = time.monotonic()
        sides["remote"] = Side("remote", {**spec, "name": REMOTE}, logs / "remote.log")
        sides["remote"].read()
        print(f"ssh cluster on 3 lab hosts up in {time.monotonic() - began:.1f} s", flush=True)
        sides["local"] = Side("local", {**spec, "name": LOCAL}, logs / "local.log")
        sides["local"].read()
        if before_tree:
            sides["before"] = Side("local", {**spec, "name": BEFORE}, logs / "before.log", package_from=before_tree)
            sides["before"].read()
        remote = sides["remote"]

        # A: empty cells, alternated; the bare client round trip next to the remote cells
        for name, s in sides.items():
            s.ask(op="cells", n=20, workers=2)            # builds the group, warms up
            where = s.ask(op="where", workers=2)
            print(f"{name}: kernel and worker load {where['kernel']} / {where['worker']}", flush=True)
        remote.ask(op="rtt", n=20)
        requests = remote.ask(op="requests", n=20, workers=2)
        rounds = []
        for r in range(args.rounds):
            got = {}
            names = list(sides)
            for which in names if r % 2 == 0 else names[::-1]:
                got[which] = med(sides[which].ask(op="cells", n=args.cells, workers=2)["s"])
                if which == "remote":
                    got["rtt"] = med(remote.ask(op="rtt", n=args.cells)["s"])
            rounds.append(got)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in got.items()), flush=True)
        for name in ("local", "before"):
            if name in sides:
                sides.pop(name).stop()

        # C: rank 0's hop to another host, interleaved call by call
        hops = [remote.ask(op="hop", n=args.cells * 2) for _ in range(3)]

        # B: the DDP loop across the three hosts, alternated. First one untimed round of both at
        # full length: the 3-worker group is new, and the sides just stopped are still exiting
        # (the first timed round, ours first, measured 0.83 and 0.86 of plain without it)
        remote.ask(op="loop", steps=args.steps, workers=3)
        plain_steps_per_s(lab, args.steps)
        ours, plain, cells3, rtt3 = [], [], [], []
        for r in range(args.rounds):
            if r % 2 == 0:
                ours.append(remote.ask(op="loop", steps=args.steps, workers=3)["steps_per_s"])
                plain.append(plain_steps_per_s(lab, args.steps))
            else:
                plain.append(plain_steps_per_s(lab, args.steps))
                ours.append(remote.ask(op="loop", steps=args.steps, workers=3)["steps_per_s"])
            cells3.append(med(remote.ask(op="cells", n=args.cells // 2, workers=3)["s"]))
            rtt3.append(med(remote.ask(op="rtt", n=args.cells // 2)["s"]))
            print(f"round {r + 1}: DDP steps/s through gg.run {ours[-1]:.1f}, plain {plain[-1]:.1f}", flush=True)
        requests3 = remote.ask(op="requests", n=20, workers=3)
    finally:
        for s in sides.values():
            s.stop()
        down_leftover_clusters()
        lab.down()
        if before_tree:
            shutil.rmtree(before_tree, ignore_errors=True)
        left = lab.leftovers()
        if left:
            print(f"left over from the lab: {', '.join(left)}", flush=True)

    def column(key):
        return [g[key] for g in rounds]

    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {args.rounds} rounds × {args.cells} cells per side")
    print(f"A  empty cell, workers=2: remote (Ray Client through the SSH tunnel) {ms(column('remote'))}, "
          f"local {ms(column('local'))} → remote/local {med([g['remote'] / g['local'] for g in rounds]):.2f}×")
    print(f"   bare Ray Client round trip (actor method that does nothing) {ms(column('rtt'))}; remote cell − "
          f"round trip {med([g['remote'] - g['rtt'] for g in rounds]) * 1000:.2f} ms (goal ≤ 3 ms); local cell "
          f"{ms(column('local'))} (goal ≤ 3 ms)")
    if "before" in rounds[0]:
        print(f"   local empty cell with the package of {args.against}: {ms(column('before'))} → now/before "
              f"{med([g['local'] / g['before'] for g in rounds]):.2f}")
    for key in rounds[0]:
        print(f"   per round, {key} (ms): {listed(column(key), 1000)}")
    print(f"   Ray Client requests per remote empty cell: {json.dumps(requests)} (workers=2), "
          f"{json.dumps(requests3)} (workers=3)")
    print(f"   workers=3: remote empty cell {ms(cells3)}, round trip {ms(rtt3)}, cell − round trip "
          f"{med([c - t for c, t in zip(cells3, rtt3, strict=True)]) * 1000:.2f} ms")
    actor, by_line = [med(h["actor"]) for h in hops], [med(h["line"]) for h in hops]
    print(f"C  rank 0 → a rank on another host and back, {args.cells * 2} × 3 interleaved: Ray actor call "
          f"{ms(actor)} ({listed(actor, 1000)}), cell line {med(by_line) * 1000:.3f} ms "
          f"({', '.join(f'{v * 1000:.3f}' for v in by_line)}) → line/actor {med(by_line) / med(actor):.3f}")
    print(f"B  3-host DDP steps/s ({args.steps} steps, MLP 256→1024→256, batch 64): gg.run {med(ours):.1f} "
          f"({listed(ours)}) vs plain torch.distributed {med(plain):.1f} ({listed(plain)}) "
          f"→ {med(ours) / med(plain):.3f} (goal ≥ 0.95); "
          f"per-round ratios median {med([o / p for o, p in zip(ours, plain, strict=True)]):.3f}")


if __name__ == "__main__":
    main()
