"""The host script's idea of "ours", on this machine's own processes: every process in a session
that a process carrying the cluster's marker is in — also one that dropped its environment, as
Ray's agents do — and nothing of a session without the marker. And a node whose raylet misses Ray's
fixed startup wait is started again, up to three times."""

from __future__ import annotations

import json
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


# `ray start` as a busy host's: Ray's own line for a raylet that missed its 30 s, the first MISSES times
MISSING = ("import pathlib, sys\n"
           "count = pathlib.Path({count!r})\n"
           "count.write_text(str(tries := int(count.read_text() or 0) + 1))\n"
           "if tries <= {misses}:\n"
           "    print('Exception: The current node timed out during startup. This could happen because ...')\n"
           "    sys.exit(1)\n")


def test_a_node_that_misses_rays_startup_wait_is_started_again_and_the_third_miss_is_the_error(
        tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_text("t" * 32)
    count = tmp_path / "count"
    order = json.dumps({"role": "worker", "marker": f"test-{os.getpid()}", "head": "127.0.0.1:6379",
                        "ip": "127.0.0.1", "port": 6379, "temp_dir": str(tmp_path / "ray"),
                        "token_path": str(token)})
    for misses, ok in ((2, True), (3, False)):
        count.write_text("")
        monkeypatch.setattr(script, "RAY_START", MISSING.format(count=str(count), misses=misses))
        said = script.start([order])
        assert int(count.read_text()) == script.START_TRIES == 3
        assert said["ok"] is ok, said
        if not ok:
            assert "timed out during startup" in said["error"] and "\n" not in said["error"]
