"""The lid closed on a running job: a cell on the lab's three hosts, then its kernel SIGSTOPped (as
a sleeping laptop's is) and the laptop's link cut for 120 s — past Ray Client's 30 s grace. The
job goes on on the hosts (its workers belong to the cluster), and once the kernel wakes and the
link is back, the same cell picks up: it shows what it missed and ends with the same pulled
values as a run nobody interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from cluster_processes import kernel_line, settings
from models import logged_steps

from gpugeek_jupyter.cluster import registry

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_LID"), reason="the lid closed for two minutes takes five: `make lid` runs it "
    "(make test rides out a cut past the tunnel's keepalive in test_head_guard.py)")]

STEPS = 150
PAUSE_S = 1.0          # a step's pause: the job takes STEPS × PAUSE_S
ASLEEP_S = 120.0       # the kernel stopped and the link cut this long
GAP_LIMIT_S = 5.0      # no gap between two steps on the hosts longer than this
CHECKPOINT_EVERY = 10  # steps: a checkpoint into the cluster's S3 storage, written during the cut too
KERNEL = """
import sys, time, torch, gpugeek_jupyter as gg
gg.up('lid', backend='ssh', hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour=3.6,
      pip_index_url={index!r}, storage='s3://lab/lid')
plain = gg.run({plain!r}, workers=3, pull=['final_step', 'weights'], checkpoint_every={every}, name='uncut')
print('up-done', flush=True)
began = time.time()
run = gg.run({cell!r}, workers=3, pull=['final_step', 'weights'], checkpoint_every={every}, name='lid')
print('ended', time.time() - began, flush=True)
same = run.pulled['final_step'] == plain.pulled['final_step'] and all(
    torch.equal(a, b) for a, b in zip(run.pulled['weights'], plain.pulled['weights']))
print('pulled', run.pulled['final_step'], 'same' if same else 'DIFFERENT', flush=True)
"""


@pytest.mark.timeout(900)
def test_the_lid_closed_for_two_minutes_the_job_goes_on_and_the_cell_picks_up(lab, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=1.0)
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    log = "/tmp/gpugeek-lid-steps.log"
    for host in lab.hosts:
        host.file(log).unlink(missing_ok=True)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL.format(
            hosts=hosts, key=str(lab.key), index=lab.index_url, every=CHECKPOINT_EVERY,
            plain=logged_steps(STEPS, 0, shown=True, log="/dev/null"),
            cell=logged_steps(STEPS, PAUSE_S, shown=True, log=log))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)})
    said: list[str] = []
    passed = False
    try:
        kernel_line(kernel, "up-done", 300, said)
        kernel_line(kernel, "step 20", 60, said)
        kernel.send_signal(signal.SIGSTOP)        # the lid closes: the laptop sleeps, then its network goes
        lab.cut_laptop()
        asleep, cut_at = time.monotonic(), time.time()
        try:
            time.sleep(ASLEEP_S)                  # the lid stays closed this long: nothing to poll for
        finally:
            lab.reconnect_laptop()
            back_at = time.time()
            kernel.send_signal(signal.SIGCONT)
        print(f"\nthe kernel slept and the link was cut for {time.monotonic() - asleep:.0f} s")
        ended = kernel_line(kernel, "ended", STEPS * PAUSE_S + 180, said)
        pulled = kernel_line(kernel, "pulled", 60, said)
        print("\n".join(line for line in said if not line.startswith("step ")))
        assert pulled == f"pulled {STEPS} same", pulled
        written = next(h.file(log) for h in lab.hosts if h.file(log).exists())     # rank 0's host
        steps = [(int(a), float(b)) for a, b in (line.split() for line in written.read_text().splitlines())]
        numbers = [s for s, _ in steps]
        assert numbers == list(range(1, STEPS + 1)), "steps were repeated or skipped: a resume, or a lost stretch"
        gaps = [b - a for (_, a), (_, b) in pairwise(steps)]
        print(f"{ended}; the longest gap between two steps on the hosts: {max(gaps):.2f} s")
        assert max(gaps) <= GAP_LIMIT_S, f"the job stalled on the hosts for {max(gaps):.1f} s"
        after = said[said.index("up-done") + 1:]            # the uncut run before it printed its steps too
        shown = [int(line.split()[1]) for line in after if line.startswith("step ")]
        assert shown == list(range(1, STEPS + 1)), "the cell did not show every step (the missed ones included)"
        assert any("out of reach; the job goes on there" in line or ("dropped" in line and "dialled again" in line)
                   for line in said), "the kernel said nothing of the cut"
        # the checkpoints: one every CHECKPOINT_EVERY steps in the cluster's S3, those of the cut
        # written while the laptop was away; none read back (no "resumed from" in the cell)
        written_at = _checkpoints(lab, "lid/checkpoints/lid/")
        during = [step for step, at in written_at.items() if cut_at <= at <= back_at]
        print(f"checkpoints at steps {sorted(written_at)}; {len(during)} written during the cut")
        assert sorted(written_at) == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)), written_at
        assert len(during) >= (ASLEEP_S / PAUSE_S) // CHECKPOINT_EVERY - 1, (during, cut_at, back_at)
        assert not any("resumed from" in line for line in said), said
        passed = True
    finally:
        if not passed:
            print(f"the hosts' Ray logs: {lab.keep_logs(Path('artifacts') / 'lid-logs')}")
        if kernel.poll() is None:
            kernel.send_signal(signal.SIGCONT)
            kernel.kill()
        kernel.wait(10)
        if registry.live("lid") is not None:
            lab.reconnect_laptop()
            import gpugeek_jupyter as gg
            gg.down("lid")



def _checkpoints(lab, prefix: str) -> dict[int, float]:
    """Each checkpoint's step and when it was complete (its last object's time), from the S3
    server itself."""
    import boto3

    client = boto3.client("s3", endpoint_url=lab.env["AWS_ENDPOINT_URL"], aws_access_key_id="lab",
                          aws_secret_access_key="lab", region_name="us-east-1")
    written: dict[int, float] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="lab", Prefix=prefix):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix):].split("/")[0]          # step-000010
            if name.startswith("step-"):
                step = int(name.split("-")[1])
                written[step] = max(written.get(step, 0.0), item["LastModified"].timestamp())
    return written
