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


def our_processes(base, since: float, stop: bool = False) -> list[str]:
    """Processes still alive in a session that a test's cluster registry says we started.

    Every test keeps its registry under pytest's base temp dir, so the sessions recorded there
    (Ray heads, simulated nodes, watchdogs) are exactly ours — other Ray on the machine is left alone.
    """
    import os
    import sqlite3

    import psutil

    sessions = set()
    for db in base.rglob("state.db"):
        with sqlite3.connect(db) as conn:
            for sid, watchdog in conn.execute("SELECT session_id, watchdog_pid FROM clusters"):
                sessions.update(x for x in (sid, watchdog) if x)
    found, procs = [], []
    for proc in psutil.process_iter(["pid", "create_time", "cmdline", "status"]):
        info = proc.info
        try:
            if (info["pid"] == os.getpid() or info["create_time"] < since
                    or info["status"] == psutil.STATUS_ZOMBIE or os.getsid(info["pid"]) not in sessions):
                continue
        except OSError:
            continue
        found.append(f"{info['pid']} {' '.join(info['cmdline'] or [])[:120]}")
        procs.append(proc)
    if stop:  # a failed run must not leave its mess on the machine either
        for proc in procs:
            proc.kill()
    return found


@pytest.fixture(scope="session", autouse=True)
def no_ray_process_left_behind(tmp_path_factory):
    """The suite starts real Ray clusters; it must stop every process it started (asserted)."""
    import time

    start = time.time()
    base = tmp_path_factory.getbasetemp()
    yield
    if "ray" in sys.modules:
        import ray

        ray.shutdown()
    deadline = time.time() + 15
    left = our_processes(base, start)
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = our_processes(base, start)
    if left:
        our_processes(base, start, stop=True)
    assert not left, f"processes left behind: {left}"
