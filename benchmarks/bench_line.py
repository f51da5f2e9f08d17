"""The line against the tree before it, on the lab: a kernel of this tree (it talks to the keeper on
the head over the line) and one of ``--against REV`` (a Ray Client through the tunnel), each
driving an ``ssh`` cluster of its own on the same three lab hosts, side by side, the order flipped
every round so the machine's noise hits both alike:

- the remote empty cell, ``gg.run("pass", workers=2)``, each side on its own cluster; with it the
  SSH round trip — one byte there and back through an ``ssh -L`` forward made as the cluster's
  tunnel is (``remote/ssh.py``'s options, a terminal session) to an echo on the head's loopback —
  which the remote cell is held against (goal: cell ≤ round trip + 3 ms);
- P1, the warm 20-step DDP cell (``bench_run.py``), on two workers on two hosts (goal: no slower);
- the first cell after ``up``: seconds from ``up``'s return to the first cell's start on the workers
  (now ``up --workers 2``, whose group starts while ``up`` returns; before, ``up``, which had no
  warm start) — goal ≤ 10 s.

The local empty cell is ``bench_remote.py --parts L --against REV`` (no lab).

    sudo .venv/bin/python benchmarks/bench_line.py --against REV [--rounds 5] [--cells 60] [--ups 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_remote import Side, export, listed, med, ms  # noqa: E402 - the sides and the tree before

NOW, BEFORE = "bench-line-now", "bench-line-before"
# one connection at a time, for good: the first is the check that the forward opened
ECHO = ("import socket\nserver = socket.create_server(('127.0.0.1', 0))\nprint(server.getsockname()[1], flush=True)\n"
        "while True:\n    conn, _ = server.accept()\n    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        "    while (data := conn.recv(64)):\n        conn.sendall(data)\n    conn.close()\n")


class Forward:
    """An echo on the head's loopback, reached through an ``ssh -L`` made as the cluster's tunnel is."""

    def __init__(self, lab, head):
        from gpugeek_jupyter import ports
        from gpugeek_jupyter.remote import ssh

        self.echo = subprocess.Popen(["ip", "netns", "exec", head.netns, sys.executable, "-c", ECHO],
                                     stdout=subprocess.PIPE, text=True)
        far = int(self.echo.stdout.readline())
        self.port = ports.free_port("127.0.0.1")
        cmd = ssh.argv(ssh.Target(head.address, "root"), str(lab.key), "-tt", "sleep 3600",
                       known_hosts=str(lab.known_hosts))
        cmd[1:1] = ["-o", "ExitOnForwardFailure=yes", f"-L127.0.0.1:{self.port}:127.0.0.1:{far}"]
        self.ssh = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not ports.answers("127.0.0.1", self.port, 0.5):
            if time.monotonic() > deadline:
                raise RuntimeError("the forward to the head's echo did not open")
            time.sleep(0.1)      # ssh logs in and listens: nothing else to wait on
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trips(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            began = time.perf_counter()
            self.sock.sendall(b"x")
            self.sock.recv(1)
            out.append(time.perf_counter() - began)
        return out

    def close(self) -> None:
        self.sock.close()
        for proc in (self.ssh, self.echo):
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", required=True, help="the tree before: a git revision")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cells", type=int, default=60, help="empty cells per side per round")
    parser.add_argument("--ups", type=int, default=3, help="ups per side, for the first cell after up")
    args = parser.parse_args()

    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_line: {reason}")
    home = tempfile.mkdtemp(prefix="gpugeek-bench-line-")
    os.environ["GPUGEEK_HOME"] = home
    before_tree = export(args.against)
    print(f"load average before: {os.getloadavg()[0]:.2f} (logs in {home})", flush=True)
    lab = netlab.up(3)
    lab.serve_index()
    sides: dict[str, Side] = {}
    forward = None
    rounds, ups = [], {"now": [], "before": []}
    try:
        spec = {"hosts": ",".join(f"root@{h.address}" for h in lab.hosts), "key": str(lab.key),
                "index": lab.index_url}
        for which, name, tree in (("now", NOW, None), ("before", BEFORE, before_tree)):
            began = time.monotonic()
            sides[which] = Side("remote", {**spec, "name": name}, Path(home) / f"{which}.log", package_from=tree)
            sides[which].read()
            sides[which].ask(op="cells", n=10, workers=2)        # its group built, warm
            print(f"{which}: up and warm in {time.monotonic() - began:.1f} s; kernel and worker load "
                  f"{sides[which].ask(op='where', workers=2)}", flush=True)
        forward = Forward(lab, lab.hosts[0])
        forward.round_trips(50)
        for r in range(args.rounds):
            got = {}
            for which in ("now", "before") if r % 2 == 0 else ("before", "now"):
                got[which] = med(sides[which].ask(op="cells", n=args.cells, workers=2)["s"])
                got[f"{which} P1"] = med(sides[which].ask(op="p1", n=max(5, args.cells // 6))["s"])
                got[f"ssh after {which}"] = med(forward.round_trips(args.cells))
            rounds.append(got)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in got.items()), flush=True)
        for u in range(args.ups):
            for which in ("now", "before") if u % 2 == 0 else ("before", "now"):
                ups[which].append(sides[which].ask(op="again", workers=2))
                print(f"up {u + 1}, {which}: {ups[which][-1]}", flush=True)
    finally:
        if forward is not None:
            forward.close()
        for s in sides.values():
            s.stop()
        lab.down()
        shutil.rmtree(before_tree, ignore_errors=True)
        left = lab.leftovers()
        if left:
            print(f"left over from the lab: {', '.join(left)}", flush=True)
    report(args, rounds, ups)


def report(args, rounds: list[dict], ups: dict) -> None:
    def column(key):
        return [g[key] for g in rounds]

    ssh = [(g["ssh after now"] + g["ssh after before"]) / 2 for g in rounds]
    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.cells} cells a side")
    print(f"remote empty cell, workers=2: now (the line) {ms(column('now'))}, before ({args.against}, a Ray "
          f"Client) {ms(column('before'))} → now/before {med([g['now'] / g['before'] for g in rounds]):.2f}")
    print(f"   SSH round trip through a forward like the tunnel's {ms(ssh)}; now − round trip "
          f"{med([g['now'] - t for g, t in zip(rounds, ssh, strict=True)]) * 1000:.2f} ms, before − round trip "
          f"{med([g['before'] - t for g, t in zip(rounds, ssh, strict=True)]) * 1000:.2f} ms (goal: now ≤ 3 ms)")
    print(f"P1, the warm 20-step DDP cell on 2 hosts: now {ms(column('now P1'))}, before {ms(column('before P1'))} "
          f"→ now/before {med([g['now P1'] / g['before P1'] for g in rounds]):.3f} (goal: no slower)")
    for which in ("now", "before"):
        first = [u["first"] for u in ups[which]]
        print(f"first cell after up ({'up --workers 2' if ups[which] and ups[which][0]['warm'] else 'up'}), {which}: "
              f"began {med(first):.1f} s after up returned ({listed(first)}); up itself "
              f"{med([u['up'] for u in ups[which]]):.1f} s")
    for key in rounds[0]:
        print(f"   per round, {key} (ms): {listed(column(key), 1000)}")


if __name__ == "__main__":
    main()
