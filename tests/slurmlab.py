"""A real Slurm on one machine (Debian's ``slurm-wlm`` and ``munge``): what a university or a GPU
cloud hands out — a login node you SSH to, compute nodes behind it that a scheduler allocates.

    slurm = slurmlab.up(nodes=2)      # ... slurm.down()

- ``slurmctld`` in a network namespace of its own on a lab bridge (``netlab``), at ``.4``;
- a **login host** (``login``, ``.30``): sshd with the lab's key for root, the Slurm commands with
  ``SLURM_CONF`` set, the cluster's home as its ``/root``;
- **compute nodes** (``node1``…, ``.31``…, two CPUs declared each, so that two jobs of one CPU share
  a node): one ``slurmd`` each in a network, PID and mount namespace
  of its own, each with its own ``/tmp`` and the cluster's home as ``/root`` — shared with the
  login host as clusters share their home, and with nothing of the laptop's (its checkout, its
  venv and its ``/root`` are out of sight); the lab's machine image (a Python with torch, no Ray);
  GPUs declared as GRES on fake device files (``nvidia0``…: a step sees ``CUDA_VISIBLE_DEVICES``);
- munge on a socket of the lab's own; the partition ``gpu`` with a walltime limit, and
  ``EnforcePartLimits=ALL`` so that a job over it is refused, not left pending;
- preemption as GPU clouds and shared university partitions set it: a partition ``urgent`` over
  the same nodes whose jobs preempt ``gpu``'s (``preempt/partition_prio``), which are requeued —
  or cancelled where they may not be — after a grace time (``GraceTime``), told by the job's own
  signal (``preempt_send_user_signal``) rather than a SIGTERM to every process;
- ``JobCompType=jobcomp/filetxt``: one line per ended job, Slurm's own record; with
  ``accounting=True`` also Slurm's accounting as sites run it — ``slurmdbd`` over a MariaDB of the
  lab's own (both in the controller's namespace), an account ``gglab`` for the cluster's user, and
  ``AccountingStorageEnforce=associations``, so that ``sacct`` answers and an unknown account is
  refused.

The laptop reaches the login host alone: the controller and the compute nodes are blackholed in
this machine's namespace (namespace to namespace, over the bridge, is not affected). What a job
left on a node is counted by the node's network namespace (``Slurm.strays``). ``down`` ends every
daemon and job, and removes every namespace, link, route and file it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import netlab
from netlab import _run

CONTROLLER_AT, LOGIN_AT, NODES_FROM = 4, 30, 31      # the last byte of their addresses on the bridge
PARTITION = "gpu"
URGENT = "urgent"          # a partition over the same nodes whose jobs preempt the ``gpu`` partition's
GRACE_S = 30               # a preempted job's grace time: its end, once the scheduler preempted it
MAX_TIME_MIN = 60          # the partition's walltime limit
START_TIMEOUT_S = 30
ACCOUNT = "gglab"          # the cluster user's account, where the lab runs accounting


def why_not(accounting: bool = False) -> str | None:
    """One line saying why a Slurm lab (with its accounting) cannot be made here, or None when it can."""
    if reason := netlab.why_not():
        return reason
    for tool in ("slurmctld", "slurmd", "sbatch", "munged", "nsenter"):
        if shutil.which(tool) is None:
            return f"the Slurm lab needs `{tool}` — apt-get install slurm-wlm munge"
    for tool in ("slurmdbd", "mariadbd", "mariadb-install-db") if accounting else ():
        if shutil.which(tool) is None:
            return f"the Slurm lab's accounting needs `{tool}` — apt-get install slurmdbd mariadb-server"
    return None


@dataclass
class Slurm:
    lab: netlab.Lab
    login: netlab.Host
    nodes: list[netlab.Host]
    controller: str                          # slurmctld's address
    gpus_per_node: int
    cpus_per_node: int             # declared (``config_overrides``: more than this machine's cores allowed)
    accounting: bool = False       # slurmdbd and its database run: ``sacct`` answers, accounts are enforced
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)   # munged, slurmctld, slurmd-nodeN, …

    @property
    def dir(self) -> Path:
        return self.lab.dir / "slurm"

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def home(self) -> Path:
        """The cluster's home folder: the login host's and every compute node's ``/root``."""
        return Path(self.login.disk) / "root"

    @property
    def netns(self) -> str:
        return f"{netlab.PREFIX}{self.lab.bridge[2:-2]}-ctl"

    @property
    def jobcomp(self) -> Path:
        """Slurm's own record of each ended job (``jobcomp/filetxt``)."""
        return self.dir / "jobcomp.txt"

    def runs(self, job: str) -> list[dict]:
        """The job's lines in Slurm's record of ended jobs, as key=value (``StartTime`` and ``EndTime``
        also as ``start``/``end``, seconds since the epoch): one a run — a job requeued has a line
        for each run it ended (``JobState=PENDING``), then one for its end."""
        text = self.jobcomp.read_text() if self.jobcomp.exists() else ""
        found = []
        for line in text.splitlines():
            if f"JobId={job} " in line:
                fields = dict(pair.split("=", 1) for pair in line.split() if "=" in pair)
                for key, name in (("StartTime", "start"), ("EndTime", "end")):    # slurmctld's local time
                    fields[name] = time.mktime(time.strptime(fields[key], "%Y-%m-%dT%H:%M:%S"))
                found.append(fields)
        return found

    def ended(self, job: str) -> dict | None:
        """The job's end in Slurm's record of ended jobs (``runs``' last line, once it is not a
        requeued run's); None until it is there."""
        found = [run for run in self.runs(job) if run["JobState"] not in ("PENDING", "REQUEUED")]
        return found[-1] if found else None

    def ssh(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """``command`` on the login host, as the cluster's user runs it."""
        return self.lab.ssh(self.login, command, timeout=timeout)

    def preempt(self, seconds: float = 5) -> str:
        """A job in the ``urgent`` partition that wants every node whole for ``seconds``: it preempts
        whatever the ``gpu`` partition runs there. Its id."""
        done = self.ssh(f"sbatch --parsable -p {URGENT} -N {len(self.nodes)} --exclusive -J urgent "
                        f"-o /dev/null --wrap 'sleep {seconds}'")
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def squeue(self) -> list[dict]:
        """The queue as Slurm lists it (every job, every user): id, name, state, reason, nodes."""
        done = self.ssh("squeue -h -o '%i|%j|%T|%r|%N'")
        if done.returncode != 0:
            raise RuntimeError(f"squeue failed: {done.stderr.strip()}")
        rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
        return [dict(zip(("id", "name", "state", "reason", "nodes"), row, strict=True)) for row in rows]

    def strays(self, node: netlab.Host) -> list[int]:
        """Every process in the node's network namespace but its slurmd (and the ``unshare`` that
        holds its PID namespace): what a job left there, counted from outside."""
        daemon = self.daemons.get(f"slurmd-{node.name}")
        keep = set()
        if daemon is not None and daemon.poll() is None:
            import psutil

            try:
                keep = {daemon.pid, *(p.pid for p in psutil.Process(daemon.pid).children())}
            except psutil.Error:
                pass
        return [pid for pid in node.pids() if pid not in keep]

    # -- life ---------------------------------------------------------------------------------------

    def down(self) -> None:
        """Every job and daemon ended, then every namespace, link, route and file gone."""
        for node in self.nodes:
            self.lab.kill_host(node)             # slurmd and what any job left
        for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):
            daemon = self.daemons.get(name)
            if daemon is not None and daemon.poll() is None:
                daemon.kill()
                daemon.wait(timeout=10)
        for pid in _run("ip", "netns", "pids", self.netns, check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        for address in [self.controller, *(n.address for n in self.nodes)]:
            _run("ip", "route", "del", "blackhole", f"{address}/32", check=False)
        _run("ip", "link", "del", f"gl{self.lab.bridge[2:-2]}ctl", check=False)
        _run("ip", "netns", "del", self.netns, check=False)
        self.lab.down()

    def leftovers(self) -> list[str]:
        left = self.lab.leftovers()
        namespaces = _run("ip", "netns", "list", check=False).stdout
        if self.netns in namespaces.split():
            left.append(f"namespace {self.netns}")
        routes = _run("ip", "route", "show", "type", "blackhole", check=False).stdout.split()
        left += [f"route blackhole {a}" for a in [self.controller, *(n.address for n in self.nodes)] if a in routes]
        left += [f"{name} {d.pid}" for name, d in self.daemons.items() if d.poll() is None]
        return left


def up(nodes: int = 2, gpus_per_node: int = 2, cpus_per_node: int = 2, accounting: bool = False) -> Slurm:
    """The Slurm lab, its nodes idle and the login host answering (with Slurm's accounting, its
    database and the cluster user's account, where ``accounting``); torn down again on any failure."""
    lab = netlab.up(0)
    prefix = lab.gateway.rsplit(".", 1)[0]
    lab_id = lab.bridge[2:-2]
    cluster = lab.dir / "cluster"                # the login host's disk: its root is the cluster's home
    (lab.dir / "disks").mkdir(exist_ok=True)     # (each host covers the lab's own disks)
    for top in ("root", "tmp"):
        (cluster / top).mkdir(parents=True, exist_ok=True)
    (cluster / "tmp").chmod(0o1777)
    make = dict(disk=str(cluster))
    login = netlab.Host(name="login", netns=f"{netlab.PREFIX}{lab_id}-login", address=f"{prefix}.{LOGIN_AT}",
                        link=f"gl{lab_id}login", setup="mount -t tmpfs tmpfs /tmp", **make)
    workers = [netlab.Host(name=f"node{i}", netns=f"{netlab.PREFIX}{lab_id}-node{i}",
                           address=f"{prefix}.{NODES_FROM + i - 1}", link=f"gl{lab_id}n{i}",
                           setup="mount -t tmpfs tmpfs /tmp", **make) for i in range(1, nodes + 1)]
    slurm = Slurm(lab, login, workers, controller=f"{prefix}.{CONTROLLER_AT}", gpus_per_node=gpus_per_node,
                  cpus_per_node=cpus_per_node, accounting=accounting)
    try:
        lab.serve_index()
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpugeek-lab-login", "-f",
             str(lab.dir / "host_key-login"))
        for host in (login, *workers):
            lab.plug(host)
            lab.hosts.append(host)
        lab.save()
        _plug_controller(slurm)
        _configure(slurm)
        _start_munge(slurm)
        if accounting:
            _start_accounting(slurm)
        _start_controller(slurm)
        for node in workers:
            _start_node(slurm, node)
        lab.start_sshd(login, {"SLURM_CONF": str(slurm.conf)})
        for address in [slurm.controller, *(n.address for n in workers)]:   # the laptop reaches the login host alone
            _run("ip", "route", "add", "blackhole", f"{address}/32")
        _wait_idle(slurm)
    except BaseException:
        slurm.down()
        raise
    return slurm


