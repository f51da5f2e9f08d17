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
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.group import orphans, workergroup
from gpugeek_jupyter.group.driver import RayDriver
from gpugeek_jupyter.meter import ledger

pytestmark = pytest.mark.slow

STEPS = 12
CELL = f"""
import time, torch
torch.manual_seed(0)
w = torch.zeros(3)
for step in range(1, {STEPS} + 1):
    w += torch.arange(3.0) * step
    gg.log(loss=float(w.sum()))
    print("step", step, flush=True)
    time.sleep(PAUSE)
final = w.tolist()
"""
# a job that runs until the test opens its gate (a file the local workers see)
GATED = """
import os, time
step = 0
while not os.path.exists(GATE):
    step += 1
    gg.log(loss=float(step))
    print("step", step, flush=True)
    time.sleep(0.5)
"""


def _uninterrupted() -> list:
    """``final`` of a run of ``CELL`` nobody interrupted: its arithmetic is plain and deterministic, so
    it is worked out here, without its pauses (and without a cluster)."""
    import contextlib
    import io
    import types

    scope = {"gg": types.SimpleNamespace(log=lambda **_: None)}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(CELL.replace("PAUSE", "0"), scope)
    return scope["final"]


def test_a_job_outlives_its_kernel_and_another_kernel_attaches(gpugeek_home):
    # on a rehearsal cluster, a head process of its own as a remote cluster's is (attaching to a
    # local cluster is the same code: the cluster's record, then the job's group). Its workers on
    # CPUs: a one-GPU rehearsal node holds one GPU worker.
    up = "gg.up('held', backend='sim', gpu='A100', count=1)"
    kernel = subprocess.Popen(
        [sys.executable, "-c", f"import gpugeek_jupyter as gg\n{up}\nprint('up-done', flush=True)\n"
                               f"gg.run({CELL.replace('PAUSE', '1.0')!r}, workers=2, pull=['final'], name='held', "
                               f"gpus_per_worker=0)\n"],
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
        # another kernel lists the job, then (one process, one connection: not a new one per look)
        # sees it finish
        listed = new_kernel(
            "import json, time\nimport gpugeek_jupyter as gg\n"
            "def row():\n    return json.loads(gg.jobs('held').to_json(orient='records'))[0]\n"
            "print(json.dumps(first := row()), flush=True)\ndeadline = time.monotonic() + 60\n"
            "while (last := row())['state'] != 'finished' and time.monotonic() < deadline:\n"
            "    time.sleep(0.5)\n"
            "print(json.dumps(last))", gpugeek_home)
        assert listed.returncode == 0, listed.stderr[-3000:]
        row, last = (json.loads(line) for line in listed.stdout.strip().splitlines()[-2:])
        # running, unless a busy machine took longer to start the new kernel than the job had left
        assert row["name"] == "held" and row["state"] in ("running", "finished"), row
        assert last["state"] == "finished", last
        attached = new_kernel(
            "import gpugeek_jupyter as gg\nfrom gpugeek_jupyter.cells import attach\nseen = []\n"
            "class Monitor:\n    def __init__(self, **job): pass\n"
            "    def update(self, samples): seen.extend(samples)\n"
            "    def finish(self, status): print('monitor', status, flush=True)\n"
            f"r = attach.attach({row['job']!r}, 'held', adopt=True, watch=Monitor)\n"
            "print('pulled', r.pulled['final'])\n"
            "print('curve', sorted(s['rank'] for s in seen for _ in s.get('logged', {}).get('loss', [])))\n"
            # the adopted group runs this kernel's next cell: the dead kernel's variables are there
            "print('kept', gg.run('(step, w.tolist())', workers=2, gpus_per_worker=0).shown())\n"
            "print(gg.jobs('held').to_json(orient='records'))", gpugeek_home)
        assert attached.returncode == 0, attached.stderr[-3000:]
        out = attached.stdout.splitlines()
        assert [int(x.split()[1]) for x in out if x.startswith("step ")] == list(range(1, STEPS + 1)), out
        plain = _uninterrupted()
        assert next(x for x in out if x.startswith("pulled")) == f"pulled {plain}"
        assert f"note: this kernel's cells now run on job {row['job']!r}'s worker group, with its variables" in out
        assert next(x for x in out if x.startswith("kept")) == f"kept ({STEPS}, {plain})"
        # the monitor had the whole curve, from before this kernel came: every step of both ranks
        assert "monitor finished" in out
        assert next(x for x in out if x.startswith("curve")) == f"curve {[0] * STEPS + [1] * STEPS}"
        # the ledger here says the job ended when the cluster says it did: its $ stop there
        job = next(j for j in ledger.jobs_of(record.id) if j["job_id"] == row["job"])
        assert job["status"] == "finished" and job["ended"] is not None
        assert job["ended"] <= time.time()
    finally:
        if kernel.poll() is None:
            kernel.kill()
        if registry.live("held") is not None:
            gg.down("held")


LONG = """
import time
for step in range(1, 2001):
    print("step", step, flush=True)
    time.sleep(0.1)
"""
STOPPED_WITHIN_S = 3.0
# a notebook kernel's stop button: SIGINT raises KeyboardInterrupt (ipykernel sets that handler); a
# process started in the background (``make test &``) inherits SIGINT ignored, so set it as a kernel does
STOP_BUTTON = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def test_interrupt_stops_a_running_job_within_3_s_from_its_kernel_and_from_one_that_attached(gpugeek_home):
    """SIGINT is the stop button of a kernel process. Timed from the signal to the moment the
    cluster's own list (``jobs``, read by this process) calls the job interrupted."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", f"{STOP_BUTTON}import gpugeek_jupyter as gg\ngg.up('intr')\n"
                               f"for name in ('first', 'second'):\n"
                               f"    try:\n        gg.run({LONG!r}, workers=2, name=name)\n"
                               f"    except Exception as exc:\n        print('said', name, exc, flush=True)\n"
                               # it stays until the test has read rank 0's word: a kernel that
                               # exits takes its group along
                               f"import sys\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    attached = None
    try:
        def running(name: str, after: int, behind: str | None = None) -> dict:
            while True:                 # (the steps of a cell before ``behind`` do not count)
                line = kernel.stdout.readline()
                assert line, kernel.stderr.read()[-3000:]
                behind = None if behind is not None and line.startswith(behind) else behind
                if behind is None and line.startswith("step ") and int(line.split()[1]) >= after:
                    break
            return next(j for j in gg.jobs("intr").to_dict("records") if j["name"] == name)

        def lead():
            import ray

            from gpugeek_jupyter.group.orphans import NAMESPACE

            (names,) = RayDriver().groups().values()              # the one group on this cluster
            return ray.get_actor(names[0], namespace=NAMESPACE)

        def stopped_after(job: dict, signalled: float, lead) -> float:
            """Rank 0's own word (``state``), asked directly: the observer costs one actor call."""
            import ray

            seen = {}

            def stopped() -> bool:
                seen.update(ray.get(lead.state.remote(), timeout=10))
                return (seen["job"] or {}).get("id") != job["job"] or not seen["running"]

            try:
                wait_until(stopped, 10, "the job to stop")
            except AssertionError:
                for proc in (kernel, attached):
                    if proc is not None:
                        proc.kill()
                told = [proc.communicate(timeout=30)[1][-3000:] for proc in (kernel, attached) if proc is not None]
                raise AssertionError(f"the job did not stop: rank 0 says {seen}; the kernels said {told}") from None
            return time.monotonic() - signalled

        first = running("first", 3)
        rank0 = lead()
        signalled = time.monotonic()
        kernel.send_signal(signal.SIGINT)
        from_own = stopped_after(first, signalled, rank0)
        second = running("second", 3, behind="said first")
        attached = subprocess.Popen(
            [sys.executable, "-c", f"{STOP_BUTTON}import gpugeek_jupyter as gg\n"
                                   f"gg.attach({second['job']!r}, 'intr')\n"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        while not attached.stdout.readline().startswith("step "):
            pass                                   # it follows the job now
        signalled = time.monotonic()
        attached.send_signal(signal.SIGINT)
        from_attached = stopped_after(second, signalled, rank0)
        states = {j["name"]: j["state"] for j in gg.jobs("intr").to_dict("records")}
        print(f"interrupt → stopped: {from_own:.2f} s from its kernel, {from_attached:.2f} s from an attached one")
        assert states == {"first": "interrupted", "second": "interrupted"}, states
        assert from_own <= STOPPED_WITHIN_S and from_attached <= STOPPED_WITHIN_S, (from_own, from_attached)
        assert "Interrupted" in attached.communicate(timeout=30)[1]
        said = kernel.communicate(timeout=30)[0]      # ("said first" was read on the way to the second)
        assert "said second interrupted" in said, said
    finally:
        for proc in (kernel, attached):
            if proc is not None and proc.poll() is None:
                proc.kill()
        if registry.live("intr") is not None:
            gg.down("intr")


def test_a_gone_kernels_group_is_kept_for_attach_until_a_new_group_needs_its_room(
        gpugeek_home, tmp_path, capsys, monkeypatch):
    """Nobody adopted it. A new group that finds no room says which job holds it while it runs;
    once it ended the group is kept for `attach`, until a new group needs its room — then it is
    removed, and says so: its workers' processes, seen by pid, end. Never before its job ended."""
    import psutil

    gate = tmp_path / "left-may-end"
    kernel = subprocess.Popen(
        [sys.executable, "-c", "import gpugeek_jupyter as gg\ngg.up('orph')\n"
                               "gg.run('import os\\nprint(\"pid\", os.getpid())', workers=2, all_ranks=True)\n"
                               f"gg.run({GATED.replace('GATE', repr(str(gate)))!r}, workers=2, name='left')\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pids = []
        while True:
            line = kernel.stdout.readline()
            assert line, kernel.stderr.read()[-3000:]
            pids += [int(line.split()[-1])] if line.startswith("[rank ") and " pid " in line else []
            if line.startswith("step 2"):
                break
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(10)

        def ended(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        assert len(pids) == 2 and not any(ended(pid) for pid in pids), pids
        job = gg.jobs("orph").set_index("name").loc["left", "job"]
        # the cluster's 2 CPUs are the gone kernel's: a 1-worker group finds no room (waiting 3 s here)
        waits = workergroup.READY_TIMEOUT_S
        monkeypatch.setattr(workergroup, "READY_TIMEOUT_S", 3.0)
        capsys.readouterr()
        with pytest.raises(GpugeekError) as refused:       # while its job runs
            gg.run("1", workers=1)
        said = capsys.readouterr().out
        assert f"note: waiting for room on the cluster: job 'left' ({job}) of kernel " in said, said
        assert "(gone) runs on 2 workers, at step " in str(refused.value), refused.value
        gate.touch()                                         # its job may end now
        wait_until(lambda: gg.jobs("orph").set_index("name").loc["left", "state"] == "finished", 60,
                   "the gone kernel's job to finish")
        # ended, nobody attached: kept for `attach` through its window while no cell needs the room
        assert orphans.reclaim(RayDriver()) == [] and not any(ended(pid) for pid in pids)
        monkeypatch.setattr(workergroup, "READY_TIMEOUT_S", waits)   # the usual wait for room
        assert gg.run("1", workers=1).shown() == 1           # this cell needs the room: it goes
        said = capsys.readouterr().out
        assert "note: removed the worker group of a kernel that is gone" in said, said
        assert "job 'left' ended at " in said and " and nobody took it over; this cell needed its room" in said, said
        wait_until(lambda: all(ended(pid) for pid in pids), 15, "the gone kernel's workers to end")
    finally:
        if kernel.poll() is None:
            kernel.kill()
        if registry.live("orph") is not None:
            gg.down("orph")


def test_a_kernel_that_moves_to_another_cluster_or_exits_takes_its_group_along(gpugeek_home):
    """Moved to another cluster, shut down or restarted, a kernel leaves no workers behind (only
    one that dies does): its workers' processes on each cluster, seen by pid, end with it."""
    import psutil

    cell = "gg.run('import os\\nprint(\"pid\", os.getpid())', workers=2, all_ranks=True)\n"
    said = new_kernel(f"import gpugeek_jupyter as gg\ngg.up('leaves')\n{cell}gg.up('moved')\n{cell}", gpugeek_home)
    try:
        assert said.returncode == 0, said.stderr[-3000:]
        pids = [int(line.split()[-1]) for line in said.stdout.splitlines() if line.startswith("[rank ")]
        assert len(pids) == 4, said.stdout        # two on the cluster it left, two on the one it exited on
        wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                   for p in pids), 15, "the kernel's workers on both clusters to end")
    finally:
        for name in ("leaves", "moved"):
            if registry.live(name) is not None:
                gg.down(name)
