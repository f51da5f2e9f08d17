"""The cluster in a Slurm allocation: run by the job's batch script on its first node, beside the
host script (``onhost.py``, whose ``start`` it uses), both copied into the cluster's folder in the
shared home. Standard library only, as the host script.

    python slurmjob.py ORDER_FILE          the cluster, on the allocation's first node
    python slurmjob.py worker ORDER        Ray on another node (each task of the srun step)

Its answer, and where the head listens, go beside ORDER_FILE (``job-ID.json``) for the laptop.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# a job's end: what was asked to stop and still runs is killed this long after. Slurm kills what is left
# of the step after its KillWait (30 s by default), and an srun step's tasks a second after the job's
# srun got the signal (seen): Ray need not end gracefully (nothing of a job's Ray outlives the job)
ENDING_S = 0.5
_children = []      # what this process started, ended with it
_steps = []         # of them, the srun steps on the other nodes: they end by Slurm's signal to their tasks
STEPS_S = 1.0       # … given this long more than this node's own end
CHILDREN_END_S = 5.0   # when the head's Ray or its watchdog ended first: the rest's time to end (the keeper's too)
_temp = []          # Ray's temp folder on this node, removed once its processes have ended
_loaded = []        # the host script, once loaded
# the job's notice (sbatch --signal=B:USR2@S), left for the head's watchdog in its folder (the
# cluster's ``head``, beside this script): when it came (guard/jobend.py reads it)
NOTICE_FILE = os.path.join(HERE, "head", "walltime-notice")


def _host_script():
    """The host script beside this one (``onhost/script.py`` and its folder marks, ``marks.py``, as
    one file), loaded from its file once."""
    import importlib.util

    if not _loaded:
        spec = importlib.util.spec_from_file_location("onhost", os.path.join(HERE, "onhost.py"))
        _loaded.append(importlib.util.module_from_spec(spec))
        spec.loader.exec_module(_loaded[0])
    return _loaded[0]


def main(args):
    """The cluster in a Slurm allocation, run by its batch script on the allocation's first node.

    Everything stays in the foreground of a job step, so the scheduler sees every process and ends
    them all with the job (``scancel``, the walltime): Ray's head and the head's watchdog (which
    starts the keeper, listening on this node's address behind the cluster's token) are this
    process's children in the batch step; Ray on every other node runs in one ``srun`` step, one
    task a node. The head's address and ports go beside the order (``job-ID.json``), where the
    laptop reads them through the login node. When the head's Ray or its watchdog ends (a stop
    from the head: budget, idle), so does the job."""
    onhost = _host_script()
    path = os.path.expanduser(args[0])
    with open(path) as f:
        order = json.load(f)
    folder = os.path.dirname(path)
    job = os.environ.get("SLURM_JOB_ID", "")
    here = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    count = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    ip = onhost.node_ip(os.environ.get("SLURM_LAUNCH_NODE_IPADDR"))    # as the login node reaches this one
    said = os.path.join(folder, f"job-{job}.json")

    def tell(answer):      # each run's word its own (a requeued job runs again under the same id)
        with open(said + ".part", "w") as f:
            json.dump(dict(answer, restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0)), f)
        os.replace(said + ".part", said)

    if os.path.exists(NOTICE_FILE):     # an earlier run's (a requeued job's)
        os.remove(NOTICE_FILE)
    temp_dir = order["temp_dir"].replace("{job}", job)
    _temp.append(temp_dir)
    _sweep()
    head = dict(order["head"], role="head", ip=ip, temp_dir=temp_dir, keeper_host=ip)
    ray = onhost.ray_command(head)
    if not ray.get("ok"):
        tell({"ok": False, "error": f"Ray's head did not start on {here}: {ray.get('error')}"})
        return ray
    started = {"port": head["port"], "keeper_port": head["keeper_port"]}     # as ray_command moved them
    procs = {"Ray's head": _ray(ray)}
    deadline = time.time() + order.get("timeout", 150)
    while not _answers(ip, started["port"]):
        if procs["Ray's head"].poll() is not None or time.time() > deadline:
            procs["Ray's head"].kill()
            tell({"ok": False, "error": f"Ray's head on {here} did not answer at {ip}:{started['port']}"})
            return {"ok": False, "error": "no head"}
        time.sleep(0.2)
    if count > 1:
        worker = dict(order["worker"], role="worker", head=f"{ip}:{started['port']}", temp_dir=temp_dir,
                      gpus=order["head"].get("gpus") or 0)   # as the job asked of every node
        procs["Ray on the other nodes"] = _other_nodes(order, worker, count, here, folder, job)
    spec = order["guard"]["spec"]      # the job's id in it: the watchdog meters its nodes from Slurm's record
    guard_order = dict(order["guard"], gcs=f"{ip}:{started['port']}", ip=ip, temp_dirs={"*": temp_dir},
                       keeper=dict(order["guard"]["keeper"], port=started["keeper_port"], host=ip),
                       spec=dict(spec, remote=dict(spec.get("remote") or {}, job_id=job)))
    procs["the head's watchdog"] = _watchdog(guard_order, folder)
    tell({"ok": True, "job": job, "node": here, "ip": ip, "port": started["port"],
          "keeper_port": started["keeper_port"], "temp_dir": temp_dir, "nodes": count})
    return _until_one_ends(procs)


def _other_nodes(order, worker, count, here, folder, job):
    """Ray on every other node of the allocation: one ``srun`` step, one task a node."""
    step = ["srun", f"--nodes={count - 1}", f"--ntasks={count - 1}", "--ntasks-per-node=1", f"--exclude={here}",
            "--kill-on-bad-exit=0", *order.get("step_flags", []),
            sys.executable, os.path.abspath(__file__), "worker", json.dumps(worker)]
    with open(os.path.join(folder, f"job-{job}-workers.log"), "ab") as out:
        proc = _child(subprocess.Popen(step, stdout=out, stderr=out, stdin=subprocess.DEVNULL))
    _steps.append(proc)
    return proc


def _watchdog(order, folder):
    """The head's watchdog (``onhost.py guard``, which waits for it on a scheduled head), this
    process's child, on the package copied beside the host script."""
    home = os.path.expanduser(order["home"])
    os.makedirs(home, mode=0o700, exist_ok=True)
    path = os.path.join(home, "order.json")
    with open(path, "w") as f:
        json.dump(order, f)
    with open(os.path.join(home, "guard.log"), "ab") as out:
        # a requeued job's log goes on: until this run's guard answers, its last line is not the last run's answer
        out.write(f"the head's watchdog starts (job {os.environ.get('SLURM_JOB_ID', '')})\n".encode())
        out.flush()
        return _child(subprocess.Popen([sys.executable, os.path.join(HERE, "onhost.py"), "guard", f"@{path}"],
                                       stdout=out, stderr=out, stdin=subprocess.DEVNULL))


