"""The laptop never returns: a cell's job on the lab's three hosts, then its kernel SIGKILLed, this
machine's watchdog and tunnel SIGKILLed, and the link cut for good. The job runs to its end on the
hosts; the head's watchdog says so (a ``job-ended`` event: the idle clock starts there) and stops
the cluster one idle window later. The head's $ is checked against lifetimes seen from outside:
each host's raylet, from its start to the moment the host had no process of the cluster left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from cluster_processes import kernel_line, of_cluster, settings
from laptop_gone import head_ledger, spend

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_LID"), reason="four minutes of a cluster nobody watches: `make lid` runs it")]

STEPS = 40
PAUSE_S = 1.0
IDLE_MIN = 1.0
RATE = 3.6               # $/h a host
STOP_WITHIN_S = 40.0     # the idle stop, after the window: a look, the stop itself (three hosts over SSH)
SEEN_EVERY_S = 0.5       # how often this test looks at the hosts' processes
KERNEL = """
import gpugeek_jupyter as gg
gg.up('never', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour={rate},
      idle={idle}, pip_index_url={index!r})
print('up-done', flush=True)
gg.run('''
import time, torch
model = torch.nn.Linear(4, 1)
model, optimizer = gg.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
for batch in gg.steps([torch.randn(8, 4) for _ in range({steps})]):
    gg.backward(model(batch).pow(2).mean())
    print("step", gg.step, flush=True)
    time.sleep({pause})
''', workers=3, name='last')
"""


@pytest.mark.timeout(900)
def test_the_laptop_never_returns_the_job_ends_then_the_idle_stop(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=1.0)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(hosts=hosts, key=str(lab.key), rate=RATE, idle=IDLE_MIN,
                                             index=lab.index_url, steps=STEPS, pause=PAUSE_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    record = None
    try:
        kernel_line(kernel, "up-done", 300)
        record = registry.live("never")
        spec = ClusterSpec.from_json(record.spec)
        raylets = {h.name: min(psutil.Process(p).create_time() for p in h.pids() if _named(p, "raylet"))
                   for h in lab.hosts}
        kernel_line(kernel, "step 5", 60)
        ours = of_cluster(record)                    # this machine's watchdog and tunnel, by session
        kernel.send_signal(signal.SIGKILL)
        for proc in ours:
            proc.send_signal(signal.SIGKILL)
        lab.cut_laptop()
        gone = time.time()
        emptied: dict[str, float] = {}
        deadline = time.monotonic() + STEPS * PAUSE_S + IDLE_MIN * 60 + STOP_WITHIN_S + 60
        while len(emptied) < len(lab.hosts) and time.monotonic() < deadline:
            for host in lab.hosts:
                if host.name not in emptied and not host.strays(ssh_sessions=False):
                    emptied[host.name] = time.time()
            time.sleep(SEEN_EVERY_S)                 # a look at the hosts: the poll's own pace
        assert len(emptied) == len(lab.hosts), f"hosts still running the cluster: {emptied}"

        head, nodes, events = head_ledger(lab.hosts[0], spec, "never")
        said = {e["kind"]: e for e in events}
        print("\n" + "\n".join(f"{e['at'] - gone:+7.1f} s  {e['kind']}: {e['message']}" for e in events
                               if e["at"] >= gone - 5))
        ended = said["job-ended"]
        assert "job 'last' finished on the cluster" in ended["message"] and f"(step {STEPS})" in ended["message"]
        assert ended["at"] >= gone + (STEPS - 6) * PAUSE_S, "the job ended before its steps could have run"
        assert "idle" in head["stop_reason"], head
        stopped = head["stopped"]
        print(f"the job ended {ended['at'] - gone:.1f} s after the laptop went; the head stopped the cluster "
              f"{stopped - ended['at']:.1f} s after that ({IDLE_MIN:g} min idle window)")
        assert IDLE_MIN * 60 <= stopped - ended["at"] <= IDLE_MIN * 60 + STOP_WITHIN_S

        head_usd = spend(nodes, time.time())
        seen_usd = sum(RATE * (emptied[h.name] - raylets[h.name]) / 3600 for h in lab.hosts)
        print(f"the head's ledger ${head_usd:.4f}; Σ lifetimes seen on the hosts × rate ${seen_usd:.4f}")
        assert len(nodes) == 3 and all(n["ended"] for n in nodes)
        # a host's lifetime as seen here starts a moment before its node registers, and ends
        # within a look after its processes go: a few seconds of one host's rate at most
        assert abs(head_usd - seen_usd) <= 3 * RATE * 5 / 3600, (head_usd, seen_usd)
    finally:
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
        lab.reconnect_laptop()
        if record is not None and registry.get(record.id).stopped is None:
            import gpugeek_jupyter as gg

            gg.down("never")


def _named(pid: int, name: str) -> bool:
    try:
        return psutil.Process(pid).name() == name
    except psutil.Error:
        return False

