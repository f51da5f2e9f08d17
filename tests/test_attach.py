"""A job belongs to the cluster, not to the kernel that started it: a kernel SIGKILLed mid-job, the
job finishes on the cluster; a new kernel lists it (``jobs``) and follows it (``attach``): its
output from the start and its pulled variables, equal to those of a run nobody interrupted. The
same on a local and a ``sim`` cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cluster_processes import new_kernel, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import ledger

pytestmark = pytest.mark.slow

STEPS = 12
CELL = f"""
import time, torch
torch.manual_seed(0)
w = torch.zeros(3)
for step in range(1, {STEPS} + 1):
    w += torch.arange(3.0) * step
    print("step", step, flush=True)
    time.sleep(PAUSE)
final = w.tolist()
"""


@pytest.mark.parametrize("backend", ["local", "sim"])
def test_a_job_outlives_its_kernel_and_another_kernel_attaches(gpugeek_home, backend):
    up = f"gg.up('held', backend={backend!r}" + (", gpu='A100', count=1)" if backend == "sim" else ")")
    kernel = subprocess.Popen(
        [sys.executable, "-c", f"import gpugeek_jupyter as gg\n{up}\nprint('up-done', flush=True)\n"
                               f"gg.run({CELL.replace('PAUSE', '0.5')!r}, workers=2, pull=['final'], name='held')\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        said = []
        while not any("step 3" in line for line in said):
            line = kernel.stdout.readline()
            assert line, kernel.stderr.read()[-3000:]
            said.append(line)
        kernel.send_signal(signal.SIGKILL)       # mid-job: the kernel is gone, its job is not
        kernel.wait(10)
        record = registry.live("held")
        listed = new_kernel("import gpugeek_jupyter as gg\nprint(gg.jobs('held').to_json(orient='records'))",
                            gpugeek_home)
        assert listed.returncode == 0, listed.stderr[-3000:]
        row = json.loads(listed.stdout.strip().splitlines()[-1])[0]
        assert row["name"] == "held" and row["state"] == "running", row
        wait_until(lambda: json.loads(new_kernel(
            "import gpugeek_jupyter as gg\nprint(gg.jobs('held').to_json(orient='records'))",
            gpugeek_home).stdout.strip().splitlines()[-1])[0]["state"] == "finished", 60, "the job to finish")
        attached = new_kernel(
            "import gpugeek_jupyter as gg\n"
            f"r = gg.attach({row['job']!r}, 'held')\nprint('pulled', r.pulled['final'])\n"
            "print(gg.jobs('held').to_json(orient='records'))", gpugeek_home)
        assert attached.returncode == 0, attached.stderr[-3000:]
        out = attached.stdout.splitlines()
        assert [int(x.split()[1]) for x in out if x.startswith("step ")] == list(range(1, STEPS + 1)), out
        plain = gg.run(CELL.replace("PAUSE", "0"), workers=1, pull=["final"])
        assert next(x for x in out if x.startswith("pulled")) == f"pulled {plain.pulled['final']}"
        # the ledger here says the job ended when the cluster says it did: its $ stop there
        job = next(j for j in ledger.jobs_of(record.id) if j["job_id"] == row["job"])
        assert job["status"] == "finished" and job["ended"] is not None
        assert job["ended"] <= time.time()
    finally:
        if kernel.poll() is None:
            kernel.kill()
        if registry.live("held") is not None:
            gg.down("held")
