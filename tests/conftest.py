from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# no AWS SDK of the tests, or of what they start here, probes an instance metadata service: only the
# cloud box's hosts have one, their own (this machine's route to 169.254.169.254 is not ours)
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@pytest.fixture(autouse=True)
def gpugeek_home(request, tmp_path, monkeypatch):
    """Every test gets its own state directory, so none reads or writes ~/.gpugeek. A test that
    failed has its live clusters downed, so its failure is the one reported (a passing test that
    leaves one up is still caught, by ``no_ray_process_left_behind``)."""
    home = tmp_path / "gpugeek-home"
    monkeypatch.setenv("GPUGEEK_HOME", str(home))
    yield home
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and (home / "state.db").exists():
        import gpugeek_jupyter as gg
        from gpugeek_jupyter.errors import GpugeekError

        try:
            gg.down(all=True)
        except GpugeekError as exc:         # the suite's own check still names what was left
            print(f"could not down the failed test's clusters: {exc}")


@pytest.fixture
def stop_button():
    """The notebook's stop button, as Jupyter presses it: SIGINT to the kernel's process, whose handler
    raises KeyboardInterrupt (ipykernel sets ``default_int_handler`` around each cell). Gives the
    press; a real signal, so a wait in the main thread ends at once, as in a kernel. A suite started
    in the background (``make test &``, CI) inherits SIGINT ignored: the handler is set here."""
    import os
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield lambda: os.kill(os.getpid(), signal.SIGINT)
    signal.signal(signal.SIGINT, before)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps the call's report on the test, for ``gpugeek_home`` to know it failed."""
    report = yield
    if report.when == "call":
        item.report_call = report
    return report


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

    from gpugeek_jupyter.cluster import processes

    procs = {}
    for db in base.rglob("state.db"):
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT id, session_id, watchdog_pid, created FROM clusters").fetchall()
        for cluster_id, sid, watchdog, created in rows:
            marker = f"{db.parent}#{cluster_id}"          # ClusterRecord.marker
            for session in (x for x in (sid, watchdog) if x):
                # by marker, as the package itself tells its sessions: a session id is a pid, and a
                # stranger's process (a browser's crash handler) may get a dead cluster's one
                for proc in processes.session_processes(session, max(since, created), marker):
                    if proc.pid != os.getpid():
                        procs[proc.pid] = proc
    found = []
    for proc in procs.values():
        try:
            found.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    procs = list(procs.values())
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


def pytest_sessionfinish(session, exitstatus):
    session.config._gpugeek_exit = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The verdict is in and printed: leave without the interpreter's teardown when this process was
    a Ray driver. Ray 2.60's C++ logger, whose last session folder a test's ``down`` removed, can
    crash the process in that teardown (seen once in six runs: "[ray_log_sink] Failed writing to
    file …/logs/python-core-driver-…", then SIGSEGV after "561 passed"), which would turn a passed
    suite into exit 139."""
    if "ray" in sys.modules and hasattr(config, "_gpugeek_exit"):
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config._gpugeek_exit)
