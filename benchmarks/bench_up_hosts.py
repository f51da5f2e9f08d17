"""``up --backend ssh`` on three lab hosts whose runtimes are made, against bare Ray started the
same way on the same hosts, or against ``up --backend onprem`` (Ray's own ``ray up``).

    sudo .venv/bin/python benchmarks/bench_up_hosts.py [--rounds 5] [--against bare|onprem]

Needs root, ``ip``, ``unshare``, ``/usr/sbin/sshd`` and ``make lab-files`` (it builds the lab of
``tests/netlab.py``: hosts that share nothing with this machine, h3 bare) and takes it all down at
the end, errors included. A first ``up`` makes each host's runtime (timed, not compared).

- up:   ``gg.up(backend="ssh", hosts=…)`` until it returns: each host checked ready, Ray on every
        host (the head first), the tunnel, the head's watchdog, this process connected as a Ray
        Client. Then ``gg.down`` (not timed).
- bare: over SSH, as ``up`` does it, with the runtime's own ``ray``: ``ray start --head`` on h1,
        then ``ray start --address`` on h2 and h3 at once, with the flags ``up`` gives Ray; timed
        until the last one returns. Then every process in the hosts' namespaces but their sshd is
        ended, by PID (not timed).
- onprem: ``gg.up(backend="onprem", hosts=…)`` until it returns: Ray's ``ray up`` on the head
        (setup command, start command), its autoscaler starting the two other hosts, every host
        joined, the tunnel, this process connected. Then ``gg.down`` (not timed).

The sides alternate, the order flipped every round, so the machine's noise hits both alike; the
ratio is of the medians. Also printed: the checks alone on ready hosts (``runtime.ready``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def bare(lab, ray: str, round_no: int) -> float:
    """Seconds for ``ray start --head`` on the first host, then the others joining at once."""
    head, workers = lab.hosts[0], lab.hosts[1:]
    token = secrets.token_hex(16)
    env = f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={token} RAY_USAGE_STATS_ENABLED=0"

    def start(host, *flags: str) -> None:
        command = (f"{env} {ray} start --node-ip-address={host.address} --temp-dir=/tmp/bare-{round_no} "
                   f"--disable-usage-stats --num-cpus=1 --num-gpus=0 {' '.join(flags)}")
        done = lab.ssh(host, command, timeout=180)
        if done.returncode != 0:
            raise SystemExit(f"bare ray start on {host.name} failed: {done.stderr[-500:]}")

    began = time.monotonic()
    start(head, "--head", "--port=6379", "--ray-client-server-port=10001", "--include-dashboard=false",
          "--no-monitor")
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda h: start(h, f"--address={head.address}:6379"), workers))
    took = time.monotonic() - began
    for host in lab.hosts:        # what ran on the hosts, ended by PID (their sshd kept)
        for pid in host.strays():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    import netlab

    if left := netlab.left_on_hosts(lab):
        raise SystemExit(f"bare Ray left {left} on the hosts")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", choices=("bare", "onprem"), default="bare")
    args = parser.parse_args()
    import netlab

    reason = netlab.why_not()
    if reason:
        raise SystemExit(f"bench_up_hosts: {reason}")
    os.environ["GPUGEEK_HOME"] = tempfile.mkdtemp(prefix="gpugeek-bench-up-")
    lab = netlab.up(3, bare=("h3",))
    try:
        index = lab.serve_index()
        import gpugeek_jupyter as gg
        from gpugeek_jupyter.cluster import registry
        from gpugeek_jupyter.cluster.spec import ClusterSpec
        from gpugeek_jupyter.remote import runtime

        names = ",".join(f"root@{h.address}" for h in lab.hosts)

        def up(name: str, backend: str = "ssh") -> float:
            began = time.monotonic()
            gg.up(name, backend=backend, hosts=names, ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=1.0,
                  pip_index_url=index)
            took = time.monotonic() - began
            gg.down(name)
            return took

        first = up("first")
        print(f"first up (the hosts' runtimes made): {first:.1f} s", flush=True)
        ray = runtime.python_on_host().replace("/bin/python", "/bin/ray")
        spec = ClusterSpec.from_json(registry.latest("first").spec)
        other = args.against
        times: dict[str, list[float]] = {"up": [], other: [], "checks": []}
        for i in range(args.rounds):
            order = ["up", other] if i % 2 == 0 else [other, "up"]
            for side in order:
                if side == "up":
                    times[side].append(up(f"round{i}"))
                else:
                    times[side].append(up(f"onprem{i}", "onprem") if other == "onprem" else bare(lab, ray, i))
            began = time.monotonic()
            runtime.ready(spec, say=lambda *a, **k: None)
            times["checks"].append(time.monotonic() - began)
            print(f"round {i + 1}: up {times['up'][-1]:.1f} s, {other} {times[other][-1]:.1f} s, "
                  f"checks {times['checks'][-1]:.2f} s", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\nmedians of {args.rounds} rounds: up {med['up']:.1f} s (range {min(times['up']):.1f}–"
              f"{max(times['up']):.1f}), {other} {med[other]:.1f} s (range {min(times[other]):.1f}–"
              f"{max(times[other]):.1f}); up / {other} = {med['up'] / med[other]:.2f}; the checks on ready "
              f"hosts {med['checks']:.2f} s")
    finally:      # a cluster a failed round left: stopped before the lab goes (it would dial dead hosts)
        from gpugeek_jupyter.cluster import registry

        for record in registry.all_records(include_stopped=False):
            import gpugeek_jupyter as gg

            gg.down(record.name)
        lab.down()


if __name__ == "__main__":
    main()
