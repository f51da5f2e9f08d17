from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def gpugeek_home(tmp_path, monkeypatch):
    """Every test gets its own state directory, so none reads or writes ~/.gpugeek."""
    home = tmp_path / "gpugeek-home"
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def ipython():
    """A real IPython shell with the extension loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "gpugeek_jupyter")
    return shell


RAY_MARKERS = ("raylet", "gcs_server", "ray::", "gpugeek_jupyter.cluster.watchdog", "/tmp/gg-",
               "ray/autoscaler", "ray/dashboard", "log_monitor.py", "ray.util.client.server")


def ray_processes(since: float, stop: bool = False) -> list[str]:
    """Ray (or watchdog) processes started after ``since``: what a test may leave behind."""
    import os

    import psutil

    found = []
    procs = []
    for proc in psutil.process_iter(["pid", "create_time", "cmdline", "status"]):
        info = proc.info
        if info["pid"] == os.getpid() or info["create_time"] < since or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        line = " ".join(info["cmdline"] or [])
        if any(marker in line for marker in RAY_MARKERS):
            found.append(f"{info['pid']} {line[:120]}")
            procs.append(proc)
    if stop:  # a failed run must not leave its mess on the machine either
        for proc in procs:
            proc.kill()
    return found


@pytest.fixture(scope="session", autouse=True)
def no_ray_process_left_behind():
    """The suite starts real Ray clusters; it must stop every process it started (asserted)."""
    import time

    start = time.time()
    yield
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    deadline = time.time() + 15
    left = ray_processes(start)
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = ray_processes(start)
    if left:
        ray_processes(start, stop=True)
    assert not left, f"processes left behind: {left}"
