"""A real Slurm for one test session (``tests/slurmlab.py``): made once, torn down at the end, and
nothing of it may be left — no namespace, no link, no route, no process. ``make test`` runs this
folder after the main suite, beside the multi-host lab's stream (its wheel index made by then)."""

from __future__ import annotations

import os

import pytest
import slurmlab


@pytest.fixture(scope="session")
def slurm():
    """A real Slurm (``tests/slurmlab.py``): a controller, a login host the laptop reaches alone, two
    compute nodes with two CPUs and two GRES GPUs each that share the cluster's home with the login
    host and nothing with the laptop; everything it made gone at the end.

    ``make test``'s runs Slurm's accounting (slurmdbd: ``sacct`` answers, accounts are enforced);
    ``make slurm-lab``'s does not, as many sites, so its money scenarios read the meter's other
    record of a job's end, the job completion record."""
    accounting = not os.environ.get("GPUGEEK_SLURM_LAB")
    if reason := slurmlab.why_not(accounting):
        pytest.skip(reason)
    made = slurmlab.up(nodes=2, gpus_per_node=2, cpus_per_node=2, accounting=accounting)
    try:
        yield made
    finally:
        made.down()
        left = made.leftovers()
        assert not left, f"the Slurm lab left {', '.join(left)}"


@pytest.fixture
def cluster_user(slurm, gpugeek_home):
    """This machine as a user of the cluster: the lab's key for the login host, its wheel index as
    the mirror the compute nodes install from."""
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f'[hosts]\npip_index_url = "{slurm.lab.index_url}"\n')
    return {"backend": "slurm", "login": f"root@{slurm.login.address}", "ssh_key": str(slurm.lab.key),
            "usd_per_hour": 0}
