"""The host script's idea of "ours", on this machine's own processes: every process in a session
that a process carrying the cluster's marker is in — also one that dropped its environment, as
Ray's agents do — and nothing of a session without the marker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from cluster_processes import wait_until

from gpugeek_jupyter.cluster import processes
from gpugeek_jupyter.onhost import script

# a session leader with the marker; its child drops every variable (as Ray's agents do)
LEADER = ("import os, subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={})\n"
          "time.sleep(60)\n")


def _session(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LEADER], env=env, start_new_session=True)


def test_a_process_without_the_marker_in_a_marked_session_is_ours_and_a_strangers_is_not():
    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    ours = _session({**os.environ, script.MARKER: marker})
    stranger = _session({k: v for k, v in os.environ.items() if k != script.MARKER})
    try:
        wait_until(lambda: len(script.ours(marker)) == 2, 20, "the marked session's two processes")
        found = script.ours(marker)
        assert ours.pid in found
        assert all(os.getsid(pid) == ours.pid for pid in found)
        child = next(pid for pid in found if pid != ours.pid)
        with open(f"/proc/{child}/environ", "rb") as environ:
            assert script.MARKER.encode() not in environ.read(), "the child kept the marker"
        assert stranger.pid not in found
        done = script.stop([marker, "2"])
        assert done == {"ok": True, "left": []}
        assert ours.wait(timeout=10) == -signal.SIGTERM, "the marked session's leader was not ended by the stop"
        wait_until(lambda: not processes.alive(child), 10, "the child without the marker stopped too")
        assert stranger.poll() is None, "a stranger's session was stopped"
    finally:
        for proc in (ours, stranger):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