def _until_one_ends(procs):
    """Until the head's Ray or its watchdog ends; then the rest here is ended, and so is the job
    (its batch step ends with this process). Ray on the other nodes may end alone (a node lost)."""
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None and name != "Ray on the other nodes":
                print(f"{name} ended (exit {proc.returncode}): the job ends", flush=True)
                for other in procs.values():
                    if other.poll() is None:
                        _signal(other, signal.SIGTERM)
                # waited for, as on the job's end (``_end``): a child this process left running would
                # leave the step's process tree with it, and outlive the job (the watchdog ends its
                # keeper first, hence the longer wait)
                ours = [other for other in procs.values() if other not in _steps]
                deadline = time.time() + CHILDREN_END_S
                while any(other.poll() is None for other in ours) and time.time() < deadline:
                    time.sleep(0.1)
                for other in ours:
                    _signal(other, signal.SIGKILL)
                    other.wait()
                return {"ok": proc.returncode == 0, "ended": name}
        time.sleep(1.0)


def _ray(ray):
    """``ray start --block``, this process's child: in the foreground of the job's step, which sees
    and ends all of it."""
    with open(ray["log"], "ab") as out:     # a process group of its own: Ray's daemons end with it
        return _child(subprocess.Popen([*ray["cmd"], "--block"], env=ray["env"], stdout=out, stderr=out,
                                       stdin=subprocess.DEVNULL, start_new_session=True))


def _child(proc):
    _children.append(proc)
    return proc


