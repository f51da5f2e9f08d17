"""A Slurm cluster: one allocation, submitted from the login node, holding a warm Ray.

What a university's HPC centre or a GPU cloud's Slurm hands out is a login node you SSH to and
compute nodes behind it, reached through the scheduler. ``up`` logs in to the login node, makes
the runtime in the cluster's shared home from there (with the package index you name: compute
nodes often have no internet), writes the host script, the cluster's token and the batch script
beside it, submits it and waits while it is pending, saying the queue's own reason. Once the job
runs, Ray, the head's watchdog and the keeper stay in the foreground of its steps
(``onhost/slurmjob.py``), so the scheduler sees every process and ends them all with the job; they
use ports free on the first node and a temp dir of the job's own, so two clusters — or two users
— share nodes without colliding, and nothing of ours ever stops every Ray on a node.

The kernel reaches the head through the login node: ``ssh -L`` to the head node's address, where
the keeper listens behind the cluster's token (compute nodes never connect back, and no SSH to a
compute node is needed, which clusters without ``pam_slurm_adopt`` do not allow). ``down`` is
``scancel``, checked until ``squeue`` no longer lists the job.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from types import MappingProxyType

from ..cluster import processes, registry
from ..cluster.registry import ClusterRecord
from ..cluster.remote import Allocated, Found, Guarded, LineOpened, Submitted, learn
from ..cluster.spec import ClusterSpec
from ..config import settings
from ..errors import GpugeekError
from ..meter import allocation, ledger
from ..raynodes import HEAD_ENV, LINK_CONFIG, NODE_ENV, read_nodes, token_text
from ..remote import headguard, runtime, ssh, tunnel
from . import readiness
from .base import REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started
from .hosts import GCS_PORT, KEEPER_PORT, START_TIMEOUT_S

SLURMJOB = ssh.ONHOST.with_name("slurmjob.py")    # the job's side, beside the host script it uses
POLL_S = 2.0               # how often a pending job is looked at
STOPPED_WITHIN_S = 60.0    # `down`: until squeue no longer lists the job
HEAD_WITHIN_S = 180.0      # a running job: until its first node says where Ray's head listens
# squeue's reasons that no wait will clear (Slurm's "JOB REASON CODES"): the job is cancelled and said
NEVER = ("PartitionTimeLimit", "PartitionNodeLimit", "PartitionConfig", "BadConstraints", "InvalidAccount",
         "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "QOSMaxWallDurationPerJobLimit", "JobHeldAdmin",
         "DependencyNeverSatisfied", "ReqNodeNotAvail, UnavailableNodes")


SHOWN_DIR = "~/.gpugeek/clusters/<tag>"      # a shown script's folder, before `up` names the cluster's


def node_dir(record: ClusterRecord) -> str:
    """The cluster's folder in the shared home: the host script, the token, the batch script,
    the head's word (``job-ID.json``) and the job's log."""
    return f"~/.gpugeek/clusters/{hashlib.sha1(record.marker.encode()).hexdigest()[:8]}"


def login(spec: ClusterSpec) -> ssh.Target:
    return ssh.parse_hosts([spec.slurm.login])[0]


def on_login(spec: ClusterSpec, command: str, stdin: str | bytes | None = None, timeout: float = 60):
    """``command`` on the login node, in a login shell (the user's modules and Slurm's paths)."""
    return ssh.run(login(spec), spec.remote.ssh_key, f"bash -lc {shlex.quote(command)}", stdin, timeout)


def prepare(spec: ClusterSpec) -> None:
    """The login node answers, has Slurm's commands, and the runtime is made in the shared home
    from there (what every compute node runs Ray with), before anything is recorded or submitted."""
    done = on_login(spec, f"{spec.slurm.setup or 'true'} >/dev/null && command -v sbatch squeue scancel")
    if done.returncode != 0 or len(done.stdout.split()) < 3:
        raise GpugeekError(f"{login(spec)}: no Slurm there (sbatch, squeue and scancel not found) — "
                           f"--login names the cluster's login node")
    answers = runtime.ready(spec)
    learn(spec, Found(pythons=tuple(a["python"] for a in answers), ips=()))


def batch_script(name: str, folder: str, spec: ClusterSpec) -> str:
    """The job: sbatch's options from the flags (its log beside the script: the job starts in the
    folder it was submitted from), then the host script on the first node."""
    job = spec.slurm
    lines = ["#!/bin/bash", f"#SBATCH --job-name=gg-{name}", f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --output=job-%j.log"]
    # a requeued job runs the script again under the same id: its log goes on, not over
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if job.requeue else ["#SBATCH --no-requeue"]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{job.gpu_type + ':' if job.gpu_type else ''}{job.gpus_per_node}")
    for flag, value in (("cpus-per-task", job.cpus_per_node), ("time", job.time_min), ("partition", job.partition),
                        ("account", job.account), ("qos", job.qos), ("constraint", job.constraint)):
        if value is not None:
            lines.append(f"#SBATCH --{flag}={value}")
    if "--signal" not in (job.sbatch or ""):
        # the job's notice, before its walltime (the partition's, without --time) and where the
        # scheduler preempts it with the job's signal: the batch step (slurmjob.py) hears it, and
        # every node of the cluster is told
        lines.append(f"#SBATCH --signal=B:USR2@{allocation.NOTICE_S}")
    lines += [f"#SBATCH {option}" for option in shlex.split(job.sbatch or "")]
    python = spec.remote.pythons[0] if spec.remote.pythons else runtime.python_on_host()
    lines += ["set -e", *(job.setup.splitlines() if job.setup else []),
              f"exec {python} {folder}/slurmjob.py {folder}/job.json", ""]
    return "\n".join(lines)


def job_order(record: ClusterRecord, spec: ClusterSpec) -> dict:
    """What ``slurmjob.py`` runs on the allocation's first node."""
    folder, job = node_dir(record), spec.slurm
    tag = hashlib.sha1(record.marker.encode()).hexdigest()[:8]
    base = {"marker": record.marker, "token_path": f"{folder}/auth_token", "node_type": "host",
            "cpus": job.cpus_per_node, "timeout": START_TIMEOUT_S}
    guard = headguard.order(record, spec, settings().meter_interval_s, ip="{head_ip}", gcs_port=GCS_PORT,
                            temp_dirs={}, token_path=f"{folder}/auth_token", keeper_port=KEEPER_PORT,
                            index_url=spec.remote.pip_index_url)
    guard["scheduled"] = True
    return {"temp_dir": f"/tmp/gg-{tag}-{{job}}", "timeout": START_TIMEOUT_S,
            "head": {**base, "gpus": job.gpus_per_node, "port": GCS_PORT, "keeper_port": KEEPER_PORT,
                     "free_ports": True, "env": HEAD_ENV, "system_config": LINK_CONFIG},
            "worker": {**base, "env": NODE_ENV},
            "step_flags": [f"--gres=gpu:{job.gpus_per_node}"] if job.gpus_per_node else [],
            "guard": guard}


