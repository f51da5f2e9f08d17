"""A run killed outright (SIGKILL, a machine's restart) never reaches a lab's ``down``. What it left
— namespaces, the bridge and the routes through it, blackhole routes, the wheel index server — must
not outlive it into the next run: a cloud box would find its VPC's range taken and refuse to start.
The next lab's ``up`` sweeps it away; a lab whose maker is alive is never touched."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import netlab
import psutil
import pytest
from cluster_processes import wait_until

TESTS = Path(__file__).resolve().parent.parent

MAKER = textwrap.dedent("""
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    import netlab
    lab = netlab.up(1, bare=("h1",))
    lab.serve_index()
    subprocess.run(["ip", "route", "add", "198.18.0.0/24", "dev", lab.bridge], check=True)  # as a box routes its VPC
    subprocess.run(["ip", "route", "add", "blackhole", lab.hosts[0].address + "/32"], check=True)  # as a cut does
    print(lab.bridge, lab.hosts[0].netns, lab.hosts[0].address, lab.index_server.pid, lab.dir, flush=True)
    time.sleep(600)
""")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True).stdout


def test_a_killed_runs_lab_is_swept_by_the_next_and_a_live_one_is_kept():
    if reason := netlab.why_not():
        pytest.skip(reason)
    with netlab.fixture(1, bare=("h1",)) as alive:
        maker = subprocess.Popen([sys.executable, "-c", MAKER, str(TESTS)], stdout=subprocess.PIPE, text=True)
        try:
            bridge, netns, address, index_pid, folder = maker.stdout.readline().split()
            in_host = subprocess.Popen(["ip", "netns", "exec", netns, "sleep", "600"])   # a process on the host
            wait_until(lambda: str(in_host.pid) in _ip("netns", "pids", netns).split(), 10, "the host's process")
        finally:
            maker.send_signal(signal.SIGKILL)
            maker.wait(timeout=10)
        assert netns in _ip("netns", "list") and f"dev {bridge}" in _ip("route")     # still there: nothing downed it

        removed = netlab.sweep_orphans()

        assert in_host.wait(timeout=10) == -signal.SIGKILL, "the host's process was not ended"
        assert not psutil.pid_exists(int(index_pid)) or psutil.Process(int(index_pid)).status() == psutil.STATUS_ZOMBIE
        assert netns not in _ip("netns", "list")
        assert bridge not in _ip("-o", "link", "show")
        assert f"dev {bridge}" not in _ip("route"), "the route through the dead lab's bridge is still there"
        assert address not in _ip("route", "show", "type", "blackhole")
        assert not Path(folder).exists()
        assert f"namespace {netns}" in removed and f"link {bridge}" in removed

        # the live lab, made by this process, is untouched and still answers a login
        assert alive.hosts[0].netns in _ip("netns", "list")
        assert alive.ssh(alive.hosts[0], "true").returncode == 0
        assert alive.dir.exists() and alive.bridge in _ip("-o", "link", "show")
