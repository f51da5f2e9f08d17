"""A down leaves nothing on the hosts: every process in each host's network namespace is counted
(``ip netns pids``), not only those carrying our marker — Ray's dashboard and runtime-env agents
drop their parent's environment. ``GPUGEEK_DOWN_TRIALS=3`` runs the figures; ``make test``
checks one down in ``test_ssh_cluster.py``."""

from __future__ import annotations

import os
import time

import pytest
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg

pytestmark = pytest.mark.slow

RATE = 7.2


@pytest.mark.skipif(not os.environ.get("GPUGEEK_DOWN_TRIALS"),
                    reason="test_down_costs_the_hosts_lifetimes_and_leaves_nothing checks one down on the lab; "
                           "GPUGEEK_DOWN_TRIALS=3 repeats up, a cell and down for the figures")
def test_up_a_cell_and_down_leave_no_process_in_any_host(lab, gpugeek_home, capsys):
    """As a user would: up on three hosts, one cell on every host, down — then nothing at all runs
    in any host's namespace (Ray's dashboard and runtime-env agents included), trial after trial."""
    names = ",".join(f"root@{h.address}" for h in lab.hosts)
    for trial in range(int(os.environ["GPUGEEK_DOWN_TRIALS"])):
        assert not left_on_hosts(lab), "the hosts were not empty before the trial"
        gg.up("trial", backend="ssh", hosts=names, ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=RATE,
              pip_index_url=lab.index_url)
        try:
            assert gg.run("rank", workers=3).shown() == 0
            during = sum(len(host.strays()) for host in lab.hosts)
        finally:
            began = time.monotonic()
            gg.down("trial")
            took = time.monotonic() - began
        left = left_on_hosts(lab)
        with capsys.disabled():
            print(f"\ntrial {trial + 1}: {during} processes on the hosts during the cell; after down "
                  f"({took:.1f} s) {len(left)} left{': ' + '; '.join(described(left)) if left else ''}")
        assert not left, f"processes left on the hosts: {described(left)}"


