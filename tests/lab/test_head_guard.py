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
# Each cell runs until the time this test writes in a file on the lab's shared filesystem once the link
# is back (the cell's own end, a few seconds on): it is still running then, whatever the machine's pace,
# and it ends soon after, not at a length set for the slowest machine
TAIL_S = 3.0
FIRST_CAP_S = 60.0    # the first cell's most, had no end been written
STEPS = 60            # the second cell's most steps, a second each
ENDS = ("import time\ndef _ends(path):\n    try:\n        return time.time() >= float(open(path).read())\n"
        "    except (OSError, ValueError):\n        return False\n")
FIRST_CELL = ENDS + ("print('working', flush=True)\nbegan = time.time()\n"
                     "while time.time() - began < {cap} and not _ends({ends!r}):\n    time.sleep(0.2)\n6 * 7")
STEP_CELL = ENDS + ("for step in range(1, {steps} + 1):\n    if rank == 0:\n        print('step', step, flush=True)\n"
                    "    time.sleep(1.0)\n    if _ends({ends!r}):\n        break\nfinal_step = step")
KERNEL = """
import sys, time, gpugeek_jupyter as gg
gg.up('guarded', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour={rate},
      pip_index_url={index!r})
print('up-done', flush=True)
sys.stdin.readline()
print('cell', gg.run({first_cell!r}, workers=3).shown(), flush=True)
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


def _end(path) -> None:
    """The cell reading ``path`` ends ``TAIL_S`` from now (written whole: a rank never reads half of it)."""
    part = path.with_name(path.name + ".part")
    part.write_text(str(time.time() + TAIL_S))
    part.replace(path)


def _said(kernel) -> list[str]:
    """Every line the kernel printed so far, as ``_until`` read them."""
    if not hasattr(kernel, "said"):
        kernel.said = []
    return kernel.said


def test_a_cell_rides_out_a_blink_and_goes_on_through_a_cut_past_the_tunnels_keepalive(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    ends = {cell: lab.shared / f"guarded-{cell}-ends" for cell in ("first", "steps")}
    for path in ends.values():
        path.unlink(missing_ok=True)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(
            hosts=hosts, key=str(lab.key), rate=RATE, index=lab.index_url,
            first_cell=FIRST_CELL.format(cap=FIRST_CAP_S, ends=str(ends["first"])),
            step_cell=STEP_CELL.format(steps=STEPS, ends=str(ends["steps"])))],
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
        _end(ends["first"])
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
        _end(ends["steps"])
        ended = _until(kernel, "cell2", STEPS + 120)
        final = int(ended.split()[1])
        shown = [int(line.split()[1]) for line in _said(kernel) if line.startswith("step ")]
        assert final > 5 and shown == list(range(1, final + 1)), f"the cell did not show every step: {shown}, {ended}"
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
        for path in ends.values():
            path.unlink(missing_ok=True)
        if spec is not None:
            shutil.rmtree(lab.hosts[0].file(spec.remote.token_path.replace("~", "/root", 1)).parent,
                          ignore_errors=True)
