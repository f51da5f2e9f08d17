"""A multi-host lab on one machine: "hosts" made of Linux network namespaces on a bridge, each with
its own address and its own sshd, running in a PID namespace of its own with a test key. This
machine's root namespace plays the user's laptop; the bridge is its network to the hosts.

    sudo .venv/bin/python tests/netlab.py up [--hosts 3]   # prints the hosts and how to ssh in
    sudo .venv/bin/python tests/netlab.py down DIR         # DIR as `up` printed it

A host shares nothing with the laptop that a rented machine would not: it has its own hostname,
its own processes (``ps`` over SSH lists that host's), its own network, and its own disk — its
``/root``, ``/tmp`` and the folder that holds this checkout are folders of its own (under the
lab's ``disks/``, kept across a host's restart, as a disk is across a reboot), and the laptop's
venv, wheels and pip settings are out of its sight. What it still sees is the OS (Debian's
``python3``) and, unless it is bare, a machine image: a Python with torch and no Ray at
``/opt/image`` (``make lab-image``; or the one ``up(images=…)`` names for it, such as another
Python's), first on its PATH. One folder, ``shared/``, is mounted at the
same path on every host and the laptop: a shared filesystem (NFS, say) for the tests that need one.

Traffic stays on the bridge: a host has no route beyond it. Helpers cut a host off, make its link
slow or lossy (``tc netem``) and kill every process of a host. ``down`` removes every namespace,
link and process it made.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
PREFIX = "gglab"
ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / ".cache" / "lab-image"       # made by `make lab-image`: a Python with torch, no Ray
IMAGE_AT = "/opt/image"                    # where a host sees it
INDEX = ROOT / ".cache" / "lab-index"       # made by `make lab-files`: the wheels the hosts install
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
_made = 0
LABS = Path("/var/tmp")     # each lab's folder (not /tmp: every host has a /tmp of its own)
LEFT_WITHIN_S = 10.0    # after a cluster's down, its hosts' namespaces are empty within this


def why_not() -> str | None:
    """One line saying why a lab cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "the multi-host lab needs root (it makes network namespaces)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the multi-host lab needs `{tool}` (iproute2, util-linux, openssh-client)"
    if not os.access(SSHD, os.X_OK):
        return f"the multi-host lab needs {SSHD} — apt-get install openssh-server"
    return None


def netem_available() -> bool:
    """Whether this kernel has ``tc netem`` (CONFIG_NET_SCH_NETEM); some do not."""
    done = _run("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms", check=False)
    if done.returncode == 0:
        _run("tc", "qdisc", "del", "dev", "lo", "root", check=False)
    return done.returncode == 0


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done


def sockets_to(destination: str) -> list[str]:
    """This machine's TCP sockets with a peer in ``destination`` (an address or a subnet), as ``ss``
    lists them with their process, but those in TIME-WAIT: closed both ways, they send nothing
    more. Once a host's processes are killed, each one left is a close under way or something of
    ours that still holds a connection."""
    out = _run("ss", "-tanpH", "dst", destination).stdout
    return [line for line in out.splitlines() if line.strip() and not line.startswith("TIME-WAIT")]


