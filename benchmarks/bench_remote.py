"""Remote clusters: a cell run from a kernel outside an ``ssh`` cluster, against the local way.

    .venv/bin/python benchmarks/bench_remote.py [--rounds 7] [--cells 100] [--steps 300] [--against REV]
                                                [--parts ABC] [--ddp-hosts 3[,2]]
    .venv/bin/python benchmarks/bench_remote.py --parts L --against REV    # no lab, no root needed

Needs root, ``ip``, ``unshare`` and ``/usr/sbin/sshd`` (it builds the multi-host lab of
``tests/netlab.py``: three "hosts" in network namespaces, each with its own sshd) and takes it all
down at the end, errors included. Each side is a warm process of its own, and the two sides
alternate round by round (the order flipped every round), so the machine's noise hits both alike;
figures are medians of the rounds' medians.

- A: an empty cell, ``gg.run("pass", workers=2)``, on an ``ssh`` cluster of the three hosts (the
     kernel on the line to the head's keeper through the cluster's SSH tunnel — a Ray Client with
     a tree from before the line, whose round trip below is then a Ray Client's; with the line,
     one message to the keeper and back; ``bench_line.py`` holds the two ways side by side)
     against a local cluster
     (``gg.up(backend="local")``, the kernel a Ray driver); and one bare Ray Client round trip on the
     ssh cluster — ``ray.get(actor.nop.remote())`` with an actor whose method does nothing — which
     the remote cell is held against. The Ray Client requests of one cell are counted too.
     ``--against REV`` adds a third side: the local empty cell with the package of git revision
     REV (``git archive``d to a temporary folder put first on the path of that side and its workers),
     and with it bench_run's P1 (the warm 20-step DDP cell) on both local sides.
- L: the local empty cell and P1 alone on the machine — no lab, no remote side: the package of
     this tree against that of ``--against REV`` (needed), two local clusters side by side, as
     A's third side is but without the three hosts' Ray processes sharing the two cores.
- C: rank 0's hop to a rank on another host and back, the two ways it can go: a Ray actor call,
     and the cell line (``workers/line.py``), timed call by call inside one actor, interleaved.
- B: steps/s of the DDP loop of ``bench_run.py``'s P2 (MLP 256→1024→256, batch 64) across the three
     hosts, through ``gg.run(..., workers=3)`` on the ssh cluster, against the same loop in plain
     ``torch.distributed`` processes started on the same hosts (``ip netns exec``; gloo on
     ``eth0``, one thread each, as a 1-CPU Ray worker has). With each side's steps/s goes the CPU
     time a step costs a rank's process (all its threads: the loop's, gloo's, Ray's), the most of
     any rank. ``--ddp-hosts 3,2`` runs it again on two hosts: three ranks share this machine's two
     cores, two ranks have a core each.
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

from bench_run import LOOP, LOOP_GG, STEPS20  # noqa: E402 - the same loop as P2, the same cell as P1

REPLY = "@@bench@@ "          # marks a side's answer among whatever else it prints
REMOTE, LOCAL, BEFORE = "bench-remote", "bench-local", "bench-before"
SIDE_TIMEOUT_S = 900          # the longest a side may take to answer (starting a cluster)

# B's loop on either side: its steps/s, and the CPU a step costs a rank's process (all its threads),
# the most of any rank (read after the timed loop, so it costs the loop nothing)
def costed(loop: str) -> str:
    timed = loop.replace("t0 = time.perf_counter()", "cpu0 = time.process_time()\nt0 = time.perf_counter()")
    assert timed != loop
    return timed + (
        "cpu = torch.tensor([(time.process_time() - cpu0) / STEPS * 1e3])\n"
        "torch.distributed.all_reduce(cpu, op=torch.distributed.ReduceOp.MAX)\n"
        "result = {'steps_per_s': steps_per_s, 'cpu_ms_per_step': cpu.item()}\n")


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
    print(json.dumps(ns["result"]), flush=True)
dist.destroy_process_group()
"""


# -- a side: one warm process driving one cluster ------------------------------------------------

