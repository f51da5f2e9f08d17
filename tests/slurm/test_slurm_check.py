"""``gpugeek check slurm``: the login node answers over SSH and has sbatch — or, at a port of the
login host where nothing listens, one line saying it does not answer. Submits nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CLOSED_PORT = 1     # on the lab's login host: nothing listens there


def _check(login: str, key: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("gpugeek")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gpugeek_jupyter.cli"]
    return subprocess.run([*command, "check", "slurm", "--login", login, "--ssh-key", key],
                          env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}, capture_output=True, text=True,
                          timeout=120)


def test_check_finds_sbatch_on_the_login_node_and_says_when_it_does_not_answer(cluster_user):
    ready = _check(cluster_user["login"], cluster_user["ssh_key"])
    assert ready.returncode == 0, ready.stdout + ready.stderr
    line = ready.stdout.strip()
    assert "\n" not in line and line.startswith("slurm    ready: ") and "sbatch at /" in line, line
    assert cluster_user["login"] in line, line

    closed = f"{cluster_user['login']}:{CLOSED_PORT}"
    silent = _check(closed, cluster_user["ssh_key"])
    assert silent.returncode == 1, silent.stdout + silent.stderr
    line = silent.stdout.strip()
    assert "\n" not in line and line.startswith(f"slurm    NOT READY: {closed}: SSH failed"), line
    assert not silent.stderr, silent.stderr