def _plug_controller(slurm: Slurm) -> None:
    link = f"gl{slurm.lab.bridge[2:-2]}ctl"
    _run("ip", "netns", "add", slurm.netns)
    _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", slurm.netns)
    _run("ip", "link", "set", link, "master", slurm.lab.bridge)
    _run("ip", "link", "set", link, "up")
    for cmd in (("addr", "add", f"{slurm.controller}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                ("link", "set", "lo", "up")):
        _run("ip", "-n", slurm.netns, *cmd)


def _configure(slurm: Slurm) -> None:
    folder = slurm.dir
    for sub in ("state", "log", "dev"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    gres = ["AutoDetect=off"]
    node_lines = []
    for node in slurm.nodes:
        devices = folder / "dev" / node.name
        devices.mkdir(exist_ok=True)
        for i in range(slurm.gpus_per_node):
            if not (devices / f"nvidia{i}").exists():
                _run("mknod", str(devices / f"nvidia{i}"), "c", "195", str(i))
        if slurm.gpus_per_node:
            last = slurm.gpus_per_node - 1
            gres.append(f"NodeName={node.name} Name=gpu File={devices}/nvidia[0-{last}]" if last else
                        f"NodeName={node.name} Name=gpu File={devices}/nvidia0")
        node_lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={slurm.cpus_per_node} RealMemory=4000"
                          + (f" Gres=gpu:{slurm.gpus_per_node}" if slurm.gpus_per_node else "") + " State=UNKNOWN")
    socket = slurm.lab.dir / "munge" / "munge.socket.2"
    names = ",".join(n.name for n in slurm.nodes)
    accounting = ["AccountingStorageType=accounting_storage/none"]
    if slurm.accounting:        # AccountingStoragePass: the munge socket toward slurmdbd (AuthInfo is not read there)
        accounting = ["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={slurm.controller}",
                      "AccountingStoragePort=6819", "AccountingStorageEnforce=associations",
                      f"AccountingStoragePass={socket}"]
    slurm.conf.write_text("\n".join([
        "ClusterName=gglab", f"SlurmctldHost={host}({slurm.controller})",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={socket}",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log", f"SlurmdLogFile={folder}/log/slurmd-%n.log",
        "SlurmctldPort=6817", "SlurmdPort=6818", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SlurmdParameters=config_overrides", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "ReturnToService=2", "MpiDefault=none", "MailProg=/bin/true", "GresTypes=gpu",
        *accounting, "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={slurm.jobcomp}", "EnforcePartLimits=ALL", "SchedulerParameters=sched_interval=2",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5", "MinJobAge=30",
        "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
        "SlurmctldParameters=preempt_send_user_signal",
        *node_lines,
        f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime={MAX_TIME_MIN} State=UP PriorityTier=1"
        f" GraceTime={GRACE_S}",
        f"PartitionName={URGENT} Nodes={names} MaxTime={MAX_TIME_MIN} State=UP PriorityTier=2 PreemptMode=OFF",
        ""]))
    (folder / "gres.conf").write_text("\n".join(gres) + "\n")
    if slurm.accounting:
        dbd = folder / "slurmdbd.conf"            # beside slurm.conf, where slurmdbd looks; root's alone
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={socket}", f"DbdHost={host}", f"DbdAddr={slurm.controller}",
            "DbdPort=6819", "SlurmUser=root", f"PidFile={folder}/slurmdbd.pid", f"LogFile={folder}/log/slurmdbd.log",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", "StoragePort=3306",
            "StorageUser=root", "StorageLoc=slurm_acct_db", ""]))
        dbd.chmod(0o600)