def side(kind: str) -> None:
    """Answer the orchestrator's requests (one JSON line each) until told to quit."""
    import gpugeek_jupyter as gg

    spec = json.loads(sys.stdin.readline())
    name = spec["name"]
    bring_up(gg, kind, spec)
    answer({"ready": True})
    nop = None
    for line in sys.stdin:
        ask = json.loads(line)
        op = ask["op"]
        if op == "quit":
            break
        if op == "cells":
            answer({"s": [timed(empty_cell(gg, ask["workers"])) for _ in range(ask["n"])]})
        elif op == "p1":          # bench_run's P1: the warm 20-step DDP cell
            answer({"s": [timed(lambda: gg.run(STEPS20, workers=2, monitor=False)) for _ in range(ask["n"])]})
        elif op == "rtt" and getattr(current_session(), "line", None) is not None:
            from gpugeek_jupyter.line import messages as m  # this tree: the keeper's line, one message

            answer({"s": [timed(lambda: current_session().line.call(m.Ship(), 10)) for _ in range(ask["n"])]})
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
            code = costed(LOOP_GG).replace("STEPS", str(ask["steps"])) + "\nresult"
            answer(gg.run(code, workers=ask["workers"], monitor=False).shown())
        elif op == "again":       # down, up again, and when the first cell began on the workers
            gg.reset()
            gg.down(name)
            began = time.time()
            warm = bring_up(gg, kind, spec, workers=ask["workers"])
            returned = time.time()
            started = gg.run("import time\nstarted = time.time()", workers=ask["workers"], pull=["started"],
                             monitor=False).pulled["started"]
            answer({"up": returned - began, "first": started - returned, "warm": warm})
    gg.reset()
    gg.down(name)
    answer({"down": True})


def bring_up(gg, kind: str, spec: dict, workers: int | None = None) -> bool:
    """The side's cluster; with ``workers``, its group started while ``up`` returns where the
    package can (``up --workers`` on your own hosts): whether it could."""
    if kind != "remote":
        gg.up(spec["name"], backend="local")
        return False
    flags = {"backend": "ssh", "hosts": spec["hosts"], "ssh_key": spec["key"], "cpus_per_host": 1,
             "usd_per_hour": 1.0, "pip_index_url": spec["index"]}
    if workers:
        try:
            gg.up(spec["name"], **flags, workers=workers)
            return True
        except gg.GpugeekError as exc:          # a package from before the warm start
            if "--workers" not in str(exc):
                raise
    gg.up(spec["name"], **flags)
    return False


def current_session():
    from gpugeek_jupyter.kernel.session import current

    return current()


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
    return plain_loop(lab.hosts, steps)["steps_per_s"]


