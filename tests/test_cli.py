"""The ``gpugeek`` terminal command, run as the installed console script from a plain shell: no
Jupyter, no kernel. Its kill switch stops a cluster whose kernel was SIGKILLed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from cluster_processes import new_kernel, of_cluster, settings, still_running

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import ledger

GPUGEEK = Path(sys.executable).parent / "gpugeek"     # what the wheel installs beside python


def gpugeek(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUGEEK), *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=dict(os.environ))


@pytest.mark.parametrize("args", [["bogus"], ["down"], ["down", "a", "--all"], ["status"], ["clusters", "--nope"],
                                  ["log", "--since", "2x"], ["status", "nope"], ["cost", "nope"], ["down", "nope"],
                                  ["up", "x", "--nodes", "two"], ["up", "--bogus"], ["up", "x", "--plan", "p"]])
def test_a_bad_argument_is_one_line_and_exit_2(args):
    done = gpugeek(*args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("gpugeek") and "Traceback" not in done.stderr


def test_it_loads_no_jupyter_ipython_ray_or_pandas():
    probe = ("from gpugeek_jupyter.cli import main; main(['clusters']); import sys; print('loaded:', *sorted("
             "m for m in ('IPython', 'ipykernel', 'jupyter_server', 'tornado', 'ray', 'pandas', 'plotly', 'torch',"
             " 'ipywidgets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "loaded:", done.stdout


def test_up_takes_the_magics_flags_from_its_own_declaration():
    """``gpugeek up`` parses with ``%gpugeek up``'s parser: every flag the magic declares is there."""
    from gpugeek_jupyter.magics import up

    magic = {o for action in up.parser._actions for o in action.option_strings}
    done = gpugeek("up", "--help")
    assert done.returncode == 0 and done.stdout.startswith("gpugeek up "), done.stdout[:300]
    assert "--requeue" in magic and all(flag in done.stdout for flag in magic), magic - set(done.stdout.split())


@pytest.mark.slow
def test_up_from_a_terminal_starts_a_cluster_that_outlives_the_command(gpugeek_home):
    done = gpugeek("up", "rehearsal", "--backend", "sim", "--gpu", "A100", "--count", "8", "--workers", "1")
    procs = []
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert "rehearsal: sim cluster, running at" in done.stdout, done.stdout
        listed = gpugeek("clusters").stdout
        assert "rehearsal" in listed and "running" in listed, listed
        record = registry.live("rehearsal")
        procs = of_cluster(record)       # the command has ended: its cluster runs on
        assert record is not None and still_running(procs), "the cluster's processes"
    finally:
        stopped = gpugeek("down", "rehearsal")
    assert stopped.returncode == 0 and "stopped 'rehearsal'" in stopped.stdout, stopped
    assert not still_running(procs, wait=10), "left running after down"


def test_nothing_yet():
    assert gpugeek("clusters").stdout == "no clusters yet\n"
    assert gpugeek("log").stdout == "no events\n"
    done = gpugeek("down", "--all")
    assert done.returncode == 0 and done.stdout == "no live clusters\n"


@pytest.mark.slow
def test_lists_and_stops_a_cluster_whose_kernel_was_killed(gpugeek_home):
    # a kernel starts a local cluster and is SIGKILLed: the cluster runs on, billing
    settings(gpugeek_home, local_usd_per_hour=72.0)
    killed = new_kernel("import os, signal, gpugeek_jupyter as gg\n"
                        "gg.up('orphaned', backend='local')\n"
                        "os.kill(os.getpid(), signal.SIGKILL)\n", gpugeek_home)
    assert killed.returncode == -9, killed.stderr[-2000:]
    record = registry.live("orphaned")
    ours = of_cluster(record)
    assert record.watchdog_pid in [p.pid for p in ours] and len(ours) >= 3
    try:
        listed = gpugeek("clusters")
        assert listed.returncode == 0, listed.stderr
        line = next(x for x in listed.stdout.splitlines() if x.startswith("orphaned "))
        assert "local" in line and "running (orphan)" in line, listed.stdout
        shown = json.loads(gpugeek("clusters", "--json").stdout)
        assert [c["name"] for c in shown["clusters"] if c["live"]] == ["orphaned"]
        # the guard named by its pid, which the process table says is this cluster's watchdog
        said = gpugeek("status", "orphaned").stdout
        pid = int(re.search(r"^guarded by this machine's watchdog \(pid (\d+), ", said, re.M).group(1))
        assert "gpugeek_jupyter.guard.watchdog" in " ".join(psutil.Process(pid).cmdline()), said
        assert line.split()[-1] == "here", listed.stdout

        # --all asks first; with no terminal to ask on, it stops nothing and says how
        refused = gpugeek("down", "--all")
        assert refused.returncode == 2 and "--yes" in refused.stderr and len(refused.stderr.splitlines()) == 1
        assert registry.live("orphaned") is not None

        stopped = gpugeek("down", "orphaned", "--yes")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith("stopped 'orphaned': it cost $"), stopped.stdout
        assert still_running(ours, wait=15) == [], "processes of the cluster run on"
        final = registry.get(record.id)
        assert final.stopped is not None and final.stop_reason == "down (from the terminal)"
        cost = json.loads(gpugeek("cost", "orphaned", "--json").stdout)
        assert cost["total_usd"] > 0 and cost["total_usd"] == pytest.approx(ledger.spend(record.id), rel=1e-9)
        again = gpugeek("down", "orphaned")
        assert again.returncode == 0 and "already stopped" in again.stdout
    finally:
        if registry.live("orphaned") is not None:
            gpugeek("down", "orphaned")
