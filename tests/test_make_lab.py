"""`make lab` starts a JupyterLab on the quickstart notebook, with this package's REST API enabled
(started headless, then stopped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_processes import wait_until

from gpugeek_jupyter.ports import free_port

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_make_lab_serves_jupyterlab(tmp_path):
    port, token = free_port(), "gpugeek-test-token"
    env = dict(os.environ)
    for name in ("HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                 "IPYTHONDIR"):
        env[name] = str(tmp_path / name.lower())
    args = f"--ip=127.0.0.1 --IdentityProvider.token={token} --ServerApp.open_browser=False"
    log = tmp_path / "make-lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["make", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        status, deadline = None, time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/status",
                    headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    status = json.load(response)
                    break
            except OSError:
                time.sleep(0.5)
        assert status is not None, log.read_text()
        assert "started" in status
        with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/lab?token={token}", timeout=5) as response:
            assert b"JupyterLab" in response.read()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/gpugeek/clusters",
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["live"] == 0     # the server extension is on
        assert "/lab/tree/notebooks/quickstart.ipynb" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    def group_gone():
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_until(group_gone, 10, "nothing of that process group left")