def plain_loop(hosts, steps: int) -> dict:
    """``plain_steps_per_s`` on ``hosts``: {"steps_per_s", "cpu_ms_per_step"} (``costed``)."""
    master = hosts[0].address
    port = random.randint(29000, 29900)        # Ray's own ports on the head are below 20000
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    code = f"LOOP = {costed(LOOP)!r}\n" + PLAIN
    procs = [subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-c", code, str(rank),
                               str(len(hosts)), master, str(port), str(steps)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank, host in enumerate(hosts)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("plain torch.distributed failed: " + " | ".join(e[-500:] for _, e in outs))
    return json.loads(outs[0][0].strip().splitlines()[-1])


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
    parser.add_argument("--parts", default="ABC", help="which parts to run (default ABC; L alone)")
    parser.add_argument("--ddp-hosts", default="3", help="B on this many hosts, in turn: 3, 2 or 3,2")
    parser.add_argument("--side", choices=("local", "remote"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side(args.side)
    parts = set(args.parts.upper())
    ddp_hosts = [int(n) for n in args.ddp_hosts.split(",")]
    if parts == {"L"}:
        if not args.against:
            raise SystemExit("bench_remote: --parts L compares against a revision: give --against REV")
        return part_l(args)
    if not parts or parts - set("ABC") or any(n not in (2, 3) for n in ddp_hosts):
        raise SystemExit("bench_remote: --parts takes letters of ABC (or L alone), --ddp-hosts 2 or 3 (or 3,2)")

    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_remote: {reason}")
    home = tempfile.mkdtemp(prefix="gpugeek-bench-remote-")
    os.environ["GPUGEEK_HOME"] = home
    logs = Path(home)
    before_tree = export(args.against) if args.against and "A" in parts else None
    print(f"load average before: {os.getloadavg()[0]:.2f} (logs in {home})", flush=True)
    lab = netlab.up(3)
    lab.serve_index()
    sides: dict[str, Side] = {}
    a = hops = None
    ddp: dict[int, dict] = {}
    try:
        spec = {"hosts": ",".join(f"root@{h.address}" for h in lab.hosts), "key": str(lab.key),
                "index": lab.index_url}
        began = time.monotonic()
        sides["remote"] = Side("remote", {**spec, "name": REMOTE}, logs / "remote.log")
        sides["remote"].read()
        print(f"ssh cluster on 3 lab hosts up in {time.monotonic() - began:.1f} s", flush=True)
        remote = sides["remote"]
        if "A" in parts:
            a = part_a(args, spec, sides, logs, before_tree)
        if "C" in parts:     # rank 0's hop to another host, interleaved call by call
            hops = [remote.ask(op="hop", n=args.cells * 2) for _ in range(3)]
        if "B" in parts:
            for n in ddp_hosts:
                ddp[n] = part_b(args, remote, lab.hosts[:n], with_cells="A" in parts and n == 3)
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

    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {args.rounds} rounds")
    if a is not None:
        report_a(args, a, ddp.get(3))
    if hops is not None:
        actor, by_line = [med(h["actor"]) for h in hops], [med(h["line"]) for h in hops]
        print(f"C  rank 0 → a rank on another host and back, {args.cells * 2} × 3 interleaved: Ray actor call "
              f"{ms(actor)} ({listed(actor, 1000)}), cell line {med(by_line) * 1000:.3f} ms "
              f"({', '.join(f'{v * 1000:.3f}' for v in by_line)}) → line/actor {med(by_line) / med(actor):.3f}")
    for n, got in ddp.items():
        report_b(args, n, got)


def part_a(args, spec: dict, sides: dict, logs: Path, before_tree: str | None) -> dict:
    """Empty cells, alternated round by round; the bare client round trip next to the remote cells."""
    sides["local"] = Side("local", {**spec, "name": LOCAL}, logs / "local.log")
    sides["local"].read()
    if before_tree:
        sides["before"] = Side("local", {**spec, "name": BEFORE}, logs / "before.log", package_from=before_tree)
        sides["before"].read()
    remote = sides["remote"]
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
            if which != "remote" and "before" in sides:     # P1, now and before
                got[f"{which} P1"] = med(sides[which].ask(op="p1", n=max(5, args.cells // 4))["s"])
            if which == "remote":
                got["rtt"] = med(remote.ask(op="rtt", n=args.cells)["s"])
        rounds.append(got)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in got.items()), flush=True)
    for name in ("local", "before"):
        if name in sides:
            sides.pop(name).stop()
    remote.ask(op="cells", n=5, workers=3)          # the 3-worker group built before it is counted
    return {"rounds": rounds, "requests": requests,
            "requests3": remote.ask(op="requests", n=20, workers=3)}


def part_l(args) -> None:
    """The local empty cell and P1, this tree against ``--against``'s, alone on the machine."""
    home = tempfile.mkdtemp(prefix="gpugeek-bench-local-")
    os.environ["GPUGEEK_HOME"] = home
    before_tree = export(args.against)
    print(f"load average before: {os.getloadavg()[0]:.2f} (logs in {home})", flush=True)
    sides: dict[str, Side] = {}
    rounds = []
    try:
        sides["local"] = Side("local", {"name": LOCAL}, Path(home) / "local.log")
        sides["local"].read()
        sides["before"] = Side("local", {"name": BEFORE}, Path(home) / "before.log", package_from=before_tree)
        sides["before"].read()
        for name, s in sides.items():
            s.ask(op="cells", n=20, workers=2)            # builds the group, warms up
            print(f"{name}: kernel and worker load {s.ask(op='where', workers=2)}", flush=True)
        for r in range(args.rounds):
            got = {}
            for which in ("local", "before") if r % 2 == 0 else ("before", "local"):
                got[which] = med(sides[which].ask(op="cells", n=args.cells, workers=2)["s"])
                got[f"{which} P1"] = med(sides[which].ask(op="p1", n=max(5, args.cells // 4))["s"])
            rounds.append(got)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in got.items()), flush=True)
    finally:
        for s in sides.values():
            s.stop()
        down_leftover_clusters()
        shutil.rmtree(before_tree, ignore_errors=True)

    def column(key):
        return [g[key] for g in rounds]

    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.cells} cells a side")
    print(f"L  local empty cell, workers=2: now {ms(column('local'))}, with {args.against} {ms(column('before'))} "
          f"→ now/before {med([g['local'] / g['before'] for g in rounds]):.2f} (goal: now ≤ 2.5 ms)")
    print(f"   P1 (the warm 20-step DDP cell): now {ms(column('local P1'))}, with {args.against} "
          f"{ms(column('before P1'))} → now/before {med([g['local P1'] / g['before P1'] for g in rounds]):.3f} "
          f"(goal within 5 %)")
    for key in rounds[0]:
        print(f"   per round, {key} (ms): {listed(column(key), 1000)}")


def part_b(args, remote: Side, hosts: list, with_cells: bool) -> dict:
    """The DDP loop on ``hosts``, alternated. First one untimed round of both at full length: the
    group is new, and the sides stopped before are still exiting (the first timed round, ours
    first, measured 0.83 and 0.86 of plain without it). ``with_cells``: the 3-worker group's
    empty cell and round trip, between the rounds."""
    n = len(hosts)
    remote.ask(op="loop", steps=args.steps, workers=n)
    plain_loop(hosts, args.steps)
    got: dict = {"ours": [], "plain": [], "cells": [], "rtt": []}
    for r in range(args.rounds):
        for which in ("ours", "plain") if r % 2 == 0 else ("plain", "ours"):
            got[which].append(remote.ask(op="loop", steps=args.steps, workers=n) if which == "ours"
                              else plain_loop(hosts, args.steps))
        if with_cells:
            got["cells"].append(med(remote.ask(op="cells", n=args.cells // 2, workers=n)["s"]))
            got["rtt"].append(med(remote.ask(op="rtt", n=args.cells // 2)["s"]))
        ours, plain = got["ours"][-1], got["plain"][-1]
        print(f"round {r + 1}, {n} hosts: DDP steps/s through gg.run {ours['steps_per_s']:.1f} "
              f"({ours['cpu_ms_per_step']:.2f} CPU ms a step), plain {plain['steps_per_s']:.1f} "
              f"({plain['cpu_ms_per_step']:.2f})", flush=True)
    return got


def report_a(args, a: dict, three: dict | None) -> None:
    rounds = a["rounds"]

    def column(key):
        return [g[key] for g in rounds]

    print(f"A  empty cell, workers=2, {args.cells} cells per side per round: remote (Ray Client through the "
          f"SSH tunnel) {ms(column('remote'))}, local {ms(column('local'))} → remote/local "
          f"{med([g['remote'] / g['local'] for g in rounds]):.2f}×")
    print(f"   bare Ray Client round trip (actor method that does nothing) {ms(column('rtt'))}; remote cell − "
          f"round trip {med([g['remote'] - g['rtt'] for g in rounds]) * 1000:.2f} ms (goal ≤ 3 ms); local cell "
          f"{ms(column('local'))} (goal ≤ 3 ms)")
    if "before" in rounds[0]:
        print(f"   local empty cell with the package of {args.against}: {ms(column('before'))} → now/before "
              f"{med([g['local'] / g['before'] for g in rounds]):.2f}")
        print(f"   P1 (the warm 20-step DDP cell, local): now {ms(column('local P1'))}, with {args.against} "
              f"{ms(column('before P1'))} → now/before {med([g['local P1'] / g['before P1'] for g in rounds]):.3f} "
              f"(goal within 5 %)")
    for key in rounds[0]:
        print(f"   per round, {key} (ms): {listed(column(key), 1000)}")
    print(f"   Ray Client requests per remote empty cell: {json.dumps(a['requests'])} (workers=2), "
          f"{json.dumps(a['requests3'])} (workers=3)")
    if three and three["cells"]:
        print(f"   workers=3: remote empty cell {ms(three['cells'])}, round trip {ms(three['rtt'])}, cell − "
              f"round trip {med([c - t for c, t in zip(three['cells'], three['rtt'], strict=True)]) * 1000:.2f} ms")


def report_b(args, n: int, got: dict) -> None:
    def column(side, key):
        return [g[key] for g in got[side]]

    ours, plain = column("ours", "steps_per_s"), column("plain", "steps_per_s")
    cpu_ours, cpu_plain = column("ours", "cpu_ms_per_step"), column("plain", "cpu_ms_per_step")
    print(f"B  {n}-host DDP steps/s ({args.steps} steps, MLP 256→1024→256, batch 64): gg.run {med(ours):.1f} "
          f"({listed(ours)}) vs plain torch.distributed {med(plain):.1f} ({listed(plain)}) "
          f"→ {med(ours) / med(plain):.3f} (goal ≥ 0.95); "
          f"per-round ratios median {med([o / p for o, p in zip(ours, plain, strict=True)]):.3f}")
    print(f"   CPU ms a step costs a rank's process (the most of any rank): gg.run {med(cpu_ours):.2f} "
          f"({listed(cpu_ours)}) vs plain {med(cpu_plain):.2f} ({listed(cpu_plain)}); per-round ratios median "
          f"{med([o / p for o, p in zip(cpu_ours, cpu_plain, strict=True)]):.3f}")


if __name__ == "__main__":
    main()
