"""The Slurm lab (``tests/slurmlab.py``) held to what a real Slurm cluster does, as the slurm backend's
tests rely on it: jobs reach the compute nodes only through the login host, steps run on each
node at its own address with its GRES GPUs, the home is shared and nothing else, sbatch refuses
what the partition cannot give in its own words, and a job waits for resources while another
holds every node."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import slurmlab
from cluster_processes import wait_until

from gpugeek_jupyter.meter import allocation

pytestmark = pytest.mark.slow


def test_steps_run_on_each_node_with_its_gpus_and_the_shared_home_alone(slurm, tmp_path):
    laptop = Path("/tmp") / f"laptop-{os.getpid()}"
    laptop.write_text("the laptop's")
    try:
        done = slurm.ssh("echo from-login > ~/mark; srun -N1 -w node1 touch /tmp/node1-mark; "
                         "srun -N2 --ntasks-per-node=1 sh -c 'echo \"$(hostname)|$(hostname -I | tr -d \" \")|"
                         f"$(cat ~/mark)|$(ls /tmp/node1-mark {laptop} 2>/dev/null | tr \"\\n\" ,)\"' | sort")
    finally:
        laptop.unlink()
    assert done.returncode == 0, done.stderr
    rows = [line.split("|") for line in done.stdout.splitlines()]
    assert [r[0] for r in rows] == ["node1", "node2"]
    assert [r[1] for r in rows] == [n.address for n in slurm.nodes], "each step at its node's address"
    assert {r[2] for r in rows} == {"from-login"}, "the home is the login host's"
    assert [r[3] for r in rows] == ["/tmp/node1-mark,", ""], "each node has a /tmp of its own, not the laptop's"
    gpus = slurm.ssh("srun -N1 --gres=gpu:2 sh -c 'echo $CUDA_VISIBLE_DEVICES'")
    assert gpus.stdout.strip() == "0,1", gpus.stdout + gpus.stderr
    python = slurm.ssh("srun -N1 python3 -c 'import importlib.util as u; print(bool(u.find_spec(\"ray\")))'")
    assert python.stdout.strip() == "False", "a compute node has no Ray of the laptop's"


def test_the_laptop_reaches_the_login_host_alone(slurm):
    with socket.create_connection((slurm.login.address, 22), timeout=3):
        pass
    for address in [slurm.controller, *(n.address for n in slurm.nodes)]:
        with pytest.raises(OSError), socket.create_connection((address, 6818), timeout=2):
            pass


@pytest.mark.parametrize("flags, said", [
    ("-p nope", "invalid partition specified: nope"),
    ("-t 120", "Requested time limit is invalid (missing or exceeds some limit)"),
    ("--gres=gpu:5", "Requested node configuration is not available"),
    ("-A nosuch", "Invalid account or account/partition combination specified"),
])
def test_sbatch_refuses_in_its_own_words_and_queues_nothing(slurm, flags, said):
    if flags.startswith("-A") and not slurm.accounting:
        pytest.skip("an account is refused where Slurm's accounting runs: make test's lab")
    done = slurm.ssh(f"sbatch {flags} --wrap true")
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert slurm.squeue() == []


def test_a_job_waits_for_resources_while_another_holds_every_node_and_scancel_ends_it(slurm):
    first = slurm.ssh("sbatch --parsable -N2 --cpus-per-task=2 --wrap 'srun sleep 300'").stdout.strip()
    second = slurm.ssh("sbatch --parsable -N1 --wrap 'sleep 300'").stdout.strip()
    try:
        # the scheduler's next pass says why the second waits (Priority until then)
        queue = wait_until(lambda: (q := {j["id"]: j for j in slurm.squeue()}) and q.get(first, {}).get("state")
                           == "RUNNING" and q.get(second, {}).get("reason") == "Resources" and q, 20,
                           "the first job running, the second pending on Resources")
        assert queue[second]["state"] == "PENDING", queue
        wait_until(lambda: all(slurm.strays(n) for n in slurm.nodes), 10, "the first job's steps on both nodes")
    finally:
        slurm.ssh(f"scancel {first} {second}")
    wait_until(lambda: not slurm.squeue(), 20, "the queue empty")
    wait_until(lambda: not any(slurm.strays(n) for n in slurm.nodes), 15, "nothing left on the nodes")
    ended = slurm.jobcomp.read_text()
    assert f"JobId={first} " in ended and "JobState=CANCELLED" in ended, ended[-500:]


def test_the_meter_reads_a_job_as_slurm_records_it_running_then_ended(slurm):
    """``meter/allocation.py`` on Slurm's own answers: ``scontrol show job`` while the job runs
    (its nodes, its start, its walltime's end) and once it has ended; Slurm's accounting (``sacct``,
    where the lab runs it) and the job completion record (``sacct -c``), what is left once the
    controller forgets the job, say the same start and end as the line ``slurmctld`` wrote."""
    job = slurm.ssh("sbatch --parsable -N2 --time=5 --wrap 'sleep 3'").stdout.strip()
    read = allocation.READ.format(job=job)
    running = wait_until(lambda: (r := allocation.parse(slurm.ssh(read).stdout)) and r.state == "RUNNING" and r,
                         20, "the job running, as scontrol says")
    assert (running.source, running.nodes, running.head) == ("scontrol", ("node1", "node2"), "node1"), running
    assert running.ended is None and running.walltime_end == running.started + 5 * 60, running
    assert [i.node_type for i in running.instances()] == ["head", "host"]
    ended = wait_until(lambda: slurm.ended(job), 30, "Slurm's record of the job's end")
    over = allocation.parse(slurm.ssh(read).stdout)
    records = [over]
    for flag, source in (("-D", "sacct"), ("-c", "jobcomp")) if slurm.accounting else (("-c", "jobcomp"),):
        ask = f"SLURM_TIME_FORMAT=%s sacct {flag} -X -n -P -j {job} -o JobID,State,Start,End,NodeList"
        records.append(wait_until(lambda ask=ask, source=source: (
            r := allocation.parse(f"{source}|" + slurm.ssh(ask).stdout.strip())) and r.state != "RUNNING" and r,
            10, f"the job's end in {allocation.SOURCES[source]}"))
        assert records[-1].source == source, records[-1]
    for record in records:
        assert (record.state, record.nodes, record.started, record.ended) == \
            ("COMPLETED", ("node1", "node2"), ended["start"], ended["end"]), (record, ended)
        assert all(i.gone and i.ended == ended["end"] for i in record.instances()), record
    assert over.elapsed(0) == ended["end"] - ended["start"] >= 3


def test_the_meter_reads_each_run_of_a_requeued_job_from_slurms_record(slurm):
    """A job requeued (``scontrol requeue``) runs again under its id: the run it ended is a line of
    Slurm's accounting (where the lab runs it) and of the job completion record, and the meter bills
    it as a run of its own, start to end as the completion record's line says, while the job waits
    to run again (pending: no current run)."""
    job = slurm.ssh("sbatch --parsable -N2 --time=5 --requeue --wrap 'sleep 60'").stdout.strip()
    read = allocation.READ.format(job=job)
    try:
        wait_until(lambda: (r := allocation.parse(slurm.ssh(read).stdout)) and r.state == "RUNNING", 20,
                   "the job running")
        time.sleep(2)     # a run of whole seconds (Slurm records seconds): its start and end differ
        assert slurm.ssh(f"scontrol requeue {job}").returncode == 0
        first = wait_until(lambda: slurm.runs(job), 20, "the requeued run's line in Slurm's record")[0]
        seen = []      # every read till the job waits to run again (a requeue passes through COMPLETING)
        pending = wait_until(lambda: (r := allocation.parse(slurm.ssh(read).stdout)) and not seen.append(r)
                             and r.state == "PENDING" and r.earlier and r, 20,
                             "the job pending again, its requeued run in Slurm's record as the meter reads it")
        assert all(i.launched == first["start"] for r in seen for i in r.instances()), \
            [r for r in seen if any(i.launched != first["start"] for i in r.instances())]   # no run made up
        assert (pending.state, pending.restarts, pending.started) == ("PENDING", 1, None), pending
        assert [(r.started, r.ended, r.nodes) for r in pending.earlier] == \
            [(first["start"], first["end"], ("node1", "node2"))], (pending, first)
        rows = pending.instances()
        assert [(i.launched, i.ended, i.gone, i.head) for i in rows] == \
            [(first["start"], first["end"], True, True), (first["start"], first["end"], True, False)], rows
        assert pending.elapsed(time.time()) == first["end"] - first["start"] > 0
        assert not pending.over
    finally:
        slurm.ssh(f"scancel {job}")
    wait_until(lambda: not slurm.squeue(), 30, "the job gone from the queue")


def test_a_requeue_passing_through_completing_is_billed_as_the_run_it_ended_alone():
    """scontrol's answer in the moment a requeue passes through COMPLETING, as the lab's showed it:
    its start the requeue's moment, its end that plus the time limit — no run; the run the requeue
    ended is sacct's line (the meter billed the made-up one once, and kept its row)."""
    answer = ("scontrol|JobId=15 JobName=wrap JobState=COMPLETING Reason=None Restarts=1 BatchHost=node1 "
              "StartTime=1796580591 EndTime=1796580891 NodeList=node1\n"
              "sacct|15|REQUEUED|1796580588|1796580591|node[1-2]\n")
    job = allocation.parse(answer)
    assert (job.state, job.started, job.nodes, job.over, job.done) == ("COMPLETING", None, (), True, False), job
    assert [(i.launched, i.ended, i.gone) for i in job.instances()] == [(1796580588.0, 1796580591.0, True)] * 2
    assert job.elapsed(1796580600.0) == 3.0


def test_the_meter_reads_a_preemption_and_the_job_hears_its_own_signal(slurm):
    """A job of the ``gpu`` partition preempted for an ``urgent`` one: ``scontrol show job`` says
    when (``PreemptTime``) and moves the job's end to the end of its grace time, and the batch step
    hears the job's own signal (``--signal=B:USR2``, sent at preemption by
    ``preempt_send_user_signal``), not a SIGTERM — what ``onhost/slurmjob.py`` passes on as a notice."""
    heard = slurm.home / "preempt-heard"
    heard.unlink(missing_ok=True)
    at = "/root/preempt-heard"           # the same file, as the nodes see the shared home
    script = f"trap 'echo USR2 > {at}' USR2; trap 'echo TERM > {at}' TERM; while true; do sleep 0.2; done"
    job = slurm.ssh(f"sbatch --parsable -N2 --time=5 --signal=B:USR2@10 -o /dev/null --wrap \"{script}\"")
    job = job.stdout.strip()
    read = allocation.READ.format(job=job)
    urgent = None
    try:
        wait_until(lambda: (r := allocation.parse(slurm.ssh(read).stdout)) and r.state == "RUNNING", 20,
                   "the job running")
        assert allocation.parse(slurm.ssh(read).stdout).preempted is None
        urgent = slurm.preempt(seconds=1)
        told = wait_until(lambda: (r := allocation.parse(slurm.ssh(read).stdout)) and r.preempted and r, 20,
                          "scontrol's word of the preemption")
        assert told.state == "RUNNING" and told.walltime_end == told.preempted + slurmlab.GRACE_S, told
        assert told.walltime_end < told.started + 5 * 60, told
        assert wait_until(lambda: heard.exists() and heard.read_text().strip(), 10, "the batch step's signal") \
            == "USR2"
    finally:
        slurm.ssh(f"scancel {job} {urgent or ''}")
    wait_until(lambda: not slurm.squeue(), 30, "the jobs gone from the queue")


@pytest.mark.parametrize("hostlist", ["node[1-2]", "node1", "gpu-a[01-03,10],login,n[7-8]", "r[1-2]n[01-02]"])
def test_a_host_list_reads_as_scontrol_expands_it(slurm, hostlist):
    said = slurm.ssh(f"scontrol show hostnames '{hostlist}'")
    assert said.returncode == 0, said.stderr
    assert allocation.expand(hostlist) == tuple(said.stdout.split()), (said.stdout, said.stderr)
