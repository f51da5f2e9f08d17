"""A cluster the version before started, its record a dict, driven by this one: it lists, a
kernel of this version attaches and runs a cell on it, and ``down`` leaves nothing on the hosts.

The version before is the package as committed at ``BEFORE`` (``git archive``), run by a process of
its own — its ``up``, its watchdog and tunnel here, its keeper and watchdog on the head — as a user's
cluster is when they upgrade the package on the laptop while it runs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry

pytestmark = pytest.mark.slow

BEFORE = "64c5edf"      # the last version whose cluster record held its machines in a dict
ROOT = Path(__file__).resolve().parents[2]
RATE = 3.6


def the_version_before(folder: Path) -> Path:
    """That version's package, unpacked under ``folder`` from this clone's history."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", BEFORE, "gpugeek_jupyter"],
                             capture_output=True, timeout=60)
    assert archive.returncode == 0, f"git archive {BEFORE}: {archive.stderr.decode()[-500:]} (a clone with history)"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _runs(pid: int) -> bool:
    """Read from /proc by psutil: the process is there and is not a zombie (ended, unreaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_cluster_the_version_before_started_lists_attaches_and_downs(lab, gpugeek_home, tmp_path):
    before = the_version_before(tmp_path / "before")
    hosts = lab.hosts[:1]       # one host is all a record's load, list, attach and down need
    names = ",".join(f"root@{h.address}" for h in hosts)
    code = (f"import gpugeek_jupyter as gg\nassert gg.__file__.startswith({str(before)!r}), gg.__file__\n"
            f"gg.up('before', backend='ssh', hosts={names!r}, ssh_key={str(lab.key)!r}, cpus_per_host=1, "
            f"usd_per_hour={RATE}, pip_index_url={lab.index_url!r})\n")
    started = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home), "PYTHONPATH": str(before)})
    record = registry.live("before")
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        assert isinstance(record.spec["remote"], dict) and "known_hosts" not in record.spec["remote"], \
            "not a record of the version before"
        listed = gg.clusters().set_index("name").loc["before"]
        assert (listed["backend"], listed["state"], listed["nodes"]) == ("ssh", "running", 1), listed.to_dict()

        gg.up("before")        # attach: this kernel, over the line to that version's keeper
        name = gg.run("import socket\nsocket.gethostname()", workers=1).shown()
        assert name == hosts[0].name, f"the cell ran on {name}"
    finally:
        if registry.live("before") is not None:
            gg.down("before")
    record = registry.get(record.id)
    assert record.stopped
    assert not (left := left_on_hosts(lab)), f"processes left on the hosts: {described(left)}"
    alive = [pid for pid in {*(record.pids or []), record.watchdog_pid, record.session_id} if pid and _runs(pid)]
    assert not alive, f"the tunnel or watchdog here outlived down: {described(alive)}"
