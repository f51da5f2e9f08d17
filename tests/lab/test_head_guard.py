"""The laptop's link, on an ``ssh`` cluster on the lab's three hosts: a cell goes on through a
10 s cut; through a cut past the tunnel's keepalive its job goes on on the hosts, the cell says
so once and picks up when the link is back (every step shown); then a terminal's ``down`` stops every
host and the tunnel's hold on the head. (The laptop gone for good, the head's
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
LOST_WITHIN_S = 75.0  # a cell says its cluster is out of reach: the line's keepalive (~11 s), the tunnel's (15 s)
# the cut goes on this long after the cell said so: past the tunnel's keepalive (ServerAlive 5 s × 3), so
# the tunnel ends and is opened again; an ssh cluster's cell rides the line, not a Ray Client session
CUT_S = 15.0
STEPS = 50            # the second cell's steps, a second each: it is still running when the link is back
STEP_CELL = ("import time\nfor step in range(1, {steps} + 1):\n    if rank == 0:\n"
             "        print('step', step, flush=True)\n    time.sleep(1.0)\nfinal_step = step")
KERNEL = """
import sys, time, gpugeek_jupyter as gg
gg.up('guarded', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour={rate},
      pip_index_url={index!r})
print('up-done', flush=True)
sys.stdin.readline()
print('cell', gg.run("print('working', flush=True)\\nimport time\\ntime.sleep(20)\\n6 * 7", workers=3).shown(),
      flush=True)
sys.stdin.readline()
print('cell2', gg.run({step_cell!r}, workers=3, pull=['final_step']).pulled['final_step'], flush=True)
time.sleep(600)
"""


def _until(kernel, what: str, timeout: float) -> str:
    """The kernel's next line of output that contains ``what`` (one line per print); every line
    read is kept (``_said``)."""
    said, deadline = _said(kernel), time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = kernel.stdout.readline()
        if not line:        # the kernel ended
            raise AssertionError(f"{said[-30:]}\n{kernel.stderr.read()[-3000:]}")
        said.append(line.strip())
        if what in line:
            return line.strip()
    raise AssertionError(f"no {what!r} from the kernel within {timeout} s: {said[-30:]}")


def _said(kernel) -> list[str]:
    """Every line the kernel printed so far, as ``_until`` read them."""
    if not hasattr(kernel, "said"):
        kernel.said = []
    return kernel.said


def test_a_cell_rides_out_a_blink_and_goes_on_through_a_cut_past_the_tunnels_keepalive(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(hosts=hosts, key=str(lab.key), rate=RATE, index=lab.index_url,
                                             step_cell=STEP_CELL.format(steps=STEPS))],
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

        # cut past the tunnel's keepalive: the job goes on on the hosts, the cell says so once, and it
        # picks up when the link is back — every step shown, the pulled value the job's own
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        _until(kernel, "step 5", 90)
        lab.cut_laptop()
        try:
            said = _until(kernel, "out of reach", LOST_WITHIN_S + 15)
            print(f"\n{said}")
            assert "the job goes on there" in said and "this cell picks up when it answers" in said, said
            time.sleep(CUT_S)            # the cut itself: past the tunnel's keepalive, nothing to poll for
        finally:
            lab.reconnect_laptop()
        ended = _until(kernel, "cell2", STEPS + 120)
        assert ended == f"cell2 {STEPS}", ended
        shown = [int(line.split()[1]) for line in _said(kernel) if line.startswith("step ")]
        assert shown == list(range(1, STEPS + 1)), f"the cell did not show every step: {shown}"
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
            shutil.rmtree(lab.hosts[0].file(spec.remote.token_path.replace("~", "/root", 1)).parent,
                          ignore_errors=True)