def node_files(record: ClusterRecord, spec: ClusterSpec) -> bytes:
    """The cluster's folder as a tar: the host script, the token (0600), the head watchdog's
    package, the order and the batch script."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name: str, data: bytes, mode: int = 0o600) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))

        add("onhost.py", ssh.host_script().encode())
        add("slurmjob.py", SLURMJOB.read_bytes())
        add("auth_token", token_text().encode())
        add("job.json", json.dumps(job_order(record, spec)).encode())
        add("job.sh", batch_script(record.name, node_dir(record), spec).encode(), 0o700)
        for file in headguard.head_files():
            add(f"package/{headguard.PACKAGE.name}/{file}", (headguard.PACKAGE / file).read_bytes())
    return buffer.getvalue()


def _accounts(spec: ClusterSpec) -> str:
    """The accounts Slurm's accounting knows for the user, said beside a refused ``--account``
    (nothing, where the login node does not answer that)."""
    try:
        done = on_login(spec, "sacctmgr -n -P show assoc user=$USER format=account 2>/dev/null", timeout=30)
    except GpugeekError:
        return ""
    names = sorted({a.strip() for a in done.stdout.split() if a.strip()}) if done.returncode == 0 else []
    return f" (--account: yours here are {', '.join(names)})" if names else ""


def submit(record: ClusterRecord, spec: ClusterSpec) -> str:
    """The cluster's folder written to the shared home and the job submitted: its id, or sbatch's
    own words in one line (nothing is then queued)."""
    folder = node_dir(record)
    done = on_login(spec, f"umask 077 && mkdir -p {folder} && tar -C {folder} -xf - && "
                          f"cd {folder} && sbatch --parsable job.sh", node_files(record, spec), timeout=120)
    said = done.stdout.decode(errors="replace").strip() if isinstance(done.stdout, bytes) else done.stdout.strip()
    err = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
    if done.returncode != 0 or not re.fullmatch(r"\d+(;\S+)?", said.splitlines()[-1] if said else ""):
        words = [line.removeprefix("sbatch: error: ").strip() for line in err.splitlines() if "error" in line]
        accounts = _accounts(spec) if "Invalid account" in err else ""
        raise GpugeekError(f"Slurm refused the job: {'; '.join(words) or err.strip()[-300:] or 'no answer'}{accounts}"
                           " — fix what it names (--partition, --account, --time, --nodes) and `up` again")
    return said.splitlines()[-1].split(";")[0]


def queue_state(spec: ClusterSpec, job: str) -> dict | None:
    """The job as ``squeue`` lists it (state, reason, nodes, partition, its place among the pending
    jobs of its partition), or None once it is no longer listed."""
    done = on_login(spec, f"squeue -h -j {job} -o '%T|%r|%D|%P' 2>/dev/null; echo ---; "
                          f"squeue -h -t PD -o '%i|%P' --sort=-p,i 2>/dev/null")
    mine, _, pending = done.stdout.partition("---")
    rows = [line.split("|") for line in mine.splitlines() if line.count("|") == 3]
    if not rows:
        return None
    state, reason, nodes, partition = rows[0]
    ahead = [line.split("|")[0] for line in pending.splitlines() if line.endswith(f"|{partition}")]
    position = ahead.index(job) + 1 if job in ahead else None
    return {"state": state, "reason": reason, "nodes": nodes, "partition": partition, "position": position}


def wait_running(record: ClusterRecord, spec: ClusterSpec, job: str, say=print) -> None:
    """Until the job runs, saying each change of the queue's reason; a reason that cannot clear,
    or a job that ended before it ran, is one line (the caller's stop then cancels it)."""
    last = None
    while True:
        state = queue_state(spec, job)
        if state is None:
            raise GpugeekError(f"Slurm job {job} ended before Ray started: {_log_tail(record, spec, job)} — `sacct -j "
                               f"{job}` says why")
        if state["state"] == "RUNNING":
            return
        if state["state"] == "PENDING":
            line = _pending(job, state)
            if state["reason"] in NEVER or state["reason"].startswith("AssocGrp"):
                raise GpugeekError(f"{line}: Slurm will not run it as asked — change the flags that ask for it")
            if line != last:
                say(line, flush=True)
                last = line
        elif state["state"] not in ("CONFIGURING", "COMPLETING"):
            raise GpugeekError(f"Slurm job {job} is {state['state']} ({state['reason']}): "
                               f"{_log_tail(record, spec, job)} — `sacct -j {job}` says why; `up` again")
        time.sleep(POLL_S)


def _pending(job: str, state: dict) -> str:
    """The queue's own words for a pending job: ``pending (Resources) — 2 nodes on gpu, position 3``."""
    place = f", position {state['position']} in the queue" if state["position"] else ""
    why = f" ({state['reason']})" if state["reason"] not in ("None", "") else ""
    return (f"Slurm job {job}: pending{why} — {state['nodes']} node{'s' if state['nodes'] != '1' else ''} on "
            f"{state['partition']}{place}")


def head_of(record: ClusterRecord, spec: ClusterSpec, job: str, within: float = HEAD_WITHIN_S) -> dict:
    """Where the job's first node says Ray's head and the keeper listen (``job-ID.json``)."""
    deadline = time.monotonic() + within
    while True:
        if (answer := _word(record, spec, job)) is not None:
            if not answer.get("ok"):
                raise GpugeekError(f"Slurm job {job}: {answer.get('error')} — the job's log: "
                                   f"{node_dir(record)}/job-{job}.log on the login node")
            return answer
        if queue_state(spec, job) is None or time.monotonic() > deadline:
            raise GpugeekError(f"Slurm job {job}: Ray's head did not start ({_log_tail(record, spec, job)}) — read "
                               "the job's log, then `up` again")
        time.sleep(1.0)


def _log_tail(record: ClusterRecord, spec: ClusterSpec, job: str) -> str:
    done = on_login(spec, f"tail -n 3 {node_dir(record)}/job-{job}.log 2>/dev/null")
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return f"its log ends {'; '.join(lines)!r}" if lines else f"no log at {node_dir(record)}/job-{job}.log"


def cancel(record: ClusterRecord, spec: ClusterSpec, within: float = STOPPED_WITHIN_S) -> None:
    """``scancel`` the job (every step with it), then look until ``squeue`` no longer lists it."""
    job = spec.remote.job_id
    done = on_login(spec, f"scancel {job}")
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise GpugeekError(f"scancel {job} failed on {login(spec)}: {done.stderr.strip()[-300:]} — run `scancel "
                           f"{job}` there yourself")
    deadline = time.monotonic() + within
    while (state := queue_state(spec, job)) is not None:
        if time.monotonic() > deadline:
            raise GpugeekError(f"Slurm job {job} is still {state['state']} {within:.0f} s after scancel — look with "
                               f"`squeue -j {job}`; `down` again")
        time.sleep(1.0)


def _word(record: ClusterRecord, spec: ClusterSpec, job: str) -> dict | None:
    """What the job's latest run said of its head (``job-ID.json``), or None before it said."""
    done = on_login(spec, f"cat {node_dir(record)}/job-{job}.json 2>/dev/null")
    try:
        return json.loads(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    except ValueError:
        return None


def _allocated(answer: dict, spec: ClusterSpec) -> Allocated:
    """What a run's word (``job-ID.json``) and Slurm's record say of the allocation's head."""
    told = read_job(spec)
    return Allocated(ips=(answer["ip"],), temp_dirs=(answer["temp_dir"],), head_ip=answer["ip"],
                     gcs_port=answer["port"], keeper_port=answer["keeper_port"], keeper_host=answer["ip"],
                     walltime_end=told.walltime_end if told is not None else None,
                     restarts=int(answer.get("restart") or 0))


def follow(record: ClusterRecord) -> ClusterRecord | None:
    """A requeued job runs again under the same id, on an allocation of its own: once its new run
    says where Ray's head is, the record learns it and the tunnel goes there (``tunnel.moved``).
    None while the job has not moved (pending, or its head still starting). Done by whichever
    of the kernel and the watchdog here finds it first."""
    with tunnel.held(record):
        record = registry.get(record.id)
        spec = ClusterSpec.from_json(record.spec)
        job = spec.remote.job_id
        if not job or not record.live:
            return None
        answer = _word(record, spec, job)
        restart = int((answer or {}).get("restart") or 0)
        if answer is None or restart <= spec.remote.restarts:
            return None
        if not answer.get("ok"):
            raise GpugeekError(f"Slurm job {job} runs again, but {answer.get('error')} — the job's log: "
                               f"{node_dir(record)}/job-{job}.log on the login node")
        moved = tunnel.moved(record, _allocated(answer, spec))
    ledger.event(record.id, "head-moved", f"Slurm job {job} runs again (requeued {restart} time"
                 f"{'s' if restart != 1 else ''}) with its head on {answer['node']}: reached through "
                 f"{spec.slurm.login} again")
    return moved


def wait_requeued(record: ClusterRecord, say=print) -> ClusterRecord:
    """Until the requeued job runs again and every node of it is in Ray's table, saying the queue's
    reason as it changes: the record then. A job that ends instead is one line."""
    spec = ClusterSpec.from_json(record.spec)
    job, last = spec.remote.job_id, None
    while True:
        moved = follow(record)
        fresh = registry.get(record.id)
        if moved is None and ClusterSpec.from_json(fresh.spec).remote.restarts > spec.remote.restarts:
            moved = fresh       # this machine's watchdog followed it first
        if moved is not None:
            SlurmBackend().wait_ready(moved, ClusterSpec.from_json(moved.spec))
            return moved
        if not fresh.live:
            raise GpugeekError(f"cluster {record.name!r} was stopped while its job waited to run again "
                               f"({fresh.stop_reason}) — `up` a new one to go on")
        state = queue_state(spec, job)
        if state is None:
            raise GpugeekError(f"Slurm job {job} ended instead of running again: {_log_tail(record, spec, job)} — "
                               "`up` a new cluster to go on")
        if state["state"] == "PENDING":
            line = _pending(job, state)
        elif last is not None:        # pending before: it runs again, Ray's head starting
            line = f"Slurm job {job}: {state['state'].lower()}, Ray's head starting"
        else:                         # its run still ending, before it is pending again
            line = None
        if line is not None and line != last:
            say(line, flush=True)
            last = line
        time.sleep(POLL_S)


def read_job(spec: ClusterSpec) -> allocation.JobRecord | None:
    """The cluster's job as Slurm records it (``meter/allocation.py``): read here when this runs
    inside the job (the head's watchdog), else on the login node. None when no record answers."""
    job = spec.remote.job_id
    if not job:
        return None
    command = allocation.READ.format(job=shlex.quote(job))
    try:
        if os.environ.get("SLURM_JOB_ID") == job:
            said = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30).stdout
        else:
            said = on_login(spec, command, timeout=30).stdout
    except (GpugeekError, OSError, subprocess.SubprocessError):
        return None
    return allocation.parse(said.decode(errors="replace") if isinstance(said, bytes) else said)


class SlurmBackend(Backend):
    """A Slurm allocation holding Ray (``sbatch`` from the login node; see the module)."""

    name = "slurm"
    scheduler = "slurm"
    launches = watched = tunnelled = True
    confirm = grows = runs_here = simulated = from_offers = your_hosts = local_price = False
    kernel_joins = "line"
    notices = "kv"        # the walltime's notice, put in the cluster's KV store by the head's watchdog
    provider = None
    cannot = MappingProxyType({
        Feature.DASHBOARD: "a Slurm cluster's head starts no dashboard: its nodes are shared, and nothing of "
                           "ours listens there but behind the cluster's token — `%gpugeek status` and "
                           "`%gpugeek doctor` show its nodes",
        Feature.PREEMPT: "the scheduler preempts a Slurm job for real; `preempt` " + REHEARSAL_ONLY,
        Feature.SCALE: "a Slurm cluster is one allocation of --nodes — `down` it, then `up` with other --nodes",
    })

    def show(self, name, spec):
        return LaunchConfig(self.name, batch_script(name, SHOWN_DIR, spec), None,
                            f"run without --dry-run to submit it from {spec.slurm.login}", {})

    def worker_gpus(self, record):
        return float(ClusterSpec.from_json(record.spec).slurm.gpus_per_node)      # each node's GRES

    def preflight(self, spec):
        prepare(spec)

    def readiness(self, asked):
        return readiness.login_node(self.name, asked)

    def start(self, record, spec):
        job = submit(record, spec)
        learn(spec, Submitted(job_id=job), record_id=record.id, spec=spec.to_json())   # what a stop cancels
        print(f"Slurm job {job} submitted from {spec.slurm.login} (its log: {node_dir(record)}/job-{job}.log)",
              flush=True)
        wait_running(record, spec, job)
        head = head_of(record, spec, job)
        learn(spec, _allocated(head, spec), Guarded(guard_home=f"{node_dir(record)}/head"), record_id=record.id)
        opened = tunnel.open_tunnel(record, spec)
        return Started(address=opened.gcs, session_id=opened.pid, pids=[opened.pid],
                       learned=(LineOpened(line_address=opened.line),))

    def wait_ready(self, record, spec, timeout=float(START_TIMEOUT_S)):
        """Every node of the allocation in Ray's table (read through the tunnel)."""
        deadline = time.monotonic() + timeout
        while (alive := len([n for n in read_nodes(record.address) if n.alive])) < spec.slurm.nodes:
            if time.monotonic() > deadline:
                raise GpugeekError(f"only {alive} of the job's {spec.slurm.nodes} nodes joined Ray in {timeout:.0f} s "
                                   f"— the job's log: {node_dir(record)}/job-{spec.remote.job_id}.log")
            time.sleep(0.5)

    def job_record(self, spec):
        return read_job(spec)

    def follow(self, record):
        return follow(record)

    def wait_moved(self, record, say=print):
        return wait_requeued(record, say)

    def stop(self, record, grace=5.0):
        spec = ClusterSpec.from_json(record.spec)
        if spec.remote.job_id:
            cancel(record, spec)
        if record.session_id:      # the tunnel
            processes.stop_session(record.session_id, record.created, record.marker, grace=1)