def _end(signum, frame):
    """The job ends (``scancel``, its walltime): Slurm signals every process of the step it can
    see, and kills them once its ``KillWait`` has passed. This process stays till its children
    have ended — they stay its children, so none of them leaves the step's process tree and
    outlives the job (a tree Slurm's process tracking follows by parent, without cgroups) — and
    removes Ray's temp folder here. The other nodes' step is left to end by Slurm's own signal to
    its tasks (each does the same there): its ``srun`` ended first would have them killed at once."""
    ours = [proc for proc in _children if proc not in _steps]
    for proc in ours:
        _signal(proc, signal.SIGTERM)
    deadline = time.time() + ENDING_S
    while any(proc.poll() is None for proc in ours) and time.time() < deadline:
        time.sleep(0.1)
    for proc in ours:
        _signal(proc, signal.SIGKILL)       # and what is left of its group (Ray's raylet, GCS)
    # reaped by polling: this handler may have come while this process waited for one of them, and
    # Popen's wait is not reentrant (a blocking wait here would wait on its own lock for good)
    deadline = time.time() + ENDING_S + 2.0
    while any(proc.poll() is None for proc in ours) and time.time() < deadline:
        time.sleep(0.05)
    _tidy()
    deadline = time.time() + STEPS_S
    while any(step.poll() is None for step in _steps) and time.time() < deadline:
        time.sleep(0.1)
    for step in _steps:
        _signal(step, signal.SIGKILL)
    os._exit(128 + signum)


def _notice(signum, frame):
    """The job's end is near (``--signal=B:USR2@S`` reaches the batch step alone): its walltime, or
    the scheduler preempting it (where Slurm sends the job's signal then:
    ``SlurmctldParameters=preempt_send_user_signal``). Left in a file for the head's watchdog,
    which tells every node of the cluster at its next look, and a running cell checkpoints at its
    next step. (A file, not a signal: one that came while the watchdog was still starting would
    end it.)"""
    os.makedirs(os.path.dirname(NOTICE_FILE), mode=0o700, exist_ok=True)
    with open(NOTICE_FILE + ".part", "w") as f:
        f.write(str(time.time()))
    os.replace(NOTICE_FILE + ".part", NOTICE_FILE)
    print(f"the job's notice (signal {signum}: its walltime near, or a preemption): left for the head's watchdog",
          flush=True)


def _signal(proc, signum):
    """``signum`` to a child, and to its process group where it leads one (Ray's)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
        elif proc.poll() is None:
            proc.send_signal(signum)
    except OSError:
        pass


def _sweep():
    """Ray's temp folders that jobs of ours left on this node (a step Slurm killed before it could
    tidy), for jobs Slurm no longer lists: removed as this one starts, each said in the job's log.
    Only what is provably ours: a folder whose mark (``marks.py``, the host script's) names the job
    that made it — a name like ours proves nothing (a user's ``/tmp/gg-data-2024``)."""
    try:
        listed = set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                    timeout=30).stdout.split())
    except (OSError, subprocess.SubprocessError):
        return
    if not listed:          # squeue said nothing (it lists this job at least): leave everything
        return
    onhost = _host_script()
    for name in sorted(os.listdir("/tmp")):
        path = os.path.join("/tmp", name)
        job = (onhost.made_by(path) or {}).get("job")
        if job and job not in listed and onhost.remove_ours(path, job=job):
            print(f"removed {path}: Ray's temp folder of Slurm job {job}, which Slurm no longer lists", flush=True)


def _tidy():
    """Ray's temp folder of this job on this node gone (a node's /tmp is shared with other jobs):
    where its mark says this job made it."""
    job = os.environ.get("SLURM_JOB_ID")
    for folder in _temp if job else ():
        _host_script().remove_ours(folder, job=job)


def worker(args):
    """On every other node (the ``srun`` step): Ray joining the head, in the foreground."""
    order = json.loads(args[0])
    _temp.append(order["temp_dir"])
    _sweep()
    ray = _host_script().ray_command(order)
    return {"ok": _ray(ray).wait() == 0} if ray.get("ok") else ray


def _answers(ip, port):
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    os.umask(0o077)
    for ending in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(ending, _end)
    signal.signal(signal.SIGUSR2, _notice)
    answer = worker(sys.argv[2:]) if sys.argv[1:2] == ["worker"] else main(sys.argv[1:])
    _tidy()
    print(json.dumps(answer), flush=True)
    sys.exit(0 if answer.get("ok") else 1)
