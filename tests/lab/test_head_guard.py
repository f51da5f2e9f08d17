"""The laptop's link, on an ``ssh`` cluster on the lab's three hosts: a cell goes on through a
10 s cut; cut for good, a running cell says so in one line, and once the link is back a terminal's
``down`` stops every host and the tunnel's hold on the head. (The laptop gone for good, the head's
watchdog at the budget and every reader afterwards: tests/browser/test_laptop_gone.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from cluster_processes import settings, wait_until
from laptop_gone import holds

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.remote import headguard

pytestmark = pytest.mark.slow

RATE = 360.0          # $/h per host: 3 hosts burn 30 cents a second
INTERVAL_S = 1.0      # the watchdogs' metering interval
BLINK_S = 10.0        # a cut the session rides out
LOST_WITHIN_S = 75.0  # a cell says its cluster is out of reach: SSH's keepalive (15 s), Ray Client's grace (30 s)
KERNEL = """
import sys, time, gpugeek_jupyter as gg
gg.up('guarded', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour={rate},
      pip_index_url={index!r})
print('up-done', flush=True)
sys.stdin.readline()
print('cell', gg.run("print('working', flush=True)\\nimport time\\ntime.sleep(20)\\n6 * 7", workers=3).shown(),
      flush=True)
sys.stdin.readline()
began = time.monotonic()
try:
    gg.run("print('working', flush=True)\\nimport time\\ntime.sleep(600)", workers=3)
except gg.GpugeekError as exc:
    print(f'after {{time.monotonic() - began:.0f}} s: {{exc}}', flush=True)
time.sleep(600)
"""


def _until(kernel, what: str, timeout: float) -> str:
    """The kernel's next line of output that contains ``what`` (one line per print)."""
    said, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = kernel.stdout.readline()
        if not line:        # the kernel ended
            raise AssertionError(f"{said}\n{kernel.stderr.read()[-3000:]}")
        said.append(line.strip())
        if what in line:
            return line.strip()
    raise AssertionError(f"no {what!r} from the kernel within {timeout} s: {said}")


def test_a_cell_rides_out_a_blink_and_says_in_one_line_when_the_link_is_cut_for_good(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(hosts=hosts, key=str(lab.key), rate=RATE, index=lab.index_url)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    record = spec = None
    try:
        _until(kernel, "up-done", 180)
        record = registry.live("guarded")
        spec = ClusterSpec.from_json(record.spec)
        assert headguard.guarded(record), "the head's watchdog was not started"
        on_head = [p for p in lab.hosts[0].pids_with(onhost.MARKER, record.marker)]
        assert on_head, "no process of ours on the head"
        wait_until(lambda: headguard.beating(record), 20, "the head watchdog's heartbeat")

        # the network blinks while a cell runs: the cell goes on and answers
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        _until(kernel, "working", 60)
        lab.cut_laptop()
        time.sleep(BLINK_S)              # the blink itself: the link stays cut this long
        lab.reconnect_laptop()
        assert _until(kernel, "cell", 90) == "cell 42"

        # cut for good, a running cell says so in one line, naming what still guards the cluster
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        _until(kernel, "working", 60)
        lab.cut_laptop()
        try:
            lost = _until(kernel, "after", LOST_WITHIN_S + 15)
            print(f"\n{lost}")
            assert "'guarded' does not answer from here" in lost and "run on its head" in lost, lost
            assert int(lost.split()[1]) <= LOST_WITHIN_S
        finally:
            lab.reconnect_laptop()
        kernel.send_signal(signal.SIGKILL)
        # back on the network: `down` from a terminal stops every host and the tunnel
        done = subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", "down", "guarded", "--yes"],
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
        assert done.returncode == 0, done.stderr
        wait_until(lambda: not any(h.strays(ssh_sessions=False) for h in lab.hosts), 30,
                   "every host free of the cluster's processes (by namespace)")
        assert not holds(lab.hosts[0]), "the tunnel's hold on the head outlived the stop"
        assert not processes.alive(record.session_id), "the tunnel outlived the cluster"
    finally:
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
        if record is not None and registry.get(record.id).stopped is None:
            lab.reconnect_laptop()
            gg.down("guarded")
        if spec is not None:
            shutil.rmtree(lab.hosts[0].file(spec.remote["token_path"].replace("~", "/root", 1)).parent,
                          ignore_errors=True)