def _start_munge(slurm: Slurm) -> None:
    folder = slurm.lab.dir / "munge"
    folder.mkdir(mode=0o755, exist_ok=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    log = open(folder / "munged.log", "ab")  # noqa: SIM115 - the child keeps it
    slurm.daemons["munged"] = subprocess.Popen(
        ["munged", "--force", "--foreground", f"--socket={folder}/munge.socket.2", f"--key-file={key}",
         f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed"],
        stdout=log, stderr=log, start_new_session=True)
    log.close()
    _wait(lambda: (folder / "munge.socket.2").exists(), "munged's socket", slurm.daemons["munged"])


def _start_accounting(slurm: Slurm) -> None:
    """A MariaDB of the lab's own on the controller namespace's loopback (no grant tables: nothing
    but the lab reaches it), ``slurmdbd`` over it, and the cluster, its account and its user known to
    Slurm's accounting before the controller starts."""
    data, log = slurm.dir / "mariadb", slurm.dir / "log"
    _run("mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db",
         "--auth-root-authentication-method=normal")
    inside = ["nsenter", f"--net=/run/netns/{slurm.netns}"]
    out = open(log / "mariadbd.out", "ab")  # noqa: SIM115 - the child keeps it
    slurm.daemons["mariadbd"] = subprocess.Popen(
        [*inside, "mariadbd", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-grant-tables",
         "--bind-address=127.0.0.1", "--port=3306", f"--socket={data}/mariadbd.sock", f"--pid-file={data}/mariadbd.pid",
         "--innodb-buffer-pool-size=16M", "--skip-log-bin"], stdout=out, stderr=out, start_new_session=True)
    _wait(lambda: (data / "mariadbd.sock").exists(), "MariaDB's socket", slurm.daemons["mariadbd"])
    env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
    slurm.daemons["slurmdbd"] = subprocess.Popen([*inside, "slurmdbd", "-D"], stdout=out, stderr=out,
                                                 start_new_session=True, env=env)
    out.close()

    said = []

    def ask(*words: str) -> bool:
        done = subprocess.run([*inside, "sacctmgr", "-i", *words], capture_output=True, text=True, env=env)
        said[:] = [(done.stdout + done.stderr).strip()]
        return done.returncode == 0 or "already exists" in said[0]

    try:
        _wait(lambda: ask("add", "cluster", "gglab"), "cluster in slurmdbd", *slurm.daemons.values())
    except RuntimeError as e:
        raise RuntimeError(f"{e}; sacctmgr said: {said[0] if said else ''}; slurmdbd's log: "
                           f"{_tail(slurm.dir / 'log' / 'slurmdbd.log')} {_tail(log / 'mariadbd.out')}") from None
    for words in (("add", "account", ACCOUNT, "Cluster=gglab"),
                  ("add", "user", "root", f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}", "Cluster=gglab")):
        if not ask(*words):
            raise RuntimeError(f"the Slurm lab: sacctmgr {' '.join(words)}: {said[0]}")


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(none)"


def _start_controller(slurm: Slurm) -> None:
    log = open(slurm.dir / "log" / "slurmctld.out", "ab")  # noqa: SIM115 - the child keeps it
    slurm.daemons["slurmctld"] = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{slurm.netns}", "slurmctld", "-D", "-i", "-f", str(slurm.conf)],
        stdout=log, stderr=log, start_new_session=True)
    log.close()


def _start_node(slurm: Slurm, node: netlab.Host) -> None:
    """slurmd in the node's network namespace (``nsenter``: ``ip netns exec`` remounts /sys, and
    slurmd then finds no cgroup file system), a PID and mount namespace of its own, its own disk."""
    log = open(slurm.dir / "log" / f"slurmd-{node.name}.out", "ab")  # noqa: SIM115 - the child keeps it
    script = slurm.lab._own_disk(node) + f"cd /\nexec slurmd -D -f {slurm.conf} -N {node.name}"
    slurm.daemons[f"slurmd-{node.name}"] = node.sshd = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--pid", "--fork", "--mount-proc", "--mount",
         "--propagation", "private", "--uts", "sh", "-ec", script],
        stdout=log, stderr=log, start_new_session=True, env={**os.environ, "SLURM_CONF": str(slurm.conf)})
    log.close()


def _wait_idle(slurm: Slurm) -> None:
    def idle() -> bool:
        done = slurm.ssh("sinfo -h -N -o '%N %t'", timeout=15)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and len(states) == len(slurm.nodes) and set(states.values()) == {"idle"}
    _wait(idle, "every compute node idle in sinfo", *slurm.daemons.values())


def _wait(ready, what: str, *daemons: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        dead = [d for d in daemons if d.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"the Slurm lab: no {what} after {START_TIMEOUT_S} s"
                               + (f" (exited: {[d.args[:3] for d in dead]})" if dead else ""))
        time.sleep(0.3)