@dataclass
class Host:
    name: str          # h1, h2, …
    netns: str         # the network namespace
    address: str       # its address on the bridge
    link: str          # the bridge's end of its veth pair (the laptop's side of its cable)
    disk: str = ""     # the folder that holds its /root, /tmp and project folder
    bare: bool = False  # only the OS's python3: no machine image
    image: str = ""     # the machine image it mounts at /opt/image, when not IMAGE (``up(images=…)``)
    login: str = "root"     # the one user its sshd lets in (a cloud image's: ``ubuntu``)
    keys: str = ""          # that user's authorized keys, when not the lab's (an instance's key pair)
    setup: str = ""         # shell lines run in its mount namespace before sshd: its image's own files
    sshd: subprocess.Popen | None = None

    def file(self, path: str) -> Path:
        """Where the laptop finds a file of this host's disk (``/root/x`` → ``DISK/root/x``)."""
        for top in ("root", "tmp"):
            if path == f"/{top}" or path.startswith(f"/{top}/"):
                return Path(self.disk) / top / path[len(top) + 2:]
        raise ValueError(f"{path} is not on {self.name}'s own disk (/root or /tmp)")

    def ns(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.netns, *cmd, check=check)

    def pids(self) -> list[int]:
        """Every process living in this host's network namespace."""
        out = _run("ip", "netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def strays(self, *, ssh_sessions: bool = True, idle_sessions: bool = True) -> list[int]:
        """Every process in this host's namespace except the host's own sshd (the listener, and the
        ``unshare`` that holds its PID namespace): what anything run on the host left behind,
        counted by namespace, whatever marker or environment it carries. ``ssh_sessions=False``
        leaves out what still runs inside an SSH connection too (a laptop cut off cannot close
        its connections; the host's sshd ends them when their keepalives fail);
        ``idle_sessions=False`` leaves out only such a connection's sshd with nothing running
        under it (what it ran counts). The listener is the PID namespace's init: it adopts what a
        detached start leaves, and those count."""
        keep = set()
        if self.sshd is not None and self.sshd.poll() is None:
            try:
                unshare = psutil.Process(self.sshd.pid)
                listeners = unshare.children()
                keep = {unshare.pid, *(p.pid for p in listeners)}
                if not (ssh_sessions and idle_sessions):   # a connection's own sshd (and what runs under
                    for listener in listeners:   # it); not the orphans the listener (the namespace's init) adopted
                        for conn in listener.children():
                            if conn.name() != "sshd":
                                continue
                            under = conn.children(recursive=True)
                            if not ssh_sessions:
                                keep |= {conn.pid, *(p.pid for p in under)}
                            elif not under:
                                keep.add(conn.pid)
            except psutil.Error:
                pass
        return [pid for pid in self.pids() if pid not in keep]

    def pids_with(self, key: str, value: str) -> list[int]:
        """This host's processes whose environment has ``key=value`` (read from /proc here, so it
        needs no network to the host)."""
        needle = f"{key}={value}".encode()
        found = []
        for pid in self.pids():
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append(pid)
            except OSError:
                continue
        return found


@dataclass
class Lab:
    dir: Path
    bridge: str
    gateway: str                   # the laptop's address on the bridge
    hosts: list[Host] = field(default_factory=list)
    index_url: str | None = None   # the wheel index the laptop serves to the hosts (``serve_index``)
    index_server: subprocess.Popen | None = None
    env: dict = field(default_factory=dict)    # set in every host's sessions (its sshd's SetEnv)
    storage: subprocess.Popen | None = None    # the S3 server, in a namespace on the bridge (``start_storage``)

    @property
    def key(self) -> Path:
        """The private key every host accepts (root@HOST)."""
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def shared(self) -> Path:
        """A folder every host and the laptop see at this same path: a shared filesystem."""
        return self.dir / "shared"

    def host(self, name_or_address: str) -> Host:
        for host in self.hosts:
            if name_or_address in (host.name, host.address):
                return host
        raise KeyError(name_or_address)

    def ssh(self, host: Host, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``command`` on ``host`` over SSH, as a user of the lab would."""
        return subprocess.run(["ssh", *self.ssh_options(), f"root@{host.address}", command],
                              capture_output=True, text=True, timeout=timeout)

    def ssh_options(self) -> list[str]:
        return ["-i", str(self.key), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=5"]

    # -- faults -----------------------------------------------------------------------------------

    def cut_off(self, host: Host) -> None:
        """Unplug the host's cable at the bridge: nothing reaches it, nor leaves it."""
        _run("ip", "link", "set", host.link, "down")

    def reconnect(self, host: Host) -> None:
        _run("ip", "link", "set", host.link, "up")

    def cut_laptop(self, hosts: list[Host] | None = None) -> None:
        """Take the laptop off the network: the hosts still reach each other over the bridge, but
        what passes between them and this machine is dropped, silently, both ways (blackhole
        routes: nothing is sent anywhere else meanwhile). ``hosts``: those the laptop reaches, when
        not all (a Slurm cluster's login host)."""
        for host in self.hosts if hosts is None else hosts:
            _run("ip", "route", "add", "blackhole", f"{host.address}/32")
            host.ns("ip", "route", "add", "blackhole", f"{self.gateway}/32")

    def reconnect_laptop(self, hosts: list[Host] | None = None) -> None:
        for host in self.hosts if hosts is None else hosts:
            _run("ip", "route", "del", "blackhole", f"{host.address}/32", check=False)
            host.ns("ip", "route", "del", "blackhole", f"{self.gateway}/32", check=False)

    def reset_cut_connections(self) -> int:
        """What each host's TCP does at its next retry after a cut, done at once: every SSH connection
        from this machine to a host whose end here is no longer open (its process was killed while
        the link was cut) is reset on the host, so its sshd ends now, not a minute or two later.
        A connection still open here is left alone. Returns how many were reset."""
        reset = 0
        for host in self.hosts:
            open_here = {line.split()[-2].rsplit(":", 1)[1] for line in _run(     # local address:port
                "ss", "-tnH", "state", "established", "dst", host.address, "dport", "=", ":22").stdout.splitlines()
                if line.strip()}
            on_host = [line.split()[-1].rsplit(":", 1)[1] for line in host.ns(      # the peer: this machine
                "ss", "-tnH", "dst", self.gateway, "sport", "=", ":22").stdout.splitlines() if line.strip()]
            for port in set(on_host) - open_here:
                host.ns("ss", "-K", "-tnH", "dst", self.gateway, "dport", "=", f":{port}", "sport", "=", ":22")
                reset += 1
        return reset

    def slow_link(self, host: Host, *, rate_mbit: float | None = None, delay_ms: float | None = None,
                  loss_pct: float = 0.0) -> None:
        """Make what the host sends slow: a rate limit (``tc tbf``, in every kernel), or a delay and
        loss (``tc netem``, where the kernel has it — ``netem_available()``)."""
        if delay_ms is not None or loss_pct:
            spec = ["netem", "delay", f"{delay_ms or 0}ms"] + (["loss", f"{loss_pct}%"] if loss_pct else [])
        else:
            spec = ["tbf", "rate", f"{rate_mbit or 8}mbit", "burst", "32kb", "latency", "500ms"]
        host.ns("tc", "qdisc", "replace", "dev", "eth0", "root", *spec)

    def heal_link(self, host: Host) -> None:
        host.ns("tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def delete_host(self, host: Host) -> None:
        """End the host as a provider's console ends a machine: every process killed, the
        connections they had closed (a machine shutting down closes them before it goes dark), then
        its cable and its network namespace deleted, so nothing holds its address any more.

        Without the wait, a close racing the cable leaves a socket here retransmitting its FIN to the
        deleted address for a minute or more: the kernel's, not anything of ours dialing."""
        self.kill_host(host)
        deadline = time.monotonic() + 10
        while sockets_to(host.address) and time.monotonic() < deadline:
            time.sleep(0.05)   # polls: the closes take a round trip or two on the bridge
        _run("ip", "link", "del", host.link, check=False)
        _run("ip", "netns", "del", host.netns, check=False)

    @property
    def witness(self) -> str:
        """The bridge's listening port (``add_witness``): its far end's name."""
        return self.bridge.replace("br", "wp")

    def add_witness(self) -> None:
        """A port on the bridge that only listens (no address, no IPv6 of its own): every frame the
        bridge floods — an ARP request for an address no host holds any more, first of all — arrives
        at its far end (``frames_to`` picks them out). It also keeps the bridge's carrier up once
        every host is deleted, so what is sent towards their addresses still leaves."""
        near = self.bridge.replace("br", "wn")
        _run("ip", "link", "add", near, "type", "veth", "peer", "name", self.witness)
        for name in (near, self.witness):
            _run("sysctl", "-qw", f"net.ipv6.conf.{name}.disable_ipv6=1")
        _run("ip", "link", "set", near, "master", self.bridge)
        _run("ip", "link", "set", near, "up")
        _run("ip", "link", "set", self.witness, "up")

    def frames_to(self, addresses: set[str], seconds: float, first: bool = False) -> list[str]:
        """The frames that reach the witness within ``seconds`` and are meant for one of
        ``addresses``: an ARP request for it, or an IPv4 packet to it (what anything dialing a
        deleted host sends). Other traffic on the bridge (the bridge's own IPv6 housekeeping, say)
        is not counted. Captured with a raw socket on the witness's far end. ``first``: back with
        the first such frame."""
        wanted = {socket.inet_aton(a) for a in addresses}
        seen = []
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)) as raw:
            raw.bind((self.witness, 0))
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                raw.settimeout(left)
                try:
                    frame = raw.recv(2048)
                except TimeoutError:
                    break
                kind = frame[12:14]
                if kind == b"\x08\x06" and frame[38:42] in wanted:            # ARP: who has it
                    seen.append(f"ARP who-has {socket.inet_ntoa(frame[38:42])}")
                elif kind == b"\x08\x00" and frame[30:34] in wanted:          # IPv4 to it
                    seen.append(f"IPv4 to {socket.inet_ntoa(frame[30:34])} (protocol {frame[23]})")
                if first and seen:
                    break
        return seen

    @property
    def subnet(self) -> str:
        """The lab's addresses, e.g. ``10.213.7.0/24``."""
        return str(ipaddress.IPv4Network(f"{self.gateway}/24", strict=False))

    def plug(self, host: Host) -> None:
        """The host's network namespace, its cable to the bridge and its address: no default route,
        the bridge is all it reaches."""
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _run("ip", "link", "set", host.link, "master", self.bridge)
        _run("ip", "link", "set", host.link, "up")
        host.ns("ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
        host.ns("ip", "link", "set", "eth0", "up")
        host.ns("ip", "link", "set", "lo", "up")

    def kill_host(self, host: Host) -> list[int]:
        """SIGKILL every process of the host (its sshd too), as if it lost power."""
        pids = host.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if host.sshd is not None:
            host.sshd.wait(timeout=10)
            host.sshd = None
        return pids

    def start_sshd(self, host: Host, env: dict[str, str] | None = None) -> None:
        """sshd in the host's network namespace and a PID namespace of its own (so a command run
        over SSH sees only the host's processes), on the host's address. ``env`` is set in every
        session (sshd's ``SetEnv``): a host whose environment differs, like a PYTHONPATH that
        brings another version of a package."""
        config = self.dir / f"sshd-{host.name}.conf"
        env = {"PATH": (f"{IMAGE_AT}/bin:" if not host.bare else "") + HOST_PATH, **self.env, **(env or {})}
        config.write_text("\n".join([
            "Port 22", f"ListenAddress {host.address}", f"HostKey {self.dir / f'host_key-{host.name}'}",
            f"AuthorizedKeysFile {host.keys or self.dir / 'authorized_keys'}", "PidFile none",
            "UsePAM no", "StrictModes no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin " + ("prohibit-password" if host.login == "root" else "no"), f"AllowUsers {host.login}",
            "AllowTcpForwarding yes", "MaxStartups 64", "MaxSessions 64",
            "LogLevel ERROR", "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()), "",   # one line: sshd
        ]))                                                                        # takes the first SetEnv only
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        log = open(self.dir / f"sshd-{host.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--fork", "--mount-proc", "--mount",
             "--propagation", "private", "--uts", "sh", "-ec", self._own_disk(host) + f"exec {SSHD} -D -e -f {config}"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()
        _wait_listening(host, 22)

    def _own_disk(self, host: Host) -> str:
        """The shell lines, run in the host's new mount namespace, that give it a disk of its own:
        its folders over /root, /tmp and the checkout's parent; /opt emptied but for the image;
        the laptop's pip settings hidden; the other hosts' disks out of sight."""
        disk = Path(host.disk)
        for top in ("root", "tmp"):
            (disk / top).mkdir(parents=True, exist_ok=True)
        (disk / "tmp").chmod(0o1777)
        ssh_dir = disk / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        lines = [f"hostname {host.name}", "mount -t tmpfs tmpfs /opt"]
        if not host.bare:       # bound before anything covers the checkout, where the image is kept
            lines += [f"mkdir {IMAGE_AT}", f"mount --bind -o ro {host.image or IMAGE} {IMAGE_AT}"]
        # the checkout and ../shared beside it (one under /root or /tmp goes with those); the checkout
        # alone where its parent is / or holds the lab's own folder, which sshd reads from
        cover = ROOT.parent if ROOT.parent != Path("/") and ROOT.parent not in self.dir.parents else ROOT
        if not any(cover == Path(top) or Path(top) in cover.parents for top in ("/root", "/tmp")):
            lines.append(f"mount -t tmpfs tmpfs {cover}")
        lines += [f"mount --bind {disk}/root /root", f"mount --bind {disk}/tmp /tmp"]
        lines += [f"[ ! -e {p} ] || mount --bind /dev/null {p}" for p in ("/etc/pip.conf",)]
        lines += [f"[ ! -d {p} ] || mount -t tmpfs tmpfs {p}" for p in ("/etc/xdg/pip", "/root/.config/pip")]
        lines += [*host.setup.splitlines(), f"mount -t tmpfs tmpfs {self.dir / 'disks'}"]
        return "".join(f"{line}\n" for line in lines)

    def new_host_key(self, host: Host) -> None:
        """The host gets a new host key (reinstalled, or another machine at its address), from its
        sshd's next start."""
        key = self.dir / f"host_key-{host.name}"
        key.unlink()
        Path(f"{key}.pub").unlink(missing_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpugeek-lab-{host.name}", "-f", str(key))
        if self.known_hosts.exists():     # the lab's own ssh (``Lab.ssh``) expects the change
            _run("ssh-keygen", "-R", host.address, "-f", str(self.known_hosts), check=False)

    def restart_host(self, host: Host, env: dict[str, str] | None = None) -> None:
        """Every process of the host ended, and its sshd started again (with ``env``), answering a
        login — not only a listening port — before this returns."""
        self.kill_host(host)
        self.start_sshd(host, env)
        deadline = time.monotonic() + 30
        while (done := self.ssh(host, "true", timeout=15)).returncode != 0:
            if time.monotonic() > deadline:
                log = (self.dir / f"sshd-{host.name}.log").read_text(errors="replace")[-1500:]
                alive = host.sshd is not None and host.sshd.poll() is None
                raise RuntimeError(f"{host.name}'s sshd does not take a login after its restart "
                                   f"(running: {alive}): {done.stderr.strip()[-300:]}\n{log}")
            if host.sshd is None or host.sshd.poll() is not None:
                self.start_sshd(host, env)      # it went: once more, and say so if that fails too
            time.sleep(0.5)

    # -- life ---------------------------------------------------------------------------------------

    def save(self) -> None:
        state = {"bridge": self.bridge, "gateway": self.gateway,
                 "hosts": [{"name": h.name, "netns": h.netns, "address": h.address, "link": h.link,
                            "disk": h.disk, "bare": h.bare, "image": h.image, "login": h.login, "keys": h.keys,
                            "setup": h.setup} for h in self.hosts]}
        (self.dir / "lab.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, folder: Path) -> Lab:
        state = json.loads((folder / "lab.json").read_text())
        return cls(folder, state["bridge"], state["gateway"], [Host(**h) for h in state["hosts"]])

    def keep_logs(self, folder: Path) -> Path:
        """Every host's Ray logs (each session's ``logs``), copied to ``folder`` before the lab
        goes: what a failed test leaves to read. Its sockets and pipes are left out."""
        for host in self.hosts:
            for logs in host.file("/tmp").glob("gg-*/session_*/logs"):
                if not logs.parent.is_symlink():
                    shutil.copytree(logs, folder / host.name / logs.parent.name, dirs_exist_ok=True,
                                    ignore=lambda _, names: [n for n in names if n.endswith((".sock", ".pipe"))])
        return folder

    def leftovers(self, wait: float = 5.0) -> list[str]:
        """What of the lab still exists: namespaces, links, processes. Empty after ``down`` (the
        kernel removes a namespace's links a moment after it goes, hence ``wait``)."""
        deadline = time.monotonic() + wait
        while (left := self._leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def _leftovers(self) -> list[str]:
        left = []
        namespaces = _run("ip", "netns", "list", check=False).stdout.split()
        storage_ns, storage_link, _ = self._storage_names
        left += [f"namespace {ns}" for ns in [*(h.netns for h in self.hosts), storage_ns] if ns in namespaces]
        links = _run("ip", "-o", "link", "show", check=False).stdout
        left += [f"link {name}" for name in [self.bridge, self.witness, storage_link, *(h.link for h in self.hosts)]
                 if f" {name}:" in links or f" {name}@" in links]
        if storage_ns in namespaces:
            left += [f"process {pid}" for pid in _run("ip", "netns", "pids", storage_ns, check=False).stdout.split()]
        left += [f"process {pid}" for h in self.hosts if h.netns in namespaces for pid in h.pids()]
        routes = _run("ip", "route", "show", "type", "blackhole", check=False).stdout
        left += [f"route blackhole {h.address}" for h in self.hosts if h.address in routes.split()]
        left += [f"sshd {h.sshd.pid}" for h in self.hosts if h.sshd is not None and h.sshd.poll() is None]
        if self.index_server is not None and self.index_server.poll() is None:
            left.append(f"index server {self.index_server.pid}")
        return left

    @property
    def _storage_names(self) -> tuple[str, str, str]:
        """The S3 server's namespace, its link to the bridge, and its address (``.5``)."""
        lab_id = self.bridge[2:-2]
        return f"{PREFIX}{lab_id}-s3", f"gl{lab_id}s3", self.gateway.rsplit(".", 1)[0] + ".5"

    def start_storage(self, bucket: str = "lab") -> str:
        """An S3 server (moto's, as Ray's own tests use) in a namespace of its own on the bridge:
        the cloud's object store, on the hosts' side of the laptop's link (``cut_laptop`` leaves
        them reaching it, as a closed lid leaves a cloud's machines their S3), with ``bucket``
        made. Every host started after this gets its address and test credentials in the standard
        AWS variables, as a machine configured for S3 has them. Its URL."""
        import boto3

        netns, link, address = self._storage_names
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _run("ip", "link", "set", link, "master", self.bridge)
        _run("ip", "link", "set", link, "up")
        for cmd in (("addr", "add", f"{address}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                    ("link", "set", "lo", "up")):
            _run("ip", "netns", "exec", netns, "ip", *cmd)
        serve = ("import logging, sys, threading\nfrom moto.server import ThreadedMotoServer\n"
                 "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"     # not a line per request
                 "ThreadedMotoServer(ip_address=sys.argv[1], port=9000, verbose=False).start()\n"
                 "threading.Event().wait()\n")
        self.storage = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", serve, address],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((address, 9000), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self.storage.poll() is not None:
                    raise RuntimeError("the lab's S3 server did not start") from None
                time.sleep(0.05)
        self.env.update(AWS_ENDPOINT_URL=f"http://{address}:9000", AWS_ACCESS_KEY_ID="lab",
                        AWS_SECRET_ACCESS_KEY="lab", AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], aws_access_key_id="lab",
                     aws_secret_access_key="lab", region_name="us-east-1").create_bucket(Bucket=bucket)
        return f"s3://{bucket}"

    def serve_index(self, folder: Path = INDEX) -> str:
        """Serve ``folder`` (a PEP 503 index, ``make lab-files``) to the hosts on the laptop's bridge
        address: what a package mirror is to a user's machines, and all the hosts can reach."""
        if not (folder / "simple").is_dir():
            raise RuntimeError(f"no wheel index for the lab's hosts at {folder} — make lab-files")
        with socket.socket() as probe:
            probe.bind((self.gateway, 0))
            port = probe.getsockname()[1]
        # http.server's own, with a deep listen queue: uv asks for dozens of wheels at once, and the
        # default queue of 5 drops connections that its retries then wait out (seconds each)
        serve = ("import functools, http.server, sys\n"
                 "class Server(http.server.ThreadingHTTPServer):\n    request_queue_size = 256\n"
                 "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])\n"
                 "Server((sys.argv[1], int(sys.argv[2])), handler).serve_forever()\n")
        self.index_server = subprocess.Popen(
            [sys.executable, "-c", serve, self.gateway, str(port), str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _claim(self.dir, child=self.index_server.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.gateway, port), timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        self.index_url = f"http://{self.gateway}:{port}/simple"
        return self.index_url

    def down(self) -> None:
        if self.index_server is not None:
            self.index_server.kill()
            self.index_server.wait(timeout=10)
        if self.storage is not None:
            self.storage.kill()
            self.storage.wait(timeout=10)
        netns, link, _ = self._storage_names
        _run("ip", "link", "del", link, check=False)
        _run("ip", "netns", "del", netns, check=False)
        self.reconnect_laptop()
        for host in self.hosts:
            self.kill_host(host)
            _run("ip", "link", "del", host.link, check=False)     # both ends of the veth pair
            _run("ip", "netns", "del", host.netns, check=False)
        _run("ip", "link", "del", self.witness, check=False)     # both ends, where there is one
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def left_on_hosts(lab: Lab, within: float = LEFT_WITHIN_S, idle_sessions: bool = True) -> list[int]:
    """Every process in the hosts' namespaces but their own sshd, once it is empty or ``within``
    seconds have passed: counted by namespace, never by our marker (Ray's agents do not carry it).
    ``idle_sessions=False``: an SSH connection's sshd with nothing under it is left out (the laptop
    was cut off while it was open: only the host's keepalive ends it)."""
    deadline = time.monotonic() + within
    while (left := [pid for host in lab.hosts for pid in host.strays(idle_sessions=idle_sessions)]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def described(pids: list[int]) -> list[str]:
    """PID and command line, so a failure says which process outlived ``down``."""
    def line(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            return "(gone)"
    return [f"{pid}: {line(pid)}" for pid in pids]

@contextlib.contextmanager
def fixture(n_hosts: int, bare: tuple[str, ...] = (), storage: bool = False, images: dict[str, Path] | None = None):
    """A lab for a pytest fixture: skipped (with the reason) where namespaces can't be made, torn
    down after, and asserted to leave nothing behind."""
    import pytest

    reason = why_not()
    if reason:
        pytest.skip(reason)
    made = up(n_hosts, bare, storage, images)
    try:
        made.serve_index()
        yield made
    finally:
        made.down()
        left = made.leftovers()
        assert not left, f"the lab left {', '.join(left)}"


def up(n_hosts: int = 3, bare: tuple[str, ...] = (), storage: bool = False,
       images: dict[str, Path] | None = None) -> Lab:
    """Make the lab: a bridge on a free 10.213.X.0/24, then ``n_hosts`` hosts with sshd; the hosts
    named in ``bare`` have no machine image, those named in ``images`` mount that folder as theirs
    (another Python, say) instead of IMAGE; with ``storage``, an S3 server on the bridge
    (``Lab.start_storage``, bucket ``lab``)."""
    images = {name: Path(folder) for name, folder in (images or {}).items()}
    global _made
    _made += 1          # labs made by this process: two at once must not share a name
    lab_id = f"{(os.getpid() * 8 + _made) % 100000:05d}"
    # not under /tmp: every host has a /tmp of its own, and its sshd reads the lab's keys from here
    sweep_orphans()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{lab_id}-", dir=LABS))
    _claim(folder)
    folder.chmod(0o755)
    (folder / "shared").mkdir()
    subnet = _free_subnet()
    gateway = str(subnet.network_address + 1)
    lab = Lab(folder, bridge=f"gl{lab_id}br", gateway=gateway)
    try:
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpugeek-lab", "-f", str(lab.key))
        shutil.copy(f"{lab.key}.pub", folder / "authorized_keys")
        _run("ip", "link", "add", lab.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{gateway}/24", "dev", lab.bridge)
        _run("ip", "link", "set", lab.bridge, "up")
        for i in range(1, n_hosts + 1):
            host = Host(name=f"h{i}", netns=f"{PREFIX}{lab_id}-h{i}",
                        address=str(subnet.network_address + 10 + i), link=f"gl{lab_id}h{i}",
                        disk=str(folder / "disks" / f"h{i}"), bare=f"h{i}" in bare,
                        image=str(images.get(f"h{i}", "")))
            lab.hosts.append(host)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpugeek-lab-{host.name}", "-f",
                 str(folder / f"host_key-{host.name}"))
            lab.plug(host)
        lab.save()
        for image in {Path(h.image or IMAGE) for h in lab.hosts if not h.bare}:
            if not (image / "bin" / "python3").exists():
                raise RuntimeError(f"no machine image for the lab's hosts at {image} — make lab-image")
        if storage:
            lab.start_storage()
        for host in lab.hosts:
            lab.start_sshd(host)
    except BaseException:
        lab.down()
        raise
    return lab


# -- labs whose maker died ---------------------------------------------------------------------------
# A run killed outright (SIGKILL, a machine's restart) never reaches ``down``: its namespaces, bridge
# and routes stay, and the next cloud box finds its VPC range taken. Each lab's folder names the
# process that made it (PID and start time, so a reused PID is not mistaken for it) and the
# processes it started outside the hosts; the next ``up`` removes every lab whose maker is gone.

def _started(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _claim(folder: Path, child: int | None = None) -> None:
    """Write (or add a child process to) ``folder``'s owner.json: this process made the lab."""
    path = folder / "owner.json"
    owner = json.loads(path.read_text()) if path.exists() else \
        {"pid": os.getpid(), "started": _started(os.getpid()), "children": []}
    if child is not None:
        owner["children"].append([child, _started(child)])
    path.write_text(json.dumps(owner))


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and _started(pid) == started


def sweep_orphans(labs: Path | None = None, young_s: float = 120.0) -> list[str]:
    """Remove what labs whose maker died left: their processes (by namespace, and the children
    named in owner.json), namespaces, links, blackhole routes and folders. A lab whose maker is
    alive, or that `netlab.py up` left running on purpose, is never touched; a folder with no
    owner.json yet is left alone for ``young_s`` (its maker may be writing it). Returns what it
    removed."""
    labs = labs or LABS
    alive, dead = set(), []
    for folder in labs.glob(f"{PREFIX}-*-*"):
        lab_id = folder.name.split("-")[1]
        try:
            owner = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            owner = None
        if owner is None:
            try:
                young = time.time() - folder.stat().st_mtime < young_s
            except OSError:
                continue
            (alive.add(lab_id) if young else dead.append((lab_id, folder, {})))
        elif owner.get("kept") or _alive(owner["pid"], owner.get("started")):
            alive.add(lab_id)
        else:
            dead.append((lab_id, folder, owner))
    removed = []
    for _, _folder, owner in dead:
        for pid, started in owner.get("children", []):
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid}")
    namespaces = _run("ip", "netns", "list", check=False).stdout.split()
    for ns in namespaces:
        lab_id = ns[len(PREFIX):].split("-")[0] if ns.startswith(PREFIX) else None
        if not lab_id or not lab_id.isdigit() or lab_id in alive:
            continue
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
            removed.append(f"process {pid}")
        _run("ip", "netns", "del", ns, check=False)
        removed.append(f"namespace {ns}")
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        lab_id = name[2:7]
        if name.startswith("gl") and lab_id.isdigit() and len(lab_id) == 5 and lab_id not in alive:
            _run("ip", "link", "del", name, check=False)      # routes through it go with it
            removed.append(f"link {name}")
    blackholes = _run("ip", "route", "show", "type", "blackhole", check=False).stdout.split()
    for _, folder, _ in dead:
        try:
            state = json.loads((folder / "lab.json").read_text())
        except (OSError, ValueError):
            state = {"hosts": []}
        for address in [h["address"] for h in state["hosts"]] + ([state["gateway"]] if "gateway" in state else []):
            if address in blackholes:
                _run("ip", "route", "del", "blackhole", address, check=False)
                removed.append(f"route blackhole {address}")
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(f"folder {folder}")
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.X.0/24 that no route or address of this machine uses yet."""
    used = _run("ip", "-4", "route", "show", "table", "all", check=False).stdout
    used += _run("ip", "-4", "addr", "show", check=False).stdout
    candidates = list(range(16, 250))
    random.shuffle(candidates)
    for x in candidates:
        if f"10.213.{x}." not in used:
            return ipaddress.IPv4Network(f"10.213.{x}.0/24")
    raise RuntimeError("no free 10.213.X.0/24 for the lab")


def _wait_listening(host: Host, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.address, port), timeout=1):
                return
        except OSError:
            if host.sshd is not None and host.sshd.poll() is not None:
                raise RuntimeError(f"sshd on {host.name} exited {host.sshd.returncode}") from None
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {host.name} ({host.address}) did not listen within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="make the lab and leave it running")
    start.add_argument("--hosts", type=int, default=3)
    start.add_argument("--bare", default="", help="hosts without the machine image, like h3")
    stop = sub.add_parser("down", help="remove a lab made by `up`")
    stop.add_argument("dir", type=Path)
    sub.add_parser("sweep", help="remove what labs whose maker was killed left behind")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        raise SystemExit(reason)
    if args.command == "up":
        lab = up(args.hosts, tuple(b for b in args.bare.split(",") if b))
        for host in lab.hosts:
            host.sshd = None   # leave them running after this process ends
        owner = json.loads((lab.dir / "owner.json").read_text())
        (lab.dir / "owner.json").write_text(json.dumps({**owner, "kept": True}))   # not an orphan: `down` ends it
        print(f"lab in {lab.dir} (the laptop is {lab.gateway} on {lab.bridge}); serve the hosts a wheel index "
              f"with: {sys.executable} -m http.server --bind {lab.gateway} --directory {INDEX} PORT")
        for host in lab.hosts:
            print(f"  {host.name}  {host.address}   ssh {' '.join(lab.ssh_options())} root@{host.address}")
        print(f"take it down: {sys.executable} {__file__} down {lab.dir}")
    elif args.command == "sweep":
        print("\n".join(sweep_orphans()) or "nothing left by a dead lab")
    else:
        lab = Lab.load(args.dir)
        lab.down()
        left = lab.leftovers()
        print("lab removed" if not left else f"left over: {', '.join(left)}")


if __name__ == "__main__":
    main()
